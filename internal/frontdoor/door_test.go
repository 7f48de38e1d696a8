package frontdoor

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const domain = "tenants.test"

// ca is a test certificate authority.
type ca struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCA(t *testing.T, name string) ca {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return ca{cert: cert, key: key, pool: pool}
}

func (c ca) issue(t *testing.T, cn string, usage x509.ExtKeyUsage, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		DNSNames: names, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, key.Public(), c.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// tenant is an in-process stand-in for a tenant apiserver: its own server CA
// and client CA, a TLS listener that requires a client certificate of its
// client CA, and a handler per connection.
type tenant struct {
	name               string
	serverCA, clientCA ca
	client             tls.Certificate // a client certificate of this tenant
	addr               string
}

// newTenant serves handle on every TLS connection; handle gets the raw TCP
// connection too, for tests that look below TLS.
func newTenant(t *testing.T, name string, handle func(c *tls.Conn, raw net.Conn)) *tenant {
	t.Helper()
	tn := &tenant{name: name, serverCA: newCA(t, name+"-server-ca"), clientCA: newCA(t, name+"-client-ca")}
	tn.client = tn.clientCA.issue(t, name+"-admin", x509.ExtKeyUsageClientAuth)
	serving := tn.serverCA.issue(t, "kube-apiserver", x509.ExtKeyUsageServerAuth, name+"."+domain, "localhost")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	tn.addr = l.Addr().String()
	cfg := &tls.Config{Certificates: []tls.Certificate{serving}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: tn.clientCA.pool}
	go func() {
		for {
			raw, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer raw.Close()
				c := tls.Server(raw, cfg)
				if c.Handshake() != nil {
					return
				}
				handle(c, raw)
			}()
		}
	}()
	return tn
}

// greet answers each line with the tenant's name and the line.
func greet(name string) func(c *tls.Conn, _ net.Conn) {
	return func(c *tls.Conn, _ net.Conn) {
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if _, err := fmt.Fprintf(c, "%s: %s", name, line); err != nil {
				return
			}
		}
	}
}

// clientConfig trusts tn's server CA, presents cert and asks for serverName.
func (tn *tenant) clientConfig(serverName string, cert tls.Certificate) *tls.Config {
	return &tls.Config{RootCAs: tn.serverCA.pool, Certificates: []tls.Certificate{cert}, ServerName: serverName}
}

