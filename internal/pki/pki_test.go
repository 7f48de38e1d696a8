package pki

import (
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: not PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func pool(t *testing.T, path string) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(readCert(t, path))
	return p
}

func ensure(t *testing.T, dir string, ips ...string) Paths {
	t.Helper()
	var parsed []net.IP
	for _, ip := range ips {
		parsed = append(parsed, net.ParseIP(ip))
	}
	p, err := Ensure(dir, Options{ServingIPs: parsed, ServingNames: []string{"localhost"}, Clients: []Identity{Admin, Scheduler}})
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	return p
}

func TestServingCertCoversLoopbackAndGateway(t *testing.T) {
	p := ensure(t, t.TempDir(), "127.0.0.1", "10.250.3.1")
	cert := readCert(t, p.ServingCert)
	for _, host := range []string{"127.0.0.1", "10.250.3.1", "localhost"} {
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: host, Roots: pool(t, p.ServerCA)}); err != nil {
			t.Errorf("serving cert not valid for %s: %v", host, err)
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: "10.250.4.1", Roots: pool(t, p.ServerCA)}); err == nil {
		t.Errorf("serving cert valid for another cluster's gateway")
	}
}

func TestClientCertsChainOnlyToTheirOwnClientCA(t *testing.T) {
	a := ensure(t, t.TempDir(), "127.0.0.1")
	b := ensure(t, t.TempDir(), "127.0.0.1")
	certA, _ := a.Cert(Admin)
	admin := readCert(t, certA)
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if _, err := admin.Verify(x509.VerifyOptions{Roots: pool(t, a.ClientCA), KeyUsages: usage}); err != nil {
		t.Errorf("A's admin cert does not verify against A's client CA: %v", err)
	}
	if _, err := admin.Verify(x509.VerifyOptions{Roots: pool(t, b.ClientCA), KeyUsages: usage}); err == nil {
		t.Errorf("A's admin cert verifies against B's client CA")
	}
	if _, err := admin.Verify(x509.VerifyOptions{Roots: pool(t, a.ServerCA), KeyUsages: usage}); err == nil {
		t.Errorf("a client cert verifies against the server CA: the CAs are not separate")
	}
	if got := admin.Subject.Organization; len(got) != 1 || got[0] != "system:masters" {
		t.Errorf("admin organizations = %v", got)
	}
}

func TestKeysAreOwnerOnly(t *testing.T) {
	p := ensure(t, t.TempDir(), "127.0.0.1")
	keys, _ := filepath.Glob(filepath.Join(p.Dir, "*.key"))
	if len(keys) < 5 {
		t.Fatalf("found %d keys, want at least 5", len(keys))
	}
	for _, k := range keys {
		st, err := os.Stat(k)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", k, st.Mode().Perm())
		}
	}
	st, _ := os.Stat(p.Dir)
	if st.Mode().Perm() != 0o700 {
		t.Errorf("pki dir mode %v, want 0700", st.Mode().Perm())
	}
}

func TestEnsureKeepsCAsAndReissuesChangedLeaves(t *testing.T) {
	tests := []struct {
		name        string
		secondIPs   []string
		wantReissue bool
	}{
		{"same names keep the serving cert", []string{"127.0.0.1"}, false},
		{"a new gateway reissues the serving cert", []string{"127.0.0.1", "10.250.9.1"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			p := ensure(t, dir, "127.0.0.1")
			ca1 := readCert(t, p.ServerCA)
			s1 := readCert(t, p.ServingCert)
			p = ensure(t, dir, tt.secondIPs...)
			if !readCert(t, p.ServerCA).Equal(ca1) {
				t.Errorf("server CA replaced by a second Ensure")
			}
			reissued := !readCert(t, p.ServingCert).Equal(s1)
			if reissued != tt.wantReissue {
				t.Errorf("serving cert reissued = %v, want %v", reissued, tt.wantReissue)
			}
		})
	}
}

func TestExpiringLeafIsRenewed(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	if _, err := Ensure(dir, Options{ServingIPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Now: now}); err != nil {
		t.Fatal(err)
	}
	s1 := readCert(t, PathsFor(dir).ServingCert)
	later := now.Add(leafValidity - renewBefore/2)
	if _, err := Ensure(dir, Options{ServingIPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Now: later}); err != nil {
		t.Fatal(err)
	}
	if readCert(t, PathsFor(dir).ServingCert).Equal(s1) {
		t.Errorf("a serving cert inside its renewal window was not renewed")
	}
}

