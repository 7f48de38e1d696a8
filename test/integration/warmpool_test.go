package integration

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/boottimeline"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/nodes/qemu"
	"github.com/socialweb-computer/socialweb/internal/procnice"
)

// TestWarmPoolNode: serve --warm-pool 1 boots one node VM for no cluster, which waits
// for its identity at a lower CPU priority than nodes; a cluster's first Pod then gets that VM as its node (claimed, not
// booted): it joins with its providerID, having imported the sandbox image before its
// kubelet ran, goes Ready, runs the Pod, and logs, exec, pod to
// pod, a Service and cluster DNS work as on a node booted for it. The pool refills; once
// the Pod is gone the node is deleted as any node; and after the daemon stops and `down`
// runs no qemu, virtiofsd, pool tap or node directory is left.
func TestWarmPoolNode(t *testing.T) {
	img := nodeImage(t)
	metrics := fmt.Sprintf("127.0.0.1:%d", livetest.FreePort(t))
	// Pool VMs have the default node size: the cluster below asks for no other.
	d := newDaemon(t, 1, "--node-image", img, "--warm-pool", "1", "--default-node-disk", "4Gi", "--metrics-address", metrics)
	d.start()
	ctx := ctxT(t, 20*time.Minute)
	metric := func(name string) float64 {
		t.Helper()
		resp, err := http.Get("http://" + metrics + "/metrics")
		if err != nil {
			// The metrics listener starts after the management API d.start waits for.
			t.Logf("scraping the daemon's metrics: %v", err)
			return -1
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, l := range strings.Split(string(body), "\n") {
			if v, ok := strings.CutPrefix(l, name+" "); ok {
				f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
				if err != nil {
					t.Fatalf("metric %s: %q", name, l)
				}
				return f
			}
		}
		return -1
	}
	const ready = `socialweb_warm_pool_vms{state="ready"}`
	// Pool VMs by their directories: a claimed VM's qemu keeps its pool name in its
	// command line (-name guest=pool-...), its directory takes the node's.
	poolVMs := func() []string {
		var out []string
		entries, _ := os.ReadDir(filepath.Join(d.stateDir, "nodes"))
		for _, e := range entries {
			if e.IsDir() && strings.HasPrefix(e.Name(), "pool-") {
				out = append(out, e.Name())
			}
		}
		return out
	}

	// 1. The pool fills: one VM, of no cluster, its guest waiting for an identity.
	t0 := time.Now()
	livetest.Eventually(t, 8*time.Minute, time.Second, "a ready warm-pool VM", func() bool { return metric(ready) == 1 })
	pool := poolVMs()
	if len(pool) != 1 || len(qemusOf(d.stateDir)) != 1 {
		t.Fatalf("step 1: pool VMs %v, qemus %v; want one pool VM and nothing else", pool, qemusOf(d.stateDir))
	}
	t.Logf("warm pool VM %s ready %s after serve started", pool[0], time.Since(t0).Round(time.Millisecond))
	// It waits at a lower CPU priority than nodes (every qemu thread), until claimed.
	poolPID := qemusOf(d.stateDir)[0]
	nicesOf := func(pid int) []int {
		n, err := procnice.Threads(pid)
		if err != nil {
			t.Fatalf("nice values of qemu %d: %v", pid, err)
		}
		return slices.Sorted(maps.Values(n))
	}
	livetest.Eventually(t, 10*time.Second, time.Second, "the pool VM's qemu threads at nice 10", func() bool {
		n := nicesOf(poolPID)
		return n[0] == qemu.PoolNice && n[len(n)-1] == qemu.PoolNice
	})
	if mem := metric("socialweb_warm_pool_memory_bytes"); mem < 1<<30 {
		t.Errorf("step 1: warm pool memory %v bytes; want at least the 1 GiB guest", mem)
	}
	if con, err := os.ReadFile(filepath.Join(d.stateDir, "nodes", pool[0], "console.log")); err != nil || !bytes.Contains(con, []byte("step=identity-wait")) {
		t.Errorf("step 1: the pool VM's console does not show it waiting for its identity: %v", err)
	}
	// It warms up while it waits (the default --warm-pool-prewarm): the node below is to
	// be one that went through all of it (a throwaway sandbox network and container, a
	// standalone kubelet), as a pool VM that waited a while is.
	const prewarmed = "warm-pool VM: ran the programs"
	livetest.Eventually(t, 3*time.Minute, time.Second, "the pool VM's prewarm to end", func() bool {
		con, _ := os.ReadFile(filepath.Join(d.stateDir, "nodes", pool[0], "console.log"))
		return bytes.Contains(con, []byte(prewarmed))
	})
	t.Logf("pool VM prewarmed %s after serve started", time.Since(t0).Round(time.Millisecond))

	// 2. A cluster's first Pod: the scale decision provisions, the pool VM becomes its node.
	const hold = 20 * time.Second
	d.mustCLI("cluster", "create", "warm", "--wait", "--hold", hold.String(), "--max-nodes", "2")
	cfg, k := d.tenant("warm")
	nodeCount := func() int {
		t.Helper()
		nl, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("listing nodes: %v", err)
		}
		return len(nl.Items)
	}
	grace := int64(1)
	mkPod := func(name, cmd string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"role": name}},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &grace,
				Containers: []corev1.Container{{Name: "main", Image: "busybox:stable", Command: []string{"sh", "-c", cmd}}},
			},
		}
	}
	firstNode := firstNodeVersions(t, ctx, k)
	tPod := time.Now()
	if _, err := k.CoreV1().Pods("default").Create(ctx, mkPod("server",
		"echo warm-ran-on-$(hostname); mkdir -p /www && echo reached-$(hostname) > /www/index.html && exec httpd -f -p 8080 -h /www"),
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node := oneReadyNode(t, ctx, k)
	tReady := time.Since(tPod)
	if want := "socialweb://warm/" + node.Name; node.Spec.ProviderID != want || !strings.HasPrefix(node.Name, "warm-") {
		t.Errorf("step 2: node %s with providerID %q, want warm-<unique> and %q", node.Name, node.Spec.ProviderID, want)
	}
	// Claimed, not booted: the pool VM's qemu runs the node, from a directory named after it.
	if hits := metric(`socialweb_warm_pool_claims_total{result="hit"}`); hits < 1 {
		t.Errorf("step 2: warm pool hits %v, want 1 or more", hits)
	}
	if _, err := os.Stat(filepath.Join(d.stateDir, "nodes", node.Name)); err != nil {
		t.Errorf("step 2: node directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.stateDir, "nodes", pool[0])); !os.IsNotExist(err) {
		t.Errorf("step 2: the claimed pool VM's directory is still there: %v", err)
	}
	if n := nicesOf(poolPID); n[0] != 0 || n[len(n)-1] != 0 {
		t.Errorf("step 2: the claimed VM's qemu threads have nice values %v, want 0 (a node's priority)", n)
	}
	if !slices.Contains(vmNamesOf(d.stateDir), pool[0]) {
		t.Errorf("step 2: the pool VM's qemu (guest=%s) is gone: %v; the node was booted, not claimed", pool[0], vmNamesOf(d.stateDir))
	}
	// The node imported the sandbox image its node image carries before its kubelet ran
	// (a pool VM does it while it waits, unless claimed before it got to it), so the Pod's
	// sandbox does not pull it.
	tl := nodeBootTimeline(t, ctx, k, node.Name)
	if at, ok := tl[boottimeline.StepSandboxImage]; !ok || at > tl["kubelet"] {
		t.Errorf("step 2: boot timeline %v: want %s (the sandbox image imported from the node image) before the kubelet",
			tl, boottimeline.StepSandboxImage)
	}
	logb, _ := os.ReadFile(d.logPath)
	var claimLine string // the daemon logs JSON
	for _, l := range strings.Split(grepLines(string(logb), "node VM claimed from the warm pool"), "\n") {
		if strings.Contains(l, `"node":"`+node.Name+`"`) {
			claimLine = l
		}
	}
	if claimLine == "" || !strings.Contains(claimLine, `"vm":"`+pool[0]+`"`) {
		t.Errorf("step 2: no daemon log line saying %s claimed %s:\n%s", node.Name, pool[0], grepLines(string(logb), "warm pool"))
	}
	t.Logf("claim: %s", strings.TrimSpace(claimLine))

	// 3. The Pod runs there; logs and exec reach it.
	livetest.Eventually(t, 5*time.Minute, time.Second, "the Pod to run", func() bool {
		p, err := k.CoreV1().Pods("default").Get(ctx, "server", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning
	})
	tRunning := time.Since(tPod)
	server, _ := k.CoreV1().Pods("default").Get(ctx, "server", metav1.GetOptions{})
	if server.Spec.NodeName != node.Name {
		t.Errorf("step 3: Pod on %q, want %q", server.Spec.NodeName, node.Name)
	}
	if now, err := k.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("step 3: node %s: %v", node.Name, err)
	} else {
		checkRegisteredResources(t, firstNode(node.Name), now)
	}
	livetest.Eventually(t, time.Minute, time.Second, "the Pod's log (kubectl logs)", func() bool {
		logs, err := k.CoreV1().Pods("default").GetLogs("server", &corev1.PodLogOptions{}).DoRaw(ctx)
		return err == nil && bytes.Contains(logs, []byte("warm-ran-on-server"))
	})
	stdout, err := execIn(ctx, cfg, k, "default", "server", "sh", "-c", "echo exec-ok; cat /proc/1/cmdline | tr '\\0' ' '")
	if err != nil || !strings.Contains(stdout, "exec-ok") || !strings.Contains(stdout, "httpd") {
		t.Errorf("step 3: exec: %q, %v", stdout, err)
	}
	// What the pool VM ran while it waited (the programs of a Pod start, a throwaway
	// sandbox network and container) failed nowhere, whether it finished or was claimed.
	if con, err := os.ReadFile(filepath.Join(d.stateDir, "nodes", node.Name, "console.log")); err != nil {
		t.Errorf("step 3: the node's console: %v", err)
	} else if ran := grepLines(string(con), prewarmed); !ranEveryStep(ran) || strings.Contains(string(con), "prewarm step failed") {
		t.Errorf("step 3: the pool VM's prewarm: %q, want every step run, none failed:\n%s", ran, grepLines(string(con), "prewarm", "warm-pool VM"))
	} else {
		t.Logf("prewarm: %s", strings.TrimSpace(ran))
	}
	t.Logf("from Pod create: node Ready %s, Pod Running %s (the node was claimed from the pool)",
		tReady.Round(time.Millisecond), tRunning.Round(time.Millisecond))

	// 4. Pod to pod, a Service and cluster DNS, from a second Pod on the same node.
	if _, err := k.CoreV1().Pods("default").Create(ctx, mkPod("client", "exec sleep 3600"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	livetest.Eventually(t, 3*time.Minute, time.Second, "the client Pod to run", func() bool {
		p, err := k.CoreV1().Pods("default").Get(ctx, "client", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning
	})
	server, _ = k.CoreV1().Pods("default").Get(ctx, "server", metav1.GetOptions{})
	if _, err := k.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "server", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"role": "server"},
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"http://" + server.Status.PodIP + ":8080/", "http://server/", "http://server.default.svc.cluster.local/"} {
		livetest.Eventually(t, 2*time.Minute, 2*time.Second, "the client to reach "+u, func() bool {
			out, err := execIn(ctx, cfg, k, "default", "client", "wget", "-q", "-O-", u)
			return err == nil && strings.Contains(out, "reached-server")
		})
	}

	// 5. The pool is back to one ready VM, another one.
	livetest.Eventually(t, 8*time.Minute, 2*time.Second, "the warm pool to refill", func() bool {
		p := poolVMs()
		return metric(ready) == 1 && len(p) == 1 && p[0] != pool[0]
	})

	// 6. The Pods go; after the hold the node is deleted as any node, its VM gone; the
	// pool VM stays, and the control plane is Ready at zero nodes.
	for _, n := range []string{"client", "server"} {
		if err := k.CoreV1().Pods("default").Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	livetest.Eventually(t, time.Minute, 500*time.Millisecond, "the Pods to be gone", func() bool {
		_, err1 := k.CoreV1().Pods("default").Get(ctx, "client", metav1.GetOptions{})
		_, err2 := k.CoreV1().Pods("default").Get(ctx, "server", metav1.GetOptions{})
		return apierrors.IsNotFound(err1) && apierrors.IsNotFound(err2)
	})
	livetest.Eventually(t, hold+2*time.Minute, time.Second, "the node and its VM to be gone, the pool VM left", func() bool {
		return nodeCount() == 0 && !slices.Contains(vmNamesOf(d.stateDir), pool[0]) && len(qemusOf(d.stateDir)) == 1 && len(poolVMs()) == 1
	})
	if c := d.cluster("warm"); c.Status.Phase != v1.PhaseReady || c.Status.Nodes != 0 {
		t.Errorf("step 6: phase %s with %d nodes, want Ready at 0", c.Status.Phase, c.Status.Nodes)
	}
	if _, err := os.Stat(filepath.Join(d.stateDir, "nodes", node.Name)); !os.IsNotExist(err) {
		t.Errorf("step 6: the deleted node's directory: %v", err)
	}

	// 7. The daemon stops (its pool VM with it), `down` runs: nothing of the pool is left.
	d.stop(syscall.SIGTERM)
	if left, q := poolVMs(), qemusOf(d.stateDir); len(left)+len(q) != 0 {
		t.Errorf("step 7: after the daemon stopped: pool VMs %v, qemus %v; want none", left, q)
	}
	if out, errOut, code := d.cli("down"); code != 0 {
		t.Fatalf("socialweb down: exit %d\n%s\n%s", code, out, errOut)
	}
	if left := processesMentioning(d.stateDir); len(left) != 0 {
		t.Errorf("step 7: processes of the state dir after down (qemu, virtiofsd): %v", left)
	}
	links, err := exec.Command("ip", "-o", "link", "show").Output()
	if err != nil {
		t.Fatal(err)
	}
	if taps := grepLines(string(links), ": swp-"); taps != "" {
		t.Errorf("step 7: pool taps left after down:\n%s", taps)
	}
	entries, _ := os.ReadDir(filepath.Join(d.stateDir, "nodes"))
	for _, e := range entries {
		if e.IsDir() && e.Name() != "consoles" {
			t.Errorf("step 7: node directory left after down: %s", e.Name())
		}
	}
}

// ranEveryStep says whether line is the agent's log of a prewarm that ran every one of its
// steps and none failed: ran=N of=N failed=0.
func ranEveryStep(line string) bool {
	m := regexp.MustCompile(`ran=(\d+) of=(\d+) failed=0 `).FindStringSubmatch(line)
	return m != nil && m[1] == m[2] && m[1] != "0"
}