type testDoor struct {
	*Door
	addr   string
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

// startDoor serves a door in front of tenants; cfg's Domain and Address are set here.
func startDoor(t *testing.T, cfg Config, tenants ...*tenant) *testDoor {
	t.Helper()
	byName := map[string]string{}
	for _, tn := range tenants {
		byName[tn.name] = tn.addr
	}
	// A known cluster whose apiserver is not listening.
	byName["down"] = closedPort(t)
	cfg.Domain = domain
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Address = l.Addr().String()
	d := New(cfg, BackendsFunc(func(c string, _ bool) (string, bool) { a, ok := byName[c]; return a, ok }),
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	reg := prometheus.NewRegistry()
	reg.MustRegister(d.Collector())
	ctx, cancel := context.WithCancel(context.Background())
	td := &testDoor{Door: d, addr: cfg.Address, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { td.done <- d.Serve(ctx, l) }()
	t.Cleanup(func() { td.stop(t) })
	return td
}

func (td *testDoor) stop(t *testing.T) {
	t.Helper()
	td.cancel()
	select {
	case err := <-td.done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
		td.done <- nil // later stops return at once
	case <-time.After(5 * time.Second):
		t.Error("Serve did not return within 5s of its context ending")
	}
}

func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// dial connects through the door and completes the handshake.
func (td *testDoor) dial(cfg *tls.Config) (*tls.Conn, error) {
	raw, err := net.DialTimeout("tcp", td.addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c := tls.Client(raw, cfg)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := c.Handshake(); err != nil {
		raw.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// value is a metric's value from the registry, 0 if absent.
func (td *testDoor) value(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := td.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue metric
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			}
		}
	}
	return 0
}

func exchange(t *testing.T, c *tls.Conn, line string) string {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatalf("writing %q: %v", line, err)
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", line, err)
	}
	return strings.TrimSuffix(got, "\n")
}

// Each name reaches its own tenant, verified against that tenant's CA, with
// that tenant's client certificate: TLS is end to end.
func TestRoutesBySNI(t *testing.T) {
	a := newTenant(t, "alpha", greet("alpha"))
	b := newTenant(t, "beta", greet("beta"))
	td := startDoor(t, Config{}, a, b)
	for _, tc := range []struct {
		tn   *tenant
		sni  string
		want string
	}{
		{a, "alpha." + domain, "alpha: hi"},
		{b, "beta." + domain, "beta: hi"},
		{a, "ALPHA." + strings.ToUpper(domain), "alpha: hi"},
	} {
		t.Run(tc.sni, func(t *testing.T) {
			c, err := td.dial(tc.tn.clientConfig(tc.sni, tc.tn.client))
			if err != nil {
				t.Fatalf("handshake with %s through the door: %v", tc.sni, err)
			}
			defer c.Close()
			if err := c.ConnectionState().PeerCertificates[0].CheckSignatureFrom(tc.tn.serverCA.cert); err != nil {
				t.Errorf("the serving certificate is not %s's: %v", tc.tn.name, err)
			}
			if got := exchange(t, c, "hi"); got != tc.want {
				t.Errorf("answer %q, want %q", got, tc.want)
			}
		})
	}
}

// A client of tenant alpha that asks for beta's name reaches beta, whose
// certificate it does not trust; and alpha's client certificate presented to
// beta (trusting beta's CA) is refused by beta.
func TestOtherTenantsNameRefused(t *testing.T) {
	a := newTenant(t, "alpha", greet("alpha"))
	b := newTenant(t, "beta", greet("beta"))
	td := startDoor(t, Config{}, a, b)

	c, err := td.dial(a.clientConfig("beta."+domain, a.client))
	if err == nil {
		c.Close()
		t.Fatal("a client trusting alpha's CA completed a handshake as beta")
	}
	var unknownAuthority x509.UnknownAuthorityError
	if !errors.As(err, &unknownAuthority) {
		t.Errorf("handshake error %v, want an unknown authority (beta's certificate, alpha's CA)", err)
	}

	// Trusting beta's CA but presenting alpha's client certificate: with TLS
	// 1.3 the server's refusal arrives on the first read.
	c, err = td.dial(b.clientConfig("beta."+domain, a.client))
	if err == nil {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(c, "hi\n")
		_, err = bufio.NewReader(c).ReadString('\n')
	}
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("alpha's client certificate at beta: %v, want beta to refuse the certificate", err)
	}
}

// An unknown name, no name, a name outside the domain and a known cluster
// whose apiserver is down all get the same bytes back: one alert, then EOF.
func TestRefusalsAreIdentical(t *testing.T) {
	a := newTenant(t, "alpha", greet("alpha"))
	td := startDoor(t, Config{}, a)
	for _, tc := range []struct{ name, sni, reason string }{
		{"unknown name", "nosuch." + domain, "unknown_name"},
		{"no name", "", "no_name"},
		{"other domain", "alpha.example.com", "unknown_name"},
		{"name below a cluster", "x.alpha." + domain, "unknown_name"},
		{"apiserver down", "down." + domain, "unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := td.value(t, "socialweb_frontdoor_refused_total", map[string]string{"reason": tc.reason})
			raw, err := net.Dial("tcp", td.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			rec := &readLog{Conn: raw}
			cfg := a.clientConfig(tc.sni, a.client)
			if tc.sni == "" {
				cfg.InsecureSkipVerify = true // crypto/tls sends no SNI only then
			}
			c := tls.Client(rec, cfg)
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			start := time.Now()
			err = c.Handshake()
			took := time.Since(start)
			if err == nil || !strings.Contains(err.Error(), "unrecognized name") {
				t.Errorf("handshake: %v, want the alert unrecognized_name", err)
			}
			// Whatever is left until the door closes is part of the answer.
			_, _ = io.Copy(io.Discard, rec)
			// One fatal alert, unrecognized_name (clienthello.Refuse).
			if want := []byte{21, 3, 3, 0, 2, 2, 112}; !bytes.Equal(rec.buf.Bytes(), want) {
				t.Errorf("the door answered %x, want exactly %x", rec.buf.Bytes(), want)
			}
			if took > time.Second {
				t.Errorf("the refusal took %s", took)
			}
			if after := td.value(t, "socialweb_frontdoor_refused_total", map[string]string{"reason": tc.reason}); after != before+1 {
				t.Errorf("refused{reason=%s} went from %v to %v, want +1", tc.reason, before, after)
			}
		})
	}
	// No series anywhere carries a name a client asked for.
	families, _ := td.reg.Gather()
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.Contains(l.GetValue(), "nosuch") || strings.Contains(l.GetValue(), ".") {
					t.Errorf("%s has the label %s=%q: a requested name leaked into the metrics", f.GetName(), l.GetName(), l.GetValue())
				}
			}
		}
	}
}

