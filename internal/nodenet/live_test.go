package nodenet

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// The live test's stand-ins. Everything it sends goes to these addresses,
// all on this machine: the two clusters' bridges and guests (network
// namespaces behind veths), and an "outside" namespace behind a veth on a
// documentation range (TEST-NET-2) standing in for the internet.
const (
	liveA, liveB  = 198, 199
	outsideHostIP = "198.51.100.1"
	outsideIP     = "198.51.100.2"
	outsidePrefix = "198.51.100."
)

func requireLive(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		livetest.Skip(t, "needs root: creates bridges, taps, network namespaces and nftables tables")
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

func sh(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func shQuiet(args ...string) { exec.Command(args[0], args[1:]...).Run() }

var counters = regexp.MustCompile(`counter packets \d+ bytes \d+`)

// hostState is what the test must leave as it found: links, IPv4 routes,
// the nftables ruleset (counters ignored) and the named network namespaces.
// hostState is what this test could leave behind: its own interfaces,
// routes, tables and namespaces. Other tests (other packages run in
// parallel) may change the rest of the host meanwhile.
func hostState(t *testing.T) string {
	ours := regexp.MustCompile(`swb19[89]|swt19[89]|swx|swbtest|10\.250\.19[89]\.|10\.19[89]\.|198\.51\.100\.|socialweb-19[89]`)
	keep := func(out string) string {
		var lines []string
		for _, l := range strings.Split(out, "\n") {
			if ours.MatchString(l) {
				lines = append(lines, l)
			}
		}
		return strings.Join(lines, "\n") + "\n"
	}
	return "## ip -o link\n" + keep(sh(t, "ip", "-o", "link")) +
		"## ip route\n" + keep(sh(t, "ip", "route")) +
		"## nft list tables\n" + keep(sh(t, "nft", "list", "tables")) +
		"## ip netns list\n" + keep(sh(t, "ip", "netns", "list"))
}

// inNS runs f on a thread switched into network namespace ns: sockets f
// opens live there. The thread is never unlocked, so it dies with the
// goroutine instead of going back to the pool in the wrong namespace.
func inNS(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := syscall.Open("/run/netns/"+ns, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer syscall.Close(fd)
		nr, ok := map[string]uintptr{"amd64": 308, "arm64": 268, "riscv64": 268, "ppc64le": 350, "s390x": 339}[runtime.GOARCH]
		if !ok {
			errc <- fmt.Errorf("setns: syscall number for %s unknown to this test", runtime.GOARCH)
			return
		}
		if _, _, e := syscall.RawSyscall(nr, uintptr(fd), syscall.CLONE_NEWNET, 0); e != 0 {
			errc <- fmt.Errorf("setns %s: %w", ns, e)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// ping sends one ICMP echo from namespace ns (host when "") to dst and waits
// up to timeout for the reply.
func ping(ns, dst string, timeout time.Duration) error {
	do := func() error {
		c, err := net.ListenPacket("ip4:icmp", "0.0.0.0")
		if err != nil {
			return err
		}
		defer c.Close()
		// A random ID: conntrack remembers an echo flow for 30 s, so a fixed
		// ID would make a re-run's refused ping look "established".
		id := uint16(rand.Uint32())
		msg := []byte{8, 0, 0, 0, byte(id >> 8), byte(id), 0, 1, 's', 'w', 'b'}
		var sum uint32
		for i := 0; i+1 < len(msg); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(msg[i:]))
		}
		sum += uint32(msg[len(msg)-1]) << 8 // odd length
		sum = sum>>16 + sum&0xffff
		sum += sum >> 16
		binary.BigEndian.PutUint16(msg[2:], ^uint16(sum))
		if _, err := c.WriteTo(msg, &net.IPAddr{IP: net.ParseIP(dst)}); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(timeout))
		buf := make([]byte, 1500)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return fmt.Errorf("no echo reply from %s: %w", dst, err)
			}
			if from.String() == dst && n >= 8 && buf[0] == 0 && binary.BigEndian.Uint16(buf[4:]) == id {
				return nil
			}
		}
	}
	if ns == "" {
		return do()
	}
	return inNS(ns, do)
}

// dial connects from namespace ns to addr and returns what the server says.
func dialFrom(ns, addr string, timeout time.Duration) (string, error) {
	return dialFromSource(ns, "", addr, timeout)
}

