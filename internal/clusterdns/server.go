package clusterdns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/socialweb-computer/socialweb/internal/dnswire"
)

// maxInflight bounds the UDP queries answered at once (each may wait on the upstream);
// past it datagrams are dropped and their clients retry, instead of the agent (PID 1)
// growing without bound under a flood.
const maxInflight = 256

// Server answers DNS over UDP and TCP from the current Table and forwards names outside
// the cluster domain to Upstream (over the transport the query came on: a client retries
// a truncated UDP answer over TCP).
type Server struct {
	Upstream string // host:port
	// Domain is the cluster domain: before the first table its names get SERVFAIL (try
	// again), not the upstream's NXDOMAIN.
	Domain string
	Log    *slog.Logger
	table  atomic.Pointer[Table]
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
	buf := make([]byte, 0xffff) // any datagram whole: a truncated one would parse as garbage
	inflight := make(chan struct{}, maxInflight)
	for {
		n, from, err := conn.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("cluster DNS: reading UDP: %w", err)
		}
		select {
		case inflight <- struct{}{}:
		default:
			continue
		}
		q := append([]byte(nil), buf[:n]...)
		go func() {
			defer func() { <-inflight }()
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

// Run serves cluster DNS for domain on addr (UDP and TCP) from the tenant's Services and
// EndpointSlices until ctx ends. The table is rebuilt on every change once the caches
// have synced; before that, cluster names are not answered (never wrongly NXDOMAIN). If
// serving fails it is restarted after a second.
func Run(ctx context.Context, tenant kubernetes.Interface, domain, addr, upstream string, log *slog.Logger) error {
	return run(ctx, tenant, domain, addr, &Server{Upstream: upstream, Domain: domain, Log: log})
}

func run(ctx context.Context, tenant kubernetes.Interface, domain, addr string, s *Server) error {
	log, upstream := s.Log, s.Upstream
	factory := informers.NewSharedInformerFactoryWithOptions(tenant, 0, informers.WithTransform(slim))
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
				log.Error("cluster DNS: listing from the informers' caches", "err", err)
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

// slim drops what Build does not read from the cached Services and EndpointSlices
// (managed fields, annotations, endpoints' topology and Pod references): the node keeps
// every Service of the cluster in memory, and those are most of each object.
func slim(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		o.ManagedFields, o.Annotations, o.Labels = nil, nil, nil
		o.Status = corev1.ServiceStatus{}
	case *discoveryv1.EndpointSlice:
		o.ManagedFields, o.Annotations, o.OwnerReferences = nil, nil, nil
		for i := range o.Endpoints {
			e := &o.Endpoints[i]
			e.TargetRef, e.NodeName, e.Zone, e.Hints, e.DeprecatedTopology = nil, nil, nil, nil, nil
		}
	}
	return obj, nil
}