// readLog keeps every byte read from a connection.
type readLog struct {
	net.Conn
	buf bytes.Buffer
}

func (r *readLog) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

// Connections and bytes are counted per cluster, while a connection lasts.
func TestMetricsCountConnectionsAndBytes(t *testing.T) {
	a := newTenant(t, "alpha", greet("alpha"))
	b := newTenant(t, "beta", greet("beta"))
	td := startDoor(t, Config{}, a, b)
	for range 2 {
		c, err := td.dial(a.clientConfig("alpha."+domain, a.client))
		if err != nil {
			t.Fatal(err)
		}
		exchange(t, c, strings.Repeat("x", 100000))
		if got := td.value(t, "socialweb_frontdoor_open_connections", map[string]string{"cluster": "alpha"}); got != 1 {
			t.Errorf("open connections of alpha %v while one is open, want 1", got)
		}
		// Counted while open: more than the 100 kB line each way already.
		if in := td.value(t, "socialweb_frontdoor_bytes_total", map[string]string{"cluster": "alpha", "direction": "in"}); in < 100000 {
			t.Errorf("bytes in of alpha %v during the connection, want at least 100000", in)
		}
		c.Close()
	}
	waitFor(t, "alpha's connections to close", func() bool {
		return td.value(t, "socialweb_frontdoor_open_connections", map[string]string{"cluster": "alpha"}) == 0
	})
	if got := td.value(t, "socialweb_frontdoor_connections_total", map[string]string{"cluster": "alpha"}); got != 2 {
		t.Errorf("connections of alpha %v, want 2", got)
	}
	if got := td.value(t, "socialweb_frontdoor_connections_total", map[string]string{"cluster": "beta"}); got != 0 {
		t.Errorf("connections of beta %v, want 0", got)
	}
	in := td.value(t, "socialweb_frontdoor_bytes_total", map[string]string{"cluster": "alpha", "direction": "in"})
	out := td.value(t, "socialweb_frontdoor_bytes_total", map[string]string{"cluster": "alpha", "direction": "out"})
	if in < 200000 || out < 200000 {
		t.Errorf("alpha bytes in %v, out %v; want at least 200000 each (two 100 kB lines each way, plus TLS)", in, out)
	}
	td.Forget("alpha")
	if got := td.value(t, "socialweb_frontdoor_connections_total", map[string]string{"cluster": "alpha"}); got != 0 {
		t.Errorf("connections of alpha %v after Forget, want the series gone", got)
	}
}

// A stream that stays open, quiet for longer than the hello timeout between
// messages, is carried until the client ends it; and shutting the door closes it.
func TestLongQuietStreamStaysOpen(t *testing.T) {
	a := newTenant(t, "alpha", greet("alpha"))
	td := startDoor(t, Config{HelloTimeout: 200 * time.Millisecond}, a)
	c, err := td.dial(a.clientConfig("alpha."+domain, a.client))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 5 {
		if got, want := exchange(t, c, fmt.Sprint("tick ", i)), fmt.Sprint("alpha: tick ", i); got != want {
			t.Fatalf("answer %q, want %q", got, want)
		}
		time.Sleep(300 * time.Millisecond) // longer than the hello timeout
	}
	td.stop(t)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		t.Errorf("read after the door shut: %v, want the connection closed", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// A client that stops sending (TCP half-close) still gets the apiserver's
// answer, as kubectl exec does after stdin ends; and the apiserver's own
// half-close reaches the client.
func TestHalfClosePassesThrough(t *testing.T) {
	serverSawEOF := make(chan error, 1)
	a := newTenant(t, "alpha", func(c *tls.Conn, raw net.Conn) {
		n, err := io.Copy(io.Discard, c) // to the client's close_notify
		if err != nil {
			serverSawEOF <- err
			return
		}
		// Below TLS the client's FIN must arrive too, through the door.
		_ = raw.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := raw.Read(make([]byte, 1)); err != io.EOF {
			serverSawEOF <- fmt.Errorf("raw read after close_notify: %v, want EOF", err)
			return
		}
		serverSawEOF <- nil
		fmt.Fprintf(c, "read %d bytes", n)
		_ = c.CloseWrite()
		_ = raw.(*net.TCPConn).CloseWrite()
		time.Sleep(time.Second) // the door must not wait for this close
	})
	td := startDoor(t, Config{}, a)
	raw, err := net.Dial("tcp", td.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	c := tls.Client(raw, a.clientConfig("alpha."+domain, a.client))
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, strings.Repeat("y", 5000)); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := raw.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := <-serverSawEOF; err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading after the half-close: %v", err)
	}
	if string(got) != "read 5000 bytes" {
		t.Errorf("answer %q, want %q", got, "read 5000 bytes")
	}
	// And the apiserver's FIN came through below TLS.
	_ = raw.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := raw.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("raw read after the server's close_notify: %v, want EOF", err)
	}
}

