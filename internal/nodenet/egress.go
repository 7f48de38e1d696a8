package nodenet

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Served is what the host serves one cluster's nodes on the cluster's gateway
// address: with DNS (port 53, the forwarder every cluster gets), the only
// ports of the host its bridge may open (DESIGN.md, "Trust: who may reach
// what").
type Served struct {
	APIServer int // the tenant apiserver: the cluster's leased port
	Registry  int // the host registry (nodeservice.RegistryPort); 0: none
	// BuildCache is the host's build cache (nodeservice.BuildCachePort); 0: none.
	BuildCache int
	// Extra are TCP ports the operator opened on every gateway for a service of
	// its own on the host (EgressPolicy.HostTCP).
	Extra []int
}

// DNSPort is the gateway's DNS forwarder (UDP and TCP), served to every cluster.
const DNSPort = 53

func (s Served) check() error {
	if s.APIServer < 1 || s.APIServer > 65535 {
		return fmt.Errorf("apiserver port %d outside 1-65535: pass the cluster's leased port", s.APIServer)
	}
	if s.Registry < 0 || s.Registry > 65535 {
		return fmt.Errorf("registry port %d outside 1-65535 (0: none)", s.Registry)
	}
	if s.BuildCache < 0 || s.BuildCache > 65535 {
		return fmt.Errorf("build cache port %d outside 1-65535 (0: none)", s.BuildCache)
	}
	return nil
}

// tcpPorts are the gateway's TCP ports open to the bridge, sorted, each once.
func (s Served) tcpPorts() []int {
	ports := append([]int{DNSPort, s.APIServer}, s.Extra...)
	for _, p := range []int{s.Registry, s.BuildCache} {
		if p != 0 {
			ports = append(ports, p)
		}
	}
	slices.Sort(ports)
	return slices.Compact(ports)
}

// Egress is where forwarded traffic from a cluster's bridge may go by default.
type Egress string

const (
	// EgressInternet (the zero value too) forwards to anywhere but the walled
	// ranges and the host's own networks.
	EgressInternet Egress = "internet"
	// EgressNone forwards nothing but EgressPolicy.Allow.
	EgressNone Egress = "none"
)

// ParseEgress reads "internet" ("" too: the default) or "none".
func ParseEgress(s string) (Egress, error) {
	switch e := Egress(s); e {
	case "":
		return EgressInternet, nil
	case EgressInternet, EgressNone:
		return e, nil
	}
	return "", fmt.Errorf("%q: want internet (the public internet; private, link-local and the host's own networks walled off) or none (no forwarded egress)", s)
}

// EgressPolicy is the host's egress policy, the same for every cluster. Its
// zero value is the default: the internet, nothing opened or closed.
type EgressPolicy struct {
	Mode  Egress
	Allow []netip.Prefix // opened though walled (or under EgressNone)
	Deny  []netip.Prefix // closed; wins over Allow
	// HostTCP are TCP ports on each cluster's gateway the operator opens to its
	// nodes besides the ones socialweb serves (a git server or cache it runs on the
	// host for them): every tenant's nodes reach that host service.
	HostTCP []int
}

// Narrowing is what one cluster takes away from the host's EgressPolicy (its
// Cluster's egress and egressDeny): it can close more, never open anything.
type Narrowing struct {
	None bool           // forward nothing, not even the host's Allow
	Deny []netip.Prefix // closed on top of the host's Deny
}

// Narrow is e as the cluster n narrows it.
func (e EgressPolicy) Narrow(n Narrowing) EgressPolicy {
	out := e
	out.Deny = slices.Concat(e.Deny, n.Deny)
	if n.None {
		out.Mode, out.Allow = EgressNone, nil
	}
	return out
}

// Walled returns the IPv4 ranges a cluster's forwarded traffic may not
// reach unless the operator opens them: this network, RFC 1918, CGNAT,
// loopback, link-local (the cloud metadata address among them), multicast
// and the reserved 240/4 with the broadcast address. The host's own networks
// are walled too (HostNetworks, when the rules are applied).
func Walled() []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range []string{"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
		"172.16.0.0/12", "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4"} {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return ps
}

