package daemon

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/socialweb-computer/socialweb/internal/frontdoor"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/provider"
)

// --egress, --egress-allow and --egress-deny are read by Validate, before anything is
// created; a bad value names its flag and what would do.
func TestValidateEgress(t *testing.T) {
	base := Options{
		StateDir: t.TempDir(), APIPort: 7443, PortRange: "7500-7599", NetworkRange: "1-190", Accel: "tcg",
		FrontDoorDomain: frontdoor.DefaultDomain, FrontDoorMaxConnsPerSource: frontdoor.DefaultMaxConnsPerSource, FrontDoorMaxConns: frontdoor.DefaultMaxConns,
		Defaults: provider.Defaults{MaxNodes: 1, NodeCPUs: 1, PodsPerNode: 1, NodeMemory: resource.MustParse("1Gi")},
	}
	pfx := func(ss ...string) []netip.Prefix {
		var ps []netip.Prefix
		for _, s := range ss {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		return ps
	}
	tests := []struct {
		name    string
		change  func(*Options)
		want    nodenet.EgressPolicy
		wantErr string
	}{
		{"the default", func(*Options) {}, nodenet.EgressPolicy{Mode: nodenet.EgressInternet}, ""},
		{"internet", func(o *Options) { o.Egress = "internet" }, nodenet.EgressPolicy{Mode: nodenet.EgressInternet}, ""},
		{"none with an internal registry", func(o *Options) { o.Egress, o.EgressAllow = "none", []string{"192.168.5.0/24"} },
			nodenet.EgressPolicy{Mode: nodenet.EgressNone, Allow: pfx("192.168.5.0/24")}, ""},
		{"allow and deny", func(o *Options) {
			o.EgressAllow, o.EgressDeny = []string{"10.20.0.0/16"}, []string{"8.8.8.8/32", "1.1.1.0/24"}
		},
			nodenet.EgressPolicy{Mode: nodenet.EgressInternet, Allow: pfx("10.20.0.0/16"), Deny: pfx("8.8.8.8/32", "1.1.1.0/24")}, ""},
		{"an unknown mode", func(o *Options) { o.Egress = "lan" }, nodenet.EgressPolicy{},
			`--egress "lan": want internet (the public internet; private, link-local and the host's own networks walled off) or none`},
		{"an allow with host bits", func(o *Options) { o.EgressAllow = []string{"192.168.5.1/24"} }, nodenet.EgressPolicy{},
			`--egress-allow "192.168.5.1/24" has bits set past its length: want 192.168.5.0/24`},
		{"an allowed address without a length", func(o *Options) { o.EgressAllow = []string{"192.168.5.1"} }, nodenet.EgressPolicy{},
			`--egress-allow "192.168.5.1" has no length: want 192.168.5.1/32`},
		{"an IPv6 deny", func(o *Options) { o.EgressDeny = []string{"2001:db8::/32"} }, nodenet.EgressPolicy{},
			`--egress-deny "2001:db8::/32" is not IPv4`},
		{"a name", func(o *Options) { o.EgressDeny = []string{"metadata.internal"} }, nodenet.EgressPolicy{},
			`--egress-deny "metadata.internal" is not a CIDR: want ADDRESS/BITS`},
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.change(&o)
			v, err := Validate(context.Background(), o, log)
			if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Validate: %v, want %q", err, tc.wantErr)
			}
			if err == nil && (v.egress.Mode != tc.want.Mode || !slices.Equal(v.egress.Allow, tc.want.Allow) || !slices.Equal(v.egress.Deny, tc.want.Deny)) {
				t.Errorf("egress policy %+v, want %+v", v.egress, tc.want)
			}
		})
	}
}
