package qemu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodes"
)

// liveIndex is the network index of the live test's cluster; nodenet's live test uses
// 198 and 199.
const liveIndex = 197

const liveCluster = "qemu-live"

func requireLive(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: skipping the qemu boots")
	}
	if os.Geteuid() != 0 {
		livetest.Skip(t, "needs root: builds a node image (debootstrap, chroot), creates a bridge and taps")
	}
	if _, err := exec.LookPath(DefaultQemu); err != nil {
		livetest.Skip(t, DefaultQemu+" not found: apt-get install qemu-system-x86")
	}
	for bin, pkg := range map[string]string{"ip": "iproute2", "nft": "nftables"} {
		if _, err := exec.LookPath(bin); err != nil {
			livetest.Skip(t, fmt.Sprintf("%s not installed (apt-get install %s)", bin, pkg))
		}
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		livetest.Skip(t, "no /dev/net/tun (modprobe tun)")
	}
}

// liveJoiner stands in for the daemon: the "API server" is the test's listener on the
// bridge gateway.
type liveJoiner struct{ api string }

func (j liveJoiner) Identity(ctx context.Context, req nodes.NodeRequest, addr net.IP, mac string) (identity.Identity, error) {
	return identity.Identity{APIServer: j.api, CACert: "-----BEGIN CERTIFICATE-----\nlive-test\n-----END CERTIFICATE-----\n", ClientCACert: "-----BEGIN CERTIFICATE-----\nlive-test\n-----END CERTIFICATE-----\n",
		BootstrapToken: "abcdef.0123456789abcdef"}, nil
}

// gatewayListener accepts connections on the bridge gateway and records the first line
// of each (a node name).
type gatewayListener struct {
	l     net.Listener
	mu    sync.Mutex
	names []string
}

func listenOnGateway(t *testing.T, gw net.IP, port int) *gatewayListener {
	l, err := net.Listen("tcp", net.JoinHostPort(gw.String(), strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	g := &gatewayListener{l: l}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				line, _ := bufio.NewReader(c).ReadString('\n')
				g.mu.Lock()
				g.names = append(g.names, strings.TrimSpace(line))
				g.mu.Unlock()
			}()
		}
	}()
	return g
}

// hears waits up to timeout for name.
func (g *gatewayListener) hears(name string, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		if g.heard(name) || time.Now().After(deadline) {
			return g.heard(name)
		}
	}
}

func (g *gatewayListener) heard(name string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Contains(g.names, name)
}

