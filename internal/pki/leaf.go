package pki

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"time"
)

// Leaf is a certificate issued from one of a PKI directory's CAs (Paths.EnsureLeaf).
type Leaf struct {
	CommonName    string
	Organizations []string
	// Client: a client certificate from the client CA; else a serving certificate
	// from the server CA, valid for IPs and Names.
	Client bool
	IPs    []net.IP
	Names  []string
}

// EnsureLeaf keeps l's certificate and key at certPath and keyPath, issued by p's
// client or server CA. It is issued again when missing, when it no longer matches l,
// when that CA did not sign it (the CAs were replaced: a host joined a service) or
// when it expires within 30 days. The CA must exist; it is never made here.
func (p Paths) EnsureLeaf(certPath, keyPath string, l Leaf, now time.Time) error {
	if now.IsZero() {
		now = time.Now()
	}
	caCert, caKey, usage := p.ServerCA, p.ServerCAKey, x509.ExtKeyUsageServerAuth
	if l.Client {
		caCert, caKey, usage = p.ClientCA, p.ClientCAKey, x509.ExtKeyUsageClientAuth
	}
	ca, err := loadPair(caCert, caKey)
	if err != nil {
		return fmt.Errorf("CA %s: %w", caCert, err)
	}
	spec := leafSpec{subject: pkix.Name{CommonName: l.CommonName, Organization: l.Organizations}, usage: usage, ips: l.IPs, names: l.Names}
	return ensureLeaf(certPath, keyPath, spec, ca, now)
}
