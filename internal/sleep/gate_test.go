package sleep

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/socialweb-computer/socialweb/internal/frontdoor"
	"github.com/socialweb-computer/socialweb/internal/pki"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// apiserver stands in for a control plane started on the gate's socket, as the
// daemon starts one with the socket in ExtraFiles: HTTPS with the tenant's
// serving certificate.
func apiserver(t *testing.T, g *Gate, p pki.Paths) (stop func()) {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(p.ServingCert, p.ServingKey)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.FileListener(g.File())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "pods") })}
	go srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}}))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}
}

func get(p pki.Paths, addr, serverName string) (string, error) {
	resp, err := tlsClient(p, serverName, false).Get("https://" + addr + "/api/v1/pods")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// Clients that arrive together at a sleeping cluster cause one start, and every
// one of them is answered by the apiserver (a gate that could answer a
// failure answers nothing itself); the cluster can then sleep and be
// woken again on the same port.
func TestGateConcurrentWakersCauseOneStart(t *testing.T) {
	g, err := Listen("ci", "ci."+doorDomain, freePort(t), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	p := tenantPKI(t, "ci")
	g.AnswerWith(p.ServingCert, p.ServingKey, nil) // no failure: changes nothing
	var starts atomic.Int32
	var mu sync.Mutex
	var stopAPI func()
	wake := func() {
		starts.Add(1)
		go func() {
			time.Sleep(300 * time.Millisecond) // the control plane starting
			mu.Lock()
			stopAPI = apiserver(t, g, p)
			mu.Unlock()
			if took, ok := g.Awake(); !ok || took < 300*time.Millisecond {
				t.Errorf("Awake = %v, %v: want the time since the first connection", took, ok)
			}
		}()
	}
	for round := 1; round <= 2; round++ {
		if err := g.Sleep(wake); err != nil {
			t.Fatal(err)
		}
		if !g.Listening() {
			t.Fatal("a sleeping gate does not accept")
		}
		var wg sync.WaitGroup
		for range 5 {
			wg.Go(func() {
				body, err := get(p, g.Addr(), "ci."+doorDomain)
				if err != nil || body != "pods" {
					t.Errorf("round %d: a waking client got %q, %v; want the apiserver's answer", round, body, err)
				}
			})
		}
		wg.Wait()
		if got := starts.Load(); got != int32(round) {
			t.Fatalf("round %d: %d starts, want %d", round, got, round)
		}
		if w, _ := g.Waking(); w || g.Listening() {
			t.Fatalf("round %d: the gate still waking (%v) or accepting (%v) once awake", round, w, g.Listening())
		}
		mu.Lock()
		stopAPI() // the cluster sleeps again
		mu.Unlock()
	}
}

// recorder is an apiserver stand-in for one connection that keeps every byte
// it receives below TLS, to compare with what the client sent.
type recorder struct {
	got  chan []byte // what it received, once the client's side ended
	errs chan error
}

// startRecorder serves one TLS connection on the gate's socket: it reads
// "ping", answers "pong" and reads to the end.
func startRecorder(g *Gate, p pki.Paths) (*recorder, error) {
	cert, err := tls.LoadX509KeyPair(p.ServingCert, p.ServingKey)
	if err != nil {
		return nil, err
	}
	ln, err := net.FileListener(g.File())
	if err != nil {
		return nil, err
	}
	r := &recorder{got: make(chan []byte, 1), errs: make(chan error, 1)}
	go func() {
		defer ln.Close()
		c, err := ln.Accept()
		if err != nil {
			r.errs <- err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		rec := &readLog{Conn: c}
		tc := tls.Server(rec, &tls.Config{Certificates: []tls.Certificate{cert}})
		b := make([]byte, 4)
		if _, err := io.ReadFull(tc, b); err != nil || string(b) != "ping" {
			r.errs <- fmt.Errorf("the apiserver read %q, %v; want ping", b, err)
			return
		}
		if _, err := io.WriteString(tc, "pong"); err != nil {
			r.errs <- err
			return
		}
		_, _ = io.Copy(io.Discard, tc)
		_, _ = io.Copy(io.Discard, rec)
		r.errs <- nil
		r.got <- rec.bytes()
	}()
	return r, nil
}

// A sleeping cluster wakes only for a TLS ClientHello that names it: a bare
// connection, one that sends something else, a hello that names nothing or
// another cluster is closed without a wake and counted by reason, and the
// gate goes on accepting. A hello with the name (in any case, on the port or
// through the front door) wakes it, and the apiserver receives every byte the
// client sent, the held hello first.
func TestGateWakesOnlyForItsName(t *testing.T) {
	const name = "ci." + doorDomain
	p := tenantPKI(t, "ci")
	other := tenantPKI(t, "other") // another tenant, with its own CA
	tests := []struct {
		name    string
		viaDoor bool // the client connects to a front door in front of the gate
		// client does what the client does on its connection and returns
		// the error it saw.
		client func(c net.Conn) error
		reason string // "" wakes
	}{
		{name: "a bare connection", client: func(c net.Conn) error {
			// Connects and sends nothing.
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err := c.Read(make([]byte, 1))
			return err
		}, reason: "hello_timeout"},
		{name: "plain HTTP", client: func(c net.Conn) error {
			io.WriteString(c, "GET /api/v1/pods HTTP/1.1\r\nHost: "+name+"\r\n\r\n")
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err := c.Read(make([]byte, 1))
			return err
		}, reason: "bad_hello"},
		{name: "a ClientHello without a name (an IP address as host)", client: func(c net.Conn) error {
			return handshake(c, p, "")
		}, reason: "no_name"},
		{name: "a ClientHello naming another cluster", client: func(c net.Conn) error {
			return handshake(c, other, "other."+doorDomain)
		}, reason: "other_name"},
		{name: "a ClientHello naming a name below the cluster's", client: func(c net.Conn) error {
			return handshake(c, p, "x."+name)
		}, reason: "other_name"},
		{name: "a ClientHello naming the cluster", client: func(c net.Conn) error {
			return pingPong(c, p, name)
		}},
		{name: "the name in capitals", client: func(c net.Conn) error {
			return pingPong(c, p, strings.ToUpper(name))
		}},
		{name: "through the front door", viaDoor: true, client: func(c net.Conn) error {
			return pingPong(c, p, name)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, err := Listen("ci", name, freePort(t), slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			g.helloTimeout = 300 * time.Millisecond
			refused := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "refused"}, []string{"reason"})
			g.CountRefused(refused)
			var starts atomic.Int32
			rec := make(chan *recorder, 1)
			if err := g.Sleep(func() {
				starts.Add(1)
				go func() {
					r, err := startRecorder(g, p)
					if err != nil {
						t.Error(err)
					}
					rec <- r
					g.Awake()
				}()
			}); err != nil {
				t.Fatal(err)
			}
			addr := g.Addr()
			if tc.viaDoor {
				addr = door(t, g)
			}
			raw, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			sent := &writeLog{Conn: raw}
			clientErr := tc.client(sent)

			if tc.reason != "" {
				alert := tc.reason == "no_name" || tc.reason == "other_name"
				switch {
				case clientErr == nil:
					t.Errorf("the client was answered; want its connection closed")
				case alert && !strings.Contains(clientErr.Error(), "unrecognized name"):
					t.Errorf("the client saw %v; want the unrecognized_name alert", clientErr)
				}
				// Counted just after the gate closes the connection.
				waitFor(t, "the refusal counted", func() bool { return testutil.ToFloat64(refused.WithLabelValues(tc.reason)) == 1 })
				if n := starts.Load(); n != 0 || !g.Listening() {
					t.Errorf("%d starts, accepting %v; want none, still accepting", n, g.Listening())
				}
				return
			}
			if clientErr != nil {
				t.Fatalf("the client that named the cluster: %v", clientErr)
			}
			raw.Close()
			r := <-rec
			if err := <-r.errs; err != nil {
				t.Fatal(err)
			}
			if got, want := <-r.got, sent.bytes(); !bytes.Equal(got, want) {
				t.Errorf("the apiserver received %d bytes, not the %d the client sent", len(got), len(want))
			}
			if n := starts.Load(); n != 1 {
				t.Errorf("%d starts, want 1", n)
			}
			if n := testutil.CollectAndCount(refused); n != 0 {
				t.Errorf("%d refusals counted for a client that named the cluster", n)
			}
		})
	}
}

// handshake is a TLS client's handshake, trusting p's CA and sending
// serverName as SNI ("": none, as crypto/tls does for an IP address).
func handshake(c net.Conn, p pki.Paths, serverName string) error {
	b, _ := os.ReadFile(p.ServerCA)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b)
	cfg := &tls.Config{RootCAs: pool, ServerName: serverName}
	if serverName == "" {
		cfg.ServerName = "127.0.0.1" // what a client of https://127.0.0.1:PORT checks; not sent
	}
	tc := tls.Client(c, cfg)
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	return tc.Handshake()
}

// pingPong is a TLS client that sends ping and wants pong back, then ends
// its side.
func pingPong(c net.Conn, p pki.Paths, serverName string) error {
	b, _ := os.ReadFile(p.ServerCA)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b)
	tc := tls.Client(c, &tls.Config{RootCAs: pool, ServerName: serverName})
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(tc, "ping"); err != nil {
		return err
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(tc, got); err != nil {
		return err
	}
	if string(got) != "pong" {
		return fmt.Errorf("answered %q, want pong", got)
	}
	return tc.Close()
}

// door is a front door whose cluster ci is the gate; it returns its address.
func door(t *testing.T, g *Gate) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := frontdoor.New(frontdoor.Config{Address: l.Addr().String(), Domain: doorDomain},
		frontdoor.BackendsFunc(func(c string, _ bool) (string, bool) { return g.Addr(), c == "ci" }),
		slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done })
	return l.Addr().String()
}

