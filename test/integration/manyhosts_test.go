package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// hostBed is several hosts on this machine: a network namespace each, with an
// address on a bridge of the root namespace, where the test and a forwarder to
// the test PostgreSQL are.
type hostBed struct {
	t      *testing.T
	bridge string
	nss    []string
	addrs  []string
	// pgURL is the admin URL of the test PostgreSQL as the hosts reach it.
	pgURL string
}

const bedNet = "172.31.199"

// runIn runs a socialweb command in network namespace ns.
func runIn(ns string, args ...string) (stdout, stderr string, code int) {
	return runExec(exec.Command("ip", append([]string{"netns", "exec", ns, binary}, args...)...))
}

func sh(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func newHostBed(t *testing.T, n int, admin string) *hostBed {
	t.Helper()
	if os.Geteuid() != 0 {
		livetest.Skip(t, "needs root: network namespaces, a bridge and veths")
	}
	b := &hostBed{t: t, bridge: "swhb0"}
	_ = exec.Command("ip", "link", "del", b.bridge).Run() // a killed run's
	sh(t, "ip", "link", "add", b.bridge, "type", "bridge")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", b.bridge).Run() })
	sh(t, "ip", "addr", "add", bedNet+".254/24", "dev", b.bridge)
	sh(t, "ip", "link", "set", b.bridge, "up")
	for i := 1; i <= n; i++ {
		ns, veth, addr := fmt.Sprintf("swh%d", i), fmt.Sprintf("swhv%d", i), fmt.Sprintf("%s.%d", bedNet, i)
		_ = exec.Command("ip", "netns", "del", ns).Run()
		sh(t, "ip", "netns", "add", ns)
		t.Cleanup(func() {
			killNetns(ns)
			_ = exec.Command("ip", "netns", "del", ns).Run()
		})
		sh(t, "ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
		sh(t, "ip", "link", "set", veth, "master", b.bridge, "up")
		sh(t, "ip", "-n", ns, "addr", "add", addr+"/24", "dev", "eth0")
		sh(t, "ip", "-n", ns, "link", "set", "eth0", "up")
		sh(t, "ip", "-n", ns, "link", "set", "lo", "up")
		sh(t, "ip", "-n", ns, "route", "add", "default", "via", bedNet+".254")
		b.nss, b.addrs = append(b.nss, ns), append(b.addrs, addr)
	}
	// PostgreSQL listens on the root namespace's loopback: a forwarder on the
	// bridge carries the hosts to it.
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", bedNet+".254:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go forward(l, u.Host)
	u.Host = l.Addr().String()
	b.pgURL = u.String()
	return b
}

// forward carries every connection l accepts to target.
func forward(l net.Listener, target string) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			up, err := net.Dial("tcp", target)
			if err != nil {
				return
			}
			defer up.Close()
			var wg sync.WaitGroup
			wg.Go(func() { _, _ = io.Copy(up, c); up.(*net.TCPConn).CloseWrite() })
			_, _ = io.Copy(c, up)
			wg.Wait()
		}()
	}
}

// killNetns kills every process in ns at once: a host's death. It never
// kills the test itself, whose thread may be in ns for a netnsDial.
func killNetns(ns string) {
	out, _ := exec.Command("ip", "netns", "pids", ns).Output()
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// host starts daemon i of the bed.
func (b *hostBed) host(i int, key string, extra ...string) *daemon {
	args := []string{"--datastore", b.pgURL, "--host-name", fmt.Sprintf("h%d", i+1), "--host-address", b.addrs[i],
		"--front-door", b.addrs[i] + ":8443", "--service-address", b.addrs[0] + ":8443", "--host-lease-duration", "6s",
		"--network-range", "171-180"}
	if key != "" {
		args = append(args, "--cluster-key-file", key)
	}
	d := newDaemon(b.t, 10, append(args, extra...)...)
	d.netns = b.nss[i]
	d.portRange = "7500-7509" // each host has its own loopback; a moved tenant keeps its port
	d.start()
	return d
}

// tenantVia is a client of cluster with its admin kubeconfig, which names the
// service address: host 1's door.
func tenantVia(t *testing.T, d *daemon, cluster string) kubernetes.Interface {
	t.Helper()
	kc := d.mustCLI("cluster", "kubeconfig", cluster)
	cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(kc))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Timeout = 10 * time.Second
	return kubernetes.NewForConfigOrDie(cfg)
}

