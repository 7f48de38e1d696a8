package nodenet

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// The egress live test's stand-ins, all on this machine: a node on the cluster bridge,
// and behind veths routed from the host a LAN, a cloud metadata server, a network of the
// host's own with a public-looking address, and the internet. Its names and ranges are
// apart from TestLiveStandInGuests', so the two may run at once (from two checkouts).
const (
	egressIndex = 194
	lanHost     = "192.168.251.1" // the host on the LAN stand-in (a /24, connected)
	lanIP       = "192.168.251.2"
	metaHost    = "169.254.169.1"
	metaIP      = "169.254.169.254"
	hostNetHost = "198.18.251.1" // a connected /24 of the host's, not in a walled range
	hostNetIP   = "198.18.251.2"
	inetHost    = "203.0.113.1" // a /32 and a route, as an uplink's far side looks (TEST-NET-3)
	inetIP      = "203.0.113.2"
)

// egressState is what TestLiveEgressWalls could leave on the host: its interfaces,
// addresses, routes, table and namespaces.
func egressState(t *testing.T) string {
	t.Helper()
	ours := regexp.MustCompile(`swb194\b|swe194|swe-|socialweb-194\b|10\.250\.194\.|192\.168\.251\.|169\.254\.169\.|198\.18\.251\.|203\.0\.113\.`)
	var b strings.Builder
	for _, cmd := range [][]string{{"ip", "-o", "link"}, {"ip", "-o", "addr"}, {"ip", "route"}, {"nft", "list", "tables"}, {"ip", "netns", "list"}} {
		fmt.Fprintf(&b, "## %s\n", strings.Join(cmd, " "))
		for _, l := range strings.Split(sh(t, cmd...), "\n") {
			if ours.MatchString(l) {
				b.WriteString(l + "\n")
			}
		}
	}
	return b.String()
}