// Silent connections hold no other client up, and beyond maxReading of them
// a connection is closed at once, counted, without a wake.
func TestGateSilentConnectionsAreBounded(t *testing.T) {
	g, err := Listen("ci", "ci."+doorDomain, freePort(t), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "refused"}, []string{"reason"})
	g.CountRefused(refused)
	var starts atomic.Int32
	if err := g.Sleep(func() { starts.Add(1) }); err != nil {
		t.Fatal(err)
	}
	for range maxReading {
		c, err := net.Dial("tcp", g.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	waitFor(t, "every silent connection accepted", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.reading == maxReading
	})
	c, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("connection %d: read %v; want it closed at once", maxReading+1, err)
	}
	if n := testutil.ToFloat64(refused.WithLabelValues("too_many_pending")); n != 1 {
		t.Errorf("too_many_pending = %v, want 1", n)
	}
	if starts.Load() != 0 {
		t.Error("silent connections woke the cluster")
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
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

// writeLog keeps every byte written to a connection.
type writeLog struct {
	net.Conn
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *writeLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.buf.Write(p)
	w.mu.Unlock()
	return w.Conn.Write(p)
}

func (w *writeLog) bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.buf.Bytes())
}

// readLog keeps every byte read from a connection.
type readLog struct {
	net.Conn
	mu  sync.Mutex
	buf bytes.Buffer
}

