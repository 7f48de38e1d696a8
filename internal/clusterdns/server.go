package clusterdns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// ttl of the answers: short, because Services and endpoints change.
const ttl = 5

// Server answers DNS over UDP from the current Table and forwards names outside the
// cluster domain to Upstream.
type Server struct {
	Upstream string // host:port
	Log      *slog.Logger
	table    atomic.Pointer[Table]
}

// SetTable replaces the table answers come from.
func (s *Server) SetTable(t *Table) { s.table.Store(t) }

// Serve answers queries on conn until ctx ends or reading fails.
func (s *Server) Serve(ctx context.Context, conn net.PacketConn) error {
	go func() { <-ctx.Done(); conn.Close() }()
	buf := make([]byte, 4096)
	for {
		n, from, err := conn.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("cluster DNS: reading: %w", err)
		}
		q := append([]byte(nil), buf[:n]...)
		go func() {
			if resp := s.Answer(ctx, q); resp != nil {
				_, _ = conn.WriteTo(resp, from)
			}
		}()
	}
}

// Answer returns the response to one query message, or nil to drop it.
func (s *Server) Answer(ctx context.Context, query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	t := s.table.Load()
	var ips []net.IP
	exists, inZone := false, false
	if t != nil {
		ips, exists, inZone = t.Lookup(q.Name.String())
	}
	if !inZone {
		return s.forward(ctx, query)
	}
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired,
		RecursionAvailable: true, RCode: dnsmessage.RCodeSuccess}
	if !exists {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(q) != nil || b.StartAnswers() != nil {
		return nil
	}
	if q.Type == dnsmessage.TypeA || q.Type == dnsmessage.TypeALL {
		for _, ip := range ips {
			var a dnsmessage.AResource
			copy(a.A[:], ip.To4())
			if b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: ttl}, a) != nil {
				return nil
			}
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// forward relays a query to the upstream resolver and returns its answer (nil if none).
func (s *Server) forward(ctx context.Context, query []byte) []byte {
	if s.Upstream == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", s.Upstream)
	if err != nil {
		return nil
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write(query); err != nil {
		return nil
	}
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}

// Run serves cluster DNS for domain on addr (UDP) from the tenant's Services and
// EndpointSlices until ctx ends. The table is rebuilt on every change once the caches
// have synced; before that, cluster names are not answered (never wrongly NXDOMAIN). If
// serving fails it is restarted after a second.
func Run(ctx context.Context, tenant kubernetes.Interface, domain, addr, upstream string, log *slog.Logger) error {
	factory := informers.NewSharedInformerFactory(tenant, 0)
	svcs := factory.Core().V1().Services()
	eps := factory.Discovery().V1().EndpointSlices()
	s := &Server{Upstream: upstream, Log: log}
	kick := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	h := cache.ResourceEventHandlerFuncs{AddFunc: poke, UpdateFunc: func(_, n any) { poke(n) }, DeleteFunc: poke}
	for _, inf := range []cache.SharedIndexInformer{svcs.Informer(), eps.Informer()} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return err
		}
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), svcs.Informer().HasSynced, eps.Informer().HasSynced) {
			return
		}
		for {
			sl, err1 := svcs.Lister().List(labels.Everything())
			el, err2 := eps.Lister().List(labels.Everything())
			if err := errors.Join(err1, err2); err != nil {
				log.Error("cluster DNS: listing", "err", err)
			} else {
				s.SetTable(Build(domain, sl, el))
			}
			select {
			case <-ctx.Done():
				return
			case <-kick:
			}
		}
	}()
	for ctx.Err() == nil {
		conn, err := net.ListenPacket("udp", addr)
		if err == nil {
			log.Info("cluster DNS serving", "address", addr, "domain", domain, "upstream", upstream)
			err = s.Serve(ctx, conn)
		}
		if err != nil && ctx.Err() == nil {
			log.Error("cluster DNS stopped; restarting in 1s", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}
