// Package nodeservice gives tenant clusters their nodes. Start (setup.go) brings
// up the host's side once: the qemu provider, the registry nodes pull from, and the
// Host. When a cluster is Ready, the provider assembles its Cluster (ClusterFrom,
// from its object, lease and PKI) and starts it on the Host: a scale driver boots
// microVMs for its Pending Pods, each VM asks Joiners for its identity (the cluster's
// minter, registered while it runs) and joins as a Node, the cloud-controller-manager
// reports the VMs, and the registry, a DNS relay and pod routes serve it on its
// bridge. When the cluster is deleted, the provider stops its services and deletes
// its machines.
package nodeservice

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/socialweb-computer/socialweb/internal/buildcache"
	"github.com/socialweb-computer/socialweb/internal/ccm"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/podroutes"
	"github.com/socialweb-computer/socialweb/internal/pullevents"
	"github.com/socialweb-computer/socialweb/internal/registry"
	"github.com/socialweb-computer/socialweb/internal/scale"
	"github.com/socialweb-computer/socialweb/internal/scaledriver"
)

// Addresser is optionally implemented by a NodeProvider that knows each
// machine's address (the qemu provider does); the CCM reports it.
type Addresser interface {
	Address(name string) (net.IP, bool)
}

// Host runs node services for every Ready cluster. The zero value is not
// usable; build it with New.
type Host struct {
	// BootTimeout is how long a machine may take to register its Node before it is
	// reported and deleted, and how long a registered Node may stay not Ready and still
	// count as capacity; 0 is the scale driver's defaults. Set it before Start.
	BootTimeout time.Duration
	// ResolvConf is the host resolver configuration the clusters' DNS forwarders
	// relay to (default /etc/resolv.conf).
	ResolvConf string
	// PodRoutes, if set, gives the host route table of a cluster; Start then keeps its
	// pod routes in step with the cluster's Nodes (pod-to-pod traffic across nodes).
	PodRoutes func(Cluster) podroutes.Table
	// PullFailures, if set, says why the registry last refused a cluster's nodes an
	// image; each cluster's Pods stuck pulling it get an Event saying so.
	PullFailures func(cluster, image string) (registry.PullFailure, bool)
	// BuildCache, if set and on, serves each cluster's build cache (S3) on its
	// gateway at BuildCacheAddr, with that cluster's credentials only.
	BuildCache *buildcache.Cache

	provider nodes.NodeProvider
	joiners  *Joiners
	registry func(cluster string) http.Handler
	status   scaledriver.StatusRecorder
	metrics  prometheus.Registerer
	log      *slog.Logger

	mu       sync.Mutex
	clusters map[string]*running
}

type running struct {
	cancel context.CancelFunc
	done   chan struct{}
	// The scale driver runs apart from the other services so that an edit of the
	// Cluster's scaling fields replaces it alone (driverFor).
	ctx         context.Context
	driverCfg   scaledriver.Config
	driverStop  context.CancelFunc
	driverDone  chan struct{}
	replacement bool // a Start is replacing the driver
}

// New returns a Host. provider may be nil: clusters then stay at zero nodes
// and Start says why once. Otherwise joiners is the provider's Joiner: Start
// registers each cluster's minter there, and Stop removes it.
//
// registry gives the handler a cluster's nodes are served on its gateway (the
// registry's NodeHandlerFor: pulls only, that cluster's view); nil serves none.
func New(provider nodes.NodeProvider, joiners *Joiners, registry func(cluster string) http.Handler, status scaledriver.StatusRecorder, metrics prometheus.Registerer, log *slog.Logger) *Host {
	return &Host{provider: provider, joiners: joiners, registry: registry, status: status, metrics: metrics, log: log, clusters: map[string]*running{}}
}

// driverConfig is the scale driver's configuration for c.
func (h *Host) driverConfig(c Cluster) scaledriver.Config {
	return scaledriver.Config{
		Cluster: c.Name, NodeSize: c.NodeSize, MaxNodeSize: c.MaxNodeSize, MaxNodes: c.MaxNodes, Hold: c.Hold, BootTimeout: h.BootTimeout,
		FreshNodePerJob: c.FreshNodePerJob, IdleNodes: c.IdleNodes, IdleSchedule: c.IdleSchedule,
		// Nodes run socialweb's node image: the decision models their allocatable by it.
		Reserve: scale.DefaultReserve(),
		// A registered node still starting (kubelet, CNI) counts as coming capacity as long
		// as a boot may take: not removed as idle while Pods wait for it.
		NotReadyGrace: h.BootTimeout,
	}
}

