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

	"github.com/socialweb-computer/socialweb/internal/dnswire"
)

// ttl of the answers: short, because Services and endpoints change.
const ttl = 5

// Server answers DNS over UDP and TCP from the current Table and forwards names outside
// the cluster domain to Upstream (over the transport the query came on: a client retries
// a truncated UDP answer over TCP).
type Server struct {
	Upstream string // host:port
	Log      *slog.Logger
	table    atomic.Pointer[Table]
	// onListen, when set, sees each new pair of sockets (tests close them to kill the server).
	onListen func(net.PacketConn, net.Listener)
}

// SetTable replaces the table answers come from.
func (s *Server) SetTable(t *Table) { s.table.Store(t) }

// ServeAddr listens on addr over UDP and TCP and answers until ctx ends (nil) or either
// socket fails (the error; both are closed).
func (s *Server) ServeAddr(ctx context.Context, addr string) error {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("cluster DNS: %w", err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		pc.Close()
		return fmt.Errorf("cluster DNS: %w", err)
	}
	if s.onListen != nil {
		s.onListen(pc, l)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2)
	go func() { errs <- s.Serve(ctx, pc); cancel() }()
	go func() { errs <- s.ServeTCP(ctx, l); cancel() }()
	return errors.Join(<-errs, <-errs)
}

// Serve answers queries on conn until ctx ends (nil) or reading fails.
func (s *Server) Serve(ctx context.Context, conn net.PacketConn) error {
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	buf := make([]byte, 4096)
	for {
		n, from, err := conn.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("cluster DNS: reading UDP: %w", err)
		}
		q := append([]byte(nil), buf[:n]...)
		go func() {
			if resp := s.answerSafely(ctx, "udp", q); resp != nil {
				_, _ = conn.WriteTo(resp, from)
			}
		}()
	}
}

// ServeTCP answers queries on l (RFC 1035 4.2.2: two-byte length, then the message) until
// ctx ends (nil) or accepting fails.
func (s *Server) ServeTCP(ctx context.Context, l net.Listener) error {
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("cluster DNS: accepting TCP: %w", err)
		}
		go func() {
			defer c.Close()
			for {
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				q, err := dnswire.ReadTCP(c)
				if err != nil {
					return
				}
				resp := s.answerSafely(ctx, "tcp", q)
				if resp == nil || dnswire.WriteTCP(c, resp) != nil {
					return
				}
			}
		}()
	}
}

// answerSafely is Answer, except that a panic drops the query instead of the node's agent
// (PID 1).
func (s *Server) answerSafely(ctx context.Context, network string, query []byte) (resp []byte) {
	defer func() {
		if r := recover(); r != nil {
			if s.Log != nil {
				s.Log.Error("cluster DNS: a query panicked; dropped", "panic", r)
			}
			resp = nil
		}
	}()
	return s.answer(ctx, network, query)
}

// Answer returns the response to one query message that came over UDP, or nil to drop it.
func (s *Server) Answer(ctx context.Context, query []byte) []byte {
	return s.answer(ctx, "udp", query)
}

func (s *Server) answer(ctx context.Context, network string, query []byte) []byte {
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
		return s.forward(ctx, network, query)
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

// forward relays a query to the upstream resolver over network and returns its answer
// (nil if none).
func (s *Server) forward(ctx context.Context, network string, query []byte) []byte {
	if s.Upstream == "" {
		return nil
	}
	resp, err := dnswire.Exchange(ctx, network, s.Upstream, query, 5*time.Second)
	if err != nil {
		return nil
	}
	return resp
}

// Run serves cluster DNS for domain on addr (UDP and TCP) from the tenant's Services and
// EndpointSlices until ctx ends. The table is rebuilt on every change once the caches
// have synced; before that, cluster names are not answered (never wrongly NXDOMAIN). If
// serving fails it is restarted after a second.
func Run(ctx context.Context, tenant kubernetes.Interface, domain, addr, upstream string, log *slog.Logger) error {
	return run(ctx, tenant, domain, addr, &Server{Upstream: upstream, Log: log})
}

func run(ctx context.Context, tenant kubernetes.Interface, domain, addr string, s *Server) error {
	log, upstream := s.Log, s.Upstream
	factory := informers.NewSharedInformerFactory(tenant, 0)
	svcs := factory.Core().V1().Services()
	eps := factory.Discovery().V1().EndpointSlices()
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
		log.Info("cluster DNS serving", "address", addr, "domain", domain, "upstream", upstream)
		if err := s.ServeAddr(ctx, addr); err != nil && ctx.Err() == nil {
			log.Error("cluster DNS stopped; restarting in 1s", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}
