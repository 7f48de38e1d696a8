package frontdoor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/socialweb-computer/socialweb/internal/clienthello"
)

// Backends finds a cluster's apiserver. The daemon's provider implements it
// from its informer cache, so a lookup costs no API call.
type Backends interface {
	// Backend returns the host:port of cluster's apiserver (on this host), or
	// of the door of the host that runs it, or false when the door must not
	// carry the cluster (there is none by that name). fromPeer: the connection
	// came from another host's door, so only this host's apiserver will do; a
	// second hop would loop between hosts that disagree on the owner.
	Backend(cluster string, fromPeer bool) (addr string, ok bool)
}

// BackendsFunc adapts a function to Backends.
type BackendsFunc func(cluster string, fromPeer bool) (string, bool)

// Backend calls f.
func (f BackendsFunc) Backend(cluster string, fromPeer bool) (string, bool) {
	return f(cluster, fromPeer)
}

// Door routes TLS connections by SNI. Make it with New, run it with Serve.
type Door struct {
	cfg      Config
	backends Backends
	log      *slog.Logger
	metrics  *metrics

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	// clients counts the client connections held, per source (sourceOf)
	// and in total, against the limits.
	clients   int
	perSource map[netip.Addr]int
}

// New makes a door; cfg must have passed ValidateAddress, ValidateDomain
// and ValidateMaxConns.
func New(cfg Config, backends Backends, log *slog.Logger) *Door {
	return &Door{cfg: cfg.withDefaults(), backends: backends, log: log, metrics: newMetrics(),
		conns: map[net.Conn]struct{}{}, perSource: map[netip.Addr]int{}}
}

// Collector returns the door's Prometheus metrics.
func (d *Door) Collector() prometheus.Collector { return d.metrics }

// Serve accepts connections on l until ctx ends, then closes l and every
// connection it carries, and returns once their goroutines are done.
func (d *Door) Serve(ctx context.Context, l net.Listener) error {
	stop := context.AfterFunc(ctx, func() {
		l.Close()
		d.closeAll()
	})
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of file descriptors and the like: wait, rather than
			// spin or stop carrying every tenant.
			d.log.Warn("front door: accepting a connection", "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		src := sourceOf(c.RemoteAddr())
		if reason := d.admit(src); reason != "" {
			// Closed before a byte is read: a flood costs a descriptor
			// for a moment, and no goroutine.
			d.metrics.refused.WithLabelValues(reason).Inc()
			d.log.Debug("front door: refused", "remote", c.RemoteAddr().String(), "reason", reason)
			c.Close()
			continue
		}
		wg.Go(func() {
			defer d.leave(src)
			d.handle(ctx, c)
		})
	}
}

// sourceOf is what a client connection counts against in MaxConnsPerSource:
// its IPv4 address, or its IPv6 /64 (one host or site usually has a whole
// /64 and could spread its connections over it).
func sourceOf(a net.Addr) netip.Addr {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.Addr{} // not TCP (a test's pipe): one source
	}
	ip := ta.AddrPort().Addr().Unmap()
	if ip.Is6() {
		if p, err := ip.Prefix(64); err == nil {
			return p.Addr()
		}
	}
	return ip
}

// fromPeer says whether src is another host of the service (Config.IsPeer).
func (d *Door) fromPeer(src netip.Addr) bool { return d.cfg.IsPeer != nil && d.cfg.IsPeer(src) }

// admit counts a new client connection from src, or says why it is refused:
// too_many_connections (MaxConns) or too_many_from_source
// (MaxConnsPerSource). An admitted one is given back with leave.
func (d *Door) admit(src netip.Addr) string {
	peer := d.fromPeer(src) // carries many clients: bound by MaxConns alone
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.clients >= d.cfg.MaxConns:
		return "too_many_connections"
	case !peer && d.perSource[src] >= d.cfg.MaxConnsPerSource:
		return "too_many_from_source"
	}
	d.clients++
	d.perSource[src]++
	return ""
}

func (d *Door) leave(src netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.clients--
	if d.perSource[src]--; d.perSource[src] <= 0 {
		delete(d.perSource, src)
	}
}

