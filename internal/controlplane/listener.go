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
)

// dualListener accepts on the host loopback and, once the address exists,
// on the cluster's gateway address: kube-apiserver binds one address, and
// binding 0.0.0.0 instead would expose every tenant on every interface. The
// gateway lives on the cluster bridge, which may be created after the
// control plane starts, so that bind is retried in the background.
type dualListener struct {
	loopback net.Listener
	conns    chan net.Conn
	ctx      context.Context
	cancel   context.CancelFunc
	mu       sync.Mutex
	extra    net.Listener
	once     sync.Once
}

func listenDual(port, fd int, gateway string, log *slog.Logger) (*dualListener, error) {
	lb, err := listenLoopback(port, fd)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &dualListener{loopback: lb, conns: make(chan net.Conn), ctx: ctx, cancel: cancel}
	go l.serve(lb)
	if gateway != "" {
		go l.bindGateway(net.JoinHostPort(gateway, strconv.Itoa(port)), log)
	}
	return l, nil
}

func (l *dualListener) bindGateway(addr string, log *slog.Logger) {
	logged := false
	for {
		gl, err := net.Listen("tcp", addr)
		if err == nil {
			l.mu.Lock()
			l.extra = gl
			l.mu.Unlock()
			log.Info("apiserver listening on the gateway address", "address", addr)
			l.serve(gl)
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

func (l *dualListener) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		select {
		case l.conns <- c:
		case <-l.ctx.Done():
			c.Close()
			return
		}
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
	err := l.loopback.Close()
	if l.extra != nil {
		err = errors.Join(err, l.extra.Close())
	}
	return err
}

// Addr is the loopback address: the port is what matters to the apiserver.
func (l *dualListener) Addr() net.Addr { return l.loopback.Addr() }

// listenLoopback binds 127.0.0.1:port, or takes the inherited socket fd, which
// the daemon bound to that address.
func listenLoopback(port, fd int) (net.Listener, error) {
	if fd == 0 {
		return net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	}
	f := os.NewFile(uintptr(fd), "apiserver-listener")
	if f == nil {
		return nil, fmt.Errorf("inherited listener fd %d is not open", fd)
	}
	defer f.Close() // FileListener holds its own copy
	l, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("inherited listener fd %d: %w", fd, err)
	}
	return l, nil
}
