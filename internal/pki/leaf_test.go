package pki

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestEnsureLeaf(t *testing.T) {
	dir := t.TempDir()
	p, err := Ensure(filepath.Join(dir, "pki"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	srv := Leaf{CommonName: "peer", IPs: []net.IP{net.ParseIP("10.0.0.2")}}
	cli := Leaf{CommonName: "socialweb-host:a", Client: true}
	sc, sk := filepath.Join(dir, "srv.crt"), filepath.Join(dir, "srv.key")
	cc, ck := filepath.Join(dir, "cli.crt"), filepath.Join(dir, "cli.key")
	for _, l := range []struct {
		leaf      Leaf
		cert, key string
		ca        string
		usage     x509.ExtKeyUsage
	}{{srv, sc, sk, p.ServerCA, x509.ExtKeyUsageServerAuth}, {cli, cc, ck, p.ClientCA, x509.ExtKeyUsageClientAuth}} {
		if err := p.EnsureLeaf(l.cert, l.key, l.leaf, now); err != nil {
			t.Fatal(err)
		}
		pair, err := tls.LoadX509KeyPair(l.cert, l.key)
		if err != nil {
			t.Fatal(err)
		}
		caPEM, _ := os.ReadFile(l.ca)
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(caPEM)
		opts := x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{l.usage}}
		if !l.leaf.Client {
			opts.DNSName = "10.0.0.2"
		}
		if _, err := pair.Leaf.Verify(opts); err != nil {
			t.Errorf("%s: %v", l.leaf.CommonName, err)
		}
	}
	// Kept while it matches; issued again for another address.
	before, _ := os.ReadFile(sc)
	if err := p.EnsureLeaf(sc, sk, srv, now); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(sc); string(again) != string(before) {
		t.Error("a current leaf was issued again")
	}
	srv.IPs = []net.IP{net.ParseIP("10.0.0.3")}
	if err := p.EnsureLeaf(sc, sk, srv, now); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(sc); string(again) == string(before) {
		t.Error("a leaf for another address was kept")
	}
	if err := PathsFor(filepath.Join(dir, "none")).EnsureLeaf(sc, sk, srv, now); err == nil {
		t.Error("a leaf was issued without its CA")
	}
}