// TestHostsFailOver: three hosts, each a daemon in a network namespace of its
// own, one PostgreSQL. Six tenants are spread over them; through host 1's
// door each answers (kubectl too), and a Pod of one on host 2 runs, on a node host 2
// booted, an image pushed on host 1 only. Host 2 is killed with everything it ran: its tenant answers again
// through host 1's door with its objects kept, loses its dead node and runs a
// new Pod on a node of its new host. Host 2 comes back and runs none of it.
func TestHostsFailOver(t *testing.T) {
	admin := livetest.Postgres(t)
	img := nodeImage(t)
	tenants := []string{"t1", "t2", "t3", "t4", "t5", "t6"}
	dropDatabases(t, admin, tenants...)
	bed := newHostBed(t, 3, admin)
	common := []string{"--node-image", img, "--max-tenants", "4", "--default-hold", "10s"}
	h1 := bed.host(0, "", common...)
	key := filepath.Join(h1.stateDir, "cluster.key")
	h2 := bed.host(1, key, common...)
	h3 := bed.host(2, key, common...)
	hosts := []*daemon{h1, h2, h3}
	ctx := ctxT(t, 25*time.Minute)

	where := map[string]*daemon{}
	count := map[*daemon]int{}
	for _, name := range tenants {
		h1.mustCLI("cluster", "create", name, "--wait")
		c := h1.cluster(name)
		i, err := strconv.Atoi(strings.TrimPrefix(c.Status.Host, "h"))
		if err != nil || i < 1 || i > 3 {
			t.Fatalf("cluster %s placed on %q", name, c.Status.Host)
		}
		where[name] = hosts[i-1]
		count[hosts[i-1]]++
	}
	t.Logf("six tenants on three hosts: h1 %d, h2 %d, h3 %d", count[h1], count[h2], count[h3])
	if count[h1] == 0 || count[h2] == 0 || count[h3] == 0 {
		t.Fatalf("six tenants on three equal hosts: h1 %d, h2 %d, h3 %d; want them spread", count[h1], count[h2], count[h3])
	}
	var victim string
	var victims []string
	for _, name := range tenants {
		if where[name] == h2 {
			victims = append(victims, name)
		}
	}
	victim = victims[0]
	// Through host 1's door, each tenant answers (passed on to its host), to
	// client-go and to kubectl.
	if out, err := exec.Command("../../hack/kubectl").CombinedOutput(); err != nil {
		t.Fatalf("building bin/kubectl: %v\n%s", err, out)
	}
	for name := range where {
		k := tenantVia(t, h1, name)
		putConfigMap(t, k, "kept-"+name)
		kubectlThroughDoor(t, h1, name)
	}
	k := tenantVia(t, h1, victim)
	if _, err := k.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "kept"},
		StringData: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name string) *corev1.Pod {
		zero := int64(0)
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &zero,
				Containers: []corev1.Container{{Name: "main", Image: "busybox:stable", Command: []string{"echo", "ran"}}}}}
	}
	nodeOf := func(name string) string {
		p, err := k.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p.Spec.NodeName
	}
	// An image pushed once, on host 1, runs on host 2's node: host 2's registry
	// copies it from host 1's over their mutual-TLS peer listeners.
	im, token := testImage(t, ctx, "pushed-once")
	ref, err := name.NewTag("socialweb.test/pushed-once:1")
	if err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(t.TempDir(), "pushed-once.tar")
	if err := tarball.WriteToFile(tarPath, ref, im); err != nil {
		t.Fatal(err)
	}
	h1.mustCLI("image", "push", tarPath)
	before := pod("before")
	before.Spec.Containers[0].Image, before.Spec.Containers[0].Command = ref.String(), []string{"cat", "/token"}
	runPod(t, ctx, k, before, token)
	oldNode := nodeOf("before")
	// What a tenant's Pod must not reach of the service: each host's registry
	// peer listener (pushed images of every tenant), door and management API, on
	// the hosts' addresses. The node walls refuse them before any TLS.
	probe := pod("probe")
	var script strings.Builder
	for _, a := range bed.addrs {
		for _, port := range []string{"7444", "8443", strconv.Itoa(h1.apiPort)} {
			fmt.Fprintf(&script, "if nc -w 3 %s %s </dev/null; then echo open %s:%s; else echo closed %s:%s; fi; ", a, port, a, port, a, port)
		}
	}
	probe.Spec.Containers[0].Command = []string{"sh", "-c", script.String()}
	out := runPodOutput(t, ctx, k, probe)
	if strings.Contains(out, "open") || strings.Count(out, "closed") != 3*len(bed.addrs) {
		t.Errorf("a tenant's Pod probing the hosts' peer registries, doors and management APIs:\n%s\nwant every one closed", out)
	}
	if _, err := os.Stat(filepath.Join(h2.stateDir, "nodes", oldNode)); err != nil {
		t.Fatalf("the Pod of %s ran on node %s, which host 2 (its host) did not boot: %v", victim, oldNode, err)
	}

	// Host 2 dies with its control planes and VMs.
	killed := time.Now()
	killNetns(bed.nss[1])
	h2.stop(syscall.SIGKILL)
	livetest.Eventually(t, 2*time.Minute, 200*time.Millisecond, victim+" to answer through host 1's door again", func() bool {
		_, err := k.CoreV1().ConfigMaps("default").Get(ctx, "kept-"+victim, metav1.GetOptions{})
		return err == nil
	})
	t.Logf("failover: %s answered through host 1's door %s after host 2 was killed", victim, time.Since(killed).Round(100*time.Millisecond))
	for _, name := range victims[1:] {
		vk := tenantVia(t, h1, name)
		livetest.Eventually(t, time.Minute, 200*time.Millisecond, name+" (also on host 2) to answer through host 1's door", func() bool {
			_, err := vk.CoreV1().ConfigMaps("default").Get(ctx, "kept-"+name, metav1.GetOptions{})
			return err == nil
		})
		t.Logf("failover: %s answered %s after the kill", name, time.Since(killed).Round(100*time.Millisecond))
	}
	c := h1.cluster(victim)
	if c.Status.Host == "h2" || c.Status.Host == "" {
		t.Fatalf("%s still placed on %q after host 2 died", victim, c.Status.Host)
	}
	if p := conditionOf(c, v1.ConditionPlaced); p == nil || p.Reason != "FailedOver" {
		t.Errorf("%s: Placed condition %+v, want reason FailedOver", victim, p)
	}
	newHost := hosts[int(c.Status.Host[1]-'1')]
	if s, err := k.CoreV1().Secrets("default").Get(ctx, "kept", metav1.GetOptions{}); err != nil || string(s.Data["k"]) != "v" {
		t.Errorf("the Secret of %s after failover: %v, %v", victim, s, err)
	}
	// The new host deletes the dead host's Nodes as soon as the tenant answers
	// there, before they would turn NotReady: no new Pod is bound to them.
	livetest.Eventually(t, time.Minute, time.Second, "the dead host's node "+oldNode+" to be removed", func() bool {
		_, err := k.CoreV1().Nodes().Get(ctx, oldNode, metav1.GetOptions{})
		return err != nil && strings.Contains(err.Error(), "not found")
	})
	runPod(t, ctx, k, pod("after"), "ran")
	if n := nodeOf("after"); n == oldNode {
		t.Errorf("the Pod after failover ran on the dead host's node %s", n)
	} else if _, err := os.Stat(filepath.Join(newHost.stateDir, "nodes", n)); err != nil {
		t.Errorf("the Pod after failover ran on node %s, which its new host %s did not boot: %v", n, c.Status.Host, err)
	}

	// Host 2 comes back and runs none of what it lost.
	h2.start()
	time.Sleep(15 * time.Second) // its wait (a Lease duration) and a provider pass
	mk := h1.managementKube()
	for name := range where {
		c := h1.cluster(name)
		l, err := mk.CoordinationV1().Leases(v1.SystemNamespace).Get(ctx, v1.TenantLeaseName(name), metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != c.Status.Host {
			t.Errorf("%s on %s: Lease %v (%v)", name, c.Status.Host, l, err)
		}
		running := 0
		for i, d := range hosts {
			if controlPlaneRunning(filepath.Join(d.stateDir, "clusters", name, "instance.json")) != 0 {
				running++
				if fmt.Sprintf("h%d", i+1) != c.Status.Host {
					t.Errorf("%s runs a control plane on h%d, which does not hold it (%s does)", name, i+1, c.Status.Host)
				}
			}
		}
		if running != 1 {
			t.Errorf("%s: %d control planes run, want 1", name, running)
		}
		if _, err := tenantVia(t, h1, name).CoreV1().ConfigMaps("default").Get(ctx, "kept-"+name, metav1.GetOptions{}); err != nil {
			t.Errorf("%s through host 1's door after host 2 came back: %v", name, err)
		}
	}

	// Drain host 3: its tenants move one at a time while a client polls each
	// through host 1's door every 100 ms, and none of its requests fails.
	var moving []string
	for name := range where {
		if h1.cluster(name).Status.Host == "h3" {
			moving = append(moving, name)
		}
	}
	if len(moving) == 0 {
		t.Fatal("host 3 runs no tenant to drain")
	}
	stop := make(chan struct{})
	var pollers sync.WaitGroup
	failures := make([][]string, len(moving))
	polls := make([]int, len(moving))
	for i, name := range moving {
		kc := h1.mustCLI("cluster", "kubeconfig", name)
		cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(kc))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Timeout = 30 * time.Second
		pk := kubernetes.NewForConfigOrDie(cfg)
		pollers.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				polls[i]++
				if _, err := pk.CoreV1().ConfigMaps("default").Get(context.Background(), "kept-"+name, metav1.GetOptions{}); err != nil {
					failures[i] = append(failures[i], time.Now().Format("15:04:05.000")+" "+err.Error())
				}
			}
		})
	}
	time.Sleep(time.Second)
	drained := time.Now()
	out = h1.mustCLI("host", "drain", "h3", "--timeout", "5m")
	t.Logf("host drain h3 (%d tenants) took %s: %s", len(moving), time.Since(drained).Round(100*time.Millisecond), strings.TrimSpace(out))
	time.Sleep(2 * time.Second)
	close(stop)
	pollers.Wait()
	for i, name := range moving {
		c := h1.cluster(name)
		if c.Status.Host == "h3" || c.Status.Host == "" || c.Status.MovingTo != "" {
			t.Errorf("%s after the drain of h3: host %q, movingTo %q", name, c.Status.Host, c.Status.MovingTo)
		}
		if p := conditionOf(c, v1.ConditionPlaced); p == nil || p.Reason != "Moved" {
			t.Errorf("%s: Placed condition %+v, want reason Moved", name, p)
		}
		t.Logf("%s moved to %s; %d polls through host 1's door, %d failed", name, c.Status.Host, polls[i], len(failures[i]))
		if len(failures[i]) > 0 {
			t.Errorf("%s: %d of %d requests failed while it moved: %v", name, len(failures[i]), polls[i], failures[i])
		}
		if controlPlaneRunning(filepath.Join(h3.stateDir, "clusters", name, "instance.json")) != 0 {
			t.Errorf("%s still runs a control plane on the drained host", name)
		}
	}
}

// netnsDial dials from network namespace ns: the socket is made on a thread
// moved into ns for the call and back out after; the socket keeps ns. The
// thread must come back: Go never ends its main thread, and a main thread left
// in ns makes the test process one of ns's pids, which killNetns would kill.
func netnsDial(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			home, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
			if err != nil {
				runtime.UnlockOSThread()
				ch <- result{nil, err}
				return
			}
			defer home.Close()
			f, err := os.Open(filepath.Join("/var/run/netns", ns))
			if err != nil {
				runtime.UnlockOSThread()
				ch <- result{nil, err}
				return
			}
			defer f.Close()
			if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				runtime.UnlockOSThread()
				ch <- result{nil, fmt.Errorf("entering network namespace %s: %w", ns, err)}
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err == nil {
				runtime.UnlockOSThread() // home again: the thread may serve others
			} // else stay locked: the thread ends with the goroutine
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}