// TestLiveEgressWalls attacks a cluster's walls from a stand-in node on its bridge: the
// host answers only what it serves the cluster on the gateway, and forwarded traffic
// reaches the internet but not link-local, private or the host's own networks, unless
// the operator's policy says otherwise; what is refused is counted.
func TestLiveEgressWalls(t *testing.T) {
	requireLive(t)
	ctx := context.Background()
	pe := plan(t, egressIndex)
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	manager := func(e EgressPolicy) *Manager {
		m := NewManager(nil, log)
		m.Egress = e
		return m
	}
	m := manager(EgressPolicy{})

	// Refuse to run over anything we did not make.
	owned, err := m.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range owned.Indexes() {
		if i == egressIndex {
			t.Fatalf("network index %d is in use on this host (%+v): a leftover of an earlier run? remove it with Manager.Remove (or ip link del swb%d; nft delete table inet socialweb-%d)", i, owned, i, i)
		}
	}
	before := egressState(t)
	if before != "## ip -o link\n## ip -o addr\n## ip route\n## nft list tables\n## ip netns list\n" {
		t.Fatalf("this host already has what the test would make (an earlier run's leftovers, or a network of its own in the test's ranges):\n%s", before)
	}
	fwd, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile("/proc/sys/net/ipv4/ip_forward", fwd, 0o644) })
	t.Cleanup(func() { m.Remove(ctx, "egress", pe) })

	// The networks beyond the bridge exist before Ensure: the host's own networks are
	// read when the rules are applied.
	standIn(t, "swe-lan", "swe194l", "", lanHost+"/24", lanIP+"/24", lanHost)
	standIn(t, "swe-meta", "swe194m", "", metaHost+"/24", metaIP+"/24", metaHost)
	standIn(t, "swe-hnet", "swe194h", "", hostNetHost+"/24", hostNetIP+"/24", hostNetHost)
	standIn(t, "swe-inet", "swe194i", "", inetHost+"/32", inetIP+"/24", inetHost)
	sh(t, "ip", "route", "add", "203.0.113.0/24", "dev", "swe194i", "src", inetHost)

	apiPort, regPort, otherPort := livetest.FreePort(t), livetest.FreePort(t), livetest.FreePort(t)
	for apiPort == regPort || otherPort == apiPort || otherPort == regPort {
		regPort, otherPort = livetest.FreePort(t), livetest.FreePort(t)
	}
	served := Served{APIServer: apiPort, Registry: regPort}
	if err := m.Ensure(ctx, "egress", pe, served, Narrowing{}); err != nil {
		t.Fatal(err)
	}
	gw, node := pe.Gateway.String(), NodeAddress(pe, 11).String()
	standIn(t, "swe-node", "swe194n", BridgeName(egressIndex), "", node+"/24", gw)
	for _, dst := range []string{gw, lanHost, lanIP, metaIP, hostNetIP, inetIP} {
		out := sh(t, "ip", "route", "get", dst)
		if !regexp.MustCompile(`^local |dev (swb194|swe194[lmhi]) `).MatchString(out) {
			t.Fatalf("refusing to send test traffic to %s: the host routes it %q, not to a test interface", dst, strings.TrimSpace(out))
		}
	}

	// The host's services: the cluster's two on its gateway, and one on every address
	// (sshd, postgres, the front door, say) that the node must not reach.
	peerServer(t, "", net.JoinHostPort(gw, strconv.Itoa(apiPort)))
	peerServer(t, "", net.JoinHostPort(gw, strconv.Itoa(regPort)))
	peerServer(t, "", net.JoinHostPort("0.0.0.0", strconv.Itoa(otherPort)))
	peerServer(t, "swe-lan", lanIP+":8080")
	peerServer(t, "swe-meta", metaIP+":80")
	peerServer(t, "swe-hnet", hostNetIP+":8080")
	peerServer(t, "swe-inet", inetIP+":8080")

	const yes, no = 3 * time.Second, time.Second
	reach := func(what, addr, wantPeer string) {
		t.Helper()
		got, err := dialFrom("swe-node", addr, yes)
		if err != nil || got != wantPeer {
			t.Errorf("%s: got %q, %v; want the server at %s to see %s", what, got, err, addr, wantPeer)
		}
	}
	// walled: the egress wall refuses at once (ICMP admin-prohibited: no route to
	// host); the host's wall drops (the dial times out).
	type attempt struct{ what, addr, wantErr string }
	blocked := func(as ...attempt) {
		t.Helper()
		var wg sync.WaitGroup
		for _, a := range as {
			wg.Go(func() {
				got, err := dialFrom("swe-node", a.addr, no)
				switch {
				case err == nil:
					t.Errorf("%s: TCP %s connected (server saw %q)", a.what, a.addr, got)
				case !strings.Contains(err.Error(), a.wantErr):
					t.Errorf("%s: TCP %s: %v, want %q", a.what, a.addr, err, a.wantErr)
				}
			})
		}
		wg.Wait()
	}
	const refused, dropped = "no route to host", "i/o timeout"
	denied := func(phase string, wantEgress, wantHost uint64) {
		t.Helper()
		c, err := m.DeniedCounters(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := c[egressIndex]
		t.Logf("%s: denied %v", phase, got)
		if got["egress"] < wantEgress || got["host"] < wantHost {
			t.Errorf("%s: counters %v, want egress >= %d and host >= %d", phase, got, wantEgress, wantHost)
		}
	}
	ensureNarrowed := func(e EgressPolicy, n Narrowing) {
		t.Helper()
		m = manager(e)
		if err := m.Ensure(ctx, "egress", pe, served, n); err != nil {
			t.Fatal(err)
		}
	}
	ensure := func(e EgressPolicy) { t.Helper(); ensureNarrowed(e, Narrowing{}) }
	other := strconv.Itoa(otherPort)
	lan, meta, hostNet, inet := lanIP+":8080", metaIP+":80", hostNetIP+":8080", inetIP+":8080"

	// The default policy: the internet.
	denied("fresh", 0, 0)
	reach("(b) the apiserver on the gateway", net.JoinHostPort(gw, strconv.Itoa(apiPort)), node)
	reach("(b) the registry on the gateway", net.JoinHostPort(gw, strconv.Itoa(regPort)), node)
	if err := ping("swe-node", gw, yes); err != nil {
		t.Errorf("the node pings its gateway: %v", err)
	}
	reach("(e) the internet, masqueraded", inet, inetHost)
	blocked(
		attempt{"(a) a host service on 0.0.0.0, at the gateway", net.JoinHostPort(gw, other), dropped},
		attempt{"(a) a host service on 0.0.0.0, at the host's LAN address", net.JoinHostPort(lanHost, other), dropped},
		attempt{"(c) the LAN", lan, refused},
		attempt{"(d) the metadata address", meta, refused},
		attempt{"a network of the host's own, public-looking", hostNet, refused},
	)
	denied("internet", 3, 2)

	// A tenant control plane's uid, walled by the kernel: what a taken-over
	// apiserver (or a dial that never went through its egress proxy) reaches.
	controlPlaneWall(t, m, pe, apiPort, otherPort)

	// A node that forges a source not its cluster's (another cluster's node, say) gets
	// nothing forwarded: dropped before the egress policy, and counted.
	spoof := "10.250.193.9" // in the range of another cluster's node network
	sh(t, "ip", "-n", "swe-node", "addr", "add", spoof+"/32", "dev", "eth0")
	prior, err := m.DeniedCounters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := dialFromSource("swe-node", spoof, inet, no); err == nil {
		t.Errorf("a forged source %s reached the internet stand-in (it saw %q)", spoof, got)
	}
	denied("forged source", prior[egressIndex]["egress"]+1, 0)
	// A machine on the LAN that routes the node network to the host reaches none of the
	// cluster's services on its gateway: they answer on the cluster's bridge alone.
	sh(t, "ip", "-n", "swe-lan", "route", "add", pe.NodeCIDR.String(), "via", lanHost)
	for _, port := range []int{apiPort, regPort} {
		if got, err := dialFrom("swe-lan", net.JoinHostPort(gw, strconv.Itoa(port)), no); err == nil {
			t.Errorf("the LAN reached the gateway's port %d (the server saw %q)", port, got)
		}
	}

	// none: nothing forwarded; the gateway's services stay.
	ensure(EgressPolicy{Mode: EgressNone})
	reach("none: the apiserver on the gateway", net.JoinHostPort(gw, strconv.Itoa(apiPort)), node)
	blocked(
		attempt{"(e) none: the internet", inet, refused},
		attempt{"none: the LAN", lan, refused},
		attempt{"none: a host service on 0.0.0.0", net.JoinHostPort(gw, other), dropped},
	)
	denied("none", 2, 1)

	// (f) --egress-allow opens the LAN, and nothing more.
	ensure(EgressPolicy{Allow: []netip.Prefix{netip.MustParsePrefix("192.168.251.0/24")}})
	reach("(f) allowed: the LAN, masqueraded", lan, lanHost)
	reach("(f) allowed: still the internet", inet, inetHost)
	blocked(
		attempt{"(f) allowed: still not the metadata address", meta, refused},
		attempt{"(f) allowed: still not a host service on the LAN address", net.JoinHostPort(lanHost, other), dropped},
	)
	denied("allow", 1, 1)

	// none with the LAN allowed: an internal registry and nothing else.
	ensure(EgressPolicy{Mode: EgressNone, Allow: []netip.Prefix{netip.MustParsePrefix("192.168.251.0/24")}})
	reach("none, LAN allowed: the LAN", lan, lanHost)
	blocked(attempt{"none, LAN allowed: the internet", inet, refused})
	denied("none and allow", 1, 0)

	// --egress-deny closes more, and wins over --egress-allow.
	ensure(EgressPolicy{Allow: []netip.Prefix{netip.MustParsePrefix("192.168.251.0/24")},
		Deny: []netip.Prefix{netip.MustParsePrefix("192.168.251.2/32"), netip.MustParsePrefix("203.0.113.0/24")}})
	blocked(
		attempt{"denied within the allowed LAN", lan, refused},
		attempt{"the internet, denied", inet, refused},
	)
	denied("deny", 2, 0)

	// A Cluster narrows the host's policy (spec.egress, spec.egressDeny): none takes
	// even the host's allowed LAN away; a deny of its own closes the internet.
	lanOpen := EgressPolicy{Allow: []netip.Prefix{netip.MustParsePrefix("192.168.251.0/24")}}
	// The kernel rate-limits the ICMP a reject sends to one address (a burst of 6, then
	// one a second): the phases above spent the burst, so let it refill.
	time.Sleep(4 * time.Second)
	ensureNarrowed(lanOpen, Narrowing{None: true})
	reach("cluster none: the apiserver on the gateway", net.JoinHostPort(gw, strconv.Itoa(apiPort)), node)
	blocked(
		attempt{"cluster none: the LAN the host allows", lan, refused},
		attempt{"cluster none: the internet", inet, refused},
	)
	denied("cluster none", 2, 0)
	time.Sleep(2 * time.Second)
	ensureNarrowed(lanOpen, Narrowing{Deny: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}})
	reach("cluster deny: the LAN the host allows", lan, lanHost)
	blocked(attempt{"cluster deny: the internet it denies", inet, refused})
	denied("cluster deny", 1, 0)

	// Tear down: the node, the stand-ins, the cluster (twice); nothing of ours is left.
	for _, l := range []string{"swe194n", "swe194l", "swe194m", "swe194h", "swe194i"} {
		shQuiet("ip", "link", "del", l)
	}
	for _, ns := range []string{"swe-node", "swe-lan", "swe-meta", "swe-hnet", "swe-inet"} {
		shQuiet("ip", "netns", "del", ns)
	}
	for range 2 {
		if err := m.Remove(ctx, "egress", pe); err != nil {
			t.Fatal(err)
		}
	}
	var after string
	deadline := time.Now().Add(2 * time.Second)
	for {
		if after = egressState(t); after == before || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if after != before {
		t.Errorf("host state changed.\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// dialAsUID connects to addr from the host as uid (and gid uid): a tenant's control
// plane, taken over, opening a connection. It returns what the server says.
func dialAsUID(uid int, addr string, timeout time.Duration) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", `exec 3<>"/dev/tcp/$0/$1" && cat <&3`, host, port)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid), Groups: []uint32{}}}
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// controlPlaneWall attacks a control plane's wall from a process under its uid, on
// the host the stand-ins of TestLiveEgressWalls surround: its own loopback port, its
// nodes and the internet answer; another port on loopback (another tenant's apiserver,
// a host service), its gateway, the LAN, the metadata address and a network of the
// host's own refuse at once, and are counted. The host (root) still reaches the LAN:
// the wall is the uid's. With egress none the internet goes too; unwalled, the LAN
// answers the uid again: the table is what refused it.
func controlPlaneWall(t *testing.T, m *Manager, pe Plan, apiPort, otherPort int) {
	t.Helper()
	ctx := context.Background()
	uid := 2_000_000_000 + apiPort
	table := ControlPlaneTable(apiPort)
	t.Cleanup(func() { shQuiet("nft", "delete", "table", "inet", table) })
	gw, node := pe.Gateway.String(), NodeAddress(pe, 11).String()
	own := net.JoinHostPort("127.0.0.1", strconv.Itoa(apiPort))
	peerServer(t, "", own)
	peerServer(t, "swe-node", node+":8080")
	lan, meta, hostNet, inet := lanIP+":8080", metaIP+":80", hostNetIP+":8080", inetIP+":8080"

	reach := func(what, addr, wantPeer string) {
		t.Helper()
		if got, err := dialAsUID(uid, addr, 5*time.Second); err != nil || got != wantPeer {
			t.Errorf("control plane: %s: got %q, %v; want the server at %s to see %s", what, got, err, addr, wantPeer)
		}
	}
	refused := func(attempts ...[2]string) {
		t.Helper()
		for _, a := range attempts {
			start := time.Now()
			got, err := dialAsUID(uid, a[1], 5*time.Second)
			switch {
			case err == nil:
				t.Errorf("control plane: %s: %s connected (the server saw %q)", a[0], a[1], got)
			case !strings.Contains(err.Error(), "refused") && !strings.Contains(err.Error(), "No route to host"):
				t.Errorf("control plane: %s: %s: %v, want refused at once", a[0], a[1], err)
			case time.Since(start) > 3*time.Second:
				t.Errorf("control plane: %s: %s took %s to fail: want a refusal, not a timeout", a[0], a[1], time.Since(start))
			}
		}
	}
	wall := func(n Narrowing) {
		t.Helper()
		if err := m.WallControlPlane(ctx, "egress", ControlPlaneReach{UID: uid, Port: apiPort, Plan: &pe}, n); err != nil {
			t.Fatal(err)
		}
	}

	wall(Narrowing{})
	reach("its own port on loopback", own, "127.0.0.1")
	reach("a node", node+":8080", gw)
	reach("the internet", inet, inetHost)
	refused(
		[2]string{"another port on loopback (another tenant's apiserver, a host service)", net.JoinHostPort("127.0.0.1", strconv.Itoa(otherPort))},
		[2]string{"its gateway: the host", net.JoinHostPort(gw, strconv.Itoa(apiPort))},
		[2]string{"the LAN", lan},
		[2]string{"the metadata address", meta},
		[2]string{"a network of the host's own", hostNet},
	)
	if got, err := dialHost(lan, 3*time.Second); err != nil || got != lanHost {
		t.Errorf("the host itself (root) reaches the LAN: %q, %v; want it seen as %s", got, err, lanHost)
	}
	if c, err := m.ControlPlaneDenied(ctx); err != nil || c[apiPort] < 5 {
		t.Errorf("the wall counted %v (%v) for port %d, want >= 5", c, err, apiPort)
	}

	// The cluster's egress none: its nodes, not the internet.
	wall(Narrowing{None: true})
	reach("egress none: a node", node+":8080", gw)
	refused([2]string{"egress none: the internet", inet})

	// Unwalled, the uid reaches the LAN again: the wall was what refused it.
	for range 2 { // removing what is gone is not an error
		if err := m.UnwallControlPlane(ctx, apiPort); err != nil {
			t.Fatal(err)
		}
	}
	if out := sh(t, "nft", "list", "tables"); strings.Contains(out, table+"\n") {
		t.Errorf("table %s left after UnwallControlPlane:\n%s", table, out)
	}
	reach("unwalled: the LAN", lan, lanHost)
}

// dialHost connects from the host, as this (root) process, and returns what the
// server says.
func dialHost(addr string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	b, err := io.ReadAll(c)
	return string(b), err
}
