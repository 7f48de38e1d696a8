package controlplane

import (
	"slices"
	"testing"
)

func TestAPIServerArgs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tenant  bool
		want    []string
		wantNot []string
	}{
		{"tenant", true,
			[]string{"--authorization-mode=Node,RBAC", "--enable-bootstrap-token-auth=true", "--enable-aggregator-routing=true", "--anonymous-auth=false"},
			[]string{"--endpoint-reconciler-type=none"}},
		{"management", false,
			[]string{"--authorization-mode=RBAC", "--endpoint-reconciler-type=none", "--anonymous-auth=false"},
			[]string{"--enable-aggregator-routing=true", "--enable-bootstrap-token-auth=true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := apiserverArgs(Config{Dir: "/d", Port: 6443, ServiceCIDR: "10.96.0.0/16", AdvertiseAddress: "10.0.0.1", Tenant: tc.tenant})
			for _, w := range tc.want {
				if !slices.Contains(args, w) {
					t.Errorf("missing %s in %v", w, args)
				}
			}
			for _, w := range tc.wantNot {
				if slices.Contains(args, w) {
					t.Errorf("unexpected %s in %v", w, args)
				}
			}
		})
	}
}
