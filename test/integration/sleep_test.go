package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
)

// TestSleepAndWake: a cluster with --sleep-after 30s and no nodes goes to
// sleep (phase Asleep, its control-plane process gone); a bare connection to
// its port and a ClientHello that does not name it leave it asleep; a list
// against its own port, naming it as its kubeconfig does, wakes it and is
// answered; it sleeps again; a list through the front door wakes it; `cluster
// get` does not wake it; after a daemon restart it is still asleep, and
// clients that arrive together wake it and are all answered; a wake that
// fails is answered with a 503 saying why.
func TestSleepAndWake(t *testing.T) {
	const (
		name   = "nap"
		domain = "tenants.test"
	)
	door := fmt.Sprintf("127.0.0.1:%d", livetest.FreePort(t))
	metrics := fmt.Sprintf("127.0.0.1:%d", livetest.FreePort(t))
	d := newDaemon(t, 2, "--front-door", door, "--front-door-domain", domain, "--metrics-address", metrics)
	d.start()
	d.mustCLI("cluster", "create", name, "--sleep-after", "30s", "--wait")
	if c := d.cluster(name); c.Spec.SleepAfter == nil || c.Spec.SleepAfter.Duration != 30*time.Second {
		t.Fatalf("spec.sleepAfter = %v, want 30s", c.Spec.SleepAfter)
	}
	config := filepath.Join(d.stateDir, "clusters", name, "controlplane.json")

	viaDoor, _ := d.tenant(name) // the kubeconfig names the door when there is one
	// The cluster's own port, still naming it: Go sends no SNI for 127.0.0.1.
	own := rest.CopyConfig(viaDoor)
	own.Host = d.cluster(name).Status.URL
	if own.TLSClientConfig.ServerName != name+"."+domain {
		t.Fatalf("the kubeconfig sends server name %q, want %s.%s", own.TLSClientConfig.ServerName, name, domain)
	}

	asleep := func(when string) {
		t.Helper()
		c := d.waitPhase(name, v1.PhaseAsleep, 3*time.Minute)
		if c.Status.AsleepSince == nil {
			t.Errorf("%s: Asleep without status.asleepSince", when)
		}
		// The process stops after the phase is written: give it its grace.
		deadline := time.Now().Add(15 * time.Second)
		for len(processesMentioning(config)) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: Asleep, but its control plane still runs: %v", when, processesMentioning(config))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	wake := func(how string, cfg *rest.Config) {
		t.Helper()
		start := time.Now()
		pods, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods("").List(ctxT(t, time.Minute), metav1.ListOptions{})
		if err != nil {
			t.Fatalf("listing pods of the sleeping cluster %s: %v", how, err)
		}
		t.Logf("a list of pods %s woke the cluster and was answered (%d pods) in %s", how, len(pods.Items), time.Since(start).Round(time.Millisecond))
		c := d.waitPhase(name, v1.PhaseReady, time.Minute)
		if c.Status.AsleepSince != nil {
			t.Errorf("awake with status.asleepSince %v", c.Status.AsleepSince)
		}
		deadline := time.Now().Add(30 * time.Second)
		for !meta.IsStatusConditionTrue(d.cluster(name).Status.Conditions, v1.ConditionWake) {
			if time.Now().After(deadline) {
				t.Fatalf("woken %s, the Wake condition is not True: %+v", how, meta.FindStatusCondition(d.cluster(name).Status.Conditions, v1.ConditionWake))
			}
			time.Sleep(250 * time.Millisecond)
		}
		t.Logf("Wake condition: %s", meta.FindStatusCondition(d.cluster(name).Status.Conditions, v1.ConditionWake).Message)
	}

	asleep("after 30s idle")
	// Neither a bare connection nor a ClientHello without the cluster's name
	// wakes it: the gate closes them (the bare one after its 5 s hello
	// timeout) and counts them.
	port := strings.TrimPrefix(own.Host, "https://")
	bare, err := net.Dial("tcp", port)
	if err != nil {
		t.Fatal(err)
	}
	noName := rest.CopyConfig(own)
	noName.TLSClientConfig.ServerName = ""
	if _, err := kubernetes.NewForConfigOrDie(noName).CoreV1().Pods("").List(ctxT(t, 30*time.Second), metav1.ListOptions{}); err == nil || !strings.Contains(err.Error(), "unrecognized name") {
		t.Errorf("a list naming no server against the sleeping port: %v; want the unrecognized_name alert", err)
	}
	time.Sleep(7 * time.Second)
	bare.Close()
	if c := d.cluster(name); c.Status.Phase != v1.PhaseAsleep || len(processesMentioning(config)) > 0 {
		t.Fatalf("a bare connection or a hello without the name woke it: phase %s, processes %v", c.Status.Phase, processesMentioning(config))
	}
	if resp, err := http.Get("http://" + metrics + "/metrics"); err != nil {
		t.Errorf("scraping the daemon's metrics: %v", err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, reason := range []string{"hello_timeout", "no_name"} {
			if want := fmt.Sprintf(`socialweb_cluster_wake_refused_total{cluster=%q,reason=%q} 1`, name, reason); !strings.Contains(string(body), want) {
				t.Errorf("metrics lack %s:\n%s", want, grepLines(string(body), "socialweb_cluster_wake_refused"))
			}
		}
	}
	wake("on its own port", own)

	asleep("idle again")
	wake("through the front door", viaDoor)

	asleep("idle once more")
	for range 5 {
		d.cluster(name)
	}
	time.Sleep(3 * time.Second)
	if c := d.cluster(name); c.Status.Phase != v1.PhaseAsleep || len(processesMentioning(config)) > 0 {
		t.Fatalf("`cluster get` woke the cluster: phase %s, processes %v", c.Status.Phase, processesMentioning(config))
	}

	d.stop(syscall.SIGTERM)
	d.start()
	time.Sleep(10 * time.Second) // a restart that started it would have by now
	if c := d.cluster(name); c.Status.Phase != v1.PhaseAsleep || len(processesMentioning(config)) > 0 {
		t.Fatalf("after a daemon restart: phase %s, processes %v; want it still asleep", c.Status.Phase, processesMentioning(config))
	}
	// Clients that arrive together: one start, every one answered.
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			start := time.Now()
			if _, err := kubernetes.NewForConfigOrDie(own).CoreV1().Namespaces().List(ctxT(t, time.Minute), metav1.ListOptions{}); err != nil {
				t.Errorf("client %d waking the cluster after the restart: %v", i, err)
				return
			}
			t.Logf("client %d answered after the restart in %s", i, time.Since(start).Round(time.Millisecond))
		})
	}
	wg.Wait()
	d.waitPhase(name, v1.PhaseReady, time.Minute)

	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatalf("scraping the daemon's metrics: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`socialweb_cluster_wakes_total{cause="connection",result="ok"} 1`, "socialweb_cluster_wake_seconds_count 1"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics after the restart lack %s:\n%s", want, grepLines(string(body), "socialweb_cluster_"))
		}
	}

	// A wake that fails is answered, not dropped: the service-account key is
	// moved aside, so the apiserver exits as it starts (a garbage datastore
	// does not do: kine retries it for minutes, and the client would give up
	// on its TLS handshake first; this daemon prepared the cluster already, so
	// the start does not make the key again). The client gets a 503 whose
	// Status says why and what to do, through the door; the Wake condition is
	// False; within the hold another client is answered at once, on the
	// cluster's own port, without another start; mended, a request after the
	// hold wakes it.
	asleep("before a wake that fails")
	saKey := filepath.Join(d.stateDir, "clusters", name, "pki", "sa.key")
	if err := os.Rename(saKey, saKey+".aside"); err != nil {
		t.Fatal(err)
	}
	failed := time.Now()
	_, err = kubernetes.NewForConfigOrDie(viaDoor).CoreV1().Pods("").List(ctxT(t, time.Minute), metav1.ListOptions{})
	if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "could not be woken") || !strings.Contains(err.Error(), "socialweb cluster get "+name) {
		t.Fatalf("a list that woke a cluster whose start fails got %v; want a 503 saying why and what to do", err)
	}
	t.Logf("a failed wake was answered through the door in %s: %v", time.Since(failed).Round(time.Millisecond), err)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c := meta.FindStatusCondition(d.cluster(name).Status.Conditions, v1.ConditionWake)
		if c != nil && c.Status == metav1.ConditionFalse && c.Reason == "WakeFailed" {
			t.Logf("Wake condition: %s", c.Message)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a failed wake the Wake condition is %+v; want False, WakeFailed", c)
		}
		time.Sleep(250 * time.Millisecond)
	}
	asleep("after a failed wake")
	t0 := time.Now()
	_, err = kubernetes.NewForConfigOrDie(own).CoreV1().Namespaces().List(ctxT(t, time.Minute), metav1.ListOptions{})
	if !apierrors.IsServiceUnavailable(err) || time.Since(t0) > 5*time.Second {
		t.Errorf("within the hold, on its own port: %v after %s; want the 503 at once", err, time.Since(t0).Round(time.Millisecond))
	}
	if ps := processesMentioning(config); len(ps) > 0 {
		t.Errorf("within the hold a control plane started: %v", ps)
	}
	if err := os.Rename(saKey+".aside", saKey); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(failed.Add(35 * time.Second))) // the hold (30 s) is over
	wake("after the failed wake was mended", own)
}

