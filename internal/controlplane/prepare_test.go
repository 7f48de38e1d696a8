package controlplane

import (
	"os"
	"testing"

	"github.com/socialweb-computer/socialweb/internal/pki"
)

// Prepare runs before every start: a tenant's PKI has what its aggregation flags name
// (also a tenant made before they existed), the management plane's does not.
func TestPrepareFrontProxy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tenant bool
	}{
		{"tenant", true},
		{"management", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Name: "c", Dir: t.TempDir(), Port: 6443, AdvertiseAddress: "10.0.0.1", ServiceCIDR: "10.96.0.0/16",
				Datastore: "sqlite://x", Components: []string{APIServer}, Tenant: tc.tenant}
			if err := Prepare(c); err != nil {
				t.Fatal(err)
			}
			p := c.PKI()
			cert, key := p.Cert(pki.FrontProxyClient)
			for _, f := range []string{p.FrontProxyCA, p.FrontProxyCAKey, cert, key} {
				if _, err := os.Stat(f); (err == nil) != tc.tenant {
					t.Errorf("%s exists = %v, want %v", f, err == nil, tc.tenant)
				}
			}
		})
	}
}
