package integration

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// TestSleepingTenantWakesOnAnotherHost: two hosts in network namespaces of
// their own, one PostgreSQL. Host 1 alone takes three tenants; host 2 joins
// empty. The tenant that sleeps, asked for through host 1's door, wakes on
// host 2 (two tenants' room more; both hosts are one machine, whose free
// memory moves by a control plane's between their reports): the request that woke it is answered, with
// the objects it kept, and host 1 runs nothing of it. Asleep again, it moves
// asleep off host 2 when host 2 is drained, and its next client wakes it on
// host 1.
func TestSleepingTenantWakesOnAnotherHost(t *testing.T) {
	admin := livetest.Postgres(t)
	dropDatabases(t, admin, "lazy", "busy", "busier")
	bed := newHostBed(t, 2, admin)
	h1 := bed.host(0, "")
	h1.mustCLI("cluster", "create", "lazy", "--sleep-after", "30s", "--wait")
	h1.mustCLI("cluster", "create", "busy", "--wait")
	h1.mustCLI("cluster", "create", "busier", "--wait")
	kc := h1.mustCLI("cluster", "kubeconfig", "lazy")
	cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(kc))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Timeout = 90 * time.Second
	lazy := kubernetes.NewForConfigOrDie(cfg)
	putConfigMap(t, lazy, "kept")
	h2 := bed.host(1, filepath.Join(h1.stateDir, "cluster.key"))
	livetest.Eventually(t, 60*time.Second, 500*time.Millisecond, "both hosts live", func() bool {
		out, _, _ := h1.cli("host", "list")
		return hostLine(out, "h1", "yes") && hostLine(out, "h2", "yes")
	})

	asleepOn := func(host string) {
		t.Helper()
		livetest.Eventually(t, 3*time.Minute, time.Second, "lazy asleep on "+host, func() bool {
			c := h1.cluster("lazy")
			return c.Status.Phase == v1.PhaseAsleep && c.Status.Host == host && c.Status.MovingTo == ""
		})
		time.Sleep(5 * time.Second) // both hosts report free memory again (every 2 s): its sleep freed some
	}
	// wake asks lazy for its ConfigMap through host 1's door, once: the
	// connection that wakes it is held while it moves and wakes.
	wake := func() time.Duration {
		t.Helper()
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cm, err := lazy.CoreV1().ConfigMaps("default").Get(ctx, "kept", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the request that woke lazy, through host 1's door: %v", err)
		}
		if cm.Data["from"] != "kept" {
			t.Errorf("ConfigMap kept after the wake: %v", cm.Data)
		}
		return time.Since(start)
	}
	asleepOn("h1")
	hostsBefore, _, _ := h1.cli("host", "list")
	took := wake()
	c := h1.cluster("lazy")
	t.Logf("hosts before the wake:\n%s", hostsBefore)
	t.Logf("lazy woke on %s, %s after the request; Placed: %+v", c.Status.Host, took.Round(100*time.Millisecond), conditionOf(c, v1.ConditionPlaced))
	if c.Status.Host != "h2" || c.Status.MovingTo != "" {
		t.Errorf("lazy after its wake: host %q, movingTo %q; want h2, host 1 having a tenant more", c.Status.Host, c.Status.MovingTo)
	}
	if p := conditionOf(c, v1.ConditionPlaced); p == nil || p.Reason != "Moved" || !strings.Contains(p.Message, "wake") {
		t.Errorf("lazy's Placed condition %+v, want reason Moved saying it moved to wake", p)
	}
	livetest.Eventually(t, 30*time.Second, 500*time.Millisecond, "lazy Ready with a Wake condition", func() bool {
		c := h1.cluster("lazy")
		w := conditionOf(c, v1.ConditionWake)
		return c.Status.Phase == v1.PhaseReady && w != nil && w.Status == metav1.ConditionTrue
	})
	if n := controlPlaneRunning(filepath.Join(h1.stateDir, "clusters", "lazy", "instance.json")); n != 0 {
		t.Errorf("host 1 still runs lazy's control plane (pid %d) after it woke on host 2", n)
	}
	if controlPlaneRunning(filepath.Join(h2.stateDir, "clusters", "lazy", "instance.json")) == 0 {
		t.Error("host 2 runs no control plane of lazy, which woke there")
	}
	if b := h1.cluster("busy"); b.Status.Host != "h1" || b.Status.Phase != v1.PhaseReady {
		t.Errorf("busy, awake on h1: host %q, phase %s; an awake tenant does not move", b.Status.Host, b.Status.Phase)
	}

	// Asleep on host 2, which is drained: it moves asleep, and wakes on host 1.
	asleepOn("h2")
	drained := time.Now()
	h1.mustCLI("host", "drain", "h2", "--timeout", "2m")
	asleepOn("h1")
	c = h1.cluster("lazy")
	t.Logf("drain of h2 moved lazy asleep to h1 in %s; Placed: %+v", time.Since(drained).Round(100*time.Millisecond), conditionOf(c, v1.ConditionPlaced))
	if p := conditionOf(c, v1.ConditionPlaced); p == nil || p.Reason != "Moved" || !strings.Contains(p.Message, "asleep") {
		t.Errorf("lazy's Placed condition after the drain %+v, want reason Moved saying it arrived asleep", p)
	}
	took = wake()
	t.Logf("lazy woke on h1 %s after the request", took.Round(100*time.Millisecond))
	if c := h1.cluster("lazy"); c.Status.Host != "h1" {
		t.Errorf("lazy woke on %q, want h1 (h2 is drained)", c.Status.Host)
	}
	if n := controlPlaneRunning(filepath.Join(h2.stateDir, "clusters", "lazy", "instance.json")); n != 0 {
		t.Errorf("drained host 2 still runs lazy's control plane (pid %d)", n)
	}
}
