package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/pki"
	"github.com/socialweb-computer/socialweb/internal/registry"
)

// The registry's peer listener: the hosts of one service fetch each other's pushed
// images from it (registry.PeerHandler; why pushed images travel and pulled ones do
// not is in internal/registry/peers.go).
//
// It speaks TLS only, with a serving certificate from the management API's server CA
// and a client certificate required and verified against the management API's client
// CA; only a client certificate named socialweb-host:NAME is served. Both CAs are the
// service's (every host shares them through the datastore). Nodes run tenant code,
// and a node may well reach this port, but no node ever holds a certificate of that
// client CA (tenants' clusters have CAs of their own; the management API signs no
// CSRs), so to a node the listener is a TLS handshake that fails. Nothing is served
// without a verified client certificate.

// DefaultRegistryPeerPort is the peer listener's port on --host-address when
// --registry-peer-address is not given.
const DefaultRegistryPeerPort = 7444

// HostIdentityPrefix begins the common name of the client certificate a host
// presents to other hosts' peer listeners: socialweb-host:NAME.
const HostIdentityPrefix = "socialweb-host:"

// peerPollEvery is how often the Hosts are read for their peer listeners.
const peerPollEvery = 10 * time.Second

// registryPeerAddress is where this host's peer listener listens and the host:port
// other hosts reach it at, both "" when it is off. explicit says the address was
// asked for (--registry-peer-address), not defaulted from --host-address.
func registryPeerAddress(o Options) (listen, reported string, explicit bool, err error) {
	addr := o.RegistryPeerAddress
	if addr == "" {
		if o.HostAddress == "" {
			return "", "", false, nil
		}
		a := net.JoinHostPort(strings.Trim(o.HostAddress, "[]"), strconv.Itoa(DefaultRegistryPeerPort))
		return a, a, false, nil
	}
	want := "want HOST:PORT such as 10.0.0.2:7444, or 0.0.0.0:7444 (every interface) with --host-address, or \"\""
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", "", true, fmt.Errorf("--registry-peer-address %q: %v; %s", addr, err, want)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", "", true, fmt.Errorf("--registry-peer-address %q: port %q; %s", addr, port, want)
	}
	if p, _ := strconv.Atoi(port); p == o.APIPort {
		return "", "", true, fmt.Errorf("--registry-peer-address %q: port %d is the management API's (--api-port); pick another", addr, p)
	}
	ip := net.ParseIP(host)
	if host != "" && ip == nil && len(validation.IsDNS1123Subdomain(host)) > 0 {
		return "", "", true, fmt.Errorf("--registry-peer-address %q: host %q is neither an IP address nor a DNS name; %s", addr, host, want)
	}
	if host == "" || ip != nil && ip.IsUnspecified() {
		if o.HostAddress == "" {
			return "", "", true, fmt.Errorf("--registry-peer-address %q listens on every interface, which gives other hosts no address to reach it at: pass --host-address too, or name one address", addr)
		}
		return addr, net.JoinHostPort(strings.Trim(o.HostAddress, "[]"), port), true, nil
	}
	return addr, addr, true, nil
}

// validateRegistryPeer checks --registry-peer-address.
func validateRegistryPeer(o Options) error {
	_, _, _, err := registryPeerAddress(o)
	return err
}

