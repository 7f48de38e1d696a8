// Package publicaddr says whether an address is on the public internet: what the host
// may dial on a tenant's behalf (the registry's upstreams, a tenant apiserver's
// webhooks) without reaching its own networks, its LAN or a metadata service.
package publicaddr

import (
	"net"
	"net/netip"
)

var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"), // CGNAT
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"), // NAT64 could reach any of the above
}

// Is reports whether a is a public unicast address: not loopback, link-local,
// multicast, unspecified, RFC 1918, ULA, CGNAT or reserved.
func Is(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsGlobalUnicast() || a.IsPrivate() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// Elsewhere is Is, and not an address of this host: a public address the host holds
// itself (its uplink's) reaches the host's own services, which a tenant must not make
// it dial. The host's addresses are read at each call, so one it gains later counts;
// if they cannot be read, nothing is elsewhere.
func Elsewhere(a netip.Addr) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	var own []netip.Addr
	for _, ad := range addrs {
		if p, err := netip.ParsePrefix(ad.String()); err == nil {
			own = append(own, p.Addr())
		}
	}
	return ElsewhereFrom(a, own)
}

// ElsewhereFrom is Elsewhere for a host whose addresses are own.
func ElsewhereFrom(a netip.Addr, own []netip.Addr) bool {
	a = a.Unmap()
	if !Is(a) {
		return false
	}
	for _, o := range own {
		if o.Unmap() == a {
			return false
		}
	}
	return true
}
