package pki

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"time"
)

// NodeCertValidity is how long a node's kubelet certificates are valid: a year, as the
// controller-manager's signer gives a CSR (--cluster-signing-duration's default). Nodes
// live hours; a kubelet rotates its client certificate through a CSR near the end anyway.
const NodeCertValidity = 365 * 24 * time.Hour

// NodeSigner issues a cluster's node certificates: the kubelet's client certificate from
// the client CA and its serving certificate from the server CA.
type NodeSigner struct{ client, server authority }

// LoadNodeSigner reads the client CA (Paths.ClientCA and ClientCAKey), which the tenant
// apiserver verifies client certificates against and the controller-manager signs kubelet
// CSRs with, and the server CA (ServerCA and ServerCAKey), which the tenant apiserver
// verifies the kubelet's serving certificate against (--kubelet-certificate-authority).
func LoadNodeSigner(p Paths) (*NodeSigner, error) {
	client, err := loadPair(p.ClientCA, p.ClientCAKey)
	if err != nil {
		return nil, fmt.Errorf("client CA %s: %w", p.ClientCA, err)
	}
	server, err := loadPair(p.ServerCA, p.ServerCAKey)
	if err != nil {
		return nil, fmt.Errorf("server CA %s: %w", p.ServerCA, err)
	}
	return &NodeSigner{client: client, server: server}, nil
}

// NodeClientCert issues the kubelet client certificate of node name (system:node:<name>
// in system:nodes, what the kubelet's TLS bootstrap would get from a CSR) with a new key,
// both PEM. A node given one starts its kubelet without the bootstrap's round trips.
func (s *NodeSigner) NodeClientCert(name string, now time.Time) (certPEM, keyPEM []byte, err error) {
	if name == "" {
		return nil, nil, fmt.Errorf("a node client certificate needs the node's name")
	}
	certPEM, keyPEM, err = nodeCert(&x509.Certificate{
		Subject:     nodeSubject(name),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, s.client, now)
	if err != nil {
		return nil, nil, fmt.Errorf("client certificate of node %s: %w", name, err)
	}
	return certPEM, keyPEM, nil
}

// NodeServingCert issues the serving certificate of node name's kubelet, valid for name
// and ip (the node's InternalIP, which the apiserver dials for logs, exec and
// port-forward), with a new key, both PEM. It is what a kubelet-serving CSR would get,
// signed by the server CA.
func (s *NodeSigner) NodeServingCert(name string, ip net.IP, now time.Time) (certPEM, keyPEM []byte, err error) {
	if name == "" {
		return nil, nil, fmt.Errorf("a node serving certificate needs the node's name")
	}
	if ip.To16() == nil {
		return nil, nil, fmt.Errorf("the serving certificate of node %s needs the node's address, not %q", name, ip)
	}
	certPEM, keyPEM, err = nodeCert(&x509.Certificate{
		Subject:     nodeSubject(name),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{name},
		IPAddresses: []net.IP{ip},
	}, s.server, now)
	if err != nil {
		return nil, nil, fmt.Errorf("serving certificate of node %s: %w", name, err)
	}
	return certPEM, keyPEM, nil
}

// nodeSubject is the subject the kubelet puts in its client and serving CSRs.
func nodeSubject(name string) pkix.Name {
	return pkix.Name{CommonName: "system:node:" + name, Organization: []string{"system:nodes"}}
}

// nodeCert signs tmpl with ca for a new key, valid from a little before now for
// NodeCertValidity, and returns both PEM.
func nodeCert(tmpl *x509.Certificate, ca authority, now time.Time) (certPEM, keyPEM []byte, err error) {
	tmpl.NotBefore = now.Add(-5 * time.Minute) // a guest clock a little behind the host's
	tmpl.NotAfter = now.Add(NodeCertValidity)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, key, err := issue(tmpl, ca)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}
