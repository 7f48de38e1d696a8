package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestNodeClientCert(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	p, err := Ensure(t.TempDir(), Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	s, err := LoadClientSigner(p)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := s.NodeClientCert("n1", now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatalf("cert and key are not a pair: %v", err)
	}
	b, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(p.ClientCA)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("not a client certificate of the cluster's client CA: %v", err)
	}
	if cert.Subject.CommonName != "system:node:n1" || !slices.Equal(cert.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("subject %v, want CN system:node:n1 O system:nodes", cert.Subject)
	}
	if got := cert.NotAfter.Sub(now); got != NodeClientValidity {
		t.Errorf("valid for %v, want %v", got, NodeClientValidity)
	}
	// Another cluster's CA does not verify it.
	other, _ := Ensure(t.TempDir(), Options{Now: now})
	otherPEM, _ := os.ReadFile(other.ClientCA)
	otherPool := x509.NewCertPool()
	otherPool.AppendCertsFromPEM(otherPEM)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: otherPool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("another cluster's client CA verifies the node's certificate")
	}
	if _, _, err := s.NodeClientCert("", now); err == nil || !strings.Contains(err.Error(), "name") {
		t.Errorf("no name: err %v", err)
	}
	if _, err := LoadClientSigner(PathsFor(t.TempDir())); err == nil {
		t.Error("LoadClientSigner of an empty directory: no error")
	}
}
