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
)

// Gate holds a cluster's loopback port for the cluster's life. The daemon binds
// the port once and keeps the socket; the control plane's apiserver is given a
// copy (File) and accepts on it while awake. While the cluster sleeps the gate
// accepts instead: the first connection wakes the cluster and is held until
// the apiserver answers, then passed on. The socket never closes, so no
// connection is refused in between: a connection that arrives after the gate
// stopped accepting waits in the kernel's backlog for the apiserver.
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
	return &Gate{cluster: cluster, addr: addr, file: f, log: log}, nil
}

// File is the listening socket, for the control-plane process (ExtraFiles).
func (g *Gate) File() *os.File { return g.file }

// Addr is the held address, 127.0.0.1:port.
func (g *Gate) Addr() string { return g.addr }

// Sleep starts accepting on the port. The first connection stops the
// accepting (the apiserver, once started, takes the next ones from the
// socket), is held, and calls wake, once; wake starts the control plane and,
// once it answers, the daemon calls Awake. Sleep on a gate that is already
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
	g.ln = ln
	go g.accept(ln, wake)
	return nil
}

func (g *Gate) accept(ln net.Listener, wake func()) {
	c, err := ln.Accept()
	g.mu.Lock()
	if g.ln == ln {
		g.ln = nil
	}
	ln.Close()
	if err != nil {
		g.mu.Unlock()
		if !errors.Is(err, net.ErrClosed) {
			g.log.Warn("sleeping cluster: accepting a connection", "cluster", g.cluster, "err", err)
		}
		return
	}
	g.held = append(g.held, c)
	g.waking, g.since = true, time.Now()
	g.mu.Unlock()
	g.log.Info("waking a sleeping cluster: a connection arrived", "cluster", g.cluster, "remote", c.RemoteAddr().String())
	wake()
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
	g.held, g.waking = nil, false
	g.mu.Unlock()
	for _, c := range held {
		go g.pass(c)
	}
	if !waking {
		return 0, false
	}
	return time.Since(since), true
}

// Fail ends a wake that did not come up: every held connection is closed, so
// the client sees the connection end (an EOF, or a TLS handshake that fails)
// instead of waiting forever. The Cluster's Wake condition says why.
func (g *Gate) Fail(err error) {
	g.mu.Lock()
	held := g.held
	g.held, g.waking = nil, false
	g.mu.Unlock()
	for _, c := range held {
		g.log.Warn("closing a connection that woke a cluster that did not come up", "cluster", g.cluster, "remote", c.RemoteAddr().String(), "err", err)
		c.Close()
	}
}

// Close stops accepting, closes held connections and releases the port.
func (g *Gate) Close() error {
	g.Stop()
	g.Fail(errors.New("the cluster is being deleted"))
	g.mu.Lock()
	defer g.mu.Unlock()
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
