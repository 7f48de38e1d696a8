package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	genericapiserver "k8s.io/apiserver/pkg/server"

	"github.com/socialweb-computer/socialweb/internal/clienthello"
)

// dualListener accepts on the host loopback and, once the address exists,
// on the cluster's gateway address: kube-apiserver binds one address, and
// binding 0.0.0.0 instead would expose every tenant on every interface. The
// gateway lives on the cluster bridge, which may be created after the
// control plane starts, so that bind is retried in the background.
//
// Neither passes a connection on until Open (but the apiserver's own loopback
// client's): the apiserver is probed on a private unix socket (privateSocket)
// until it is ready, and clients are held meanwhile. With the loopback socket held by the daemon
// across runs (a wake, an upgrade), a client sees a slower answer, never a
// refused connection or an answer of a server still starting (a 403 before its
// authorizer's caches fill, a 503).
type dualListener struct {
	loopback net.Listener
	private  net.Listener
	// inherited is the daemon's socket as fd 3, kept open (and referenced, so no
	// finalizer closes it): a later daemon takes it back from this process
	// (supervisor.TakeFile) to hand to the next run.
	inherited *os.File
	conns     chan net.Conn
	open      chan struct{}
	openOnce  sync.Once
	held      chan struct{} // a slot per connection held before Open
	ctx       context.Context
	cancel    context.CancelFunc
	mu        sync.Mutex
	extra     net.Listener
	once      sync.Once
}

// privateSocket is the apiserver's socket for the control plane's own probes,
// in its working directory (c.Dir).
const privateSocket = "apiserver.sock"

func listenDual(port, fd int, gateway, private string, log *slog.Logger) (*dualListener, error) {
	lb, inherited, err := listenLoopback(port, fd)
	if err != nil {
		return nil, err
	}
	_ = os.Remove(private) // a crashed run's
	priv, err := net.Listen("unix", private)
	if err != nil {
		lb.Close()
		return nil, fmt.Errorf("listening on %s: %w", private, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &dualListener{loopback: lb, private: priv, inherited: inherited, conns: make(chan net.Conn),
		open: make(chan struct{}), held: make(chan struct{}, maxHeld), ctx: ctx, cancel: cancel}
	go l.serve(priv, false)
	go l.serve(lb, true)
	if gateway != "" {
		go l.bindGateway(net.JoinHostPort(gateway, strconv.Itoa(port)), log)
	}
	return l, nil
}

// Open lets clients in: the apiserver is ready.
func (l *dualListener) Open() { l.openOnce.Do(func() { close(l.open) }) }

func (l *dualListener) bindGateway(addr string, log *slog.Logger) {
	logged := false
	for {
		gl, err := net.Listen("tcp", addr)
		if err == nil {
			l.mu.Lock()
			l.extra = gl
			l.mu.Unlock()
			log.Info("apiserver listening on the gateway address", "address", addr)
			l.serve(gl, true)
			return
		}
		if !logged {
			log.Info("gateway address not there yet; the apiserver serves loopback only until the node network exists", "address", addr, "err", err)
			logged = true
		}
		select {
		case <-l.ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (l *dualListener) serve(ln net.Listener, gated bool) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if gated && !l.isOpen() {
			// Bounded: past maxHeld, the rest wait in the kernel's backlog.
			select {
			case l.held <- struct{}{}:
			case <-l.ctx.Done():
				c.Close()
				return
			}
			go l.holdUntilOpen(c)
			continue
		}
		l.deliver(c)
	}
}

// maxHeld bounds the connections held open (their hellos read) before Open.
const maxHeld = 1024

func (l *dualListener) isOpen() bool {
	select {
	case <-l.open:
		return true
	default:
		return false
	}
}

// holdUntilOpen passes c on at Open, or at once if it is the apiserver's own
// loopback client (its post-start hooks call it before it is ready, and
// readiness waits for them). It reads the ClientHello to tell, and replays it.
func (l *dualListener) holdUntilOpen(c net.Conn) {
	defer func() { <-l.held }()
	name, hello, err := clienthello.Read(c, heldHelloTimeout, clienthello.MaxBytes)
	if err != nil {
		c.Close()
		return
	}
	c = clienthello.Replay(c, hello)
	if name != genericapiserver.LoopbackClientServerNameOverride {
		select {
		case <-l.open:
		case <-l.ctx.Done():
			c.Close()
			return
		}
	}
	l.deliver(c)
}

// heldHelloTimeout bounds the wait for a held connection's ClientHello: every
// TLS client sends it at once.
const heldHelloTimeout = 10 * time.Second

func (l *dualListener) deliver(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.ctx.Done():
		c.Close()
	}
}

func (l *dualListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.ctx.Done():
		return nil, net.ErrClosed
	}
}

func (l *dualListener) Close() error {
	l.once.Do(l.cancel)
	l.mu.Lock()
	defer l.mu.Unlock()
	err := errors.Join(l.loopback.Close(), l.private.Close())
	if l.extra != nil {
		err = errors.Join(err, l.extra.Close())
	}
	return err
}

// Addr is the loopback address: the port is what matters to the apiserver.
func (l *dualListener) Addr() net.Addr { return l.loopback.Addr() }

// listenLoopback binds 127.0.0.1:port, or takes the inherited socket fd, which
// the daemon bound to that address; that fd stays open (returned).
func listenLoopback(port, fd int) (net.Listener, *os.File, error) {
	if fd == 0 {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		return l, nil, err
	}
	f := os.NewFile(uintptr(fd), "apiserver-listener")
	if f == nil {
		return nil, nil, fmt.Errorf("inherited listener fd %d is not open", fd)
	}
	l, err := net.FileListener(f)
	if err != nil {
		return nil, nil, fmt.Errorf("inherited listener fd %d: %w", fd, err)
	}
	return l, f, nil
}
