// Package publicaddr says whether an address is on the public internet: what the host
// may dial on a tenant's behalf (the registry's upstreams, a tenant apiserver's
// webhooks) without reaching its own networks, its LAN or a metadata service.
package publicaddr

import "net/netip"

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