// startDriver runs a scale driver of cfg for c under r's context. Under h.mu.
func (h *Host) startDriver(r *running, c Cluster, cfg scaledriver.Config) error {
	drv, err := scaledriver.New(cfg, scaledriver.Deps{
		Tenant: c.Tenant, Provider: clusterScoped{h.provider, c.Name}, Status: h.status, Metrics: h.metrics,
		Logger: h.log.With("cluster", c.Name, "component", "scaledriver"),
	})
	if err != nil {
		return fmt.Errorf("scale driver for %s: %w", c.Name, err)
	}
	ctx, stop := context.WithCancel(r.ctx)
	done := make(chan struct{})
	r.driverCfg, r.driverStop, r.driverDone = cfg, stop, done
	go func() {
		defer close(done)
		if err := drv.Run(ctx); err != nil && ctx.Err() == nil {
			h.log.Error("scale driver stopped", "cluster", c.Name, "err", err)
		}
	}()
	return nil
}

// Start runs the cluster's node services until Stop or ctx ends. Starting a running
// cluster changes nothing, unless the Cluster's scaling fields (sizes, max nodes, hold,
// idle nodes and their schedule, a fresh node per job) changed: then its scale driver
// alone is replaced by one that reads them, and its machines are kept.
func (h *Host) Start(ctx context.Context, c Cluster) error {
	h.mu.Lock()
	if r, ok := h.clusters[c.Name]; ok {
		defer h.mu.Unlock()
		return h.driverFor(r, c)
	}
	defer h.mu.Unlock()
	if h.provider == nil {
		return errors.New("no node provider: build a node image with `socialweb image build` and restart serve; the cluster stays at zero nodes")
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &running{cancel: cancel, done: make(chan struct{}), ctx: ctx}
	if err := h.startDriver(r, c, h.driverConfig(c)); err != nil {
		cancel()
		return err
	}
	h.clusters[c.Name] = r
	h.joiners.Register(c.Name, c.Minter)
	var wg sync.WaitGroup
	if h.registry != nil && c.RegistryAddr != "" {
		wg.Add(1)
		go func() { defer wg.Done(); h.serveHTTP(ctx, c.Name, "registry", c.RegistryAddr, h.registry(c.Name)) }()
	}
	if h.BuildCache != nil && h.BuildCache.On() && c.BuildCacheAddr != "" {
		cache, err := h.BuildCache.HandlerFor(c.Name, c.UID)
		if err != nil {
			h.log.Error("build cache not served", "cluster", c.Name, "err", err)
		} else {
			wg.Add(1)
			go func() { defer wg.Done(); h.serveHTTP(ctx, c.Name, "build cache", c.BuildCacheAddr, cache) }()
		}
	}
	if c.DNSAddr != "" {
		wg.Add(1)
		go func() { defer wg.Done(); h.serveDNS(ctx, c.Name, c.DNSAddr) }()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := ccm.Run(ctx, c.Tenant, &ccm.Cloud{Cluster: c.Name, Machines: h}, ccm.Options{Log: h.log.With("component", "ccm")}); err != nil {
			h.log.Error("cloud-controller-manager stopped", "cluster", c.Name, "err", err)
		}
	}()
	if h.PullFailures != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lookup := func(image string) (registry.PullFailure, bool) { return h.PullFailures(c.Name, image) }
			if err := pullevents.Run(ctx, c.Tenant, lookup, h.log.With("cluster", c.Name, "component", "pullevents")); err != nil {
				h.log.Error("pull failure events stopped", "cluster", c.Name, "err", err)
			}
		}()
	}
	if h.PodRoutes != nil {
		table := h.PodRoutes(c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := podroutes.Run(ctx, c.Tenant, table, 30*time.Second, h.log.With("cluster", c.Name, "component", "podroutes")); err != nil {
				h.log.Error("pod routes stopped", "cluster", c.Name, "err", err)
			}
		}()
	}
	go func() {
		wg.Wait()
		// The driver last: a replacement may be starting one (driverFor).
		h.mu.Lock()
		for r.replacement {
			h.mu.Unlock()
			time.Sleep(10 * time.Millisecond)
			h.mu.Lock()
		}
		done := r.driverDone
		h.mu.Unlock()
		<-done
		close(r.done)
	}()
	h.log.Info("node services started", "cluster", c.Name)
	return nil
}