// TestSleepWakeBootsANode is issue 13's test with the real scale path: a cluster sleeps;
// a Pod applied through the front door wakes it and is created; a node boots and the Pod
// runs; the cluster goes back to zero nodes and to sleep. Only the management API is
// watched while the cluster should fall asleep: a request to the tenant is activity.
func TestSleepWakeBootsANode(t *testing.T) {
	const name = "doze"
	img := nodeImage(t)
	door := fmt.Sprintf("127.0.0.1:%d", livetest.FreePort(t))
	d := newDaemon(t, 1, "--node-image", img, "--front-door", door)
	d.start()
	d.mustCLI("cluster", "create", name, "--sleep-after", "30s", "--hold", "10s", "--max-nodes", "1", "--wait")
	config := filepath.Join(d.stateDir, "clusters", name, "controlplane.json")
	asleep := func(when string, timeout time.Duration) {
		t.Helper()
		d.waitPhase(name, v1.PhaseAsleep, timeout)
		livetest.Eventually(t, 15*time.Second, 200*time.Millisecond, when+": the control plane's processes gone", func() bool {
			return len(processesMentioning(config)) == 0
		})
		if qs := qemusOf(d.stateDir); len(qs) != 0 {
			t.Fatalf("%s: asleep with qemu running: %v", when, qs)
		}
	}
	asleep("idle after create", 3*time.Minute)

	// 1. A Pod through the door: the connection wakes the cluster and the create is
	// answered, not refused.
	_, k := d.tenant(name)
	grace := int64(1)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "woken", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			Containers:                    []corev1.Container{{Name: "main", Image: "busybox:stable", Command: []string{"sh", "-c", "echo woke-and-ran"}}},
		},
	}
	t0 := time.Now()
	if _, err := k.CoreV1().Pods("default").Create(ctxT(t, time.Minute), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating a Pod in the sleeping cluster through the door: %v", err)
	}
	t.Logf("Pod created through the door in %s (the wake included)", time.Since(t0).Round(time.Millisecond))

	// 2. A node boots for it and it runs to completion.
	livetest.Eventually(t, 10*time.Minute, time.Second, "the Pod to succeed on a node booted for it", func() bool {
		p, err := k.CoreV1().Pods("default").Get(ctxT(t, 30*time.Second), "woken", metav1.GetOptions{})
		if err != nil {
			return false
		}
		if p.Status.Phase == corev1.PodFailed {
			t.Fatalf("the Pod failed: %+v", p.Status)
		}
		return p.Status.Phase == corev1.PodSucceeded && p.Spec.NodeName != ""
	})
	t.Logf("Pod succeeded %s after it was created", time.Since(t0).Round(time.Second))
	logs, err := k.CoreV1().Pods("default").GetLogs("woken", &corev1.PodLogOptions{}).DoRaw(ctxT(t, time.Minute))
	if err != nil || !strings.Contains(string(logs), "woke-and-ran") {
		t.Fatalf("the Pod's log: %q, %v", logs, err)
	}

	// 3. Back to zero nodes (hold 10 s), then asleep again (30 s without a request).
	t1 := time.Now()
	livetest.Eventually(t, 5*time.Minute, time.Second, "the cluster back at zero nodes", func() bool {
		return d.cluster(name).Status.Nodes == 0 && len(qemusOf(d.stateDir)) == 0
	})
	asleep("after the job", 4*time.Minute)
	t.Logf("back to zero nodes and asleep %s after the Pod succeeded", time.Since(t1).Round(time.Second))
}