// ParsePrefixes reads IPv4 CIDRs (flag values, already split at commas):
// each a network address with its length, such as 192.168.10.0/24.
func ParsePrefixes(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			return nil, fmt.Errorf("an empty entry in %q: want CIDRs such as 192.168.10.0/24, separated by commas", strings.Join(list, ","))
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			if a, aerr := netip.ParseAddr(s); aerr == nil && a.Is4() {
				return nil, fmt.Errorf("%q has no length: want %s/32 for one address, or a network such as 192.168.10.0/24", s, s)
			}
			return nil, fmt.Errorf("%q is not a CIDR: want ADDRESS/BITS such as 192.168.10.0/24", s)
		}
		if !p.Addr().Is4() {
			return nil, fmt.Errorf("%q is not IPv4: node networks are IPv4 only (the bridges drop IPv6)", s)
		}
		if p.Masked() != p {
			return nil, fmt.Errorf("%q has bits set past its length: want %s", s, p.Masked())
		}
		out = append(out, p)
	}
	return out, nil
}

// mergePrefixes sorts ps and drops those inside another: nft refuses
// overlapping elements of an interval set.
func mergePrefixes(ps []netip.Prefix) []netip.Prefix {
	s := slices.Clone(ps)
	slices.SortFunc(s, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return cmp.Compare(a.Bits(), b.Bits())
	})
	var out []netip.Prefix
	for _, p := range s {
		// Sorted, and CIDRs either nest or are apart: only the last kept one
		// can hold p.
		if n := len(out); n > 0 && out[n-1].Contains(p.Addr()) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// HostNetworks lists the IPv4 networks of the host's interfaces (the subnet
// of each address, from `ip -j -4 addr show`), except socialweb's bridges:
// what a node reaches there is the host's LAN, not the internet.
func (m *Manager) HostNetworks(ctx context.Context) ([]netip.Prefix, error) {
	out, err := m.cmd(ctx, "", "ip", "-j", "-4", "addr", "show")
	if err != nil {
		return nil, explain(err, "listing the host's addresses (its own networks are walled off from the nodes)")
	}
	nets, err := parseHostNetworks(out)
	if err != nil {
		return nil, fmt.Errorf("reading `ip -j -4 addr show`: %w", err)
	}
	return nets, nil
}

func parseHostNetworks(out string) ([]netip.Prefix, error) {
	var links []struct {
		IfName   string `json:"ifname"`
		AddrInfo []struct {
			Family    string `json:"family"`
			Local     string `json:"local"`
			PrefixLen int    `json:"prefixlen"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		return nil, err
	}
	var nets []netip.Prefix
	for _, l := range links {
		if bridgeRe.MatchString(l.IfName) {
			continue
		}
		for _, a := range l.AddrInfo {
			addr, err := netip.ParseAddr(a.Local)
			if a.Family != "inet" || err != nil || !addr.Is4() {
				continue
			}
			p, err := addr.Prefix(a.PrefixLen)
			if err != nil {
				return nil, fmt.Errorf("address %s/%d of %s: %w", a.Local, a.PrefixLen, l.IfName, err)
			}
			nets = append(nets, p)
		}
	}
	return mergePrefixes(nets), nil
}

// mode is Mode with the zero value read as the default.
func (e EgressPolicy) mode() Egress {
	if e.Mode == "" {
		return EgressInternet
	}
	return e.Mode
}

// check refuses what ParseEgress and ParsePrefixes would not give.
func (e EgressPolicy) check() error {
	if _, err := ParseEgress(string(e.mode())); err != nil {
		return err
	}
	for _, p := range slices.Concat(e.Allow, e.Deny) {
		if !p.IsValid() || !p.Addr().Is4() || p.Masked() != p {
			return fmt.Errorf("%s is not an IPv4 network address with its length", p)
		}
	}
	return nil
}

// ParsePorts reads TCP port numbers, 1 to 65535.
func ParsePorts(ss []string) ([]int, error) {
	var ports []int
	for _, s := range ss {
		p, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("%q is not a TCP port: want 1 to 65535", s)
		}
		ports = append(ports, p)
	}
	return ports, nil
}
