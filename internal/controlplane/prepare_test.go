package controlplane

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"slices"
	"testing"

	"k8s.io/client-go/tools/clientcmd"

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

// A tenant's name (ServerName) is on its serving certificate and in the
// admin's kubeconfig, which then wakes it when it sleeps; the components'
// and the daemon's kubeconfigs do not send it, so they never wake it.
func TestPrepareServerName(t *testing.T) {
	const name = "ci.tenants.test"
	c := Config{Name: "ci", Dir: t.TempDir(), Port: 6443, AdvertiseAddress: "10.0.0.1", ServiceCIDR: "10.96.0.0/16",
		Datastore: "sqlite://x", Components: []string{APIServer}, Tenant: true, ServerName: name}
	if err := Prepare(c); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(c.PKI().ServingCert)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cert.DNSNames, name) || !slices.Contains(cert.DNSNames, "localhost") {
		t.Errorf("the serving certificate names %v; want %s among the usual names", cert.DNSNames, name)
	}
	for _, tc := range []struct {
		id   pki.Identity
		want string
	}{
		{pki.Admin, name},
		{pki.Daemon, ""},
		{pki.ControllerManager, ""},
		{pki.Scheduler, ""},
	} {
		kc, err := clientcmd.LoadFromFile(c.Kubeconfig(tc.id))
		if err != nil {
			t.Fatal(err)
		}
		cl := kc.Clusters[kc.Contexts[kc.CurrentContext].Cluster]
		if cl.Server != c.URL() || cl.TLSServerName != tc.want {
			t.Errorf("%s's kubeconfig names %s as %q, want %s as %q", tc.id.Name, cl.Server, cl.TLSServerName, c.URL(), tc.want)
		}
	}
}
