package nodenet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Manager creates and removes clusters' node networks on this host: one
// bridge per cluster (the gateway address on it), one tap per node, host
// routes for the nodes' pod subnets, and one nftables table per cluster
// (isolation, egress NAT). Every method is idempotent.
type Manager struct {
	// Egress is where the clusters' nodes may send forwarded traffic; set it
	// before the first Ensure. The zero value is the default policy.
	Egress EgressPolicy

	run Runner
	log *slog.Logger
	mu  sync.Mutex // one change at a time: commands are quick, and it keeps logs readable
	// ensured names the cluster of each index this Manager ensured: the
	// metrics report those tables only, not another daemon's.
	ensured map[int]string
	// walled names the cluster of each control plane (by port) this Manager walled.
	walled map[int]string
	// collectErr is the last error of a metrics scrape, logged when it changes.
	collectErr string
}

// NewManager returns a Manager; a nil runner runs the host's commands, a
// nil logger discards.
func NewManager(run Runner, log *slog.Logger) *Manager {
	if run == nil {
		run = ExecRunner{}
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Manager{run: run, log: log, ensured: map[int]string{}, walled: map[int]string{}}
}

// Tap is a node's tap device; MAC is for the guest's NIC
// (qemu: -netdev tap,id=n0,ifname=<Name>,script=no,downscript=no
// -device virtio-net-device,netdev=n0,mac=<MAC>).
type Tap struct {
	Name   string
	Bridge string
	MAC    net.HardwareAddr
}

func (m *Manager) cmd(ctx context.Context, stdin, name string, args ...string) (string, error) {
	m.log.Debug("nodenet command", "cmd", cmdLine(name, args))
	return m.run.Run(ctx, stdin, name, args...)
}

func checkPlan(p Plan) error {
	if p.Index < 1 || p.Index > MaxIndex || p.Gateway.To4() == nil || p.NodeCIDR == nil ||
		p.PodCIDR == nil || p.ServiceCIDR == nil {
		return fmt.Errorf("network plan for index %d is incomplete: build it with nodenet.ForIndex", p.Index)
	}
	return nil
}

// Ensure creates (or repairs) the cluster's bridge, gateway address,
// forwarding sysctl and nftables table. served are the ports the host serves
// the cluster on its gateway: the only ones its nodes may open there; narrow is
// what the cluster takes away from the host's egress policy.
func (m *Manager) Ensure(ctx context.Context, cluster string, plan Plan, served Served, narrow Narrowing) error {
	if err := checkPlan(plan); err != nil {
		return err
	}
	served.Extra = append(served.Extra, m.Egress.HostTCP...)
	if err := served.check(); err != nil {
		return fmt.Errorf("ensuring the network of cluster %s: %w", cluster, err)
	}
	egress := m.Egress.Narrow(narrow)
	if err := egress.check(); err != nil {
		return fmt.Errorf("ensuring the network of cluster %s: egress policy: %w", cluster, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	br := BridgeName(plan.Index)
	if _, err := m.cmd(ctx, "", "ip", "link", "add", br, "type", "bridge"); err != nil && !isExists(err) {
		return explain(err, "creating bridge %s for cluster %s", br, cluster)
	}
	ones, _ := plan.NodeCIDR.Mask.Size()
	gw := fmt.Sprintf("%s/%d", plan.Gateway, ones)
	if _, err := m.cmd(ctx, "", "ip", "addr", "replace", gw, "dev", br); err != nil {
		return explain(err, "assigning gateway %s to bridge %s", gw, br)
	}
	if _, err := m.cmd(ctx, "", "ip", "link", "set", "dev", br, "up"); err != nil {
		return explain(err, "bringing bridge %s up", br)
	}
	if _, err := m.cmd(ctx, "", "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"); err != nil {
		return explain(err, "enabling net.ipv4.ip_forward (nodes' traffic is routed through the host)")
	}
	// Read when the rules are applied: the host's networks are what its
	// interfaces have now.
	hostNets, err := m.HostNetworks(ctx)
	if err != nil {
		return err
	}
	if _, err := m.cmd(ctx, Ruleset(cluster, plan, served, egress, hostNets), "nft", "-f", "-"); err != nil {
		return explain(err, "installing nftables table %s %s", tableFamily, TableName(plan.Index))
	}
	if err := m.dockerUser(ctx, plan, true); err != nil {
		return err
	}
	m.ensured[plan.Index] = cluster
	m.log.Info("cluster network ensured", "cluster", cluster, "bridge", br, "gateway", gw,
		"table", tableFamily+" "+TableName(plan.Index), "gatewayTCP", served.tcpPorts(),
		"egress", egress.mode(), "egressDeny", len(egress.Deny), "hostNetworks", hostNets)
	return nil
}

// Ruleset is the nft script Ensure applies: it replaces the cluster's table
// atomically (create-if-missing, delete, define), so re-running it repairs
// hand edits and never leaves a window without rules.
//
// Chains hook at priority filter-10 / srcnat, before iptables(-nft) tables
// at filter/srcnat: isolation drops happen first whatever else the host has.
// Service addresses mean something only to a node's kube-proxy: a packet to
// one that reaches the host (a connection opened before the node's rules were
// synced) is refused at once. Forwarded to the uplink it would hang in SYN
// retries on a conntrack entry the node never re-NATs.
//
// The walls (DESIGN.md, "Trust: who may reach what"): from the bridge the
// host answers only served's ports, DNS and ICMP on the gateway; anything
// else to the host is dropped and counted (host_denied). Forwarded traffic
// stays inside the cluster (bridge to bridge: nodes, and pods routed via
// their nodes) or goes where egress lets it: the operator's Deny first, then
// Allow, then (EgressInternet) everything but the walled ranges and hostNets,
// or (EgressNone) nothing. A refusal is an ICMP admin-prohibited, so a job
// fails at once instead of timing out, and is counted (egress_denied).
//
// Note that an accept here is not final in netfilter: a later chain with a
// drop policy (Docker's FORWARD) still sees the packet; dockerUser covers
// Docker, see there.
func Ruleset(cluster string, plan Plan, served Served, egress EgressPolicy, hostNets []netip.Prefix) string {
	br := BridgeName(plan.Index)
	t := TableName(plan.Index)
	own := fmt.Sprintf("%s, %s", plan.NodeCIDR, plan.PodCIDR)
	var b strings.Builder
	fmt.Fprintf(&b, "table %s %s\ndelete table %s %s\n", tableFamily, t, tableFamily, t)
	fmt.Fprintf(&b, "table %s %s {\n", tableFamily, t)
	fmt.Fprintf(&b, "\tcomment \"socialweb cluster %s network %d (managed: edits are overwritten)\"\n", commentSafe(cluster), plan.Index)
	fmt.Fprintf(&b, "\tcounter %s {\n\t\tcomment \"forwarded packets from %s the egress policy refused\"\n\t}\n", counterEgress, br)
	fmt.Fprintf(&b, "\tcounter %s {\n\t\tcomment \"packets from %s to the host on no port it serves the cluster\"\n\t}\n", counterHost, br)
	walls := slices.Concat(Walled(), hostNets)
	for _, set := range []struct {
		name string
		ps   []netip.Prefix
	}{{"egress_deny", egress.Deny}, {"egress_allow", egress.Allow}, {"egress_walled", walls}} {
		fmt.Fprintf(&b, "\tset %s {\n\t\ttype ipv4_addr\n\t\tflags interval\n", set.name)
		if ps := mergePrefixes(set.ps); len(ps) > 0 {
			fmt.Fprintf(&b, "\t\telements = { %s }\n", joinPrefixes(ps))
		}
		b.WriteString("\t}\n")
	}
	refuse := fmt.Sprintf(`counter name "%s" reject with icmpx admin-prohibited`, counterEgress)
	last := fmt.Sprintf(`iifname "%s" ip daddr @egress_walled %s
		iifname "%s" accept`, br, refuse, br)
	if egress.mode() == EgressNone {
		last = fmt.Sprintf(`iifname "%s" %s`, br, refuse)
	}
	var tcp []string
	for _, p := range served.tcpPorts() {
		tcp = append(tcp, strconv.Itoa(p))
	}
	fmt.Fprintf(&b, `	chain forward {
		type filter hook forward priority filter - 10; policy accept;
		iifname "%[1]s" meta nfproto ipv6 drop
		oifname "%[1]s" meta nfproto ipv6 drop
		iifname "%[1]s" ip saddr != { %[4]s } counter name "%[8]s" drop
		iifname "%[1]s" oifname "%[1]s" accept
		iifname "%[1]s" oifname "%[2]s*" counter name "%[8]s" drop
		oifname "%[1]s" iifname "%[2]s*" drop
		iifname "%[1]s" ip daddr %[5]s meta l4proto tcp reject with tcp reset
		iifname "%[1]s" ip daddr %[5]s reject with icmpx admin-prohibited
		iifname "%[1]s" tcp flags & (syn | rst) == syn tcp option maxseg size set rt mtu
		iifname "%[1]s" ip daddr @egress_deny %[6]s
		iifname "%[1]s" ip daddr @egress_allow accept
		%[7]s
		oifname "%[1]s" ct state established,related accept
		oifname "%[1]s" drop
	}
	chain input {
		type filter hook input priority filter - 10; policy accept;
		iifname != { "%[1]s", "lo" } ip daddr %[3]s drop
		iifname "%[1]s" meta nfproto ipv6 drop
		iifname "%[1]s" ct state established,related accept
		iifname "%[1]s" ip daddr %[3]s tcp dport { %[10]s } accept
		iifname "%[1]s" ip daddr %[3]s udp dport %[11]d accept
		iifname "%[1]s" ip daddr %[3]s icmp type { echo-request, destination-unreachable, time-exceeded, parameter-problem } accept
		iifname "%[1]s" meta pkttype { broadcast, multicast } drop
		iifname "%[1]s" counter name "%[9]s" drop
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		oifname != "%[1]s" ip saddr { %[4]s } ip daddr != { %[4]s, %[5]s } masquerade
	}
}
`, br, bridgePrefix, plan.Gateway, own, plan.ServiceCIDR, refuse, last, counterEgress, counterHost, strings.Join(tcp, ", "), DNSPort)
	return b.String()
}

// The cluster table's named counters of refused packets.
const (
	counterEgress = "egress_denied"
	counterHost   = "host_denied"
)

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}

func commentSafe(s string) string {
	out := []byte{}
	for i := 0; i < len(s) && len(out) < 63; i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' {
			out = append(out, c)
		} else {
			out = append(out, '_')
		}
	}
	return string(out)
}

