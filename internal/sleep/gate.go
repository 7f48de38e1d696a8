package sleep

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/socialweb-computer/socialweb/internal/clienthello"
)

// Gate holds a cluster's loopback port for the cluster's life. The daemon binds
// the port once and keeps the socket; the control plane's apiserver is given a
// copy (File) and accepts on it while awake. While the cluster sleeps the gate
// accepts instead, and a connection wakes the cluster only when its TLS
// ClientHello names it (SNI): a bare connection, a hello that names nothing
// or another name is closed without a wake and counted, so whoever can reach
// the port cannot wake every tenant for free. The hello is read with a short
// deadline and kept; the waking connection is held until the apiserver
// answers, then passed on with the hello first. The socket never closes, so
// no connection is refused in between: one that arrives after the gate
// stopped accepting waits in the kernel's backlog for the apiserver. A wake
// that fails is answered by the gate itself: an HTTP 503 saying why (Fail).
type Gate struct {
	cluster    string
	serverName string // what a ClientHello must name to wake the cluster
	addr       string
	file       *os.File
	log        *slog.Logger

	mu     sync.Mutex
	ln     net.Listener // accepting (asleep); nil when not
	wake   func()       // given to the last Sleep
	held   []net.Conn   // named the cluster while it slept, waiting for the apiserver
	waking bool
	since  time.Time // when the waking connection arrived
	// awake: Awake was called since the last Sleep, so the apiserver
	// accepts; a connection whose hello is read only now is passed on.
	awake   bool
	reading int // connections whose hello is being read or refused
	closed  bool
	// certFile and keyFile are the apiserver's serving certificate, with
	// which a failed wake is answered; without them it closes connections.
	certFile, keyFile string
	answered          prometheus.Counter     // connections answered with a failed wake; may be nil
	refused           *prometheus.CounterVec // connections closed without a wake, by reason; may be nil
	failed            *failure               // the last wake failed: answered until failed.until
	hold              time.Duration          // failHold; shorter in tests
	helloTimeout      time.Duration          // helloTimeout; shorter in tests
}

const (
	// helloTimeout bounds the wait for a ClientHello: every real client
	// sends one as soon as it connects (the front door before it even
	// dials), and one that sends nothing must not hold a goroutine long.
	helloTimeout = 5 * time.Second
	// maxReading bounds the connections whose hello is awaited, or which
	// are being refused, at once; beyond it a connection is closed (reason
	// too_many_pending), so a flood costs neither memory nor descriptors.
	maxReading = 128
)

// Listen binds 127.0.0.1:port for cluster, whose clients name it serverName
// in their ClientHello (the name its serving certificate and kubeconfigs
// carry). The gate does not accept until Sleep.
func Listen(cluster, serverName string, port int, log *slog.Logger) (*Gate, error) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if serverName == "" {
		return nil, fmt.Errorf("holding the port of %s: no server name to wake it by", cluster)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("holding the port of %s: %w", cluster, err)
	}
	defer l.Close() // the socket lives on in f
	f, err := l.(*net.TCPListener).File()
	if err != nil {
		return nil, fmt.Errorf("holding the port of %s: %w", cluster, err)
	}
	return newGate(cluster, serverName, addr, f, log), nil
}

// FromFile is Listen with the socket already bound: f, taken back from the
// control plane an earlier daemon gave it to. The gate owns f.
func FromFile(cluster, serverName string, f *os.File, log *slog.Logger) (*Gate, error) {
	if serverName == "" {
		f.Close()
		return nil, fmt.Errorf("holding the port of %s: no server name to wake it by", cluster)
	}
	l, err := net.FileListener(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("holding the port of %s from its socket: %w", cluster, err)
	}
	defer l.Close()
	tl, ok := l.(*net.TCPListener)
	if !ok || !tl.Addr().(*net.TCPAddr).IP.IsLoopback() {
		f.Close()
		return nil, fmt.Errorf("holding the port of %s: the socket taken back listens on %s, not loopback TCP", cluster, l.Addr())
	}
	return newGate(cluster, serverName, tl.Addr().String(), f, log), nil
}

func newGate(cluster, serverName, addr string, f *os.File, log *slog.Logger) *Gate {
	return &Gate{cluster: cluster, serverName: serverName, addr: addr, file: f, log: log, hold: failHold, helloTimeout: helloTimeout}
}

