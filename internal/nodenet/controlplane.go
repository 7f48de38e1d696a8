package nodenet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The kernel's wall around a tenant control plane's outbound connections. The
// control plane runs as a uid of its own (tenantuid), so one nftables table per
// control plane, hooked on output, can match the new connections of that uid and
// refuse all but where the control plane has business. It stands under the
// apiserver's egress proxy (controlplane/egress.go, in the same process): a flaw
// that gets past the proxy, or a dial that never went through it, meets this.
//
// Why a uid match and not a network namespace per tenant: the uid is already
// there, the control plane keeps the daemon's listening socket (the sleep gate
// hands it over) and its loopback, and no veth, route or NAT per tenant is
// needed. The match is positive (`meta skuid U ... jump`): a packet without a
// socket (a kernel RST) has no uid, and a negated test would let it through.

// cpTablePrefix names a control plane's wall: socialweb-cp-<its apiserver port>.
// A port is held by one cluster of one daemon at a time on a host, so is the uid
// derived from it, and so is this name. It is not tableRe's: orphan cleanup of
// node networks leaves it alone.
const cpTablePrefix = "socialweb-cp-"

var cpTableRe = regexp.MustCompile(`^socialweb-cp-([0-9]{1,5})$`)

// ControlPlaneTable is the nftables table (family inet) walling the control plane
// that serves port.
func ControlPlaneTable(port int) string { return cpTablePrefix + strconv.Itoa(port) }

// counterControlPlane counts the new connections a control plane's wall refused.
const counterControlPlane = "controlplane_denied"

// ControlPlaneReach is where one tenant control plane may open connections: its
// own apiserver port on loopback (its controller-manager and scheduler, and the
// apiserver's own loopback client), its cluster's nodes and Pods except the
// gateway (the host), its datastore server, and, when the cluster's egress lets
// its nodes reach the internet, the host's DNS resolvers and public addresses
// (URL webhooks, audit). Nothing else: not another tenant's port on loopback, not
// the host's LAN, not link-local.
type ControlPlaneReach struct {
	UID  int // the control plane's uid (tenantuid.For); never 0
	Port int // its apiserver port
	// Plan is the cluster's node network; nil while it holds none.
	Plan *Plan
	// Datastore is where its kine dials a datastore server (postgres); none for sqlite.
	Datastore []netip.AddrPort
	// Resolvers are the host's DNS servers (HostResolvers), reached only with the internet.
	Resolvers []netip.Addr
}

func (r ControlPlaneReach) check() error {
	if r.UID < 1 || r.UID > 1<<32-2 {
		return fmt.Errorf("uid %d: a control plane's wall needs its own uid (not root): serve with --control-plane-uid-base", r.UID)
	}
	if r.Port < 1 || r.Port > 65535 {
		return fmt.Errorf("apiserver port %d outside 1-65535: pass the cluster's leased port", r.Port)
	}
	if r.Plan != nil {
		if err := checkPlan(*r.Plan); err != nil {
			return err
		}
	}
	return nil
}

