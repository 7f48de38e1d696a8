package sleep

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Gate holds a cluster's loopback port for the cluster's life. The daemon binds
// the port once and keeps the socket; the control plane's apiserver is given a
// copy (File) and accepts on it while awake. While the cluster sleeps the gate
// accepts instead: the first connection wakes the cluster and is held until
// the apiserver answers, then passed on. The socket never closes, so no
// connection is refused in between: a connection that arrives after the gate
// stopped accepting waits in the kernel's backlog for the apiserver. A wake
// that fails is answered by the gate itself: an HTTP 503 saying why (Fail).
type Gate struct {
	cluster string
	addr    string
	file    *os.File
	log     *slog.Logger

	mu     sync.Mutex
	ln     net.Listener // accepting (asleep); nil when not
	held   []net.Conn   // accepted while asleep, waiting for the apiserver
	waking bool
	since  time.Time // when the waking connection arrived
	closed bool
	// certFile and keyFile are the apiserver's serving certificate, with
	// which a failed wake is answered; without them it closes connections.
	certFile, keyFile string
	answered          prometheus.Counter // connections answered with a failed wake; may be nil
	failed            *failure           // the last wake failed: answered until failed.until
	hold              time.Duration      // failHold; shorter in tests
}

// Listen binds 127.0.0.1:port for cluster. The gate does not accept until Sleep.
func Listen(cluster string, port int, log *slog.Logger) (*Gate, error) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("holding the port of %s: %w", cluster, err)
	}
	defer l.Close() // the socket lives on in f
	f, err := l.(*net.TCPListener).File()
	if err != nil {
		return nil, fmt.Errorf("holding the port of %s: %w", cluster, err)
	}
	return &Gate{cluster: cluster, addr: addr, file: f, log: log, hold: failHold}, nil
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

// File is the listening socket, for the control-plane process (ExtraFiles).
func (g *Gate) File() *os.File { return g.file }

// Addr is the held address, 127.0.0.1:port.
func (g *Gate) Addr() string { return g.addr }

// Sleep starts accepting on the port. The first connection stops the
// accepting (the apiserver, once started, takes the next ones from the
// socket), is held, and calls wake, once; wake starts the control plane and,
// once it answers, the daemon calls Awake. Within the hold after a failed
// wake, connections are answered with the failure instead and do not wake
// the cluster. Sleep on a gate that is already accepting or waking does
// nothing.
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
	g.ln = ln
	go g.accept(ln, wake)
	return nil
}

func (g *Gate) accept(ln net.Listener, wake func()) {
	for {
		c, err := ln.Accept()
		g.mu.Lock()
		if err != nil {
			if g.ln == ln {
				g.ln = nil
			}
			g.mu.Unlock()
			ln.Close()
			if !errors.Is(err, net.ErrClosed) {
				g.log.Warn("sleeping cluster: accepting a connection", "cluster", g.cluster, "err", err)
			}
			return
		}
		if f := g.failed; f != nil && time.Now().Before(f.until) {
			g.mu.Unlock()
			go g.answer(f, c)
			continue
		}
		g.failed = nil
		if g.ln == ln {
			g.ln = nil
		}
		ln.Close()
		g.held = append(g.held, c)
		g.waking, g.since = true, time.Now()
		g.mu.Unlock()
		g.log.Info("waking a sleeping cluster: a connection arrived", "cluster", g.cluster, "remote", c.RemoteAddr().String())
		wake()
		return
	}
}

// Listening reports whether the gate accepts (the cluster sleeps and no
// connection has come yet).
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
// another reason (a CronJob is due).
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
	g.held, g.waking, g.failed = nil, false, nil
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
// connection the gate accepts within the hold after (failHold); then a
// connection wakes the cluster again. Without the certificate the
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
// until both directions end; what the client sent while it waited (its TLS
// ClientHello) goes first, from the socket's buffer.
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
