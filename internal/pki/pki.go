// Package pki makes and keeps the certificate authorities and certificates of
// one cluster: a server CA for serving certificates, a client CA for client
// certificates, a service-account key pair and, for a cluster that aggregates
// APIs, a front-proxy CA for the apiserver's own certificate towards them. Every
// cluster has its own, so one tenant's credentials mean nothing to another's
// apiserver.
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/socialweb-computer/socialweb/internal/atomicfile"
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 365 * 24 * time.Hour
	// renewBefore reissues a leaf that would expire within this window when
	// Ensure runs (every control-plane start).
	renewBefore = 30 * 24 * time.Hour
)

// Client identities the control plane needs.
var (
	Admin             = Identity{Name: "admin", CommonName: "socialweb-admin", Organizations: []string{"system:masters"}}
	ControllerManager = Identity{Name: "controller-manager", CommonName: "system:kube-controller-manager"}
	Scheduler         = Identity{Name: "scheduler", CommonName: "system:kube-scheduler"}
	KubeletClient     = Identity{Name: "kubelet-client", CommonName: "kube-apiserver-kubelet-client", Organizations: []string{"system:masters"}}
	// Daemon is the daemon's own clients of a tenant (informers, scale driver, CCM):
	// an admin like Admin, but a user of its own, so the tenant can tell its requests
	// from a person's (a cluster that only the daemon talks to is idle).
	Daemon = Identity{Name: "daemon", CommonName: "socialweb-daemon", Organizations: []string{"system:masters"}}
	// FrontProxyClient is the apiserver itself when it proxies a request to an
	// aggregated API: signed by the front-proxy CA, never the client CA, so it
	// authenticates nowhere else, and the aggregated server trusts the user it names
	// in X-Remote-User only from this certificate.
	FrontProxyClient = Identity{Name: "front-proxy-client", CommonName: "front-proxy-client"}
)

// Identity is a client certificate's subject and the file name it is kept under.
type Identity struct {
	Name          string
	CommonName    string
	Organizations []string
}

// Options says what the serving certificate must be valid for.
type Options struct {
	ServingIPs   []net.IP
	ServingNames []string
	Clients      []Identity
	// FrontProxy makes the front-proxy CA and FrontProxyClient's certificate: a
	// tenant's apiserver proxies to aggregated APIs with them.
	FrontProxy bool
	Now        time.Time
}

// Paths are the files Ensure keeps in a cluster's PKI directory.
type Paths struct {
	Dir                                  string
	ServerCA, ServerCAKey                string
	ClientCA, ClientCAKey                string
	ServiceAccountKey, ServiceAccountPub string
	ServingCert, ServingKey              string
	// The front-proxy CA (--requestheader-client-ca-file), when Options.FrontProxy.
	FrontProxyCA, FrontProxyCAKey string
}

// Cert returns the certificate and key paths of a client identity.
func (p Paths) Cert(id Identity) (cert, key string) {
	return filepath.Join(p.Dir, id.Name+".crt"), filepath.Join(p.Dir, id.Name+".key")
}

// PathsFor names the files under dir without touching the disk.
func PathsFor(dir string) Paths {
	j := func(n string) string { return filepath.Join(dir, n) }
	return Paths{
		Dir:      dir,
		ServerCA: j("server-ca.crt"), ServerCAKey: j("server-ca.key"),
		ClientCA: j("client-ca.crt"), ClientCAKey: j("client-ca.key"),
		ServiceAccountKey: j("sa.key"), ServiceAccountPub: j("sa.pub"),
		ServingCert: j("apiserver.crt"), ServingKey: j("apiserver.key"),
		FrontProxyCA: j("front-proxy-ca.crt"), FrontProxyCAKey: j("front-proxy-ca.key"),
	}
}

