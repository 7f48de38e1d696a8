package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// poolOf is a pool holding the CA certificate in file.
func poolOf(t *testing.T, file string) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatalf("%s holds no certificate", file)
	}
	return pool
}

// pairCert checks that certPEM and keyPEM are a pair and returns the certificate.
func pairCert(t *testing.T, certPEM, keyPEM []byte) *x509.Certificate {
	t.Helper()
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatalf("cert and key are not a pair: %v", err)
	}
	b, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// clusterSigner is a new cluster's PKI and its node signer.
func clusterSigner(t *testing.T, now time.Time) (Paths, *NodeSigner) {
	t.Helper()
	p, err := Ensure(t.TempDir(), Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	s, err := LoadNodeSigner(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, s
}

func TestNodeClientCert(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	p, s := clusterSigner(t, now)
	certPEM, keyPEM, err := s.NodeClientCert("n1", now)
	if err != nil {
		t.Fatal(err)
	}
	cert := pairCert(t, certPEM, keyPEM)
	if cert.Subject.CommonName != "system:node:n1" || !slices.Equal(cert.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("subject %v, want CN system:node:n1 O system:nodes", cert.Subject)
	}
	if got := cert.NotAfter.Sub(now); got != NodeCertValidity {
		t.Errorf("valid for %v, want %v", got, NodeCertValidity)
	}
	other, err := Ensure(t.TempDir(), Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		roots  *x509.CertPool
		verify bool
	}{
		{"the cluster's client CA", poolOf(t, p.ClientCA), true},
		{"another cluster's client CA", poolOf(t, other.ClientCA), false},
		{"the cluster's server CA", poolOf(t, p.ServerCA), false},
	} {
		_, err := cert.Verify(x509.VerifyOptions{Roots: tc.roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		if (err == nil) != tc.verify {
			t.Errorf("%s verifies the node's client certificate: %v, want %v (err %v)", tc.name, err == nil, tc.verify, err)
		}
	}
	if _, _, err := s.NodeClientCert("", now); err == nil || !strings.Contains(err.Error(), "name") {
		t.Errorf("no name: err %v", err)
	}
}

func TestNodeServingCert(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	ip := net.ParseIP("10.250.3.2")
	p, s := clusterSigner(t, now)
	certPEM, keyPEM, err := s.NodeServingCert("n1", ip, now)
	if err != nil {
		t.Fatal(err)
	}
	cert := pairCert(t, certPEM, keyPEM)
	if !cert.NotBefore.Equal(now.Add(-5*time.Minute)) || cert.NotAfter.Sub(now) != NodeCertValidity {
		t.Errorf("valid %v to %v, want from 5 min before %v for %v", cert.NotBefore, cert.NotAfter, now, NodeCertValidity)
	}
	other, err := Ensure(t.TempDir(), Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	server := poolOf(t, p.ServerCA)
	for _, tc := range []struct {
		name   string
		roots  *x509.CertPool
		host   string // what the apiserver dials: the node's name or its InternalIP
		usage  x509.ExtKeyUsage
		verify bool
	}{
		{"the cluster's server CA, by IP", server, "10.250.3.2", x509.ExtKeyUsageServerAuth, true},
		{"the cluster's server CA, by name", server, "n1", x509.ExtKeyUsageServerAuth, true},
		{"another node's IP", server, "10.250.3.3", x509.ExtKeyUsageServerAuth, false},
		{"another node's name", server, "n2", x509.ExtKeyUsageServerAuth, false},
		{"as a client certificate", server, "10.250.3.2", x509.ExtKeyUsageClientAuth, false},
		{"another cluster's server CA", poolOf(t, other.ServerCA), "10.250.3.2", x509.ExtKeyUsageServerAuth, false},
		{"the cluster's client CA", poolOf(t, p.ClientCA), "10.250.3.2", x509.ExtKeyUsageServerAuth, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := cert.Verify(x509.VerifyOptions{Roots: tc.roots, DNSName: tc.host, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{tc.usage}})
			if (err == nil) != tc.verify {
				t.Errorf("verified %v, want %v (err %v)", err == nil, tc.verify, err)
			}
		})
	}
	for _, tc := range []struct {
		name, node string
		ip         net.IP
		wantErr    string
	}{
		{"no name", "", ip, "name"},
		{"no address", "n1", nil, "address"},
		{"a malformed address", "n1", net.IP{10, 250, 3}, "address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := s.NodeServingCert(tc.node, tc.ip, now); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("err %v, want one naming %q", err, tc.wantErr)
			}
		})
	}
}

func TestLoadNodeSignerNeedsBothCAs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		remove  func(Paths) string
		wantErr string
	}{
		{"no PKI", func(p Paths) string { return p.Dir }, "client CA"},
		{"no client CA key", func(p Paths) string { return p.ClientCAKey }, "client CA"},
		{"no server CA key", func(p Paths) string { return p.ServerCAKey }, "server CA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Ensure(t.TempDir(), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(tc.remove(p)); err != nil {
				t.Fatal(err)
			}
			if _, err := LoadNodeSigner(p); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("err %v, want one naming the %s", err, tc.wantErr)
			}
		})
	}
}