// TestSleepingClustersGiveBackTheirNetwork: a sleeping cluster holds its port
// but not its node network, so a host registers more clusters than it has node
// networks. With two networks: "a" sleeps and gives its network back (no
// bridge, no gateway in its status); "c" is created on it; with every network
// held, a wake of "a" is answered with a 503 saying so; once "b" is deleted,
// "a" wakes on the other network, and its serving certificate and cluster-info
// name the new gateway.
func TestSleepingClustersGiveBackTheirNetwork(t *testing.T) {
	const lo, hi = 151, 152 // outside the range other tests' daemons use
	d := newDaemon(t, 3, "--network-range", fmt.Sprintf("%d-%d", lo, hi))
	d.start()
	d.mustCLI("cluster", "create", "a", "--sleep-after", "30s", "--wait")
	d.mustCLI("cluster", "create", "b", "--wait")
	gateway := func(i int) string { return fmt.Sprintf("10.250.%d.1", i) }
	if got := d.cluster("a").Status.Gateway; got != gateway(lo) {
		t.Fatalf("a's gateway is %q, want %s", got, gateway(lo))
	}
	bridgeUp := func(i int) bool { return exec.Command("ip", "link", "show", nodenet.BridgeName(i)).Run() == nil }

	c := d.waitPhase("a", v1.PhaseAsleep, 3*time.Minute)
	if c.Status.Gateway != "" || c.Status.PodCIDR != "" || c.Status.Port == 0 {
		t.Errorf("asleep, a's status shows gateway %q, pod CIDR %q, port %d; want no network and its port", c.Status.Gateway, c.Status.PodCIDR, c.Status.Port)
	}
	livetest.Eventually(t, 15*time.Second, 200*time.Millisecond, "a's bridge removed once it sleeps", func() bool { return !bridgeUp(lo) })
	if cond := meta.FindStatusCondition(c.Status.Conditions, v1.ConditionLeased); cond == nil || cond.Status != metav1.ConditionTrue {
		t.Errorf("asleep, a's Leased condition is %+v; want True (its port)", cond)
	}

	// Before, a sleeping cluster kept its network and this create failed.
	d.mustCLI("cluster", "create", "c", "--wait")
	if got := d.cluster("c").Status.Gateway; got != gateway(lo) {
		t.Fatalf("c's gateway is %q, want a's old %s", got, gateway(lo))
	}

	own, k := d.tenant("a")
	failed := time.Now()
	_, err := k.CoreV1().Pods("").List(ctxT(t, time.Minute), metav1.ListOptions{})
	if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "no node network is free") {
		t.Fatalf("waking a with every node network held: %v; want a 503 saying no node network is free", err)
	}
	t.Logf("a wake with every network held was answered in %s: %v", time.Since(failed).Round(time.Millisecond), err)
	livetest.Eventually(t, 30*time.Second, 250*time.Millisecond, "a asleep with Wake False (WakeFailed)", func() bool {
		c := d.cluster("a")
		w := meta.FindStatusCondition(c.Status.Conditions, v1.ConditionWake)
		return c.Status.Phase == v1.PhaseAsleep && w != nil && w.Reason == "WakeFailed"
	})

	d.mustCLI("cluster", "delete", "b", "--wait")
	time.Sleep(time.Until(failed.Add(35 * time.Second))) // the failed wake's hold (30 s) is over
	start := time.Now()
	if _, err := k.CoreV1().Pods("").List(ctxT(t, time.Minute), metav1.ListOptions{}); err != nil {
		t.Fatalf("waking a once b's network is free: %v", err)
	}
	t.Logf("a woke on another network and answered in %s", time.Since(start).Round(time.Millisecond))
	c = d.waitPhase("a", v1.PhaseReady, time.Minute)
	if c.Status.Gateway != gateway(hi) || !bridgeUp(hi) {
		t.Fatalf("a woke with gateway %q (bridge up: %v), want %s", c.Status.Gateway, bridgeUp(hi), gateway(hi))
	}
	// Nodes reach the apiserver at the new gateway: its certificate must name it.
	// No server name: the check is of the gateway address itself.
	viaGateway := rest.CopyConfig(own)
	viaGateway.Host, viaGateway.TLSClientConfig.ServerName = fmt.Sprintf("https://%s:%d", gateway(hi), c.Status.Port), ""
	if _, err := kubernetes.NewForConfigOrDie(viaGateway).CoreV1().Namespaces().List(ctxT(t, time.Minute), metav1.ListOptions{}); err != nil {
		t.Fatalf("a's apiserver at its new gateway: %v", err)
	}
	info, err := k.CoreV1().ConfigMaps("kube-public").Get(ctxT(t, time.Minute), "cluster-info", metav1.GetOptions{})
	if err != nil || !strings.Contains(info.Data["kubeconfig"], viaGateway.Host) {
		t.Fatalf("cluster-info after the wake (%v) does not name %s:\n%s", err, viaGateway.Host, info.Data["kubeconfig"])
	}
}