// listenRegistryPeers takes the peer listener's address and records in v the address
// other hosts reach it at. A defaulted address that cannot be taken (a --host-address
// this machine does not hold, behind NAT) leaves the listener off, loudly; one asked
// for is an error.
func listenRegistryPeers(v *validated, log *slog.Logger) (net.Listener, error) {
	listen, reported, explicit, err := registryPeerAddress(v.Options)
	if err != nil || listen == "" {
		return nil, err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil && explicit {
		return nil, fmt.Errorf("--registry-peer-address %s: %w: stop what listens there or pick another address", listen, err)
	}
	if err != nil {
		log.Warn("the registry's peer listener is off: other hosts' nodes cannot fetch the images pushed on this host; pass --registry-peer-address",
			"address", listen, "err", err)
		return nil, nil
	}
	v.registryPeer = reported
	return ln, nil
}

// registryPeers is this host's side of the exchange: the client other hosts' peer
// listeners are asked with, and the live hosts that have one.
type registryPeers struct {
	self   string
	client *http.Client
	certs  *hostCerts
	log    *slog.Logger

	mu    sync.Mutex
	peers []registry.Peer
}

// List is the other live hosts' registries, at the last poll (registry.Server.Peers).
func (p *registryPeers) List() []registry.Peer {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.peers
}

// hostLiveness is what the peer list asks membership (hosts.Membership.HostLive).
type hostLiveness interface {
	HostLive(host string) (live, known bool)
}

// startRegistryPeers serves the registry under STATE/registry to other hosts on ln
// (nil: no listener) and keeps the list of other hosts' listeners, until ctx ends.
func startRegistryPeers(ctx context.Context, v validated, ln net.Listener, live hostLiveness, dyn dynamic.Interface, log *slog.Logger) (*registryPeers, error) {
	log = log.With("component", "registry-peers")
	certs, err := newHostCerts(v.StateDir, v.hostName, v.registryPeer, log)
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return nil, err
	}
	p := &registryPeers{self: v.hostName, client: certs.peerClient(), certs: certs, log: log}
	if ln != nil {
		dir := filepath.Join(v.StateDir, "registry")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			ln.Close()
			return nil, fmt.Errorf("creating the registry dir: %w", err)
		}
		rs := &registry.Server{Dir: dir, Logger: log}
		go func() {
			if err := servePeers(ctx, ln, certs, rs.PeerHandler(), log); err != nil {
				log.Error("the registry's peer listener stopped", "err", err)
			}
		}()
		log.Info("registry peer listener", "address", ln.Addr().String(), "reported", v.registryPeer)
	}
	go p.run(ctx, live, dyn)
	return p, nil
}

