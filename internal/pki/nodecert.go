package pki

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"time"
)

// NodeClientValidity is how long a node's kubelet client certificate is valid: a year,
// as the controller-manager's signer gives a CSR (--cluster-signing-duration's default).
// Nodes live hours; a kubelet rotates its certificate through a CSR near the end anyway.
const NodeClientValidity = 365 * 24 * time.Hour

// Signer issues certificates from a cluster's client CA.
type Signer struct{ ca authority }

// LoadClientSigner reads the client CA (Paths.ClientCA and ClientCAKey): the CA the
// tenant apiserver verifies client certificates against and the controller-manager
// signs kubelet CSRs with.
func LoadClientSigner(p Paths) (*Signer, error) {
	ca, err := loadPair(p.ClientCA, p.ClientCAKey)
	if err != nil {
		return nil, fmt.Errorf("client CA %s: %w", p.ClientCA, err)
	}
	return &Signer{ca: ca}, nil
}

// NodeClientCert issues the kubelet client certificate of node name (system:node:<name>
// in system:nodes, what the kubelet's TLS bootstrap would get from a CSR) with a new key,
// both PEM. A node given one starts its kubelet without the bootstrap's round trips.
func (s *Signer) NodeClientCert(name string, now time.Time) (certPEM, keyPEM []byte, err error) {
	if name == "" {
		return nil, nil, fmt.Errorf("a node client certificate needs the node's name")
	}
	der, key, err := issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "system:node:" + name, Organization: []string{"system:nodes"}},
		NotBefore:   now.Add(-5 * time.Minute), // a guest clock a little behind the host's
		NotAfter:    now.Add(NodeClientValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, s.ca)
	if err != nil {
		return nil, nil, fmt.Errorf("node %s: %w", name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the key of node %s: %w", name, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}