// Turning the front door on adds the cluster's SNI name: an existing serving
// certificate without it is reissued by the same CA (so every kubeconfig
// handed out stays valid) and then verifies for that name.
func TestAddedNameReissuesServingCert(t *testing.T) {
	dir := t.TempDir()
	ips := []net.IP{net.IPv4(127, 0, 0, 1)}
	p, err := Ensure(dir, Options{ServingIPs: ips, ServingNames: []string{"localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	ca1, s1 := readCert(t, p.ServerCA), readCert(t, p.ServingCert)
	const sni = "ci.socialweb.localhost"
	if _, err := s1.Verify(x509.VerifyOptions{DNSName: sni, Roots: pool(t, p.ServerCA)}); err == nil {
		t.Fatalf("the first serving cert is already valid for %s", sni)
	}
	for range 2 { // the second Ensure must keep what the first made
		if p, err = Ensure(dir, Options{ServingIPs: ips, ServingNames: []string{"localhost", sni}}); err != nil {
			t.Fatal(err)
		}
	}
	s2 := readCert(t, p.ServingCert)
	if s2.Equal(s1) || !readCert(t, p.ServerCA).Equal(ca1) {
		t.Fatalf("serving cert reissued %v, CA kept %v; want reissued by the same CA", !s2.Equal(s1), readCert(t, p.ServerCA).Equal(ca1))
	}
	for _, name := range []string{sni, "localhost", "127.0.0.1"} {
		if _, err := s2.Verify(x509.VerifyOptions{DNSName: name, Roots: pool(t, p.ServerCA)}); err != nil {
			t.Errorf("reissued serving cert not valid for %s: %v", name, err)
		}
	}
}

func TestKubeconfigViaNamesTheServerName(t *testing.T) {
	p := ensure(t, t.TempDir(), "127.0.0.1")
	for _, tc := range []struct{ server, serverName string }{
		{"https://127.0.0.1:7500", ""},
		{"https://127.0.0.1:8443", "ci.socialweb.localhost"},
	} {
		b, err := KubeconfigVia(p, Admin, "ci", tc.server, tc.serverName)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := clientcmd.RESTConfigFromKubeConfig(b)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Host != tc.server || cfg.TLSClientConfig.ServerName != tc.serverName {
			t.Errorf("kubeconfig names %s and server name %q, want %s and %q", cfg.Host, cfg.TLSClientConfig.ServerName, tc.server, tc.serverName)
		}
	}
}

// The front-proxy CA is the tenant's own: its client certificate (CN front-proxy-client,
// client auth) verifies against it alone, not another tenant's nor the cluster's client
// CA (so it is no credential for the apiserver itself).
func TestFrontProxyIsPerClusterAndForClientAuth(t *testing.T) {
	opts := Options{ServingIPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Clients: []Identity{Admin}, FrontProxy: true}
	a, err := Ensure(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Ensure(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if readCert(t, a.FrontProxyCA).Equal(readCert(t, b.FrontProxyCA)) {
		t.Fatal("two clusters share a front-proxy CA")
	}
	certA, keyA := a.Cert(FrontProxyClient)
	fp := readCert(t, certA)
	if fp.Subject.CommonName != "front-proxy-client" || len(fp.Subject.Organization) != 0 {
		t.Errorf("front-proxy client subject %v, want CN front-proxy-client and no organization", fp.Subject)
	}
	if !slices.Equal(fp.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
		t.Errorf("front-proxy client usages %v, want client auth only", fp.ExtKeyUsage)
	}
	for _, tc := range []struct {
		name  string
		roots string
		ok    bool
	}{
		{"its own front-proxy CA", a.FrontProxyCA, true},
		{"another cluster's front-proxy CA", b.FrontProxyCA, false},
		{"its cluster's client CA", a.ClientCA, false},
		{"its cluster's server CA", a.ServerCA, false},
	} {
		_, err := fp.Verify(x509.VerifyOptions{Roots: pool(t, tc.roots), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		if (err == nil) != tc.ok {
			t.Errorf("verifies against %s = %v, want %v", tc.name, err == nil, tc.ok)
		}
	}
	for _, k := range []string{keyA, a.FrontProxyCAKey} {
		if st, err := os.Stat(k); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", k, err, st.Mode().Perm())
		}
	}
}

// A cluster made before the front-proxy CA existed gets it at its next Ensure, and
// keeps its CAs and client certificates; without FrontProxy none is made.
func TestFrontProxyAddedToAnExistingCluster(t *testing.T) {
	for _, tc := range []struct {
		name       string
		frontProxy bool
	}{
		{"tenant: added", true},
		{"management: none", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := ensure(t, dir, "127.0.0.1") // no FrontProxy: a cluster of an older daemon
			if _, err := os.Stat(p.FrontProxyCA); !os.IsNotExist(err) {
				t.Fatalf("front-proxy CA made without FrontProxy: %v", err)
			}
			admin, _ := p.Cert(Admin)
			before := map[string]*x509.Certificate{p.ServerCA: readCert(t, p.ServerCA), p.ClientCA: readCert(t, p.ClientCA), admin: readCert(t, admin), p.ServingCert: readCert(t, p.ServingCert)}
			for range 2 { // the second keeps what the first made
				if _, err := Ensure(dir, Options{ServingIPs: []net.IP{net.ParseIP("127.0.0.1")}, ServingNames: []string{"localhost"},
					Clients: []Identity{Admin, Scheduler}, FrontProxy: tc.frontProxy}); err != nil {
					t.Fatal(err)
				}
			}
			for path, c := range before {
				if !readCert(t, path).Equal(c) {
					t.Errorf("%s replaced", path)
				}
			}
			fcert, fkey := p.Cert(FrontProxyClient)
			for _, f := range []string{p.FrontProxyCA, p.FrontProxyCAKey, fcert, fkey} {
				if _, err := os.Stat(f); (err == nil) != tc.frontProxy {
					t.Errorf("%s exists = %v, want %v", f, err == nil, tc.frontProxy)
				}
			}
			if tc.frontProxy {
				if _, err := readCert(t, fcert).Verify(x509.VerifyOptions{Roots: pool(t, p.FrontProxyCA), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
					t.Errorf("front-proxy client does not verify against the front-proxy CA: %v", err)
				}
			}
		})
	}
}