// AnswerWith gives the gate the apiserver's serving certificate and key, so
// a wake that fails is answered with an HTTP 503 saying why (see Fail)
// instead of a closed connection; answered (may be nil) counts those
// answers. Call before Sleep.
func (g *Gate) AnswerWith(certFile, keyFile string, answered prometheus.Counter) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.certFile, g.keyFile, g.answered = certFile, keyFile, answered
}

// CountRefused gives the gate a counter, labelled by reason only, of the
// connections it closes without a wake: no_name, other_name, bad_hello,
// hello_timeout, too_many_pending. Call before Sleep.
func (g *Gate) CountRefused(refused *prometheus.CounterVec) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refused = refused
}

// File is the listening socket, for the control-plane process (ExtraFiles).
func (g *Gate) File() *os.File { return g.file }

// Addr is the held address, 127.0.0.1:port.
func (g *Gate) Addr() string { return g.addr }

// Sleep starts accepting on the port. The first connection whose hello
// names the cluster stops the accepting (the apiserver, once started, takes
// the next ones from the socket), is held, and calls wake, once; wake starts
// the control plane and, once it answers, the daemon calls Awake. Within the
// hold after a failed wake, such connections are answered with the failure
// instead and do not wake the cluster. Sleep on a gate that is already
// accepting or waking does nothing.
func (g *Gate) Sleep(wake func()) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return net.ErrClosed
	}
	if g.ln != nil || g.waking {
		return nil
	}
	ln, err := net.FileListener(g.file)
	if err != nil {
		return fmt.Errorf("accepting on the port of %s: %w", g.cluster, err)
	}
	g.ln, g.wake, g.awake = ln, wake, false
	go g.accept(ln)
	return nil
}

// accept takes connections while the gate accepts and reads each one's hello
// on its own goroutine, so a slow client delays no other.
func (g *Gate) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			g.mu.Lock()
			stopped := g.ln != ln
			g.mu.Unlock()
			if stopped || errors.Is(err, net.ErrClosed) {
				ln.Close()
				return
			}
			// Out of file descriptors and the like: wait, rather than spin
			// or stop accepting for good.
			g.log.Warn("sleeping cluster: accepting a connection", "cluster", g.cluster, "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		arrived := time.Now()
		g.mu.Lock()
		full := g.reading >= maxReading
		if !full {
			g.reading++
		}
		g.mu.Unlock()
		if full {
			g.countRefused(c, "too_many_pending")
			c.Close()
			continue
		}
		go g.admit(c, arrived)
	}
}

// admit reads a connection's hello and closes it unless it names the
// cluster; one that does wakes a sleeping cluster, waits with the others, or
// is passed on or answered, by the gate's state once its hello is read.
func (g *Gate) admit(c net.Conn, arrived time.Time) {
	name, hello, err := clienthello.Read(c, g.helloTimeout, clienthello.MaxBytes)
	// A refusal keeps its slot until it is done (Refuse lingers up to 2 s),
	// so refusals too are bounded by maxReading.
	switch {
	case err != nil:
		g.countRefused(c, clienthello.Reason(err))
		c.Close()
		g.doneReading()
		return
	case !strings.EqualFold(name, g.serverName):
		reason := "other_name"
		if name == "" {
			reason = "no_name"
		}
		g.countRefused(c, reason)
		clienthello.Refuse(c)
		c.Close()
		g.doneReading()
		return
	}
	g.doneReading()
	c = clienthello.Replay(c, hello)
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		c.Close()
		return
	}
	if f := g.failed; f != nil && time.Now().Before(f.until) {
		g.mu.Unlock()
		go g.answer(f, c)
		return
	}
	g.failed = nil
	if g.awake {
		g.mu.Unlock()
		g.pass(c)
		return
	}
	g.held = append(g.held, c)
	wake := g.ln != nil && !g.waking
	if wake {
		g.ln.Close()
		g.ln = nil
		g.waking, g.since = true, arrived
	}
	wakeFn := g.wake
	g.mu.Unlock()
	if wake {
		g.log.Info("waking a sleeping cluster: a client named it", "cluster", g.cluster, "remote", c.RemoteAddr().String())
		wakeFn()
	}
}

func (g *Gate) doneReading() {
	g.mu.Lock()
	g.reading--
	g.mu.Unlock()
}

