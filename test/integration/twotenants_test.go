package integration

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
)

// countingServer serves HTTP on ln, answering body, and counts every connection it
// accepts (a bare TCP connect included): a stand-in that says whether anything got in.
func countingServer(ln net.Listener, body string) *atomic.Int32 {
	n := new(atomic.Int32)
	go http.Serve(countingListener{ln, n}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(body + "\n"))
	}))
	return n
}

type countingListener struct {
	net.Listener
	n *atomic.Int32
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// vmRecord is what a node's instance record (STATE/nodes/NAME/instance.json) says of
// whose it is and which qemu runs it.
type vmRecord struct {
	Request struct{ Cluster, Name string } `json:"request"`
	Process *supervisor.Identity           `json:"process"`
}

func readVMRecord(t *testing.T, stateDir, node string) vmRecord {
	t.Helper()
	var rec vmRecord
	b, err := os.ReadFile(filepath.Join(stateDir, "nodes", node, "instance.json"))
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	if err != nil {
		t.Fatalf("the instance record of node %s: %v", node, err)
	}
	return rec
}

// podProbe is one connection attempt from a Pod: a shell command whose exit status
// says whether it got through.
type podProbe struct {
	what, cmd string
}

// probeFromPod runs every probe at once in a Pod's first container and returns, per
// probe, its exit status and what it printed.
func probeFromPod(t *testing.T, run func(...string) (string, error), probes []podProbe) map[string]string {
	t.Helper()
	var script strings.Builder
	for i, p := range probes {
		fmt.Fprintf(&script, "( out=$(%s 2>&1); rc=$?; printf 'probe %d rc=%%s %%s\\n' \"$rc\" \"$(echo $out)\" ) &\n", p.cmd, i)
	}
	script.WriteString("wait\n")
	out, err := run("sh", "-c", script.String())
	if err != nil {
		t.Fatalf("running the probes in the Pod: %v\n%s", err, out)
	}
	got := map[string]string{}
	re := regexp.MustCompile(`^probe (\d+) (rc=\d+.*)$`)
	for _, l := range strings.Split(out, "\n") {
		if m := re.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			i, _ := strconv.Atoi(m[1])
			got[probes[i].what] = m[2]
		}
	}
	for _, p := range probes {
		if _, ok := got[p.what]; !ok {
			t.Fatalf("probe %q (%s) printed no result:\n%s", p.what, p.cmd, out)
		}
	}
	return got
}