// A client that sends nothing, a few bytes, garbage or an endless hello is
// dropped without an answer, and meanwhile other clients are served.
func TestBadHellosAreDroppedWithoutBlocking(t *testing.T) {
	a := newTenant(t, "alpha", greet("alpha"))
	// Were connections handled one at a time, a good client would wait out
	// a silent one's 2 s; it must not take even half of that.
	td := startDoor(t, Config{HelloTimeout: 2 * time.Second}, a)
	for _, tc := range []struct {
		name   string
		send   func(net.Conn)
		reason string
	}{
		{"silent", func(net.Conn) {}, "hello_timeout"},
		{"partial record", func(c net.Conn) { c.Write([]byte{22, 3, 1}) }, "hello_timeout"},
		{"plain HTTP", func(c net.Conn) { io.WriteString(c, "GET / HTTP/1.1\r\nHost: alpha\r\n\r\n") }, "bad_hello"},
		{"endless hello", func(c net.Conn) {
			// A handshake record announcing a ClientHello of 60000 bytes, and then
			// more records of it than the door reads.
			c.Write([]byte{22, 3, 1, 0x40, 0x00, 1, 0x00, 0xea, 0x60})
			c.Write(make([]byte, 0x4000-4))
			for range 8 {
				c.Write(append([]byte{22, 3, 1, 0x40, 0x00}, make([]byte, 0x4000)...))
			}
		}, "bad_hello"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := td.value(t, "socialweb_frontdoor_refused_total", map[string]string{"reason": tc.reason})
			bad, err := net.Dial("tcp", td.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer bad.Close()
			var wg sync.WaitGroup
			wg.Go(func() { tc.send(bad) })
			// A good client is served while the bad one is pending.
			start := time.Now()
			c, err := td.dial(a.clientConfig("alpha."+domain, a.client))
			if err != nil {
				t.Fatal(err)
			}
			if got := exchange(t, c, "hi"); got != "alpha: hi" {
				t.Errorf("answer %q", got)
			}
			c.Close()
			if took := time.Since(start); took > time.Second {
				t.Errorf("a good client took %s while a bad one was pending", took)
			}
			_ = bad.SetReadDeadline(time.Now().Add(5 * time.Second))
			got, err := io.ReadAll(bad)
			if len(got) != 0 || isTimeout(err) {
				t.Errorf("the bad client read %x, %v; want nothing and the connection closed", got, err)
			}
			wg.Wait()
			if after := td.value(t, "socialweb_frontdoor_refused_total", map[string]string{"reason": tc.reason}); after != before+1 {
				t.Errorf("refused{reason=%s} went from %v to %v, want +1", tc.reason, before, after)
			}
		})
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// dialFrom connects through the door from the loopback address src (Linux
// routes all of 127/8 to lo) and completes the handshake.
func (td *testDoor) dialFrom(src string, cfg *tls.Config) (*tls.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	raw, err := d.Dial("tcp", td.addr)
	if err != nil {
		return nil, err
	}
	c := tls.Client(raw, cfg)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := c.Handshake(); err != nil {
		raw.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// The door holds at most MaxConnsPerSource connections from one source and
// MaxConns from everyone: the one beyond is closed at once and counted, a
// connection from another source is still carried (per source), and a slot
// is free again once a connection ends.
func TestConnectionLimits(t *testing.T) {
	type step struct {
		from   string // source address; "close N" ends the Nth carried connection instead
		refuse string // "" carried, else the reason counted
	}
	tests := []struct {
		name             string
		perSource, total int
		peer             string // a source IsPeer says is another host's door
		steps            []step
	}{
		{"per source", 2, 10, "", []step{
			{"127.0.0.2", ""}, {"127.0.0.2", ""}, {"127.0.0.2", "too_many_from_source"},
			{"127.0.0.3", ""},
			{"close 0", ""}, {"127.0.0.2", ""}, {"127.0.0.2", "too_many_from_source"},
		}},
		// Another host's door carries many clients: the total bounds it, not the per-source limit.
		{"a peer", 2, 4, "127.0.0.9", []step{
			{"127.0.0.9", ""}, {"127.0.0.9", ""}, {"127.0.0.9", ""}, {"127.0.0.2", ""}, {"127.0.0.9", "too_many_connections"},
		}},
		{"in total", 2, 3, "", []step{
			{"127.0.0.2", ""}, {"127.0.0.3", ""}, {"127.0.0.4", ""}, {"127.0.0.5", "too_many_connections"},
			{"127.0.0.2", "too_many_connections"},
			{"close 1", ""}, {"127.0.0.5", ""}, {"127.0.0.6", "too_many_connections"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := newTenant(t, "alpha", greet("alpha"))
			cfg := Config{MaxConnsPerSource: tc.perSource, MaxConns: tc.total}
			if tc.peer != "" {
				cfg.IsPeer = func(a netip.Addr) bool { return a.String() == tc.peer }
			}
			td := startDoor(t, cfg, a)
			var carried []*tls.Conn
			defer func() {
				for _, c := range carried {
					c.Close()
				}
			}()
			for i, s := range tc.steps {
				if n, ok := strings.CutPrefix(s.from, "close "); ok {
					k, _ := strconv.Atoi(n)
					carried[k].Close()
					waitFor(t, "the ended connection given back", func() bool {
						td.mu.Lock()
						defer td.mu.Unlock()
						return td.clients == len(carried)-1
					})
					carried = append(carried[:k], carried[k+1:]...)
					continue
				}
				before := td.value(t, "socialweb_frontdoor_refused_total", map[string]string{"reason": s.refuse})
				c, err := td.dialFrom(s.from, a.clientConfig("alpha."+domain, a.client))
				if s.refuse == "" {
					if err != nil {
						t.Fatalf("step %d, from %s: %v; want it carried", i, s.from, err)
					}
					if got := exchange(t, c, "hi"); got != "alpha: hi" {
						t.Fatalf("step %d, from %s: answer %q", i, s.from, got)
					}
					carried = append(carried, c)
					continue
				}
				if err == nil {
					c.Close()
					t.Fatalf("step %d, from %s: carried; want it refused (%s)", i, s.from, s.refuse)
				}
				if after := td.value(t, "socialweb_frontdoor_refused_total", map[string]string{"reason": s.refuse}); after != before+1 {
					t.Errorf("step %d: refused{reason=%s} went from %v to %v, want +1", i, s.refuse, before, after)
				}
			}
		})
	}
}

// A source is an IPv4 address or an IPv6 /64.
func TestSourceOf(t *testing.T) {
	tcp := func(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	tests := []struct {
		name string
		a, b net.Addr
		same bool
	}{
		{"two ports of one IPv4 address", tcp("192.0.2.1:1000"), tcp("192.0.2.1:2000"), true},
		{"two IPv4 addresses", tcp("192.0.2.1:1000"), tcp("192.0.2.2:1000"), false},
		{"an IPv4 address and its IPv4-mapped IPv6 form", tcp("192.0.2.1:1000"), tcp("[::ffff:192.0.2.1]:1000"), true},
		{"two addresses in one IPv6 /64", tcp("[2001:db8:1:2::1]:1000"), tcp("[2001:db8:1:2:ffff::9]:1000"), true},
		{"two IPv6 /64s", tcp("[2001:db8:1:2::1]:1000"), tcp("[2001:db8:1:3::1]:1000"), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := sourceOf(tc.a) == sourceOf(tc.b); got != tc.same {
				t.Errorf("sourceOf(%s) = %s, sourceOf(%s) = %s: same %v, want %v", tc.a, sourceOf(tc.a), tc.b, sourceOf(tc.b), got, tc.same)
			}
		})
	}
}