// handle carries one client connection: read the ClientHello, find the
// cluster, replay the hello to its apiserver and splice.
func (d *Door) handle(ctx context.Context, client net.Conn) {
	if !d.track(client) {
		return
	}
	defer d.untrack(client)
	log := d.log.With("remote", client.RemoteAddr().String())

	name, hello, err := clienthello.Read(client, d.cfg.HelloTimeout, d.cfg.MaxHello)
	if err != nil {
		// A hello that is not TLS, too large or too slow: nothing to answer.
		d.metrics.refused.WithLabelValues(clienthello.Reason(err)).Inc()
		log.Debug("front door: refused", "err", err)
		return
	}
	cluster, ok := d.cfg.cluster(name)
	var addr string
	if ok {
		addr, ok = d.backends.Backend(cluster, d.fromPeer(sourceOf(client.RemoteAddr())))
	}
	if !ok {
		reason := "unknown_name"
		if name == "" {
			reason = "no_name"
		}
		d.metrics.refused.WithLabelValues(reason).Inc()
		log.Debug("front door: refused", "reason", reason)
		clienthello.Refuse(client)
		return
	}
	log = log.With("cluster", cluster)
	dialer := net.Dialer{Timeout: d.cfg.DialTimeout}
	backend, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		d.metrics.refused.WithLabelValues("unavailable").Inc()
		log.Warn("front door: the cluster's apiserver does not answer", "backend", addr, "err", err)
		clienthello.Refuse(client)
		return
	}
	if !d.track(backend) {
		return
	}
	defer d.untrack(backend)

	m := d.metrics.forCluster(cluster)
	m.connections.Inc()
	m.open.Inc()
	defer m.open.Dec()
	start := time.Now()
	if _, err := backend.Write(hello); err != nil {
		log.Warn("front door: passing the ClientHello on", "backend", addr, "err", err)
		return
	}
	m.in.Add(float64(len(hello)))
	in, out := splice(client, backend, m.in, m.out)
	log.Debug("front door: connection ended", "bytesIn", in+int64(len(hello)), "bytesOut", out, "took", time.Since(start).Round(time.Millisecond))
}

// splice copies both ways until both directions have ended and returns the
// bytes carried each way. A direction that ends cleanly (EOF) is passed on
// as a half-close: kubectl exec sends EOF on stdin and still reads the
// command's output. A direction that fails closes both connections, so the
// other one ends too. There is no idle timeout: a watch may be quiet for
// minutes; TCP keepalive (on by default for Go's listeners and dialers)
// finds a peer that went away.
func splice(client, backend net.Conn, in, out prometheus.Counter) (nIn, nOut int64) {
	var wg sync.WaitGroup
	wg.Go(func() { nIn = pipe(backend, client, in) })
	wg.Go(func() { nOut = pipe(client, backend, out) })
	wg.Wait()
	client.Close()
	backend.Close()
	return nIn, nOut
}

// pipe copies src to dst, counting as it goes so a long stream shows in the
// metrics while it lasts, not only once it ends.
func pipe(dst, src net.Conn, count prometheus.Counter) int64 {
	buf := make([]byte, 32<<10)
	var n int64
	for {
		r, rerr := src.Read(buf)
		if r > 0 {
			w, werr := dst.Write(buf[:r])
			n += int64(w)
			count.Add(float64(w))
			if werr != nil {
				dst.Close()
				src.Close()
				return n
			}
		}
		if rerr != nil {
			cw, ok := dst.(interface{ CloseWrite() error })
			if errors.Is(rerr, io.EOF) && ok && cw.CloseWrite() == nil {
				return n
			}
			dst.Close()
			src.Close()
			return n
		}
	}
}

// track records a connection so Serve can close it on shutdown; false if the
// door is already shut (the connection is closed).
func (d *Door) track(c net.Conn) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		c.Close()
		return false
	}
	d.conns[c] = struct{}{}
	return true
}

func (d *Door) untrack(c net.Conn) {
	d.mu.Lock()
	delete(d.conns, c)
	d.mu.Unlock()
	c.Close()
}

func (d *Door) closeAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	for c := range d.conns {
		c.Close()
	}
}

// Forget drops the metrics of a deleted cluster, so they do not pile up.
func (d *Door) Forget(cluster string) { d.metrics.forget(cluster) }

// ServerName is the SNI name a client asks for to reach cluster.
func (d *Door) ServerName(cluster string) string { return d.cfg.ServerName(cluster) }

// Server is the URL kubeconfigs name for the door.
func (d *Door) Server() string { return d.cfg.Server() }