// TestTenantsCannotReachEachOther is issue 38's attack by one tenant's admin on another
// tenant, with real VMs: tenants a and b each run a node, and a's admin (who may run
// privileged Pods, create Node objects and write pods/status) tries to reach b and the
// host.
//
//  1. A privileged Pod of a reaches what it may (its apiserver and registry on its
//     gateway, its other Pod, a LAN address the operator allowed), so a broken network
//     does not pass for a wall; and none of: a host service bound to 0.0.0.0 (at a's
//     gateway, b's gateway, the host's LAN address), the LAN stand-in (a network
//     namespace), the metadata address, b's gateway (apiserver, registry, ping), b's node
//     (kubelet, ping) or b's Pod (TCP, HTTP, ping). The stand-ins count every
//     connection; b's server logs every request.
//  2. a writes b's Pod IP, then the LAN stand-in's address, into a Pod's status:
//     pods/proxy through a's apiserver fetches neither (its egress proxy refuses), though
//     it fetches a's own Pod and b's apiserver fetches b's.
//  3. a creates a Node named after b's node (claiming b's providerID, address and Pod
//     range), Ready: a's scale-down removes it after a's hold, and b's VM still runs
//     (same qemu), its Node is Ready and schedulable, its Pod untouched (same UID, no
//     restart), its identity disk and Pod route unchanged, its server still answers.
func TestTenantsCannotReachEachOther(t *testing.T) {
	img := nodeImage(t)
	// The LAN: a stand-in a's Pods must not reach, and one the operator opened with
	// --egress-allow, the control that forwarding from a's Pods works at all.
	lan := livetest.NewPeer(t)
	lanHits := countingServer(lan.Listen(t, 8080), "the LAN answered")
	allowed := livetest.NewPeer(t)
	allowedHits := countingServer(allowed.Listen(t, 8080), "the allowed LAN answered")
	lanHost := lan.Addr.Prev().String() // the host's own address on that LAN
	// A host service bound to every address (sshd, a database, the front door, say).
	hostPort := livetest.FreePort(t)
	hostLn, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", hostPort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hostLn.Close() })
	hostHits := countingServer(hostLn, "a host service answered")
	// The host reaches each itself (else the test would prove nothing); then the
	// counts start again at 0.
	hostReaches := func(addr string, hits *atomic.Int32) {
		t.Helper()
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("the host cannot reach %s itself (%v): the test would prove nothing", addr, err)
		}
		c.Close()
		livetest.Eventually(t, 5*time.Second, 10*time.Millisecond, addr+" to count the host's connection", func() bool { return hits.Load() == 1 })
		hits.Store(0)
	}
	hostReaches(lan.Addr.String()+":8080", lanHits)
	hostReaches(allowed.Addr.String()+":8080", allowedHits)
	hostReaches(net.JoinHostPort(lanHost, strconv.Itoa(hostPort)), hostHits)

	const holdA = 10 * time.Second
	d := newDaemon(t, 2, "--node-image", img, "--egress-allow", allowed.Addr.String()+"/32")
	d.start()
	size := []string{"--max-nodes", "1", "--node-cpus", "1", "--node-memory", "512Mi", "--node-disk", "3Gi"}
	d.mustCLI(append([]string{"cluster", "create", "a", "--wait", "--hold", holdA.String()}, size...)...)
	d.mustCLI(append([]string{"cluster", "create", "b", "--wait", "--hold", "10m"}, size...)...)
	cfgA, ka := d.tenant("a")
	_, kb := d.tenant("b")
	ctx := ctxT(t, 25*time.Minute)
	ca, cb := d.cluster("a"), d.cluster("b")
	gwA, gwB := ca.Status.Gateway, cb.Status.Gateway
	portA, portB := strconv.Itoa(int(ca.Status.Port)), strconv.Itoa(int(cb.Status.Port))
	if gwA == "" || gwB == "" || gwA == gwB {
		t.Fatalf("gateways %q and %q: want one each", gwA, gwB)
	}
	t.Logf("a: gateway %s, apiserver port %s, Pods %s; b: gateway %s, apiserver port %s, Pods %s",
		gwA, portA, ca.Status.PodCIDR, gwB, portB, cb.Status.PodCIDR)
	hostReaches(net.JoinHostPort(gwA, strconv.Itoa(hostPort)), hostHits)
	// The host's metadata address, if anything answers it here: a's Pods must not reach it.
	if c, err := net.DialTimeout("tcp", "169.254.169.254:80", 2*time.Second); err == nil {
		c.Close()
		t.Logf("169.254.169.254:80 answers the host")
	} else {
		t.Logf("169.254.169.254:80 does not answer the host (%v): the probe of it below only shows a's Pod is refused", err)
	}

	zero := int64(0)
	privileged := true
	mk := func(name, cmd string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &zero,
				Containers: []corev1.Container{{Name: "main", Image: "busybox:stable", Command: []string{"sh", "-c", cmd}}}},
		}
	}
	serve := func(answer string) string {
		// -vv: every request's path on stderr, the Pod's log. Every path the test asks
		// for answers 200.
		return "mkdir -p /www && for f in index.html from-b from-b-after from-a-network from-a-proxy; do echo " + answer +
			" > /www/$f; done && exec httpd -f -vv -p 8080 -h /www"
	}
	attacker := mk("attacker", "exec sleep 3600")
	attacker.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &privileged}
	for _, c := range []struct {
		k kubernetes.Interface
		p *corev1.Pod
	}{{ka, attacker}, {ka, mk("a-server", serve("a-answered"))}, {kb, mk("b-server", serve("b-answered"))}} {
		if _, err := c.k.CoreV1().Pods("default").Create(ctx, c.p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now()
	runningPod := func(k kubernetes.Interface, name string) *corev1.Pod {
		t.Helper()
		var p *corev1.Pod
		livetest.Eventually(t, 10*time.Minute, 2*time.Second, "Pod "+name+" to run", func() bool {
			var err error
			p, err = k.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			return err == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != ""
		})
		return p
	}
	bPod := runningPod(kb, "b-server")
	aServer := runningPod(ka, "a-server")
	runningPod(ka, "attacker")
	t.Logf("both tenants' nodes booted and their Pods run, %s after the Pods were created", time.Since(t0).Round(time.Second))
	bNode := oneReadyNode(t, ctx, kb)
	var bNodeIP string
	for _, a := range bNode.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			bNodeIP = a.Address
		}
	}
	if bNodeIP == "" || bPod.Spec.NodeName != bNode.Name {
		t.Fatalf("b's node %s has addresses %v and b's Pod is on %q", bNode.Name, bNode.Status.Addresses, bPod.Spec.NodeName)
	}
	bRestarts := func(p *corev1.Pod) int32 {
		if len(p.Status.ContainerStatuses) != 1 {
			t.Fatalf("b's Pod has container statuses %+v", p.Status.ContainerStatuses)
		}
		return p.Status.ContainerStatuses[0].RestartCount
	}
	restartsBefore := bRestarts(bPod)
	bLog := func() string {
		t.Helper()
		b, err := kb.CoreV1().Pods("default").GetLogs("b-server", &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			t.Fatalf("b's server's log: %v", err)
		}
		return string(b)
	}
	fromA := regexp.MustCompile(`url:/from-a`)
	// b's own apiserver reaches b's server (pods/proxy), which logs the request: b's
	// server answers at that address, and its log counts requests.
	if body, err := kb.CoreV1().Pods("default").ProxyGet("http", "b-server", "8080", "/from-b", nil).DoRaw(ctx); err != nil {
		t.Fatalf("b's own pods/proxy to its server: %v (%q)", err, body)
	}
	livetest.Eventually(t, 30*time.Second, time.Second, "b's server to log b's own request", func() bool {
		return strings.Contains(bLog(), "url:/from-b")
	})

	// 3, started first so that a's hold runs during 1 and 2: b's VM as it is, then a
	// Node in a named after it.
	bRec := readVMRecord(t, d.stateDir, bNode.Name)
	if bRec.Request.Cluster != "b" || bRec.Process == nil || !running(bRec.Process.PID) {
		t.Fatalf("b's node %s: instance record %+v, want b's with a running qemu", bNode.Name, bRec)
	}
	bQemu := bRec.Process.PID
	if id, err := supervisor.Observe(bQemu); err != nil || !slices.Contains(id.Cmdline, "guest="+bNode.Name) {
		t.Fatalf("b's qemu %d: %v, command line %q: want guest=%s", bQemu, err, id.Cmdline, bNode.Name)
	}
	bDisk := filepath.Join(d.stateDir, "nodes", bNode.Name, "identity.img")
	var diskBefore [32]byte
	livetest.Eventually(t, 2*time.Minute, time.Second, "the host to take the bootstrap token off b's identity disk", func() bool {
		b, err := os.ReadFile(bDisk)
		diskBefore = sha256.Sum256(b)
		return err == nil && !identity.HoldsJoinSecret(b)
	})
	bRoutes := func() string {
		t.Helper()
		return grepLines(runOK(t, 30*time.Second, "ip", "route", "show"), bNode.Spec.PodCIDR, bNodeIP)
	}
	routesBefore := bRoutes()
	if bNode.Spec.PodCIDR == "" || !strings.Contains(routesBefore, bNode.Spec.PodCIDR) {
		t.Errorf("b's node %s has Pod range %q and the host routes %q to it", bNode.Name, bNode.Spec.PodCIDR, routesBefore)
	}
	fake := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: bNode.Name, Labels: bNode.Labels},
		Spec:       corev1.NodeSpec{ProviderID: nodes.ProviderID("b", bNode.Name), PodCIDR: bNode.Spec.PodCIDR, PodCIDRs: bNode.Spec.PodCIDRs},
	}
	if _, err := ka.CoreV1().Nodes().Create(ctx, fake, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a creating a Node named %s: %v", bNode.Name, err)
	}
	// Ready, so that no controller takes it for a dead machine before a's hold is out.
	// a's controllers write it too (taints): on a conflict, again from what it is now.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := ka.CoreV1().Nodes().Get(ctx, bNode.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: bNodeIP}, {Type: corev1.NodeHostName, Address: bNode.Name}}
		n.Status.Capacity, n.Status.Allocatable = bNode.Status.Capacity, bNode.Status.Allocatable
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: now, LastTransitionTime: now}}
		_, err = ka.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatalf("a writing its Node %s's status: %v", bNode.Name, err)
	}
	tFake := time.Now()
	t.Logf("a created Node %s (b's node, qemu %d), Ready, claiming %s", bNode.Name, bQemu, fake.Spec.ProviderID)

	// 1. From a privileged Pod of a.
	t1 := time.Now()
	nc := func(host string, port any) string { return fmt.Sprintf("nc -w 3 %s %v -e true", host, port) }
	ping := func(host string) string { return "ping -c 1 -W 3 " + host }
	wget := func(url string) string { return "timeout 5 wget -q -O- " + url }
	reachable := []podProbe{
		{"a's apiserver on its gateway", nc(gwA, portA)},
		{"a's registry on its gateway", nc(gwA, 5000)},
		{"ping a's gateway", ping(gwA)},
		{"a's other Pod", wget("http://" + aServer.Status.PodIP + ":8080/")},
		{"the LAN address the operator allowed", nc(allowed.Addr.String(), 8080)},
	}
	walled := []podProbe{
		{"a host service on 0.0.0.0, at a's gateway", nc(gwA, hostPort)},
		{"a host service on 0.0.0.0, at b's gateway", nc(gwB, hostPort)},
		{"a host service on 0.0.0.0, at the host's LAN address", nc(lanHost, hostPort)},
		{"the LAN stand-in", nc(lan.Addr.String(), 8080)},
		{"the metadata address", nc("169.254.169.254", 80)},
		{"b's apiserver on b's gateway", nc(gwB, portB)},
		{"b's registry on b's gateway", nc(gwB, 5000)},
		{"ping b's gateway", ping(gwB)},
		{"b's node's kubelet", nc(bNodeIP, 10250)},
		{"ping b's node", ping(bNodeIP)},
		{"b's Pod, TCP", nc(bPod.Status.PodIP, 8080)},
		{"b's Pod, HTTP", wget("http://" + bPod.Status.PodIP + ":8080/from-a-network")},
		{"ping b's Pod", ping(bPod.Status.PodIP)},
	}
	got := probeFromPod(t, func(cmd ...string) (string, error) {
		return execIn(ctx, cfgA, ka, "default", "attacker", cmd...)
	}, append(slices.Clone(reachable), walled...))
	for _, p := range reachable {
		if r := got[p.what]; !strings.HasPrefix(r, "rc=0") || (strings.Contains(p.cmd, "wget") && !strings.Contains(r, "a-answered")) {
			t.Fatalf("a's Pod cannot reach %s (%s): %s; the walls below would prove nothing", p.what, p.cmd, r)
		}
		t.Logf("reached, as it may: %s", p.what)
	}
	if allowedHits.Load() == 0 {
		t.Errorf("the allowed LAN stand-in saw no connection though a's Pod's probe of it succeeded")
	}
	for _, p := range walled {
		if r := got[p.what]; strings.HasPrefix(r, "rc=0") || strings.Contains(r, "answered") {
			t.Errorf("a's privileged Pod reached %s (%s): %s", p.what, p.cmd, r)
		} else {
			t.Logf("refused: %s: %s", p.what, r)
		}
	}
	if n := hostHits.Load(); n != 0 {
		t.Errorf("the host service on 0.0.0.0:%d accepted %d connections from a's Pod", hostPort, n)
	}
	if n := lanHits.Load(); n != 0 {
		t.Errorf("the LAN stand-in accepted %d connections from a's Pod", n)
	}
	if l := grepLines(bLog(), "url:/from-a"); l != "" {
		t.Errorf("b's server logged requests from a's Pod:\n%s", l)
	}
	t.Logf("step 1 (%d probes from a's Pod) took %s", len(got), time.Since(t1).Round(time.Millisecond))

	// 2. pods/proxy through a's apiserver, to an address a wrote into a Pod's status.
	if body, err := ka.CoreV1().Pods("default").ProxyGet("http", "a-server", "8080", "/", nil).DoRaw(ctx); err != nil || !bytes.Contains(body, []byte("a-answered")) {
		t.Fatalf("a's pods/proxy to its own Pod: %q, %v; the refusals below would prove nothing", body, err)
	}
	decoy := mk("decoy", "exec sleep 3600")
	decoy.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "socialweb.test/never"}} // never runs, wants no node
	if _, err := ka.CoreV1().Pods("default").Create(ctx, decoy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, target := range []struct{ what, ip, path string }{
		{"b's Pod", bPod.Status.PodIP, "/from-a-proxy"},
		{"the LAN stand-in", lan.Addr.String(), "/from-a-proxy-lan"},
	} {
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			p, err := ka.CoreV1().Pods("default").Get(ctx, "decoy", metav1.GetOptions{})
			if err != nil {
				return err
			}
			p.Status.PodIP, p.Status.PodIPs = target.ip, []corev1.PodIP{{IP: target.ip}}
			_, err = ka.CoreV1().Pods("default").UpdateStatus(ctx, p, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatalf("a writing %s into its Pod's status: %v", target.ip, err)
		}
		body, err := ka.CoreV1().Pods("default").ProxyGet("http", "decoy", "8080", target.path, nil).DoRaw(ctx)
		switch {
		case err == nil || bytes.Contains(body, []byte("answered")):
			t.Errorf("pods/proxy through a's apiserver fetched %s (%s:8080): %q, %v", target.what, target.ip, body, err)
		case !apierrors.IsServiceUnavailable(err) && !apierrors.IsForbidden(err):
			t.Errorf("pods/proxy through a's apiserver to %s refused with %v; want 503 (the dial refused) or 403", target.what, err)
		default:
			t.Logf("pods/proxy to %s (%s) refused: %v", target.what, target.ip, err)
		}
	}
	if n := lanHits.Load(); n != 0 {
		t.Errorf("the LAN stand-in accepted %d connections after a's pods/proxy", n)
	}
	if l := grepLines(bLog(), "url:/from-a"); l != "" {
		t.Errorf("b's server logged requests from a:\n%s", l)
	}
	cpLog, err := os.ReadFile(filepath.Join(d.stateDir, "clusters", "a", "run", "controlplane.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range []string{bPod.Status.PodIP, lan.Addr.String()} {
		if !strings.Contains(grepLines(string(cpLog), "apiserver egress refused"), ip+":8080") {
			t.Errorf("a's control-plane log has no egress refusal naming %s:8080:\n%s", ip, grepLines(string(cpLog), "egress"))
		}
	}

	// 3. a's scale-down removes the Node it named after b's node, past a's hold.
	livetest.Eventually(t, holdA+2*time.Minute, time.Second, "a's Node "+bNode.Name+" to be removed", func() bool {
		_, err := ka.CoreV1().Nodes().Get(ctx, bNode.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	gone := time.Since(tFake)
	evs, err := ka.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	decided := ""
	for _, e := range evs.Items {
		if strings.Contains(e.Note, bNode.Name) && (e.Reason == "ScaleDown" || e.Reason == "Teardown") {
			decided = e.Reason + ": " + e.Note
		}
	}
	if decided == "" {
		t.Errorf("a's Node %s went %s after it was made, but no scale-down of a named it: the attack on the provider was not made", bNode.Name, gone.Round(time.Second))
	} else {
		t.Logf("a's scale-down removed Node %s %s after it was made (hold %s): %s", bNode.Name, gone.Round(time.Second), holdA, decided)
	}
	if gone < holdA {
		t.Errorf("a's Node %s went %s after it was made, before a's %s hold", bNode.Name, gone.Round(time.Second), holdA)
	}
	time.Sleep(10 * time.Second) // time for a VM a Delete reached to die, and for b to see it
	if !running(bQemu) {
		t.Errorf("b's qemu %d is gone after a removed its Node %s", bQemu, bNode.Name)
	} else if id, err := supervisor.Observe(bQemu); err != nil || id.StartTime != bRec.Process.StartTime {
		t.Errorf("b's qemu %d is another process now (%+v, %v)", bQemu, id, err)
	}
	if _, err := os.Stat(filepath.Join(d.stateDir, "nodes", bNode.Name, "instance.json")); err != nil {
		t.Errorf("b's node's instance record: %v", err)
	} else if rec := readVMRecord(t, d.stateDir, bNode.Name); rec.Request.Cluster != "b" || rec.Process == nil || rec.Process.PID != bQemu {
		t.Errorf("b's node's instance record is now %+v", rec)
	}
	if b, err := os.ReadFile(bDisk); err != nil || sha256.Sum256(b) != diskBefore {
		t.Errorf("b's node's identity disk changed (or is gone: %v) after a's attack", err)
	}
	if r := bRoutes(); r != routesBefore {
		t.Errorf("the host's routes to b's node and Pods changed:\n%s\nbefore:\n%s", r, routesBefore)
	}
	n, err := kb.CoreV1().Nodes().Get(ctx, bNode.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("b's Node %s: %v", bNode.Name, err)
	}
	ready := false
	for _, c := range n.Status.Conditions {
		ready = ready || c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
	}
	if !ready || n.Spec.Unschedulable || n.UID != bNode.UID {
		t.Errorf("b's Node %s after a's attack: Ready %v, unschedulable %v, UID %s (was %s)", n.Name, ready, n.Spec.Unschedulable, n.UID, bNode.UID)
	}
	p, err := kb.CoreV1().Pods("default").Get(ctx, "b-server", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("b's Pod: %v", err)
	}
	if p.UID != bPod.UID || p.Status.Phase != corev1.PodRunning || p.Spec.NodeName != bNode.Name || bRestarts(p) != restartsBefore || p.DeletionTimestamp != nil {
		t.Errorf("b's Pod after a's attack: UID %s (was %s), %s on %s, %d restarts (was %d), deleting %v",
			p.UID, bPod.UID, p.Status.Phase, p.Spec.NodeName, bRestarts(p), restartsBefore, p.DeletionTimestamp != nil)
	}
	if body, err := kb.CoreV1().Pods("default").ProxyGet("http", "b-server", "8080", "/from-b-after", nil).DoRaw(ctx); err != nil || !bytes.Contains(body, []byte("b-answered")) {
		t.Errorf("b's server after a's attack: %q, %v", body, err)
	}
	if fromA.MatchString(bLog()) {
		t.Errorf("b's server logged requests from a:\n%s", grepLines(bLog(), "url:/from-a"))
	}
	t.Logf("b's node %s: qemu %d still runs, Node Ready, Pod %s untouched, %s after a made its Node", bNode.Name, bQemu, p.Name, time.Since(tFake).Round(time.Second))
}