// waitConsole waits for a line containing marker on the node's console and returns the
// console. It fails early if the VM exits.
func waitConsole(t *testing.T, p *Provider, name, marker string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		con, err := p.ConsoleTail(name, 400)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(con, marker) {
			return con
		}
		if ex, why := p.Exited(name); ex {
			t.Fatalf("node %s exited before %q: %s", name, marker, why)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q on %s's console within %s; last lines:\n%s", marker, name, timeout, tailOf(con, 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// timeline picks the console lines that show where a boot spends its time.
func timeline(con string) string {
	var out []string
	for _, l := range strings.Split(con, "\n") {
		for _, k := range []string{"Linux version", "tsc:", "Freeing unused kernel", "Run /init", "virtio_blk", "EXT4-fs (vda)", "socialweb-initramfs", "SWQT", "random:", "clocksource"} {
			if strings.Contains(l, k) {
				out = append(out, "  "+l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

func tailOf(s string, n int) string {
	l := strings.Split(s, "\n")
	return strings.Join(l[max(len(l)-n, 0):], "\n")
}

func vmRSSMiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return kb / 1024
		}
	}
	return -1
}

func linkExists(name string) bool {
	return exec.Command("ip", "link", "show", "dev", name).Run() == nil
}

// assertGone checks that nothing of the node is left: qemu, tap, directory.
func assertGone(t *testing.T, p *Provider, info Info) {
	t.Helper()
	if linkExists(info.Tap) {
		t.Errorf("tap %s of %s is still there", info.Tap, info.Name)
	}
	if _, err := os.Stat(info.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("node dir %s: %v", info.Dir, err)
	}
	if err := p.Delete(t.Context(), info.Name); !nodes.IsNotFound(err) {
		t.Errorf("Delete %s again: %v, want not found", info.Name, err)
	}
}

// TestLive boots real microVMs from a freshly built node image on a real cluster bridge:
// two nodes at once (their consoles show their own identities, a read-only /dev/vdb, and
// a TCP connection to the gateway), then a provider restart that adopts a running VM.
func TestLive(t *testing.T) {
	requireLive(t)
	tmp := t.TempDir()
	image := liveImage(t, tmp)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()

	// The nodes' "API server": the gateway walls off every other port.
	apiPort := livetest.FreePort(t)
	mgr, plan := liveNetwork(ctx, t, liveIndex, apiPort)
	gw := listenOnGateway(t, plan.Gateway, apiPort)

	stateDir := filepath.Join(tmp, "state")
	t.Cleanup(func() { killLeftovers(t, stateDir) })
	cfg := Config{StateDir: stateDir, ImageDir: image, StopGrace: 2 * time.Second}
	deps := Deps{Networks: mgr, Joiner: liveJoiner{api: "https://" + gw.l.Addr().String()},
		Plan: func(c string) (nodenet.Plan, error) {
			if c != liveCluster {
				return nodenet.Plan{}, fmt.Errorf("no network for cluster %s", c)
			}
			return plan, nil
		}, Log: testLogger(t)}
	newProvider := func() *Provider {
		p, err := New(cfg, deps)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		res, err := p.Recover(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("recover: %+v", res)
		return p
	}
	p := newProvider()
	t.Logf("accel %s", p.Accel())
	nodeReq := func(name string) nodes.NodeRequest {
		return nodes.NodeRequest{Cluster: liveCluster, Name: name, CPUs: 1, MemoryMiB: 512, MaxPods: 8}
	}
	bootTimeout := 3 * time.Minute

	t.Run("two nodes at once", func(t *testing.T) {
		names := []string{}
		for range 2 {
			n, err := nodes.NewNodeName(liveCluster)
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, n)
		}
		t0 := time.Now()
		var wg sync.WaitGroup
		errs := make([]error, 2)
		took := make([]time.Duration, 2)
		for i, n := range names {
			wg.Go(func() {
				_, errs[i] = p.Create(ctx, nodeReq(n))
				took[i] = time.Since(t0)
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		t.Logf("Create returned after %s and %s", took[0].Round(time.Millisecond), took[1].Round(time.Millisecond))
		infos := make([]Info, 2)
		for i, n := range names {
			infos[i], _ = p.Info(n)
			t.Cleanup(func() { p.Delete(context.Background(), n) })
		}
		if got := listed(t, p); len(got) != 2 || got[names[0]] != nodes.StateRunning || got[names[1]] != nodes.StateRunning {
			t.Errorf("List right after Create: %v", got)
		}
		for i, n := range names {
			wg.Go(func() {
				con := waitConsole(t, p, n, markStart, bootTimeout)
				t.Logf("%s: marker %s after %s", n, markStart, time.Since(t0).Round(time.Millisecond))
				con = waitConsole(t, p, n, markGateway, bootTimeout)
				t.Logf("%s: gateway reached %s after Create began", n, time.Since(t0).Round(time.Millisecond))
				other := names[1-i]
				switch {
				case !strings.Contains(con, markName+n+"\n"):
					t.Errorf("%s's console does not show its own name:\n%s", n, tailOf(con, 30))
				case strings.Contains(con, other):
					t.Errorf("%s's console shows the other node's name %s", n, other)
				case !strings.Contains(con, markReadOnly+" ro=1") || strings.Contains(con, markWritable):
					t.Errorf("%s: /dev/vdb is not read-only:\n%s", n, tailOf(con, 30))
				case !strings.Contains(con, markGateway+" "+plan.Gateway.String()+":"):
					t.Errorf("%s: no connection to the gateway:\n%s", n, tailOf(con, 30))
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		for _, n := range names {
			// The guest prints its marker once it wrote; the listener reads the line
			// in its own time on a busy host.
			if !gw.hears(n, 10*time.Second) {
				t.Errorf("the gateway listener did not hear from %s within 10s of its marker (heard %v)", n, gw.names)
			}
		}
		for _, in := range infos {
			t.Logf("%s: address %s, tap %s, pid %d, RSS %d MiB", in.Name, in.Address, in.Tap, in.PID, vmRSSMiB(in.PID))
			if said := tailLines(filepath.Join(in.Dir, fileQemuLog), 20); said != "" {
				t.Logf("%s: qemu.log:\n%s", in.Name, said)
			}
			if !linkExists(in.Tap) {
				t.Errorf("tap %s missing while the node runs", in.Tap)
			}
		}
		if got := listed(t, p); len(got) != 2 || got[names[0]] != nodes.StateRunning || got[names[1]] != nodes.StateRunning {
			t.Errorf("List after boot: %v", got)
		}
		td := time.Now()
		for _, n := range names {
			wg.Go(func() {
				if err := p.Delete(ctx, n); err != nil {
					t.Errorf("Delete %s: %v", n, err)
				}
			})
		}
		wg.Wait()
		t.Logf("both deleted in %s", time.Since(td).Round(time.Millisecond))
		for _, in := range infos {
			assertGone(t, p, in)
		}
		if q := qemusUsing(stateDir); len(q) != 0 {
			t.Errorf("qemu processes left: %v", q)
		}
		if got := listed(t, p); len(got) != 0 {
			t.Errorf("List after Delete: %v", got)
		}
	})

	t.Run("restart adopts a running node", func(t *testing.T) {
		name, _ := nodes.NewNodeName(liveCluster)
		t0 := time.Now()
		if _, err := p.Create(ctx, nodeReq(name)); err != nil {
			t.Fatal(err)
		}
		t.Logf("Create returned after %s", time.Since(t0).Round(time.Millisecond))
		waitConsole(t, p, name, markStart, bootTimeout)
		t.Logf("single node: marker %s after %s", markStart, time.Since(t0).Round(time.Millisecond))
		con := waitConsole(t, p, name, markGateway, bootTimeout)
		t.Logf("single node: gateway reached %s after Create began; guest timeline:\n%s", time.Since(t0).Round(time.Millisecond), timeline(con))
		before, _ := p.Info(name)
		if err := p.Close(); err != nil { // the daemon goes away; the VM stays
			t.Fatal(err)
		}
		p2 := newProvider()
		t.Cleanup(func() { p2.Delete(context.Background(), name) })
		after, err := p2.Info(name)
		if err != nil {
			t.Fatal(err)
		}
		if !after.Adopted || after.PID != before.PID || after.State != nodes.StateRunning {
			t.Errorf("after restart: %+v; want adopted pid %d running", after, before.PID)
		}
		if got := listed(t, p2); len(got) != 1 || got[name] != nodes.StateRunning {
			t.Errorf("List after restart: %v", got)
		}
		if con, _ := p2.ConsoleTail(name, 400); !strings.Contains(con, markName+name) {
			t.Errorf("console after restart:\n%s", tailOf(con, 20))
		}
		td := time.Now()
		if err := p2.Delete(ctx, name); err != nil {
			t.Fatal(err)
		}
		t.Logf("adopted node deleted in %s", time.Since(td).Round(time.Millisecond))
		assertGone(t, p2, before)
		if q := qemusUsing(stateDir); len(q) != 0 {
			t.Errorf("qemu processes left: %v", q)
		}
	})

	if owned, err := mgr.List(ctx); err == nil {
		for _, tap := range owned.Taps {
			if strings.HasPrefix(tap, fmt.Sprintf("swt%d-", liveIndex)) {
				t.Errorf("tap %s left on the bridge", tap)
			}
		}
	}
}

// liveNetwork makes the test cluster's bridge and nftables at network index on this host
// (refusing an index already in use: a leftover of an earlier run) and removes them, and
// restores ip_forward, when the test ends. apiPort is the only port besides DNS and the
// registry its nodes may open on the gateway.
func liveNetwork(ctx context.Context, t *testing.T, index, apiPort int) (*nodenet.Manager, nodenet.Plan) {
	t.Helper()
	mgr := nodenet.NewManager(nil, nil)
	owned, err := mgr.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(owned.Indexes(), index) {
		t.Fatalf("network index %d is in use on this host (%+v): a leftover of an earlier run? remove it with nodenet's Manager.Remove (or ip link del swb%d; nft delete table inet socialweb-%d)",
			index, owned, index, index)
	}
	plan, err := nodenet.ForIndex(index)
	if err != nil {
		t.Fatal(err)
	}
	fwd, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	t.Cleanup(func() { os.WriteFile("/proc/sys/net/ipv4/ip_forward", fwd, 0o644) })
	t.Cleanup(func() {
		if err := mgr.Remove(context.Background(), liveCluster, plan); err != nil {
			t.Errorf("removing the test network: %v", err)
		}
	})
	if err := mgr.Ensure(ctx, liveCluster, plan, nodenet.Served{APIServer: apiPort, Registry: 5000}, nodenet.Narrowing{}); err != nil {
		t.Fatal(err)
	}
	return mgr, plan
}