// dialFromSource is dialFrom with the connection's source address set to src ("": the
// kernel's choice).
func dialFromSource(ns, src, addr string, timeout time.Duration) (string, error) {
	var c net.Conn
	if err := inNS(ns, func() (err error) {
		d := net.Dialer{Timeout: timeout}
		if src != "" {
			d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
		}
		c, err = d.Dial("tcp", addr)
		return err
	}); err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout + time.Second))
	b, err := io.ReadAll(c)
	return string(b), err
}

// peerServer listens in ns (host when "") on addr and tells each client
// the address it sees the client come from.
func peerServer(t *testing.T, ns, addr string) {
	t.Helper()
	var l net.Listener
	listen := func() (err error) { l, err = net.Listen("tcp", addr); return err }
	var err error
	if ns == "" {
		err = listen()
	} else {
		err = inNS(ns, listen)
	}
	if err != nil {
		t.Fatalf("listening on %s in %q: %v", addr, ns, err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
			c.Write([]byte(host))
			c.Close()
		}
	}()
}

// standIn is a stand-in guest: namespace ns, its eth0 a veth whose host end
// hostIf is a port of bridge (or, with bridge "", a routed host interface
// with address hostAddr).
func standIn(t *testing.T, ns, hostIf, bridge, hostAddr, addr, gw string) {
	t.Helper()
	t.Cleanup(func() { shQuiet("ip", "link", "del", hostIf); shQuiet("ip", "netns", "del", ns) })
	sh(t, "ip", "netns", "add", ns)
	sh(t, "ip", "link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", ns)
	if bridge != "" {
		sh(t, "ip", "link", "set", "dev", hostIf, "master", bridge, "up")
	} else {
		sh(t, "ip", "addr", "add", hostAddr, "dev", hostIf)
		sh(t, "ip", "link", "set", "dev", hostIf, "up")
	}
	sh(t, "ip", "-n", ns, "addr", "add", addr, "dev", "eth0")
	sh(t, "ip", "-n", ns, "link", "set", "dev", "eth0", "up")
	sh(t, "ip", "-n", ns, "link", "set", "dev", "lo", "up")
	sh(t, "ip", "-n", ns, "route", "add", "default", "via", gw)
}

// mustStayLocal fails the test unless the host routes dst to one of the
// test's own interfaces or itself: no test packet may leave the machine.
func mustStayLocal(t *testing.T, dst string) {
	t.Helper()
	out := sh(t, "ip", "route", "get", dst)
	if !regexp.MustCompile(`^local |dev (swb19[89]|swxout) `).MatchString(out) {
		t.Fatalf("refusing to send test traffic to %s: the host routes it %q, not to a test interface", dst, strings.TrimSpace(out))
	}
}