func (r *readLog) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	r.mu.Lock()
	r.buf.Write(p[:n])
	r.mu.Unlock()
	return n, err
}

func (r *readLog) bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.buf.Bytes())
}

// Stop (a wake for a CronJob) stops accepting without a connection; Close
// releases the port.
func TestGateStopAndClose(t *testing.T) {
	port := freePort(t)
	g, err := Listen("ci", "ci."+doorDomain, port, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Sleep(func() { t.Error("woken without a connection") }); err != nil {
		t.Fatal(err)
	}
	g.Stop()
	if g.Listening() {
		t.Fatal("still accepting after Stop")
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", g.Addr())
	if err != nil {
		t.Fatalf("the port is still held after Close: %v", err)
	}
	l.Close()
}

// What a sleeping cluster's gate costs the daemon: its heap and goroutine
// stack, measured over many gates (the density target is 5 MiB per sleeping
// tenant, all of it; a gate is a small part of that).
func TestSleepingGateCost(t *testing.T) {
	const n = 200
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	gates := make([]*Gate, 0, n)
	for range n {
		g, err := Listen("ci", "ci."+doorDomain, 0, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		if err := g.Sleep(func() { t.Error("woken without a connection") }); err != nil {
			t.Fatal(err)
		}
		gates = append(gates, g)
	}
	time.Sleep(100 * time.Millisecond) // every accept goroutine parked
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := (int64(after.HeapInuse) - int64(before.HeapInuse)) / n
	stack := (int64(after.StackInuse) - int64(before.StackInuse)) / n
	t.Logf("a sleeping gate: %d B heap, %d B goroutine stack", heap, stack)
	if heap+stack > 64<<10 {
		t.Errorf("a sleeping gate costs %d B; want under 64 KiB", heap+stack)
	}
	runtime.KeepAlive(gates)
}