// ControlPlaneRuleset is the nft script WallControlPlane applies: it replaces the
// control plane's table atomically (create-if-missing, delete, define). Only new
// connections are looked at: the replies of the apiserver to its clients, and
// connections already open, pass. A refusal is a TCP reset or an ICMP
// admin-prohibited, so the dial fails at once, and is counted.
func ControlPlaneRuleset(cluster string, r ControlPlaneReach, egress EgressPolicy, hostNets []netip.Prefix) string {
	t := ControlPlaneTable(r.Port)
	var allow []string
	add := func(format string, a ...any) { allow = append(allow, fmt.Sprintf(format, a...)) }
	add("ip daddr 127.0.0.1 tcp dport %d accept", r.Port)
	add("ip6 daddr ::1 tcp dport %d accept", r.Port)
	for _, ap := range r.Datastore {
		add("%s daddr %s tcp dport %d accept", ipFamily(ap.Addr()), ap.Addr().Unmap(), ap.Port())
	}
	if r.Plan != nil {
		// The gateway is in the node network, and is the host.
		add("ip daddr != %s ip daddr { %s, %s } accept", r.Plan.Gateway, r.Plan.NodeCIDR, r.Plan.PodCIDR)
	}
	if egress.mode() == EgressInternet {
		for _, a := range r.Resolvers {
			add("%s daddr %s meta l4proto { tcp, udp } th dport %d accept", ipFamily(a), a.Unmap(), DNSPort)
		}
		if deny := mergePrefixes(egress.Deny); len(deny) > 0 {
			add("ip daddr { %s } counter name \"%s\" reject with icmpx admin-prohibited", joinPrefixes(deny), counterControlPlane)
		}
		add("ip daddr != { %s } accept", joinPrefixes(mergePrefixes(slices.Concat(Walled(), hostNets))))
	}
	// A reject with tcp reset matches only TCP: the ICMP one takes the rest.
	add("meta l4proto tcp counter name \"%s\" reject with tcp reset", counterControlPlane)
	add("counter name \"%s\" reject with icmpx admin-prohibited", counterControlPlane)

	var b strings.Builder
	fmt.Fprintf(&b, "table %s %s\ndelete table %s %s\n", tableFamily, t, tableFamily, t)
	fmt.Fprintf(&b, "table %s %s {\n", tableFamily, t)
	fmt.Fprintf(&b, "\tcomment \"socialweb cluster %s control plane, uid %d (managed: edits are overwritten)\"\n", commentSafe(cluster), r.UID)
	fmt.Fprintf(&b, "\tcounter %s {\n\t\tcomment \"new connections of uid %d its wall refused\"\n\t}\n", counterControlPlane, r.UID)
	fmt.Fprintf(&b, "\tchain output {\n\t\ttype filter hook output priority filter - 10; policy accept;\n")
	fmt.Fprintf(&b, "\t\tmeta skuid %d ct state new jump wall\n\t}\n", r.UID)
	b.WriteString("\tchain wall {\n")
	for _, rule := range allow {
		fmt.Fprintf(&b, "\t\t%s\n", rule)
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}

func ipFamily(a netip.Addr) string {
	if a.Unmap().Is4() {
		return "ip"
	}
	return "ip6"
}

// WallControlPlane writes (or rewrites) the wall of the control plane r names,
// under the host's egress policy as the cluster narrows it. Idempotent; the
// control plane's process must not start before it returns.
func (m *Manager) WallControlPlane(ctx context.Context, cluster string, r ControlPlaneReach, narrow Narrowing) error {
	if err := r.check(); err != nil {
		return fmt.Errorf("walling the control plane of cluster %s: %w", cluster, err)
	}
	egress := m.Egress.Narrow(narrow)
	if err := egress.check(); err != nil {
		return fmt.Errorf("walling the control plane of cluster %s: egress policy: %w", cluster, err)
	}
	hostNets, err := m.HostNetworks(ctx)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.cmd(ctx, ControlPlaneRuleset(cluster, r, egress, hostNets), "nft", "-f", "-"); err != nil {
		return explain(err, "installing nftables table %s %s (the wall of cluster %s's control plane)", tableFamily, ControlPlaneTable(r.Port), cluster)
	}
	m.walled[r.Port] = cluster
	m.log.Info("control plane walled", "cluster", cluster, "uid", r.UID, "table", tableFamily+" "+ControlPlaneTable(r.Port),
		"nodeNetwork", r.Plan != nil, "datastore", r.Datastore, "internet", egress.mode() == EgressInternet)
	return nil
}

// UnwallControlPlane removes the wall of the control plane that served port,
// once its process is gone. Removing what is gone is not an error.
func (m *Manager) UnwallControlPlane(ctx context.Context, port int) error {
	t := ControlPlaneTable(port)
	m.mu.Lock()
	defer m.mu.Unlock()
	_, err := m.cmd(ctx, "", "nft", "delete", "table", tableFamily, t)
	if err != nil && !isNotFound(err) && !errors.Is(err, exec.ErrNotFound) {
		return explain(err, "removing nftables table %s %s", tableFamily, t)
	}
	delete(m.walled, port)
	return nil
}

// HostResolvers reads the nameserver lines of a resolv.conf (/etc/resolv.conf):
// the DNS servers a control plane's resolver asks. A missing file is none.
func HostResolvers(path string) ([]netip.Addr, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the host's DNS servers: %w", err)
	}
	defer f.Close()
	var out []netip.Addr
	s := bufio.NewScanner(f)
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		// A zone (fe80::1%eth0) is not nft's: such a server is not reached.
		if a, err := netip.ParseAddr(f[1]); err == nil && a.Zone() == "" && !slices.Contains(out, a.Unmap()) {
			out = append(out, a.Unmap())
		}
	}
	return out, s.Err()
}