// driverFor replaces r's scale driver if c's configuration differs from the one it
// runs: the old one is stopped (its pass in flight ends first) before the new one
// starts, so two never decide at once. Called and returns under h.mu, which it lets go
// while the old driver stops.
func (h *Host) driverFor(r *running, c Cluster) error {
	cfg := h.driverConfig(c)
	if reflect.DeepEqual(cfg, r.driverCfg) || r.replacement || r.ctx.Err() != nil {
		return nil
	}
	r.replacement = true
	stop, done := r.driverStop, r.driverDone
	h.mu.Unlock()
	stop()
	<-done
	h.mu.Lock()
	r.replacement = false
	if h.clusters[c.Name] != r || r.ctx.Err() != nil {
		return nil // stopped meanwhile
	}
	h.log.Info("the Cluster's scaling changed: scale driver replaced", "cluster", c.Name,
		"maxNodes", cfg.MaxNodes, "hold", cfg.Hold, "idleNodes", cfg.IdleNodes, "idleSchedule", cfg.IdleSchedule, "freshNodePerJob", cfg.FreshNodePerJob)
	return h.startDriver(r, c, cfg)
}

// serveHTTP serves handler (what names it in the log) on a cluster's gateway address;
// the bridge may appear after the cluster starts, so the bind is retried.
func (h *Host) serveHTTP(ctx context.Context, cluster, what, addr string, handler http.Handler) {
	for ctx.Err() == nil {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
		go func() { <-ctx.Done(); _ = srv.Close() }()
		h.log.Info(what+" serving the cluster's nodes", "cluster", cluster, "address", addr)
		_ = srv.Serve(l)
		return
	}
}

