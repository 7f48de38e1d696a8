package livetest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
	"golang.org/x/sys/unix"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	ggcr "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Upstream is a real registry (Debian's docker-registry, which is distribution) in a
// network namespace of its own, behind TLS from a CA made for the test: what a test
// points the host's pull-through cache at as if it were docker.io or a company's
// registry. Traffic stays on this machine.
type Upstream struct {
	// Addr is host:port of the registry (an address in 10.253.0.0/16, a private one,
	// so only an operator's mirror setting reaches it).
	Addr string
	// CAFile is the PEM of the CA its certificate is signed by.
	CAFile string
	// User and Password, when the registry was started with auth.
	User, Password string

	ns      string
	dir     string
	logPath string
	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	pool    *x509.CertPool
}

// UpstreamOptions shape StartUpstream.
type UpstreamOptions struct {
	// Auth makes every request need User/Password (htpasswd, bcrypt).
	Auth bool
}

// StartUpstream starts docker-registry in a fresh network namespace and returns once it
// answers. It skips (or fails, under SOCIALWEB_REQUIRE_LIVE=1) without root or the
// docker-registry package. Everything is removed when t ends.
func StartUpstream(t testing.TB, opts UpstreamOptions) *Upstream {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "needs root: a network namespace for the upstream registry")
	}
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		Skip(t, "docker-registry is not installed (Debian package docker-registry; hack/deps installs it)")
	}
	peer := NewPeer(t)
	u := &Upstream{ns: peer.Netns, dir: t.TempDir(), done: make(chan struct{})}
	regIP := peer.Addr.String()
	u.Addr = regIP + ":5000"
	t.Cleanup(u.Stop) // before the namespace goes (cleanups run last first)

	caPEM, certPEM, keyPEM, err := testPKI(regIP)
	if err != nil {
		t.Fatal(err)
	}
	u.CAFile = filepath.Join(u.dir, "ca.pem")
	for f, b := range map[string][]byte{u.CAFile: caPEM, filepath.Join(u.dir, "cert.pem"): certPEM, filepath.Join(u.dir, "key.pem"): keyPEM} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	u.pool = x509.NewCertPool()
	u.pool.AppendCertsFromPEM(caPEM)
	auth := ""
	if opts.Auth {
		u.User, u.Password = "ci", fmt.Sprintf("s3cret-%d", mrand.Uint32())
		h, err := bcrypt.GenerateFromPassword([]byte(u.Password), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(u.dir, "htpasswd"), []byte(u.User+":"+string(h)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		auth = fmt.Sprintf("auth:\n  htpasswd:\n    realm: upstream-test\n    path: %s\n", filepath.Join(u.dir, "htpasswd"))
	}
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: info
  formatter: text
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
  tls:
    certificate: %s
    key: %s
%s`, filepath.Join(u.dir, "data"), u.Addr, filepath.Join(u.dir, "cert.pem"), filepath.Join(u.dir, "key.pem"), auth)
	cfgPath := filepath.Join(u.dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	u.logPath = filepath.Join(u.dir, "registry.log")
	u.start(t, bin, cfgPath)
	t.Logf("upstream registry (docker-registry) at https://%s in netns %s (auth %v)", u.Addr, u.ns, opts.Auth)
	return u
}

func (u *Upstream) start(t testing.TB, bin, cfgPath string) {
	t.Helper()
	logf, err := os.OpenFile(u.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", u.ns, bin, "serve", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting docker-registry: %v", err)
	}
	logf.Close()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	u.mu.Lock()
	u.cmd, u.done = cmd, done
	u.mu.Unlock()
	c := u.client()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := c.Get("https://" + u.Addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			return
		}
		select {
		case <-done:
			b, _ := os.ReadFile(u.logPath)
			t.Fatalf("docker-registry exited: %s", b)
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(u.logPath)
			t.Fatalf("docker-registry did not answer in 20s: %v\n%s", err, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop kills the registry (the network namespace stays, answering nothing).
func (u *Upstream) Stop() {
	u.mu.Lock()
	cmd, done := u.cmd, u.done
	u.cmd = nil
	u.mu.Unlock()
	if cmd == nil {
		return
	}
	// ip netns exec execs the registry: the pid is the registry's.
	cmd.Process.Kill()
	<-done
}

func (u *Upstream) client() *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: u.pool}}}
}

// Push writes img to the registry as repo:tag (with the credentials, under Auth).
func (u *Upstream) Push(ctx context.Context, img ggcr.Image, repoTag string) (string, error) {
	ref, err := name.ParseReference(u.Addr + "/" + repoTag)
	if err != nil {
		return "", err
	}
	a := authn.Anonymous
	if u.User != "" {
		a = &authn.Basic{Username: u.User, Password: u.Password}
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx), remote.WithAuth(a), remote.WithTransport(u.client().Transport)); err != nil {
		return "", fmt.Errorf("pushing %s to the upstream registry: %w", ref, err)
	}
	d, err := img.Digest()
	return d.String(), err
}

var accessLine = regexp.MustCompile(`"(GET|HEAD) (/v2/[^ ?]*)`)

// Requests counts the registry's access-log lines of method for paths containing
// substr (a repository, "/manifests/", "/blobs/").
func (u *Upstream) Requests(method, substr string) int {
	b, _ := os.ReadFile(u.logPath)
	n := 0
	for _, m := range accessLine.FindAllSubmatch(b, -1) {
		if string(m[1]) == method && bytes.Contains(m[2], []byte(substr)) {
			n++
		}
	}
	return n
}

var sentRE = regexp.MustCompile(`HTTP/[0-9.]+" [0-9]+ ([0-9]+) `)

// SentBytes sums the response bytes the registry's access log records.
func (u *Upstream) SentBytes() int64 {
	b, _ := os.ReadFile(u.logPath)
	var n int64
	for _, m := range sentRE.FindAllSubmatch(b, -1) {
		v, _ := strconv.ParseInt(string(m[1]), 10, 64)
		n += v
	}
	return n
}

// Log is the registry's output so far.
func (u *Upstream) Log() string {
	b, _ := os.ReadFile(u.logPath)
	return string(b)
}

// Peer is a network namespace behind a veth from the host: a machine on the host's
// LAN, as far as the host can tell (10.253.k.2, the host 10.253.k.1).
type Peer struct {
	Netns string
	Addr  netip.Addr
}

// NewPeer makes a Peer, removed when t ends. It needs root.
func NewPeer(t testing.TB) Peer {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "needs root: a network namespace")
	}
	// A free 10.253.k.0/30: another test's namespace may hold one.
	k := 0
	for range 50 {
		c := 1 + mrand.IntN(250)
		if exec.Command("ip", "netns", "pids", fmt.Sprintf("regup%d", c)).Run() != nil {
			k = c
			break
		}
	}
	if k == 0 {
		t.Fatal("no free test network in 10.253.0.0/16")
	}
	p := Peer{Netns: fmt.Sprintf("regup%d", k), Addr: netip.MustParseAddr(fmt.Sprintf("10.253.%d.2", k))}
	hostIP := fmt.Sprintf("10.253.%d.1", k)
	veth := fmt.Sprintf("regup%dh", k)
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	exec.Command("ip", "netns", "del", p.Netns).Run()
	exec.Command("ip", "link", "del", veth).Run()
	sh("ip", "netns", "add", p.Netns)
	t.Cleanup(func() {
		exec.Command("ip", "link", "del", veth).Run()
		exec.Command("ip", "netns", "del", p.Netns).Run()
	})
	sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", p.Netns)
	sh("ip", "addr", "add", hostIP+"/30", "dev", veth)
	sh("ip", "link", "set", veth, "up")
	sh("ip", "-n", p.Netns, "addr", "add", p.Addr.String()+"/30", "dev", "eth0")
	sh("ip", "-n", p.Netns, "link", "set", "eth0", "up")
	sh("ip", "-n", p.Netns, "link", "set", "lo", "up")
	return p
}

// Listen opens a TCP listener on addr inside the peer's namespace (the socket stays in
// it after this thread returns to the host's).
func (p Peer) Listen(t testing.TB, port int) net.Listener {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	host, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	ns, err := os.Open("/run/netns/" + p.Netns)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		t.Fatalf("entering netns %s: %v", p.Netns, err)
	}
	ln, lerr := net.Listen("tcp", netip.AddrPortFrom(p.Addr, uint16(port)).String())
	if err := unix.Setns(int(host.Fd()), unix.CLONE_NEWNET); err != nil {
		panic(fmt.Sprintf("returning to the host's netns: %v", err)) // this thread is unusable
	}
	if lerr != nil {
		t.Fatal(lerr)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// testPKI makes a CA and a server certificate for ip, PEM-encoded.
func testPKI(ip string) (caPEM, certPEM, keyPEM []byte, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "upstream-test CA"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: ip}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP(ip)}, DNSNames: []string{"upstream.test"}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), nil
}
