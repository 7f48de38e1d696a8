package publicaddr

import (
	"net/netip"
	"testing"
)

func TestElsewhereFrom(t *testing.T) {
	own := []netip.Addr{netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("2001:db8::7"), netip.MustParseAddr("10.0.0.5")}
	tests := []struct {
		addr string
		want bool
	}{
		{"8.8.8.8", true},
		{"203.0.113.7", false},        // the host's own uplink address
		{"::ffff:203.0.113.7", false}, // the same, v4-mapped
		{"203.0.113.8", true},         // a neighbour on the uplink
		{"2001:db8::7", false},
		{"10.0.0.5", false},
		{"127.0.0.1", false},
	}
	for _, tt := range tests {
		if got := ElsewhereFrom(netip.MustParseAddr(tt.addr), own); got != tt.want {
			t.Errorf("ElsewhereFrom(%s) = %t, want %t", tt.addr, got, tt.want)
		}
	}
	if Elsewhere(netip.MustParseAddr("127.0.0.1")) {
		t.Error("loopback is elsewhere")
	}
}