// serveDNS relays DNS from a cluster's gateway address to the host's resolvers
// (/etc/resolv.conf, or ResolvConf); the bridge may appear after the cluster
// starts, and a failed forwarder is started again, so both are retried.
func (h *Host) serveDNS(ctx context.Context, cluster, addr string) {
	resolvConf := h.ResolvConf
	if resolvConf == "" {
		resolvConf = "/etc/resolv.conf"
	}
	logged := false
	for ctx.Err() == nil {
		err := func() error {
			ups, err := nodenet.ResolvConfUpstreams(resolvConf)
			if err != nil {
				return err
			}
			f, err := nodenet.ListenDNS(addr, ups)
			if err != nil {
				return err
			}
			f.Log = h.log.With("cluster", cluster, "component", "dns-forwarder")
			h.log.Info("DNS forwarder serving the cluster's nodes", "cluster", cluster, "address", addr, "upstreams", ups)
			logged = false
			return f.Serve(ctx)
		}()
		if err != nil && ctx.Err() == nil && !logged {
			h.log.Warn("DNS forwarder for the cluster's nodes: retrying", "cluster", cluster, "address", addr, "err", err)
			logged = true
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// Stop ends a cluster's node services and waits for them; its machines are
// the caller's to delete (DeleteAll).
func (h *Host) Stop(name string) {
	h.mu.Lock()
	r := h.clusters[name]
	if r != nil {
		delete(h.clusters, name)
		h.joiners.Remove(name)
	}
	h.mu.Unlock()
	if r == nil {
		return
	}
	r.cancel()
	<-r.done
}

// Close closes the node provider at daemon stop, if it can be closed: the qemu
// provider destroys its unclaimed warm-pool VMs and releases its state dir, and leaves
// the nodes running for the next serve to adopt.
func (h *Host) Close() error {
	if c, ok := h.provider.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// DeleteAll deletes every machine of a cluster (on cluster delete).
func (h *Host) DeleteAll(ctx context.Context, cluster string) error {
	if h.provider == nil {
		return nil
	}
	insts, err := h.provider.List(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, in := range insts {
		if in.Cluster == cluster {
			if err := h.provider.Delete(ctx, in.Name); err != nil && !nodes.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Machine implements ccm.Machines over the provider's List.
func (h *Host) Machine(ctx context.Context, cluster, node string) (ccm.Machine, bool, error) {
	insts, err := h.provider.List(ctx)
	if err != nil {
		return ccm.Machine{}, false, err
	}
	for _, in := range insts {
		if in.Cluster == cluster && in.Name == node {
			m := ccm.Machine{Running: in.State == nodes.StateRunning}
			if a, ok := h.provider.(Addresser); ok {
				m.Address, _ = a.Address(node)
			}
			return m, true, nil
		}
	}
	return ccm.Machine{}, false, nil
}

// clusterScoped is one cluster's view of the provider, which serves every
// cluster on the host: it lists, creates, deletes and diagnoses only that
// cluster's machines. Machine names come from the tenant (its Node objects,
// which its admin may write), so a name alone must never reach another
// tenant's VM or console.
type clusterScoped struct {
	nodes.NodeProvider
	cluster string
}

// owns reports whether name is one of this cluster's machines.
func (c clusterScoped) owns(ctx context.Context, name string) (bool, error) {
	mine, err := c.List(ctx)
	if err != nil {
		return false, err
	}
	for _, in := range mine {
		if in.Name == name {
			return true, nil
		}
	}
	return false, nil
}

// Create boots a machine only for this cluster.
func (c clusterScoped) Create(ctx context.Context, req nodes.NodeRequest) (nodes.Instance, error) {
	if req.Cluster != c.cluster {
		return nodes.Instance{}, fmt.Errorf("node request for cluster %q through cluster %q's provider", req.Cluster, c.cluster)
	}
	return c.NodeProvider.Create(ctx, req)
}

// Delete destroys name only if it is this cluster's: another cluster's machine
// of that name is, to this cluster, not found (so its Node object goes, not the VM).
func (c clusterScoped) Delete(ctx context.Context, name string) error {
	ok, err := c.owns(ctx, name)
	if err != nil {
		return fmt.Errorf("finding machine %s of cluster %s: %w", name, c.cluster, err)
	}
	if !ok {
		return nodes.NewNotFound(name)
	}
	return c.NodeProvider.Delete(ctx, name)
}

// Diagnose forwards to the provider if it can diagnose machines, for this
// cluster's machines only (the console of another tenant's VM is its secret).
func (c clusterScoped) Diagnose(name string) string {
	d, ok := c.NodeProvider.(nodes.Diagnoser)
	if !ok || !c.ownsNow(name) {
		return ""
	}
	return d.Diagnose(name)
}

// EarlyBootStall forwards to the provider if it watches early boots, for this
// cluster's machines only.
func (c clusterScoped) EarlyBootStall(name string) string {
	w, ok := c.NodeProvider.(nodes.EarlyBootWatcher)
	if !ok || !c.ownsNow(name) {
		return ""
	}
	return w.EarlyBootStall(name)
}

// ForgetJoin forwards to the provider if it hands machines join secrets, for this
// cluster's machines only (a Node name is the tenant's to choose).
func (c clusterScoped) ForgetJoin(ctx context.Context, name string) error {
	f, ok := c.NodeProvider.(nodes.JoinForgetter)
	if !ok {
		return nil
	}
	mine, err := c.owns(ctx, name)
	if err != nil || !mine {
		return err
	}
	return f.ForgetJoin(ctx, name)
}

// ownsNow is owns for the optional sides, which take no context: a failed
// list owns nothing.
func (c clusterScoped) ownsNow(name string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ok, err := c.owns(ctx, name)
	return err == nil && ok
}

// Accelerator forwards to the provider if it reports one ("" otherwise: nothing to show).
func (c clusterScoped) Accelerator() (string, string) {
	if r, ok := c.NodeProvider.(nodes.AcceleratorReporter); ok {
		return r.Accelerator()
	}
	return "", ""
}

func (c clusterScoped) List(ctx context.Context) ([]nodes.Instance, error) {
	all, err := c.NodeProvider.List(ctx)
	if err != nil {
		return nil, err
	}
	var mine []nodes.Instance
	for _, in := range all {
		if in.Cluster == c.cluster {
			mine = append(mine, in)
		}
	}
	return mine, nil
}