// Ensure creates whatever is missing under dir and reissues leaves whose
// names no longer match or that are about to expire. CAs and the
// service-account key are never replaced: that would invalidate every
// credential already handed out. A directory made before a CA existed (the
// front-proxy CA) gets it added beside what it has.
func Ensure(dir string, opts Options) (Paths, error) {
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	p := PathsFor(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return p, fmt.Errorf("creating pki dir: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return p, fmt.Errorf("restricting pki dir: %w", err)
	}
	serverCA, err := ensureCA(p.ServerCA, p.ServerCAKey, "socialweb-server-ca", opts.Now)
	if err != nil {
		return p, err
	}
	clientCA, err := ensureCA(p.ClientCA, p.ClientCAKey, "socialweb-client-ca", opts.Now)
	if err != nil {
		return p, err
	}
	if err := ensureServiceAccountKey(p.ServiceAccountKey, p.ServiceAccountPub); err != nil {
		return p, err
	}
	serving := leafSpec{
		subject: pkix.Name{CommonName: "kube-apiserver"},
		usage:   x509.ExtKeyUsageServerAuth,
		ips:     opts.ServingIPs,
		names:   opts.ServingNames,
	}
	if err := ensureLeaf(p.ServingCert, p.ServingKey, serving, serverCA, opts.Now); err != nil {
		return p, err
	}
	for _, id := range opts.Clients {
		cert, key := p.Cert(id)
		spec := leafSpec{
			subject: pkix.Name{CommonName: id.CommonName, Organization: id.Organizations},
			usage:   x509.ExtKeyUsageClientAuth,
		}
		if err := ensureLeaf(cert, key, spec, clientCA, opts.Now); err != nil {
			return p, err
		}
	}
	if opts.FrontProxy {
		if err := ensureFrontProxy(p, opts.Now); err != nil {
			return p, err
		}
	}
	return p, nil
}

// ensureFrontProxy keeps the front-proxy CA and the client certificate it signs.
func ensureFrontProxy(p Paths, now time.Time) error {
	ca, err := ensureCA(p.FrontProxyCA, p.FrontProxyCAKey, "socialweb-front-proxy-ca", now)
	if err != nil {
		return err
	}
	cert, key := p.Cert(FrontProxyClient)
	spec := leafSpec{subject: pkix.Name{CommonName: FrontProxyClient.CommonName}, usage: x509.ExtKeyUsageClientAuth}
	if err := ensureLeaf(cert, key, spec, ca, now); err != nil {
		return fmt.Errorf("front-proxy client certificate: %w", err)
	}
	return nil
}

type authority struct {
	cert *x509.Certificate
	key  crypto.Signer
}

type leafSpec struct {
	subject pkix.Name
	usage   x509.ExtKeyUsage
	ips     []net.IP
	names   []string
}

func ensureCA(certPath, keyPath, cn string, now time.Time) (authority, error) {
	if ca, err := loadPair(certPath, keyPath); err == nil {
		return ca, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return authority{}, fmt.Errorf("loading CA %s: %w (move the pki directory aside to start over; every issued credential becomes invalid)", certPath, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return authority{}, fmt.Errorf("generating CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: fmt.Sprintf("%s@%d", cn, now.Unix())},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return authority{}, fmt.Errorf("signing CA %s: %w", cn, err)
	}
	if err := writePair(certPath, keyPath, der, key); err != nil {
		return authority{}, err
	}
	cert, _ := x509.ParseCertificate(der)
	return authority{cert: cert, key: key}, nil
}

func ensureLeaf(certPath, keyPath string, spec leafSpec, ca authority, now time.Time) error {
	if cur, err := loadPair(certPath, keyPath); err == nil && leafCurrent(cur.cert, spec, ca, now) {
		return nil
	}
	der, key, err := issue(&x509.Certificate{
		Subject:     spec.subject,
		NotBefore:   now.Add(-time.Hour),
		NotAfter:    now.Add(leafValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{spec.usage},
		IPAddresses: spec.ips,
		DNSNames:    spec.names,
	}, ca)
	if err != nil {
		return err
	}
	return writePair(certPath, keyPath, der, key)
}

// issue makes a new P-256 key and signs tmpl (given a fresh serial) for it with ca.
func issue(tmpl *x509.Certificate, ca authority) ([]byte, *ecdsa.PrivateKey, error) {
	name := tmpl.Subject.CommonName
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating key for %s: %w", name, err)
	}
	tmpl.SerialNumber = serial()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing certificate for %s: %w", name, err)
	}
	return der, key, nil
}

// leafCurrent says whether an existing leaf still matches what is wanted.
func leafCurrent(cert *x509.Certificate, spec leafSpec, ca authority, now time.Time) bool {
	if cert.CheckSignatureFrom(ca.cert) != nil || now.Add(renewBefore).After(cert.NotAfter) {
		return false
	}
	if cert.Subject.CommonName != spec.subject.CommonName || !slices.Equal(cert.Subject.Organization, spec.subject.Organization) {
		return false
	}
	if !slices.Equal(cert.DNSNames, spec.names) && !(len(cert.DNSNames) == 0 && len(spec.names) == 0) {
		return false
	}
	if len(cert.IPAddresses) != len(spec.ips) {
		return false
	}
	for i := range spec.ips {
		if !cert.IPAddresses[i].Equal(spec.ips[i]) {
			return false
		}
	}
	return true
}

func ensureServiceAccountKey(keyPath, pubPath string) error {
	if _, err := os.Stat(keyPath); err == nil {
		if _, err := os.Stat(pubPath); err == nil {
			return nil
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generating service-account key: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("encoding service-account key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return fmt.Errorf("encoding service-account public key: %w", err)
	}
	if err := atomicfile.Write(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	return atomicfile.Write(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644)
}

func loadPair(certPath, keyPath string) (authority, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return authority{}, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return authority{}, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return authority{}, fmt.Errorf("%s or %s is not PEM", certPath, keyPath)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return authority{}, fmt.Errorf("parsing %s: %w", certPath, err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return authority{}, fmt.Errorf("parsing %s: %w", keyPath, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return authority{}, fmt.Errorf("%s holds no signing key", keyPath)
	}
	return authority{cert: cert, key: signer}, nil
}

func writePair(certPath, keyPath string, der []byte, key *ecdsa.PrivateKey) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("encoding key %s: %w", keyPath, err)
	}
	if err := atomicfile.Write(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	return atomicfile.Write(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	return n
}

// ReadFile is os.ReadFile with the path in the error.
func ReadFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return bytes.TrimSpace(b), nil
}