func TestLiveStandInGuests(t *testing.T) {
	requireLive(t)
	start := time.Now()
	ctx := context.Background()
	pa, pb := plan(t, liveA), plan(t, liveB)
	m := NewManager(nil, slog.New(slog.NewTextHandler(t.Output(), nil)))

	// Refuse to run over anything we did not make.
	owned, err := m.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range owned.Indexes() {
		if i == liveA || i == liveB {
			t.Fatalf("network index %d is in use on this host (%+v): a leftover of an earlier run? remove it with Manager.Remove (or ip link del swb%d; nft delete table inet socialweb-%d)", i, owned, i, i)
		}
	}
	if addrs := sh(t, "ip", "-o", "addr"); strings.Contains(addrs, outsidePrefix) || strings.Contains(sh(t, "ip", "netns", "list"), "swbtest-") {
		t.Fatalf("%s0/24 or a swbtest-* namespace is already on this host; clean up the earlier run", outsidePrefix)
	}
	before := hostState(t)
	fwd, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile("/proc/sys/net/ipv4/ip_forward", fwd, 0o644) })
	t.Cleanup(func() { m.Remove(ctx, "live-a", pa); m.Remove(ctx, "live-b", pb) })

	for _, c := range []struct {
		name string
		p    Plan
	}{{"live-a", pa}, {"live-b", pb}, {"live-a", pa}} { // the second Ensure of A must change nothing
		// 8081: B serves its "apiserver" there (below), 5001 its build cache; A1 must
		// reach neither of B's, and does reach its own build cache.
		if err := m.Ensure(ctx, c.name, c.p, Served{APIServer: 8081, BuildCache: 5001}, Narrowing{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := counters.ReplaceAllString(sh(t, "nft", "list", "table", "inet", TableName(liveA)), "counter"); !strings.Contains(got, `iifname "swb198" oifname "swb*" counter name "egress_denied" drop`) || strings.Count(got, "chain ") != 3 {
		t.Fatalf("table after two Ensures:\n%s", got)
	}

	// Real taps: on the bridge, up, and RemoveTap is idempotent.
	tap1, err := m.AddTap(ctx, "live-a", pa, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	tap2, err := m.AddTap(ctx, "live-a", pa, "node-2")
	if err != nil {
		t.Fatal(err)
	}
	if again, err := m.AddTap(ctx, "live-a", pa, "node-1"); err != nil || again.Name != tap1.Name || again.MAC.String() != tap1.MAC.String() {
		t.Fatalf("AddTap again = %+v, %v", again, err)
	}
	onBridge := sh(t, "ip", "-o", "link", "show", "master", BridgeName(liveA))
	for _, tap := range []Tap{tap1, tap2} {
		if !strings.Contains(onBridge, " "+tap.Name+":") {
			t.Errorf("tap %s not on %s:\n%s", tap.Name, BridgeName(liveA), onBridge)
		}
	}
	if err := m.RemoveTap(ctx, tap2.Name); err != nil {
		t.Fatal(err)
	}
	if err := m.RemoveTap(ctx, tap2.Name); err != nil {
		t.Fatalf("removing a removed tap: %v", err)
	}
	// tap1 stays: Remove must take it.

	// Stand-in guests and the stand-in internet.
	a1, a2 := NodeAddress(pa, 11).String(), NodeAddress(pa, 12).String()
	b1, b2 := NodeAddress(pb, 11).String(), NodeAddress(pb, 12).String()
	gwA, gwB := pa.Gateway.String(), pb.Gateway.String()
	standIn(t, "swbtest-a1", "swx198a1", "swb198", "", a1+"/24", gwA)
	standIn(t, "swbtest-a2", "swx198a2", "swb198", "", a2+"/24", gwA)
	standIn(t, "swbtest-b1", "swx199b1", "swb199", "", b1+"/24", gwB)
	standIn(t, "swbtest-b2", "swx199b2", "swb199", "", b2+"/24", gwB)
	standIn(t, "swbtest-out", "swxout", "", outsideHostIP+"/24", outsideIP+"/24", outsideHostIP)
	// A pod on A2's node: its /24 routed via A2 by the host.
	sh(t, "ip", "-n", "swbtest-a2", "addr", "add", "10.198.2.1/32", "dev", "lo")
	if err := m.AddPodRoute(ctx, pa, "10.198.2.0/24", net.ParseIP(a2)); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{a1, a2, b1, b2, gwA, gwB, outsideIP, "10.198.2.1"} {
		mustStayLocal(t, dst)
	}

	// DNS forwarder on A's gateway, relaying to a fake upstream on loopback.
	up := startFakeUpstream(t)
	dns, err := ListenDNS(net.JoinHostPort(gwA, "53"), []string{up.addr})
	if err != nil {
		t.Fatal(err)
	}
	dnsCtx, stopDNS := context.WithCancel(ctx)
	t.Cleanup(stopDNS)
	go dns.Serve(dnsCtx)

	peerServer(t, "swbtest-out", outsideIP+":8080")
	peerServer(t, "swbtest-a1", ":8080")
	peerServer(t, "swbtest-a2", "10.198.2.1:8080")
	peerServer(t, "swbtest-b1", ":8080")
	peerServer(t, "", gwB+":8081") // a host service on B's gateway (B's apiserver, say)
	peerServer(t, "", gwB+":5001") // B's build cache
	peerServer(t, "", gwA+":5001") // A's build cache
	t.Logf("setup took %v", time.Since(start))

	const yes, no = time.Second, 300 * time.Millisecond
	reach := func(what, ns, dst string) {
		t.Helper()
		if err := ping(ns, dst, yes); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	reachTCP := func(what, ns, addr, wantPeer string) {
		t.Helper()
		got, err := dialFrom(ns, addr, yes)
		if err != nil || got != wantPeer {
			t.Errorf("%s: got %q, %v; want the server to see %s", what, got, err, wantPeer)
		}
	}
	blocked := func(what, ns, addr string) {
		t.Helper()
		host, _, _ := net.SplitHostPort(addr)
		if err := ping(ns, host, no); err == nil {
			t.Errorf("%s: ping %s answered", what, host)
		}
		if got, err := dialFrom(ns, addr, no); err == nil {
			t.Errorf("%s: TCP %s connected (server saw %q)", what, addr, got)
		}
	}

	reach("A1 pings A2 (same cluster)", "swbtest-a1", a2)
	reach("A1 pings its gateway", "swbtest-a1", gwA)
	reach("B1 pings B2 (same cluster)", "swbtest-b1", b2)
	reach("A1 pings a pod on A2's node (pod route)", "swbtest-a1", "10.198.2.1")
	reach("the host pings a pod on A2's node (pod route)", "", "10.198.2.1")
	reachTCP("A1 to a pod on A2's node keeps its address", "swbtest-a1", "10.198.2.1:8080", a1)
	reachTCP("egress from A1 is masqueraded", "swbtest-a1", outsideIP+":8080", outsideHostIP)
	reachTCP("egress from B1 is masqueraded", "swbtest-b1", outsideIP+":8080", outsideHostIP)
	// A Service address reaching the host (a node whose kube-proxy has not synced yet)
	// is refused at once rather than sent out to hang in SYN retries.
	if _, err := dialFrom("swbtest-a1", "10.251.0.10:80", 3*time.Second); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("A1 to a Service address through the host: %v; want connection refused", err)
	}
	if _, err := dialFrom("swbtest-a1", gwA+":5001", 3*time.Second); err != nil {
		t.Errorf("A1 to its own build cache on its gateway: %v", err)
	}
	var wg sync.WaitGroup // each refused check waits out its timeout: run them together
	for _, c := range [][3]string{
		{"A1 to B1 (other cluster)", "swbtest-a1", b1 + ":8080"},
		{"B1 to A1 (other cluster)", "swbtest-b1", a1 + ":8080"},
		{"A1 to the host on B's gateway", "swbtest-a1", gwB + ":8081"},
		{"A1 to B's build cache on B's gateway", "swbtest-a1", gwB + ":5001"},
		{"B1 to A's DNS forwarder", "swbtest-b1", gwA + ":53"},
		{"the outside opening a connection to A1", "swbtest-out", a1 + ":8080"},
	} {
		wg.Go(func() { blocked(c[0], c[1], c[2]) })
	}
	wg.Wait()

	for i, network := range []string{"udp", "tcp"} {
		var got string
		err := inNS("swbtest-a1", func() (err error) {
			got, err = lookup(network, net.JoinHostPort(gwA, "53"), fakeName, uint16(100+i))
			return err
		})
		if err != nil || got != fakeA {
			t.Errorf("DNS over %s from A1 via the gateway = %q, %v; want %s", network, got, err, fakeA)
		}
	}
	stopDNS()

	owned, err = m.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ownTaps, ownRoutes, ownTables := 0, 0, 0
	for _, x := range owned.Taps {
		if strings.HasPrefix(x, "swt198") || strings.HasPrefix(x, "swt199") {
			ownTaps++
		}
	}
	for _, x := range owned.Routes {
		if strings.Contains(x, "swb198") || strings.Contains(x, "swb199") {
			ownRoutes++
		}
	}
	for _, x := range owned.Tables {
		if strings.HasSuffix(x, "-198") || strings.HasSuffix(x, "-199") {
			ownTables++
		}
	}
	if !slices.Contains(owned.Indexes(), liveA) || !slices.Contains(owned.Indexes(), liveB) || ownTaps != 1 || ownRoutes != 1 || ownTables != 2 {
		t.Errorf("List = %+v", owned)
	}
	if err := m.RemovePodRoute(ctx, pa, "10.198.2.0/24", net.ParseIP(a2)); err != nil {
		t.Fatal(err)
	}
	if out := sh(t, "ip", "route", "show", "10.198.2.0/24"); out != "" {
		t.Errorf("pod route still there: %s", out)
	}

	// Tear down: guests first (as nodes would go), then the clusters, twice.
	for _, g := range []string{"a1", "a2", "b1", "b2"} {
		shQuiet("ip", "link", "del", "swx"+map[byte]string{'a': "198", 'b': "199"}[g[0]]+g)
		shQuiet("ip", "netns", "del", "swbtest-"+g)
	}
	shQuiet("ip", "link", "del", "swxout")
	shQuiet("ip", "netns", "del", "swbtest-out")
	for range 2 {
		if err := m.Remove(ctx, "live-a", pa); err != nil {
			t.Fatal(err)
		}
		if err := m.Remove(ctx, "live-b", pb); err != nil {
			t.Fatal(err)
		}
	}
	owned, err = m.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range owned.Indexes() {
		if i == liveA || i == liveB {
			t.Errorf("after Remove, index %d still has %+v", i, owned)
		}
	}
	var after string
	deadline := time.Now().Add(2 * time.Second)
	for {
		if after = hostState(t); after == before || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if after != before {
		t.Errorf("host state changed.\nbefore:\n%s\nafter:\n%s", before, after)
	}
	t.Logf("total %v", time.Since(start))
}