// servePeers serves h over mutual TLS on ln until ctx ends.
func servePeers(ctx context.Context, ln net.Listener, certs *hostCerts, h http.Handler, log *slog.Logger) error {
	srv := &http.Server{
		Handler:           onlyHosts(h, log),
		TLSConfig:         certs.serverConfig(),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug), // failed handshakes (a node, a scanner)
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			srv.Close()
		}
	}()
	err := srv.ServeTLS(ln, "", "")
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// onlyHosts serves a request only with a verified client certificate of another
// host (the TLS configuration already refuses a connection without one verified
// against the client CA; this also refuses the CA's other users, the operator's
// admin certificate among them).
func onlyHosts(h http.Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 ||
			!strings.HasPrefix(r.TLS.VerifiedChains[0][0].Subject.CommonName, HostIdentityPrefix) {
			cn := ""
			if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
				cn = r.TLS.PeerCertificates[0].Subject.CommonName
			}
			log.Warn("refused a request without a host's client certificate", "remote", r.RemoteAddr, "subject", cn, "path", r.URL.Path)
			http.Error(w, `{"errors":[{"code":"DENIED","message":"only the service's hosts are served here"}]}`, http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// run reads the Hosts every peerPollEvery until ctx ends.
func (p *registryPeers) run(ctx context.Context, live hostLiveness, dyn dynamic.Interface) {
	t := time.NewTicker(peerPollEvery)
	defer t.Stop()
	for {
		p.poll(ctx, live, dyn)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// poll lists the other hosts that report a peer listener and are live (or not yet
// known to membership).
func (p *registryPeers) poll(ctx context.Context, live hostLiveness, dyn dynamic.Interface) {
	list, err := dyn.Resource(v1.HostGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		if ctx.Err() == nil {
			p.log.Warn("reading the Hosts for their registries", "err", err)
		}
		return
	}
	var peers []registry.Peer
	for i := range list.Items {
		h, err := v1.HostFromUnstructured(&list.Items[i])
		if err != nil || h.Name == p.self || h.Status.Registry == "" {
			continue
		}
		if ok, known := live.HostLive(h.Name); known && !ok {
			continue
		}
		peers = append(peers, registry.Peer{Name: h.Name, BaseURL: "https://" + h.Status.Registry, Client: p.client})
	}
	slices.SortFunc(peers, func(a, b registry.Peer) int { return strings.Compare(a.Name, b.Name) })
	p.mu.Lock()
	changed := !slices.EqualFunc(peers, p.peers, func(a, b registry.Peer) bool { return a.Name == b.Name && a.BaseURL == b.BaseURL })
	p.peers = peers
	p.mu.Unlock()
	if changed {
		names := make([]string, len(peers))
		for i, pe := range peers {
			names[i] = pe.Name + "=" + pe.BaseURL
		}
		p.log.Info("registry peers", "peers", names)
	}
}

// hostCerts are this host's certificates towards other hosts: a serving certificate
// for its peer listener from the management server CA, and a client certificate
// (CN socialweb-host:NAME) from the management client CA. Kept under
// STATE/registry-peer and checked again (renewed, or issued again if the CAs
// changed) at most every certCheckEvery.
type hostCerts struct {
	log        *slog.Logger
	paths      pki.Paths
	dir        string
	server     pki.Leaf
	client     pki.Leaf
	serverCAs  *x509.CertPool // verify peers' listeners
	clientCAs  *x509.CertPool // verify peers' client certificates
	mu         sync.Mutex
	checked    time.Time
	serverCert *tls.Certificate
	clientCert *tls.Certificate
}

const certCheckEvery = time.Hour

// newHostCerts reads the management API's CAs under stateDir and issues host's
// certificates; the serving one is valid for the host of reported ("" issues none).
func newHostCerts(stateDir, host, reported string, log *slog.Logger) (*hostCerts, error) {
	c := &hostCerts{
		log:    log,
		paths:  pki.PathsFor(filepath.Join(stateDir, "mgmt", "pki")),
		dir:    filepath.Join(stateDir, "registry-peer"),
		client: pki.Leaf{CommonName: HostIdentityPrefix + host, Client: true},
		server: pki.Leaf{CommonName: HostIdentityPrefix + host},
	}
	if reported != "" {
		h, _, err := net.SplitHostPort(reported)
		if err != nil {
			return nil, err
		}
		if ip := net.ParseIP(h); ip != nil {
			c.server.IPs = []net.IP{ip}
		} else {
			c.server.Names = []string{h}
		}
	}
	var err error
	if c.serverCAs, err = certPool(c.paths.ServerCA); err != nil {
		return nil, err
	}
	if c.clientCAs, err = certPool(c.paths.ClientCA); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", c.dir, err)
	}
	if err := c.refresh(time.Now()); err != nil {
		return nil, err
	}
	return c, nil
}

func certPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the management API's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("the management API's CA %s holds no PEM certificate", path)
	}
	return pool, nil
}

// refresh issues the certificates again if they need it, and loads them.
func (c *hostCerts) refresh(now time.Time) error {
	load := func(name string, l pki.Leaf) (*tls.Certificate, error) {
		cert, key := filepath.Join(c.dir, name+".crt"), filepath.Join(c.dir, name+".key")
		if err := c.paths.EnsureLeaf(cert, key, l, now); err != nil {
			return nil, fmt.Errorf("the registry peer %s certificate: %w", name, err)
		}
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("the registry peer %s certificate: %w", name, err)
		}
		return &pair, nil
	}
	client, err := load("client", c.client)
	if err != nil {
		return err
	}
	var server *tls.Certificate
	if len(c.server.IPs)+len(c.server.Names) > 0 {
		if server, err = load("server", c.server); err != nil {
			return err
		}
	}
	c.mu.Lock()
	c.clientCert, c.serverCert, c.checked = client, server, now
	c.mu.Unlock()
	return nil
}

// current returns the certificates, checked again if it is time.
func (c *hostCerts) current() (server, client *tls.Certificate) {
	c.mu.Lock()
	due := time.Since(c.checked) > certCheckEvery
	c.mu.Unlock()
	if due {
		if err := c.refresh(time.Now()); err != nil {
			c.log.Warn("renewing the registry peer certificates; the current ones are kept", "err", err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.serverCert, c.clientCert
}

// serverConfig is the peer listener's TLS: a client certificate from the management
// client CA is required and verified.
func (c *hostCerts) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs:  c.clientCAs,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			s, _ := c.current()
			if s == nil {
				return nil, errors.New("no serving certificate")
			}
			return s, nil
		},
	}
}

// peerClient asks other hosts' peer listeners: their certificates verified against
// the management server CA, this host's client certificate presented. No overall
// timeout (a layer may be large); connecting and each answer's headers are bounded.
func (c *hostCerts) peerClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   4,
		ForceAttemptHTTP2:     true,
		TLSClientConfig: &tls.Config{
			MinVersion: tls.VersionTLS13,
			RootCAs:    c.serverCAs,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				_, cl := c.current()
				return cl, nil
			},
		},
	}}
}
