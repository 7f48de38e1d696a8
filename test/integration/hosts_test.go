package integration

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	swdaemon "github.com/socialweb-computer/socialweb/internal/daemon"
	"github.com/socialweb-computer/socialweb/internal/datastore"
	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// dropDatabases removes the management database and the named tenants' from the
// test server, now and when the test ends, so that a test starts a new service.
func dropDatabases(t *testing.T, admin string, tenants ...string) {
	t.Helper()
	db, err := sql.Open("pgx", admin)
	if err != nil {
		t.Fatal(err)
	}
	drop := func() {
		for _, n := range append([]string{"mgmt"}, tenants...) {
			name := datastore.DatabaseName(n)
			_, _ = db.Exec(`DROP DATABASE IF EXISTS "` + name + `" WITH (FORCE)`)
			_, _ = db.Exec(`DROP ROLE IF EXISTS "` + name + `"`)
		}
	}
	drop()
	t.Cleanup(func() { drop(); db.Close() })
}

// TestTwoHostsShareOneManagementPlane: two daemons on one PostgreSQL are one
// service. Each registers a Host and lists the other live; clusters created
// through one are placed over both (--max-tenants 1 each), run on the host
// their Lease names and nowhere else, and answer through their kubeconfigs; a
// third cluster fits nowhere, is refused saying why and is not left behind; the
// same name created through both at once is created once; a host with another
// cluster key is refused at start.
func TestTwoHostsShareOneManagementPlane(t *testing.T) {
	admin := livetest.Postgres(t)
	dropDatabases(t, admin, "one", "two", "three")
	common := []string{"--datastore", admin, "--max-tenants", "1", "--host-lease-duration", "6s"}
	a := newDaemon(t, 3, append([]string{"--host-name", "host-a"}, common...)...)
	a.start()
	key := filepath.Join(a.stateDir, "cluster.key")
	if fi, err := os.Stat(key); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("host-a's cluster key %s: %v, mode %v; want a 0600 file made on the first start", key, err, fi)
	}

	// A host with a key of its own does not join, and says which key it needs.
	stranger := stateTempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, append([]string{"serve", "--state-dir", stranger, "--host-name", "host-x",
		"--api-port", strconv.Itoa(livetest.FreePort(t)), "--port-range", "29990-29999", "--metrics-address", ""}, common...)...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another cluster key") || !strings.Contains(string(out), "--cluster-key-file") {
		t.Errorf("a host with another cluster key: %v\n%s\nwant it refused, naming --cluster-key-file", err, tail(string(out), 10))
	}
	if mgmtRunning(stranger) {
		t.Error("the refused host left its management API running")
	}

	b := newDaemon(t, 3, append([]string{"--host-name", "host-b", "--cluster-key-file", key}, common...)...)
	b.start()
	for _, d := range []*daemon{a, b} {
		livetest.Eventually(t, 30*time.Second, 500*time.Millisecond, "both hosts live in `host list`", func() bool {
			out, _, _ := d.cli("host", "list")
			return hostLine(out, "host-a", "yes") && hostLine(out, "host-b", "yes")
		})
	}

	// The same name through both hosts at once is created once.
	var wg sync.WaitGroup
	codes, errs := make([]int, 2), make([]string, 2)
	for i, d := range []*daemon{a, b} {
		wg.Go(func() { _, errs[i], codes[i] = d.cli("cluster", "create", "one") })
	}
	wg.Wait()
	if codes[0]+codes[1] == 0 || codes[0] != 0 && codes[1] != 0 || !strings.Contains(errs[0]+errs[1], "already exists") {
		t.Errorf("`cluster create one` through both hosts at once: exits %v, want exactly one 0 and the other saying it exists; stderr: %q", codes, errs)
	}
	a.mustCLI("cluster", "create", "two", "--wait")
	a.waitPhase("one", v1.PhaseReady, 2*time.Minute)
	seen := map[string]string{}
	for _, name := range []string{"one", "two"} {
		c := b.cluster(name) // read through the other host: one API
		if c.Status.Host != "host-a" && c.Status.Host != "host-b" {
			t.Fatalf("cluster %s: status.host %q, want host-a or host-b", name, c.Status.Host)
		}
		seen[c.Status.Host] = name
		placed := conditionOf(c, v1.ConditionPlaced)
		if placed == nil || placed.Status != metav1.ConditionTrue || !strings.Contains(placed.Message, "placed on "+c.Status.Host) {
			t.Errorf("cluster %s: Placed condition %+v, want True saying where and why", name, placed)
		}
		lease, err := b.managementKube().CoordinationV1().Leases(v1.SystemNamespace).Get(context.Background(), v1.TenantLeaseName(name), metav1.GetOptions{})
		if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != c.Status.Host {
			t.Errorf("cluster %s on %s: its Lease %v (err %v), want held by that host", name, c.Status.Host, lease, err)
		}
		// Its control plane runs from its host's state dir and from no other.
		own, other := a, b
		if c.Status.Host == "host-b" {
			own, other = b, a
		}
		if controlPlaneRunning(filepath.Join(own.stateDir, "clusters", name, "instance.json")) == 0 {
			t.Errorf("cluster %s: no control plane runs on its host %s", name, c.Status.Host)
		}
		if controlPlaneRunning(filepath.Join(other.stateDir, "clusters", name, "instance.json")) != 0 {
			t.Errorf("cluster %s: a control plane runs on the host that does not own it too", name)
		}
		_, k := a.tenant(name)
		putConfigMap(t, k, "on-"+c.Status.Host)
	}
	if len(seen) != 2 {
		t.Fatalf("two clusters on two hosts of --max-tenants 1: placed %v, want one on each", seen)
	}
	if out := a.mustCLI("cluster", "list"); !strings.Contains(out, "HOST") || !strings.Contains(out, "host-a") || !strings.Contains(out, "host-b") {
		t.Errorf("cluster list does not say where each runs:\n%s", out)
	}

	// Both hosts full: a third cluster is refused, says why, and is not left behind.
	_, errOut, code := b.cli("cluster", "create", "three")
	if code == 0 || !strings.Contains(errOut, "no host can take") || !strings.Contains(errOut, "host-a: 1 tenants") || !strings.Contains(errOut, "host-b: 1 tenants") {
		t.Errorf("a cluster no host can take: exit %d, %q; want refused, saying each host is at its --max-tenants", code, errOut)
	}
	if _, _, code := a.cli("cluster", "get", "three"); code == 0 {
		t.Error("the refused cluster was left behind")
	}
	out2 := b.mustCLI("host", "list")
	if !hostLine(out2, "host-a", "yes") || !hostLine(out2, "host-b", "yes") {
		t.Errorf("host list:\n%s", out2)
	}
}

// hostLine says whether `host list` shows host with LIVE live.
func hostLine(out, host, live string) bool {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == host && f[1] == live {
			return true
		}
	}
	return false
}

// conditionOf is c's condition of type t, or nil.
func conditionOf(c v1.Cluster, t string) *metav1.Condition {
	for i := range c.Status.Conditions {
		if c.Status.Conditions[i].Type == t {
			return &c.Status.Conditions[i]
		}
	}
	return nil
}

// managementKube is a typed client of the management API, with the daemon's admin kubeconfig.
func (d *daemon) managementKube() kubernetes.Interface {
	d.t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(d.stateDir, swdaemon.AdminKubeconfig))
	if err != nil {
		d.t.Fatalf("the management API's kubeconfig: %v", err)
	}
	if d.netns != "" {
		cfg.Dial = netnsDial(d.netns) // it listens on the namespace's loopback
	}
	return kubernetes.NewForConfigOrDie(cfg)
}