// dockerUserRules are the rules that let a cluster's traffic through
// Docker's FORWARD chain (policy DROP, br_netfilter on): Docker's
// documented hook is the DOCKER-USER chain, evaluated first.
func dockerUserRules(plan Plan) [][]string {
	br, tag := BridgeName(plan.Index), TableName(plan.Index)
	return [][]string{
		{"-i", br, "-m", "comment", "--comment", tag, "-j", "ACCEPT"},
		{"-o", br, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-m", "comment", "--comment", tag, "-j", "ACCEPT"},
	}
}

// dockerUser adds (or deletes) the cluster's DOCKER-USER rules when this
// host has iptables and a DOCKER-USER chain; otherwise it does nothing.
func (m *Manager) dockerUser(ctx context.Context, plan Plan, add bool) error {
	if _, err := m.cmd(ctx, "", "iptables", "-w", "-S", "DOCKER-USER"); err != nil {
		return nil // no iptables, or no Docker: nothing to punch through
	}
	for _, spec := range dockerUserRules(plan) {
		if add {
			if _, err := m.cmd(ctx, "", "iptables", append([]string{"-w", "-C", "DOCKER-USER"}, spec...)...); err == nil {
				continue
			}
			if _, err := m.cmd(ctx, "", "iptables", append([]string{"-w", "-I", "DOCKER-USER", "1"}, spec...)...); err != nil {
				return explain(err, "letting bridge %s through Docker's FORWARD chain (DOCKER-USER)", BridgeName(plan.Index))
			}
			continue
		}
		for range 8 { // a rule added twice by hand is deleted twice
			if _, err := m.cmd(ctx, "", "iptables", append([]string{"-w", "-D", "DOCKER-USER"}, spec...)...); err != nil {
				break
			}
		}
	}
	return nil
}

// AddTap creates the node's tap, attaches it to the cluster bridge and sets
// it up. Ensure must have run for the cluster.
func (m *Manager) AddTap(ctx context.Context, cluster string, plan Plan, node string) (Tap, error) {
	if err := checkPlan(plan); err != nil {
		return Tap{}, err
	}
	if node == "" {
		return Tap{}, errors.New("adding a tap: empty node name")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	tap := Tap{Name: TapName(plan.Index, cluster, node), Bridge: BridgeName(plan.Index), MAC: NodeMAC(cluster, node)}
	if _, err := m.cmd(ctx, "", "ip", "tuntap", "add", "dev", tap.Name, "mode", "tap"); err != nil {
		// An existing tap is fine (a retried AddTap): check it is there.
		if _, serr := m.cmd(ctx, "", "ip", "-o", "link", "show", "dev", tap.Name); serr != nil {
			return Tap{}, explain(err, "creating tap %s for node %s of cluster %s", tap.Name, node, cluster)
		}
	}
	if _, err := m.cmd(ctx, "", "ip", "link", "set", "dev", tap.Name, "master", tap.Bridge, "up"); err != nil {
		if isNotFound(err) {
			return Tap{}, fmt.Errorf("attaching tap %s to bridge %s: %w: run Ensure for cluster %s first", tap.Name, tap.Bridge, err, cluster)
		}
		return Tap{}, explain(err, "attaching tap %s to bridge %s", tap.Name, tap.Bridge)
	}
	m.log.Info("tap added", "cluster", cluster, "node", node, "tap", tap.Name, "mac", tap.MAC.String())
	return tap, nil
}

// AddPoolTap creates a warm-pool VM's tap (PoolTapName of owner and vm), left down and
// on no bridge: the VM has no network until ClaimTap gives the tap to a cluster. An
// existing tap is fine (a retried AddPoolTap). The returned Tap has no Bridge; its MAC is
// PoolMAC(vm).
func (m *Manager) AddPoolTap(ctx context.Context, owner, vm string) (Tap, error) {
	if vm == "" {
		return Tap{}, errors.New("adding a pool tap: empty VM name")
	}
	if err := checkPoolTapOwner(owner); err != nil {
		return Tap{}, fmt.Errorf("adding a pool tap for VM %s: %w", vm, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	tap := Tap{Name: PoolTapName(owner, vm), MAC: PoolMAC(vm)}
	if _, err := m.cmd(ctx, "", "ip", "tuntap", "add", "dev", tap.Name, "mode", "tap"); err != nil {
		if _, serr := m.cmd(ctx, "", "ip", "-o", "link", "show", "dev", tap.Name); serr != nil {
			return Tap{}, explain(err, "creating pool tap %s for VM %s", tap.Name, vm)
		}
	}
	m.log.Info("pool tap added", "vm", vm, "tap", tap.Name, "mac", tap.MAC.String())
	return tap, nil
}

// ClaimTap gives a warm-pool VM's tap to node of cluster: it renames the pool tap (down,
// as AddPoolTap left it) to TapName(plan.Index, cluster, node), attaches it to the
// cluster bridge and sets it up, in that order: Linux refuses to rename an interface that
// is up. Ensure must have run for the cluster. A retried ClaimTap whose rename was done
// goes on from there.
//
// The returned Tap has no MAC: the VM keeps the PoolMAC it booted with, not
// NodeMAC(cluster, node), and the identity written on claim must name PoolMAC.
func (m *Manager) ClaimTap(ctx context.Context, poolTap string, cluster string, plan Plan, node string) (Tap, error) {
	if err := checkPlan(plan); err != nil {
		return Tap{}, err
	}
	if !poolTapRe.MatchString(poolTap) {
		return Tap{}, fmt.Errorf("claiming tap %q: not a pool tap name (swp<owner>-<hash>, from AddPoolTap)", poolTap)
	}
	if node == "" {
		return Tap{}, fmt.Errorf("claiming tap %s for cluster %s: empty node name", poolTap, cluster)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	tap := Tap{Name: TapName(plan.Index, cluster, node), Bridge: BridgeName(plan.Index)}
	if _, err := m.cmd(ctx, "", "ip", "link", "set", "dev", poolTap, "name", tap.Name); err != nil {
		switch {
		case isNotFound(err):
			// Renamed by an earlier try, or gone with its VM.
			if _, serr := m.cmd(ctx, "", "ip", "-o", "link", "show", "dev", tap.Name); serr != nil {
				return Tap{}, fmt.Errorf("claiming pool tap %s for node %s of cluster %s: %w: the pool VM's tap is gone; destroy that VM and claim another",
					poolTap, node, cluster, err)
			}
		case isExists(err):
			return Tap{}, fmt.Errorf("renaming pool tap %s to %s: %w: node %s of cluster %s already has a tap; remove it (RemoveTap) or pick another node name",
				poolTap, tap.Name, err, node, cluster)
		case stderrHas(err, "device or resource busy"):
			return Tap{}, fmt.Errorf("renaming pool tap %s to %s: %w: the tap is up; set it down (ip link set dev %s down) and claim again",
				poolTap, tap.Name, err, poolTap)
		default:
			return Tap{}, explain(err, "renaming pool tap %s to %s", poolTap, tap.Name)
		}
	}
	if _, err := m.cmd(ctx, "", "ip", "link", "set", "dev", tap.Name, "master", tap.Bridge); err != nil {
		if isNotFound(err) {
			return Tap{}, fmt.Errorf("attaching tap %s to bridge %s: %w: run Ensure for cluster %s first", tap.Name, tap.Bridge, err, cluster)
		}
		return Tap{}, explain(err, "attaching tap %s to bridge %s", tap.Name, tap.Bridge)
	}
	if _, err := m.cmd(ctx, "", "ip", "link", "set", "dev", tap.Name, "up"); err != nil {
		return Tap{}, explain(err, "setting tap %s up", tap.Name)
	}
	m.log.Info("pool tap claimed", "cluster", cluster, "node", node, "poolTap", poolTap, "tap", tap.Name)
	return tap, nil
}

// RemoveTap deletes a tap made by AddTap, AddPoolTap or ClaimTap; a missing one is not
// an error.
func (m *Manager) RemoveTap(ctx context.Context, name string) error {
	if !tapRe.MatchString(name) && !poolTapRe.MatchString(name) && !legacyPoolTapRe.MatchString(name) {
		return fmt.Errorf("removing tap %q: not a socialweb tap name (swt<index>-<hash> or swp<owner>-<hash>); refusing to delete it", name)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.cmd(ctx, "", "ip", "link", "del", "dev", name); err != nil && !isNotFound(err) {
		return explain(err, "removing tap %s", name)
	}
	return nil
}

func (m *Manager) podRoute(plan Plan, podCIDR string, nodeIP net.IP) (string, error) {
	if err := checkPlan(plan); err != nil {
		return "", err
	}
	ip, n, err := net.ParseCIDR(podCIDR)
	if err != nil || ip.To4() == nil || !n.IP.Equal(ip) {
		return "", fmt.Errorf("pod route: %q is not an IPv4 network address in CIDR form (like 10.%d.2.0/24)", podCIDR, plan.Index)
	}
	ones, _ := n.Mask.Size()
	pones, _ := plan.PodCIDR.Mask.Size()
	if !plan.PodCIDR.Contains(n.IP) || ones < pones {
		return "", fmt.Errorf("pod route: %s is not inside cluster pod range %s", n, plan.PodCIDR)
	}
	if nodeIP.To4() == nil || !plan.NodeCIDR.Contains(nodeIP) || nodeIP.Equal(plan.Gateway) {
		return "", fmt.Errorf("pod route: node address %s is not a node address in %s", nodeIP, plan.NodeCIDR)
	}
	return n.String(), nil
}

// AddPodRoute routes a node's pod subnet via the node's address on the
// cluster bridge, so the host and the other nodes reach its pods.
func (m *Manager) AddPodRoute(ctx context.Context, plan Plan, podCIDR string, nodeIP net.IP) error {
	dst, err := m.podRoute(plan, podCIDR, nodeIP)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	br := BridgeName(plan.Index)
	if _, err := m.cmd(ctx, "", "ip", "route", "replace", dst, "via", nodeIP.String(), "dev", br); err != nil {
		if isNotFound(err) {
			return fmt.Errorf("routing pods %s via %s: %w: run Ensure for the cluster first", dst, nodeIP, err)
		}
		return explain(err, "routing pods %s via node %s on %s", dst, nodeIP, br)
	}
	return nil
}

// PodRoutes lists the cluster's pod routes (those AddPodRoute made): pod subnet ->
// node address.
func (m *Manager) PodRoutes(ctx context.Context, plan Plan) (map[string]net.IP, error) {
	if err := checkPlan(plan); err != nil {
		return nil, err
	}
	br := BridgeName(plan.Index)
	out, err := m.cmd(ctx, "", "ip", "route", "show", "dev", br)
	if err != nil {
		if isNotFound(err) {
			return map[string]net.IP{}, nil
		}
		return nil, explain(err, "listing routes on %s", br)
	}
	return parsePodRoutes(out, plan), nil
}

// parsePodRoutes picks "<subnet> via <node> ..." lines whose subnet lies in the cluster's
// pod range out of `ip route show dev <bridge>`.
func parsePodRoutes(out string, plan Plan) map[string]net.IP {
	routes := map[string]net.IP{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[1] != "via" {
			continue
		}
		_, n, err := net.ParseCIDR(f[0])
		via := net.ParseIP(f[2])
		if err != nil || via == nil || !plan.PodCIDR.Contains(n.IP) {
			continue
		}
		routes[n.String()] = via
	}
	return routes
}

// RemovePodRoute deletes a route added by AddPodRoute; a missing route (or
// bridge) is not an error.
func (m *Manager) RemovePodRoute(ctx context.Context, plan Plan, podCIDR string, nodeIP net.IP) error {
	dst, err := m.podRoute(plan, podCIDR, nodeIP)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	br := BridgeName(plan.Index)
	if _, err := m.cmd(ctx, "", "ip", "route", "del", dst, "via", nodeIP.String(), "dev", br); err != nil && !isNotFound(err) {
		return explain(err, "removing pod route %s via %s", dst, nodeIP)
	}
	return nil
}

// Remove deletes the cluster's taps (attached or not), its bridge (and with
// it the gateway address and pod routes through it), its nftables table and
// its DOCKER-USER rules. Other clusters are untouched. Idempotent.
func (m *Manager) Remove(ctx context.Context, cluster string, plan Plan) error {
	if plan.Index < 1 || plan.Index > MaxIndex {
		return fmt.Errorf("removing cluster %s: network index %d outside 1-%d", cluster, plan.Index, MaxIndex)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	links, err := m.links(ctx)
	if err != nil {
		return explain(err, "listing links to remove cluster %s's taps", cluster)
	}
	prefix := fmt.Sprintf("%s%d-", tapPrefix, plan.Index)
	for _, l := range links {
		if strings.HasPrefix(l, prefix) && tapRe.MatchString(l) {
			if _, err := m.cmd(ctx, "", "ip", "link", "del", "dev", l); err != nil && !isNotFound(err) {
				return explain(err, "removing tap %s of cluster %s", l, cluster)
			}
		}
	}
	br := BridgeName(plan.Index)
	if _, err := m.cmd(ctx, "", "ip", "link", "del", "dev", br); err != nil && !isNotFound(err) {
		return explain(err, "removing bridge %s of cluster %s", br, cluster)
	}
	t := TableName(plan.Index)
	script := fmt.Sprintf("table %s %s\ndelete table %s %s\n", tableFamily, t, tableFamily, t)
	if _, err := m.cmd(ctx, script, "nft", "-f", "-"); err != nil && !errors.Is(err, exec.ErrNotFound) {
		return explain(err, "removing nftables table %s %s", tableFamily, t)
	}
	if err := m.dockerUser(ctx, plan, false); err != nil {
		return err
	}
	delete(m.ensured, plan.Index)
	m.log.Info("cluster network removed", "cluster", cluster, "bridge", br)
	return nil
}

// PoolTaps lists owner's warm-pool taps not claimed (swp<owner>-<hash>): on daemon
// start and `down`, what is left of its pool VMs that are gone, to RemoveTap. Another
// owner's taps (another daemon's, maybe with pool VMs waiting on them) are not listed.
func (m *Manager) PoolTaps(ctx context.Context, owner string) ([]string, error) {
	if err := checkPoolTapOwner(owner); err != nil {
		return nil, fmt.Errorf("listing pool taps: %w", err)
	}
	links, err := m.links(ctx)
	if err != nil {
		return nil, explain(err, "listing links to find pool taps")
	}
	var taps []string
	for _, l := range links {
		if m := poolTapRe.FindStringSubmatch(l); m != nil && m[1] == owner {
			taps = append(taps, l)
		}
	}
	return taps, nil
}

// checkPoolTapOwner accepts what PoolTapOwner returns: 4 lower-case hex digits.
func checkPoolTapOwner(owner string) error {
	if !poolTapOwnerRe.MatchString(owner) {
		return fmt.Errorf("pool tap owner %q is not 4 lower-case hex digits (nodenet.PoolTapOwner of the state directory)", owner)
	}
	return nil
}

// links lists the names of the host's interfaces.
func (m *Manager) links(ctx context.Context) ([]string, error) {
	out, err := m.cmd(ctx, "", "ip", "-o", "link", "show")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, line := range strings.Split(out, "\n") {
		// "7: swb3: <BROADCAST,...>" or "9: veth0@if8: <...>"
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		names = append(names, name)
	}
	return names, nil
}

// Owned is what socialweb has on this host.
type Owned struct {
	Bridges []string // swb<index>
	Taps    []string // swt<index>-<hash>; unclaimed pool taps (swp<owner>-<hash>) are PoolTaps'
	Routes  []string // non-kernel routes through a socialweb bridge (pod routes), as `ip route` prints them
	Tables  []string // "inet socialweb-<index>"
}

// Empty reports whether nothing is owned.
func (o Owned) Empty() bool {
	return len(o.Bridges)+len(o.Taps)+len(o.Routes)+len(o.Tables) == 0
}

// Indexes returns every network index something owned belongs to, sorted:
// on restart, Remove those that no live cluster holds.
func (o Owned) Indexes() []int {
	var idx []int
	add := func(s string) {
		if i, err := strconv.Atoi(s); err == nil && !slices.Contains(idx, i) {
			idx = append(idx, i)
		}
	}
	for _, b := range o.Bridges {
		add(bridgeRe.FindStringSubmatch(b)[1])
	}
	for _, t := range o.Taps {
		add(tapRe.FindStringSubmatch(t)[1])
	}
	for _, t := range o.Tables {
		if m := tableRe.FindStringSubmatch(strings.TrimPrefix(t, tableFamily+" ")); m != nil {
			add(m[1])
		}
	}
	slices.Sort(idx)
	return idx
}

// List reports the socialweb-owned interfaces, routes and tables.
func (m *Manager) List(ctx context.Context) (Owned, error) {
	var o Owned
	links, err := m.links(ctx)
	if err != nil {
		return o, explain(err, "listing links")
	}
	for _, l := range links {
		switch {
		case bridgeRe.MatchString(l):
			o.Bridges = append(o.Bridges, l)
		case tapRe.MatchString(l):
			o.Taps = append(o.Taps, l)
		}
	}
	routes, err := m.cmd(ctx, "", "ip", "route", "show")
	if err != nil {
		return o, explain(err, "listing routes")
	}
	for _, line := range strings.Split(routes, "\n") {
		f := strings.Fields(line)
		i := slices.Index(f, "dev")
		if i < 0 || i+1 >= len(f) || !bridgeRe.MatchString(f[i+1]) || strings.Contains(line, "proto kernel") {
			continue
		}
		o.Routes = append(o.Routes, strings.TrimSpace(line))
	}
	tables, err := m.cmd(ctx, "", "nft", "list", "tables")
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return o, nil // no nft: no tables of ours either
		}
		return o, explain(err, "listing nftables tables")
	}
	for _, line := range strings.Split(tables, "\n") {
		f := strings.Fields(line) // "table inet socialweb-3"
		if len(f) == 3 && f[0] == "table" && f[1] == tableFamily && tableRe.MatchString(f[2]) {
			o.Tables = append(o.Tables, f[1]+" "+f[2])
		}
	}
	return o, nil
}