// countRefused counts and logs a connection closed without a wake.
func (g *Gate) countRefused(c net.Conn, reason string) {
	g.mu.Lock()
	refused := g.refused
	g.mu.Unlock()
	if refused != nil {
		refused.WithLabelValues(reason).Inc()
	}
	g.log.Debug("sleeping cluster: a connection that does not name it, not woken", "cluster", g.cluster, "remote", c.RemoteAddr().String(), "reason", reason)
}

// Listening reports whether the gate accepts (the cluster sleeps and no
// connection has named it yet).
func (g *Gate) Listening() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ln != nil
}

// Waking reports whether a connection woke the cluster and waits for it, and since when.
func (g *Gate) Waking() (bool, time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waking, g.since
}

// Stop stops accepting without a wake: the daemon starts the control plane for
// another reason (a CronJob is due). A connection whose hello is still being
// read and names the cluster is held until Awake.
func (g *Gate) Stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ln != nil {
		g.ln.Close()
		g.ln = nil
	}
}

// Awake passes every held connection on to the apiserver, which now accepts on
// the socket, and returns how long the wake took since the first connection;
// false if no connection was waiting.
func (g *Gate) Awake() (time.Duration, bool) {
	g.mu.Lock()
	held, waking, since := g.held, g.waking, g.since
	g.held, g.waking, g.failed, g.awake = nil, false, nil, true
	g.mu.Unlock()
	for _, c := range held {
		go g.pass(c)
	}
	if !waking {
		return 0, false
	}
	return time.Since(since), true
}

// Fail ends a wake that did not come up. Each held connection is answered
// with an HTTP 503 whose Kubernetes Status says why and what to do (over TLS
// with the apiserver's certificate, see AnswerWith), and so is every
// connection that names the cluster within the hold after (failHold); then
// such a connection wakes the cluster again. Without the certificate the
// connections are closed. The daemon stops the control plane and calls Sleep
// again: connections that arrived meanwhile wait in the backlog and get the
// same answer.
func (g *Gate) Fail(why error) {
	g.mu.Lock()
	held := g.held
	g.held, g.waking = nil, false
	var f *failure
	var err error
	if g.certFile != "" {
		if f, err = newFailure(g.cluster, g.certFile, g.keyFile, why, time.Now(), g.hold); err == nil {
			g.failed = f
		}
	}
	g.mu.Unlock()
	if err != nil {
		g.log.Warn("cannot answer the clients of a failed wake; closing their connections", "cluster", g.cluster, "err", err)
	}
	for _, c := range held {
		g.log.Warn("answering a connection that woke a cluster that did not come up", "cluster", g.cluster, "remote", c.RemoteAddr().String(), "why", why)
		if f == nil {
			c.Close()
			continue
		}
		go g.answer(f, c)
	}
}

// answer answers one connection with the failure.
func (g *Gate) answer(f *failure, c net.Conn) {
	if err := f.answer(c); err != nil {
		g.log.Debug("answering a connection with the failed wake", "cluster", g.cluster, "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	if g.answered != nil {
		g.answered.Inc()
	}
}

// Close stops accepting, closes held connections and releases the port.
func (g *Gate) Close() error {
	g.Stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.held {
		c.Close()
	}
	g.held, g.waking, g.failed = nil, false, nil
	if g.closed {
		return nil
	}
	g.closed = true
	return g.file.Close()
}

// pass connects a held connection to the apiserver and copies both ways
// until both directions end; the ClientHello the gate read goes first (the
// connection replays it), then what the client sent while it waited, from
// the socket's buffer.
func (g *Gate) pass(client net.Conn) {
	backend, err := net.DialTimeout("tcp", g.addr, 10*time.Second)
	if err != nil {
		g.log.Warn("passing a waking connection to the apiserver", "cluster", g.cluster, "err", err)
		client.Close()
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() { copyHalf(backend, client) })
	wg.Go(func() { copyHalf(client, backend) })
	wg.Wait()
	client.Close()
	backend.Close()
}

// copyHalf copies src to dst and passes a clean end on as a half-close, so a
// client that closes its sending side still reads the answer; a failure
// closes both.
func copyHalf(dst, src net.Conn) {
	_, err := io.Copy(dst, src)
	if cw, ok := dst.(interface{ CloseWrite() error }); ok && err == nil && cw.CloseWrite() == nil {
		return
	}
	dst.Close()
	src.Close()
}
