package provider

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/buildcache"
	"github.com/socialweb-computer/socialweb/internal/cgroup"
	"github.com/socialweb-computer/socialweb/internal/controlplane"
	"github.com/socialweb-computer/socialweb/internal/datastore"
	"github.com/socialweb-computer/socialweb/internal/frontdoor"
	"github.com/socialweb-computer/socialweb/internal/lease"
	"github.com/socialweb-computer/socialweb/internal/logrotate"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodeservice"
	"github.com/socialweb-computer/socialweb/internal/pki"
	"github.com/socialweb-computer/socialweb/internal/registry"
	"github.com/socialweb-computer/socialweb/internal/sleep"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
	"github.com/socialweb-computer/socialweb/internal/tenantuid"
)

// Defaults fill a Cluster's empty spec fields.
type Defaults struct {
	MaxNodes int32
	Hold     time.Duration
	// NodeCPUs, NodeMemory and NodeDisk are the smallest node, the Max* fields the
	// largest; a maximum of 0 is its minimum (a fixed size). NodeDisk 0 gives nodes no
	// disk of their own.
	NodeCPUs      int32
	MaxNodeCPUs   int32
	NodeMemory    resource.Quantity
	MaxNodeMemory resource.Quantity
	NodeDisk      resource.Quantity
	MaxNodeDisk   resource.Quantity
	PodsPerNode   int32
	// SleepAfter is the idle time before a cluster's control plane sleeps, for a
	// cluster that does not say; 0 is never.
	SleepAfter time.Duration
	// ControlPlaneMemory, ControlPlanePIDs and ControlPlaneCPUWeight are the control
	// plane's limits for a cluster that does not say (ClusterSpec.ControlPlane*).
	ControlPlaneMemory    resource.Quantity
	ControlPlanePIDs      int32
	ControlPlaneCPUWeight int32
}

// Config is what the provider needs from the daemon.
type Config struct {
	StateDir   string // clusters live in StateDir/clusters/NAME
	Executable string // the socialweb binary, run as `controlplane` per tenant
	Ports      lease.Range
	Networks   lease.Range
	Defaults   Defaults
	// ExecutableDigest names Executable's build (its SHA-256): a control plane an
	// earlier daemon left running is adopted only if it runs the same build and
	// configuration (supervisor.Spec.Fingerprint).
	ExecutableDigest string
	// Env is added to each control-plane process's environment (GOGC...).
	Env []string
	// ControlPlaneLog bounds each control plane's controlplane.log; the control
	// plane rotates it itself (logrotate.Stdio).
	ControlPlaneLog logrotate.Rotation
	// Networks makes each cluster's node network; nil leaves clusters
	// without one (loopback only, no nodes).
	NodeNetworks Networks
	// NodeServices gives Ready clusters nodes; nil keeps every cluster at
	// zero nodes.
	NodeServices nodeservice.NodeServices
	// FrontDoor, when set, carries every cluster: admin kubeconfigs name
	// the door.
	FrontDoor *frontdoor.Door
	// Cgroups, when set, holds each control plane in a cgroup of its own with its
	// spec's limits (tenant-NAME); nil runs them unlimited.
	Cgroups *cgroup.Hierarchy
	// Domain names the clusters: cluster NAME is NAME.Domain, the name its
	// clients send (SNI), through the door or to its own port, which its
	// serving certificate carries, its admin kubeconfig sends, and a
	// sleeping cluster wakes for. "" is frontdoor.DefaultDomain.
	Domain string
	// UIDBase is serve's --control-plane-uid-base: a tenant's control plane runs
	// as uid and gid UIDBase + its port (tenantuid.For); 0 runs it as root.
	UIDBase int64
	// BuildCache is the host's build cache: when on, each cluster's nodes may open
	// its port on their gateway and its access is kept in a Secret for runner
	// credentials; on or off, a deleted cluster's cache goes. nil: none.
	BuildCache *buildcache.Cache
	// Ownership says which clusters this host runs, of a management API other
	// hosts may share; nil runs every cluster.
	Ownership Ownership
	// SharePKI keeps each tenant's CAs in the management API (PKISecretName),
	// so that any host can run it: the hosts share a datastore.
	SharePKI bool
}

// Networks is the part of nodenet.Manager the provider uses.
type Networks interface {
	// Ensure creates the cluster's bridge, addresses and rules; idempotent.
	// served are the ports the host serves the cluster's nodes on its gateway,
	// the only ones they may open there.
	// narrow is what the cluster takes away from the host's egress policy.
	Ensure(ctx context.Context, cluster string, plan nodenet.Plan, served nodenet.Served, narrow nodenet.Narrowing) error
	// Remove deletes them; removing what is gone is not an error.
	Remove(ctx context.Context, cluster string, plan nodenet.Plan) error
	// WallControlPlane writes the kernel's wall around the new connections of a
	// control plane's uid; idempotent. UnwallControlPlane removes it (by its
	// apiserver port) once the process is gone; removing what is gone is not an
	// error.
	WallControlPlane(ctx context.Context, cluster string, reach nodenet.ControlPlaneReach, narrow nodenet.Narrowing) error
	UnwallControlPlane(ctx context.Context, port int) error
}

// Provider reconciles Cluster objects. Run it once.
type Provider struct {
	cfg      Config
	log      *slog.Logger
	dyn      dynamic.Interface
	kube     kubernetes.Interface
	store    datastore.Store
	sup      *supervisor.Supervisor
	leases   leaseStore
	queue    workqueue.TypedRateLimitingInterface[string]
	factory  dynamicinformer.DynamicSharedInformerFactory
	informer cache.SharedIndexInformer
	lister   cache.GenericLister
	probeMu  sync.Mutex
	probes   map[string]*probe
	probing  map[string]bool // a probe is in flight
	// failures remembers the last Lease/Provision error per cluster so the
	// plan reports it instead of retrying in a tight loop.
	failMu   sync.Mutex
	failures map[string]map[Op]error
	// prepared holds the clusters whose PKI, config and admin kubeconfig
	// this daemon has written; a cluster provisioned by an earlier daemon is
	// prepared again before its first start, so a changed front door or
	// domain (a new name on the serving certificate, kubeconfigs that name
	// the door) reaches existing clusters too; a sleeping one gets its
	// admin kubeconfig at once (goToSleep). Under failMu.
	prepared map[string]bool
	// egressApplied is, per cluster, the egress narrowing (egressKey) its node
	// network's rules were last made with: a Cluster edit that changes it
	// re-applies them (OpEnsureNetwork). Under failMu.
	egressApplied map[string]string
	// takenOver holds the clusters taken over from a lost host whose Nodes (all
	// of that host) are still to be deleted. Under failMu.
	takenOver map[string]bool
	// moving holds the clusters this host is handing over (drain.go). Under failMu.
	moving map[string]bool
	// wakePlaced is when a door last asked where a sleeping cluster wakes:
	// asked again only after wakePlaceEvery, so that a flood of connections
	// naming it costs the management API one view, not one per connection.
	// A move it wrote is kept, so that the next connections too are held.
	// Under failMu.
	wakePlaced map[string]wakePlacement
	// sleepers is the sleep state of clusters that may sleep (sleep.go).
	sleepMu      sync.Mutex
	sleepers     map[string]*sleeper
	sleepMetrics *sleep.Metrics
}

type probe struct {
	last   time.Time // when it was last probed
	state  ProbeState
	client *http.Client
	cfg    controlplane.Config
}

// New wires a provider. The supervisor must have been created with
// p.Enqueue-compatible change notifications (see SupervisorHook).
func New(cfg Config, log *slog.Logger, dyn dynamic.Interface, kube kubernetes.Interface, store datastore.Store, sup *supervisor.Supervisor) *Provider {
	factory := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 30*time.Second)
	inf := factory.ForResource(v1.ClusterResource)
	return &Provider{
		cfg: cfg, log: log, dyn: dyn, kube: kube, store: store, sup: sup,
		factory:  factory,
		informer: inf.Informer(),
		lister:   inf.Lister(),
		leases:   leaseStore{kube: kube, ports: cfg.Ports, networks: cfg.Networks},
		queue:    workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		probes:   map[string]*probe{},
		probing:  map[string]bool{},
		failures: map[string]map[Op]error{},
		prepared: map[string]bool{},
		sleepers: map[string]*sleeper{},

		egressApplied: map[string]string{},
		takenOver:     map[string]bool{},
		moving:        map[string]bool{},
		wakePlaced:    map[string]wakePlacement{},

		sleepMetrics: sleep.NewMetrics(),
	}
}

// reconcileWorkers is how many clusters are reconciled at once.
const reconcileWorkers = 4

// ProcessName is the supervisor's name for a cluster's control plane.
func ProcessName(cluster string) string { return "cluster/" + cluster }

// ClusterDir is where a cluster's files live.
func ClusterDir(stateDir, cluster string) string { return filepath.Join(stateDir, "clusters", cluster) }

// RunDir is the part of a cluster's dir its control plane writes, owned by its uid.
func RunDir(stateDir, cluster string) string {
	return filepath.Join(ClusterDir(stateDir, cluster), controlplane.RunDirName)
}

// SupervisorHook is the onChange callback to give the supervisor.
func (p *Provider) SupervisorHook(name string) {
	if len(name) > len("cluster/") && name[:len("cluster/")] == "cluster/" {
		p.queue.Add(name[len("cluster/"):])
		p.failWakeIfExited(name[len("cluster/"):])
	}
}

// Run watches Clusters until ctx ends, then stops every control plane.
func (p *Provider) Run(ctx context.Context) error {
	_, _ = p.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { p.enqueue(o) },
		UpdateFunc: func(_, o any) { p.enqueue(o) },
		DeleteFunc: func(o any) { p.enqueue(o) },
	})
	if err := p.removeOrphanNetworks(ctx); err != nil {
		p.log.Warn("cleaning up node networks of deleted clusters", "err", err)
	}
	p.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), p.informer.HasSynced) {
		return fmt.Errorf("cluster informer did not sync")
	}
	p.reapUnwanted()
	go p.probeLoop(ctx)
	go p.sleepLoop(ctx)
	go p.drainLoop(ctx)
	go func() {
		<-ctx.Done()
		p.queue.ShutDown()
	}()
	// The queue hands a cluster to one worker at a time; several workers keep a
	// wake from waiting behind other clusters' sleeps, each of which waits for
	// its control plane to exit (seconds, up to the stop timeout).
	var wg sync.WaitGroup
	for range reconcileWorkers {
		wg.Go(func() {
			for p.processNext(ctx) {
			}
		})
	}
	wg.Wait()
	return nil
}

// Synced says whether Run has started and its Cluster informer has listed the
// Clusters: only then does the provider reconcile them.
func (p *Provider) Synced() bool { return p.informer.HasSynced() }

func (p *Provider) enqueue(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	if u, ok := o.(*unstructured.Unstructured); ok {
		p.queue.Add(u.GetName())
	}
}

func (p *Provider) processNext(ctx context.Context) bool {
	name, quit := p.queue.Get()
	if quit {
		return false
	}
	defer p.queue.Done(name)
	requeue, err := p.reconcile(ctx, name)
	switch {
	case apierrors.IsConflict(err):
		// Someone (often our own last write) changed the object: read it again.
		p.log.Debug("conflict; requeueing", "cluster", name)
		p.queue.AddRateLimited(name)
	case err != nil:
		p.log.Error("reconcile failed", "cluster", name, "err", err)
		p.queue.AddRateLimited(name)
	case requeue > 0:
		p.queue.Forget(name)
		p.queue.AddAfter(name, requeue)
	default:
		p.queue.Forget(name)
	}
	return true
}

// reconcile observes, plans and acts until the plan has nothing left to do
// (or an op fails), then writes the status.
func (p *Provider) reconcile(ctx context.Context, name string) (time.Duration, error) {
	c, err := p.cached(name)
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	owned, wait, err := p.owns(ctx, c)
	if err != nil {
		return 0, err
	}
	if !owned {
		p.letGo(ctx, name)
		return wait, nil
	}
	if wait > 0 { // claimed just now, its status written: act on the object as it is now
		return wait, nil
	}
	if moved, err := p.moveRequested(ctx, c); moved || err != nil { // a door asked for it to wake elsewhere
		return 0, err
	}
	var plan Plan
	var obs Observed
	for range 10 {
		obs, err = p.observe(ctx, c)
		if err != nil {
			return 0, err
		}
		plan = Decide(obs)
		if len(plan.Ops) == 0 {
			break
		}
		if c, err = p.act(ctx, c, obs, plan.Ops); err != nil {
			return 0, err
		}
		if c == nil { // finalizer removed: the object is gone
			return 0, nil
		}
	}
	if err := p.writeStatus(ctx, c, obs, plan); err != nil {
		return 0, err
	}
	if plan.Phase == v1.PhaseReady && p.awake(c.Name) {
		p.queue.Add(c.Name) // the Wake condition
	}
	if plan.Phase == v1.PhaseAsleep && obs.Gated {
		// Moved here asleep: its port is held here now, and wakes it here.
		if err := p.arrived(ctx, c, true); err != nil {
			p.log.Error("recording a cluster moved here", "cluster", c.Name, "err", err)
		}
	}
	if plan.Phase == v1.PhaseReady && obs.Lease != nil {
		if err := p.arrived(ctx, c, false); err != nil {
			p.log.Error("recording a cluster moved here", "cluster", c.Name, "err", err)
		}
		if err := p.removeStaleNodes(ctx, c.Name); err != nil {
			p.log.Error("removing the Nodes of the host a cluster was taken from", "cluster", c.Name, "err", err)
		}
		if err := p.startNodeServices(ctx, c, *obs.Lease); err != nil {
			p.log.Error("starting node services", "cluster", c.Name, "err", err)
		}
	}
	if obs.LeaseErr != nil || obs.ProvisionErr != nil {
		return 10 * time.Second, nil
	}
	return 0, nil
}

func (p *Provider) observe(ctx context.Context, c *v1.Cluster) (Observed, error) {
	o := Observed{
		Deleting:     c.DeletionTimestamp != nil,
		HasFinalizer: slices.Contains(c.Finalizers, v1.Finalizer),
		Now:          time.Now(),
		WasReady:     meta.IsStatusConditionTrue(c.Status.Conditions, v1.ConditionReady) || c.Status.Phase == v1.PhaseUnavailable,
	}
	l, err := p.leases.Get(ctx, c.Name)
	if err != nil {
		return o, err
	}
	o.Lease = l
	p.failMu.Lock()
	o.LeaseErr = p.failures[c.Name][OpLease]
	o.ProvisionErr = p.failures[c.Name][OpProvision]
	if applied, ok := p.egressApplied[c.Name]; ok && l != nil && l.HasNetwork() {
		o.NetworkStale = applied != egressKey(c.Spec)
	}
	p.failMu.Unlock()
	dir := ClusterDir(p.cfg.StateDir, c.Name)
	if _, err := os.Stat(dir); err == nil {
		o.DataPresent = true
	}
	if l != nil {
		if cfg, err := controlplane.ReadConfig(filepath.Join(dir, controlplane.ConfigFile)); err == nil {
			o.Provisioned = provisionedFor(cfg, *l)
		}
	}
	if o.Provisioned || o.Deleting {
		// Postgres data exists once provisioned, even if the dir is gone.
		o.DataPresent = o.DataPresent || (o.Provisioned && p.store.Kind() == "postgres")
	}
	if st, ok := p.sup.State(ProcessName(c.Name)); ok {
		o.Process = ProcessState{Supervised: true, Running: st.Running, PID: st.PID, Restarts: st.Restarts, LastExit: st.LastExit, Since: st.Since}
	}
	p.probeMu.Lock()
	if pr := p.probes[c.Name]; pr != nil {
		o.Probe = pr.state
	}
	p.probeMu.Unlock()
	p.observeSleep(c, &o)
	return o, nil
}

func (p *Provider) fail(cluster string, op Op, err error) {
	p.failMu.Lock()
	defer p.failMu.Unlock()
	if p.failures[cluster] == nil {
		p.failures[cluster] = map[Op]error{}
	}
	if err == nil {
		delete(p.failures[cluster], op)
	} else {
		p.failures[cluster][op] = err
	}
}

// act performs ops in order. It returns the updated object (nil once the
// finalizer is gone).
func (p *Provider) act(ctx context.Context, c *v1.Cluster, obs Observed, ops []Op) (*v1.Cluster, error) {
	name := c.Name // an op that fails may return no object
	log := p.log.With("cluster", name)
	for _, op := range ops {
		log.Info("performing", "op", op)
		var err error
		switch op {
		case OpAddFinalizer:
			c, err = p.addFinalizerAndDefaults(ctx, c)
		case OpLease:
			_, lerr := p.leases.Acquire(ctx, c.Name)
			if lerr != nil && !errors.Is(lerr, lease.ErrExhausted) {
				return c, lerr
			}
			p.fail(c.Name, OpLease, lerr)
			if lerr != nil && obs.Lease != nil {
				// A wake with every node network held: the waiting client gets
				// a 503 saying so, and the cluster sleeps on.
				p.failWake(c.Name, "no node network is free for the wake: "+lerr.Error())
			}
		case OpProvision:
			perr := p.provision(ctx, c, *obs.Lease)
			p.fail(c.Name, OpProvision, perr)
			if perr != nil {
				log.Error("provision failed", "err", perr)
			}
		case OpStart:
			// Provisioned by an earlier daemon: written again, for what this
			// daemon's configuration changes (the front door's name and address).
			if !p.isPrepared(c.Name) {
				if err = p.provision(ctx, c, *obs.Lease); err != nil {
					break
				}
			}
			// The bridge is made before every start, not only at provision:
			// a host reboot loses it while the cluster's files remain.
			if err = p.ensureNetwork(ctx, c, *obs.Lease); err != nil {
				break
			}
			// A cluster that may sleep starts on the port the daemon holds.
			var g *sleep.Gate
			if g, err = p.gateFor(c, *obs.Lease); err == nil {
				err = p.start(c, *obs.Lease, g)
			}
		case OpEnsureNetwork:
			err = p.ensureNetwork(ctx, c, *obs.Lease)
		case OpSleep:
			err = p.goToSleep(ctx, c, *obs.Lease)
		case OpStop:
			// Machines go before the control plane they report to.
			if err = p.stopNodeServices(ctx, c.Name); err != nil {
				break
			}
			if err = p.stopProcess(c.Name); err != nil {
				break
			}
			p.forgetProbe(c.Name)
		case OpRemoveData:
			err = p.removeData(ctx, c)
		case OpReleaseLease:
			p.forgetSleeper(c.Name) // the held port goes with the lease
			err = p.leases.Release(ctx, c.Name)
		case OpRemoveFinalizer:
			err = p.removeFinalizer(ctx, c)
			if err == nil && p.cfg.Ownership != nil {
				err = p.cfg.Ownership.Release(ctx, c.Name)
			}
			if err == nil {
				p.fail(c.Name, OpLease, nil)
				p.fail(c.Name, OpProvision, nil)
				p.setPrepared(c.Name, false)
				p.forgetSleeper(c.Name)
				if p.cfg.FrontDoor != nil {
					p.cfg.FrontDoor.Forget(c.Name)
				}
				log.Info("cluster deleted")
				return nil, nil
			}
		}
		if err != nil {
			return c, fmt.Errorf("%s for %s: %w", op, name, err)
		}
	}
	return c, nil
}

func (p *Provider) addFinalizerAndDefaults(ctx context.Context, c *v1.Cluster) (*v1.Cluster, error) {
	c = c.DeepCopy()
	c.Finalizers = append(c.Finalizers, v1.Finalizer)
	d := p.cfg.Defaults
	s := &c.Spec
	if s.MaxNodes == 0 {
		s.MaxNodes = d.MaxNodes
	}
	if s.Hold.Duration == 0 {
		s.Hold.Duration = d.Hold
	}
	applySizeDefaults(s, d)
	if s.PodsPerNode == 0 {
		s.PodsPerNode = d.PodsPerNode
	}
	if s.ControlPlaneMemory.IsZero() {
		s.ControlPlaneMemory = d.ControlPlaneMemory.DeepCopy()
	}
	if s.ControlPlanePIDs == 0 {
		s.ControlPlanePIDs = d.ControlPlanePIDs
	}
	if s.ControlPlaneCPUWeight == 0 {
		s.ControlPlaneCPUWeight = d.ControlPlaneCPUWeight
	}
	if s.SleepAfter == nil && d.SleepAfter > 0 {
		s.SleepAfter = &metav1.Duration{Duration: d.SleepAfter}
	}
	if s.Datastore == "" {
		s.Datastore = p.store.Kind()
	}
	u, err := c.ToUnstructured()
	if err != nil {
		return nil, err
	}
	out, err := p.dyn.Resource(v1.ClusterResource).Update(ctx, u, metav1.UpdateOptions{})
	if err != nil {
		return nil, err
	}
	return v1.FromUnstructured(out)
}

// applySizeDefaults fills the node sizes a spec leaves 0. A default never contradicts a
// size that is set: a default minimum above a set maximum becomes that maximum, and a
// default maximum below the minimum becomes the minimum.
func applySizeDefaults(s *v1.ClusterSpec, d Defaults) {
	if s.NodeCPUs == 0 {
		s.NodeCPUs = d.NodeCPUs
		if s.MaxNodeCPUs != 0 {
			s.NodeCPUs = min(s.NodeCPUs, s.MaxNodeCPUs)
		}
	}
	if s.MaxNodeCPUs == 0 {
		s.MaxNodeCPUs = max(d.MaxNodeCPUs, s.NodeCPUs)
	}
	s.NodeMemory, s.MaxNodeMemory = quantityDefaults(s.NodeMemory, s.MaxNodeMemory, d.NodeMemory, d.MaxNodeMemory)
	s.NodeDisk, s.MaxNodeDisk = quantityDefaults(s.NodeDisk, s.MaxNodeDisk, d.NodeDisk, d.MaxNodeDisk)
}

// quantityDefaults is applySizeDefaults for one quantity's minimum and maximum.
func quantityDefaults(lo, hi, defLo, defHi resource.Quantity) (resource.Quantity, resource.Quantity) {
	if lo.IsZero() {
		lo = defLo.DeepCopy()
		if !hi.IsZero() && hi.Cmp(lo) < 0 {
			lo = hi.DeepCopy()
		}
	}
	if hi.IsZero() {
		hi = defHi.DeepCopy()
		if hi.Cmp(lo) < 0 {
			hi = lo.DeepCopy()
		}
	}
	return lo, hi
}

func (p *Provider) removeFinalizer(ctx context.Context, c *v1.Cluster) error {
	c = c.DeepCopy()
	c.Finalizers = slices.DeleteFunc(c.Finalizers, func(f string) bool { return f == v1.Finalizer })
	u, err := c.ToUnstructured()
	if err != nil {
		return err
	}
	_, err = p.dyn.Resource(v1.ClusterResource).Update(ctx, u, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// controlPlaneConfig derives a tenant's control-plane config from its lease.
func (p *Provider) controlPlaneConfig(c *v1.Cluster, l lease.Lease, endpoint string) (controlplane.Config, error) {
	if !l.HasNetwork() {
		return controlplane.Config{}, fmt.Errorf("cluster %s holds no node network (asleep); it is provisioned again at the wake", c.Name)
	}
	net, err := nodenet.ForIndex(l.Network)
	if err != nil {
		return controlplane.Config{}, err
	}
	owner, err := p.owner(l)
	if err != nil {
		return controlplane.Config{}, err
	}
	return controlplane.Config{
		Name:             c.Name,
		ServerName:       p.serverName(c.Name),
		Dir:              ClusterDir(p.cfg.StateDir, c.Name),
		RunDir:           RunDir(p.cfg.StateDir, c.Name),
		Components:       []string{controlplane.APIServer, controlplane.ControllerManager, controlplane.Scheduler},
		Datastore:        endpoint,
		Port:             l.Port,
		AdvertiseAddress: net.Gateway.String(),
		ServiceCIDR:      net.ServiceCIDR.String(),
		ClusterCIDR:      net.PodCIDR.String(),
		NodeCIDR:         net.NodeCIDR.String(),
		NodeCIDRMaskSize: 24,
		Tenant:           true,
		SeedDir:          controlplane.SeedDirIn(p.cfg.StateDir),
		SeedReadOnly:     !owner.Root(),
	}, nil
}

// owner is the uid and gid of the control plane of the cluster holding l.
func (p *Provider) owner(l lease.Lease) (tenantuid.Owner, error) {
	return tenantuid.For(p.cfg.UIDBase, l.Port)
}

// provisionedFor reports whether a config on disk was written for the lease:
// its port, and the gateway of its node network when it holds one (a woken
// cluster may get another network than it had, and its config, serving
// certificate and cluster-info must name the new gateway).
func provisionedFor(cfg controlplane.Config, l lease.Lease) bool {
	if cfg.Port != l.Port {
		return false
	}
	if !l.HasNetwork() {
		return true
	}
	plan, err := nodenet.ForIndex(l.Network)
	// A config without its node CIDR predates the apiserver's egress wall: write it again.
	return err == nil && cfg.AdvertiseAddress == plan.Gateway.String() && cfg.NodeCIDR == plan.NodeCIDR.String()
}

func (p *Provider) provision(ctx context.Context, c *v1.Cluster, l lease.Lease) error {
	if err := p.adoptRestore(c); err != nil {
		return err
	}
	dir := ClusterDir(p.cfg.StateDir, c.Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	owner, err := p.owner(l)
	if err != nil {
		return err
	}
	// The sqlite datastore is in the run dir, which the control plane writes.
	endpoint, err := p.store.Ensure(ctx, c.Name, RunDir(p.cfg.StateDir, c.Name))
	if err != nil {
		return err
	}
	if err := p.loadRestoredDatastore(ctx, c, dir, endpoint); err != nil {
		return err
	}
	cfg, err := p.controlPlaneConfig(c, l, endpoint)
	if err != nil {
		return err
	}
	plan, _ := nodenet.ForIndex(l.Network)
	if p.cfg.SharePKI {
		if err := p.restorePKI(ctx, c.Name, cfg.PKI()); err != nil {
			return err
		}
	}
	if err := controlplane.Prepare(cfg, plan.APIService); err != nil {
		return err
	}
	if p.cfg.SharePKI {
		if err := p.savePKI(ctx, c.Name, cfg.PKI()); err != nil {
			return err
		}
	}
	if err := shareWithTenant(dir, owner); err != nil {
		return fmt.Errorf("giving cluster %s's control plane its files: %w", c.Name, err)
	}
	if err := p.writeAdminKubeconfig(ctx, c, cfg.PKI(), cfg.URL()); err != nil {
		return err
	}
	if err := p.writeBuildCacheAccess(ctx, c, plan); err != nil {
		return err
	}
	p.setPrepared(c.Name, true)
	return nil
}

// serverName is the name cluster's clients send (SNI), through the door or
// to its own port (Config.Domain).
func (p *Provider) serverName(cluster string) string {
	return frontdoor.Config{Domain: cmp.Or(p.cfg.Domain, frontdoor.DefaultDomain)}.ServerName(cluster)
}

// writeAdminKubeconfig writes the cluster's admin kubeconfig Secret: the
// door's address if there is one, else url (its own port), and its name as
// tls-server-name either way, so the kubeconfig wakes it when it sleeps.
func (p *Provider) writeAdminKubeconfig(ctx context.Context, c *v1.Cluster, paths pki.Paths, url string) error {
	if p.cfg.FrontDoor != nil {
		url = p.cfg.FrontDoor.Server()
	}
	kc, err := pki.KubeconfigVia(paths, pki.Admin, c.Name, url, p.serverName(c.Name))
	if err != nil {
		return err
	}
	return p.writeAdminSecret(ctx, c, kc)
}

func (p *Provider) isPrepared(cluster string) bool {
	p.failMu.Lock()
	defer p.failMu.Unlock()
	return p.prepared[cluster]
}

func (p *Provider) setPrepared(cluster string, ok bool) {
	p.failMu.Lock()
	defer p.failMu.Unlock()
	if ok {
		p.prepared[cluster] = true
	} else {
		delete(p.prepared, cluster)
	}
}

// Backend is the loopback address of a cluster's apiserver, or the door of the
// host that runs it, for the front door: from caches, so a connection costs no
// API call.
func (p *Provider) Backend(cluster string, fromPeer bool) (string, bool) {
	obj, err := p.lister.Get(cluster)
	if err != nil {
		return "", false
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return "", false
	}
	// A sleeping cluster may wake on another host; one handed from a drained
	// host to another, or to wake there, is held until it answers there.
	u, staleRV := p.placeWake(u, fromPeer)
	u, held := p.holdWhileMoving(cluster, u, staleRV)
	if !p.runsHere(u) {
		// Another host runs it: its door, which reaches it on its loopback; TLS
		// stays between the client and the tenant's apiserver. A peer's
		// connection goes no further (two hosts that disagree on the owner would
		// loop), but for one held here while the cluster moved away: the new
		// host is its owner and serves it itself.
		host, _, _ := unstructured.NestedString(u.Object, "status", "host")
		if fromPeer && !held || host == "" || p.cfg.Ownership == nil {
			return "", false
		}
		return p.cfg.Ownership.DoorOf(host)
	}
	port, found, err := unstructured.NestedInt64(u.Object, "status", "port")
	if err != nil || !found || port <= 0 {
		return "", false
	}
	return net.JoinHostPort("127.0.0.1", strconv.FormatInt(port, 10)), true
}

// AdminSecretName is the management-API Secret holding a tenant's admin kubeconfig.
func AdminSecretName(cluster string) string { return cluster + "-admin-kubeconfig" }

func (p *Provider) writeAdminSecret(ctx context.Context, c *v1.Cluster, kubeconfig []byte) error {
	return p.putSecret(ctx, c.Name, AdminSecretName(c.Name), map[string][]byte{"kubeconfig": kubeconfig})
}

// putSecret creates or replaces the management-API Secret name of cluster.
func (p *Provider) putSecret(ctx context.Context, cluster, name string, data map[string][]byte) error {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: v1.SystemNamespace,
			Labels: map[string]string{"socialweb.computer/cluster": cluster}},
		Data: data,
	}
	secrets := p.kube.CoreV1().Secrets(v1.SystemNamespace)
	_, err := secrets.Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
	}
	return err
}

// deleteSecret deletes the management-API Secret name; one already gone is no error.
func (p *Provider) deleteSecret(ctx context.Context, name string) error {
	err := p.kube.CoreV1().Secrets(v1.SystemNamespace).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// start supervises the cluster's control plane; with a gate, its apiserver
// accepts on the socket the daemon holds (fd 3) instead of binding the port.
// A control plane an earlier daemon left running is adopted if its fingerprint
// is this one's, and replaced as the daemon's upgrade strategy says if not.
func (p *Provider) start(c *v1.Cluster, l lease.Lease, g *sleep.Gate) error {
	dir := ClusterDir(p.cfg.StateDir, c.Name)
	configPath := filepath.Join(dir, controlplane.ConfigFile)
	spec := ControlPlaneSpec(ProcessName(c.Name), dir, p.cfg.Executable, p.cfg.Env, p.cfg.ControlPlaneLog)
	// Its log is in the run dir it writes, and rotated there by it.
	spec.LogPath = filepath.Join(RunDir(p.cfg.StateDir, c.Name), LogFile)
	spec.Args = controlPlaneArgs(dir, spec.LogPath, p.cfg.ControlPlaneLog)
	if g != nil {
		spec.Args = append(spec.Args, "--listen-fd", "3")
		spec.ExtraFiles = []*os.File{g.File()}
	}
	owner, err := p.owner(l)
	if err != nil {
		return err
	}
	if !owner.Root() {
		spec.Credential = &syscall.Credential{Uid: uint32(owner.UID), Gid: uint32(owner.GID)}
	}
	// Before each run, none running: an older daemon's files move into the run dir,
	// and the kernel's wall is (written again) in place: no run of it goes unwalled,
	// a restart after a crash included.
	spec.BeforeStart = func() error {
		if err := layOutRunDir(dir, owner); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return p.wallControlPlane(ctx, p.latest(c), l)
	}
	if spec.Fingerprint, err = Fingerprint(p.cfg.ExecutableDigest, spec.Args, spec.Env, configPath, owner); err != nil {
		return err
	}
	spec.Ready = func(ctx context.Context) error {
		cfg, err := controlplane.ReadConfig(configPath)
		if err != nil {
			return err
		}
		client, err := controlplane.AdminHTTPClient(cfg)
		if err != nil {
			return err
		}
		return controlplane.ProbeUp(ctx, client, cfg)
	}
	if p.cfg.Cgroups != nil {
		jail, err := p.cfg.Cgroups.Ensure(CgroupName(p.cfg.StateDir, c.Name), ControlPlaneLimits(c.Spec, p.cfg.Defaults))
		if err != nil {
			return fmt.Errorf("limiting the control plane of %s: %w", c.Name, err)
		}
		spec.Jail = jail
	}
	p.sup.Start(spec)
	return nil
}

// stopProcess stops the cluster's control plane: the supervised one, or one an
// earlier daemon left running that this one never started (the cluster was to
// stop or sleep when this daemon came up).
func (p *Provider) stopProcess(cluster string) error {
	p.sup.Stop(ProcessName(cluster), 10*time.Second)
	record := filepath.Join(ClusterDir(p.cfg.StateDir, cluster), "instance.json")
	if _, err := supervisor.Reap(record, 10*time.Second); err != nil {
		return fmt.Errorf("stopping the control plane an earlier daemon left: %w", err)
	}
	return nil
}

// reapUnwanted stops control planes an earlier daemon left running for clusters
// that are gone (deleted while no daemon ran, or their state dir kept after
// the management API lost them) or that another host holds now (taken over
// while this one was away): before anything starts, no tenant runs twice.
// Called once the informer has synced.
func (p *Provider) reapUnwanted() {
	records, _ := filepath.Glob(filepath.Join(p.cfg.StateDir, "clusters", "*", "instance.json"))
	for _, r := range records {
		name := filepath.Base(filepath.Dir(r))
		if _, err := p.lister.Get(name); err == nil && p.heldHere(name) {
			continue
		}
		killed, err := supervisor.Reap(r, 10*time.Second)
		if err != nil {
			p.log.Warn("stopping the control plane of a cluster that is gone", "cluster", name, "err", err)
		} else if killed {
			p.log.Info("stopped the control plane of a cluster that is gone", "cluster", name)
		}
	}
}

// ControlPlaneSpec is the process of the control plane whose files are in dir
// (a tenant's, or the management API's), without its fingerprint.
func ControlPlaneSpec(name, dir, executable string, env []string, rot logrotate.Rotation) supervisor.Spec {
	logPath := filepath.Join(dir, LogFile)
	return supervisor.Spec{
		Name:       name,
		Path:       executable,
		Args:       controlPlaneArgs(dir, logPath, rot),
		Env:        env,
		LogPath:    logPath,
		RecordPath: filepath.Join(dir, "instance.json"),
	}
}

// LogFile is a control plane's log (stdout and stderr), in its WorkDir.
const LogFile = "controlplane.log"

// controlPlaneArgs is the command line of the control plane whose config is in
// dir, logging to logPath.
func controlPlaneArgs(dir, logPath string, rot logrotate.Rotation) []string {
	return []string{"controlplane", "--config", filepath.Join(dir, controlplane.ConfigFile),
		"--log-file", logPath, "--log-max-size", strconv.FormatInt(rot.MaxSize, 10), "--log-keep", strconv.Itoa(rot.Keep)}
}

// Fingerprint names a control-plane run: the build, its command line and
// environment, its config file's contents, and the uid it runs as (a control
// plane an older daemon started as root is replaced, not adopted). Two runs of
// one fingerprint serve alike, so a daemon adopts one it finds running.
func Fingerprint(digest string, args, env []string, configPath string, owner tenantuid.Owner) (string, error) {
	config, err := os.ReadFile(configPath)
	if err != nil {
		return "", fmt.Errorf("reading the control plane's config: %w", err)
	}
	parts := [][]byte{[]byte(digest), []byte(strings.Join(args, "\x00")), []byte(strings.Join(env, "\x00")), config}
	if !owner.Root() {
		// Root's runs keep the fingerprint they had before there were uids.
		parts = append(parts, fmt.Appendf(nil, "uid=%d gid=%d", owner.UID, owner.GID))
	}
	h := sha256.New()
	for _, part := range parts {
		fmt.Fprintf(h, "%d:", len(part))
		h.Write(part)
	}
	return fmt.Sprintf("%x", h.Sum(nil)), nil
}

// CgroupName is the cgroup a cluster's control plane runs in, under the daemon's
// parent group: named for the daemon (its state dir) too, since two daemons on one
// host (a test beside a serving one) may each have a cluster of that name.
func CgroupName(stateDir, cluster string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return fmt.Sprintf("tenant-%x-%s", sum[:4], cluster)
}

// ControlPlaneLimits are the cgroup limits of a cluster's control plane: its
// spec's, and d's where it leaves a field 0 (a cluster made before the fields).
func ControlPlaneLimits(s v1.ClusterSpec, d Defaults) cgroup.Limits {
	l := cgroup.Limits{MemoryMax: s.ControlPlaneMemory.Value(), PIDsMax: int64(s.ControlPlanePIDs), CPUWeight: int64(s.ControlPlaneCPUWeight)}
	if l.MemoryMax == 0 {
		l.MemoryMax = d.ControlPlaneMemory.Value()
	}
	if l.PIDsMax == 0 {
		l.PIDsMax = int64(d.ControlPlanePIDs)
	}
	if l.CPUWeight == 0 {
		l.CPUWeight = int64(d.ControlPlaneCPUWeight)
	}
	return l
}

// removeCgroup removes the cluster's control-plane cgroup (its process stopped).
func (p *Provider) removeCgroup(cluster string) error {
	if p.cfg.Cgroups == nil {
		return nil
	}
	return p.cfg.Cgroups.Lookup(CgroupName(p.cfg.StateDir, cluster)).Remove()
}

// SleepCollectors are the sleep and wake metrics.
func (p *Provider) SleepCollectors() []prometheus.Collector { return p.sleepMetrics.Collectors() }

// OrphanLister is implemented by a Networks that can list what it made
// (nodenet.Manager).
type OrphanLister interface {
	List(ctx context.Context) (nodenet.Owned, error)
}

// removeOrphanNetworks removes node networks in this daemon's index range
// that no lease holds: left by a cluster whose state was lost (a state dir
// thrown away, a crash between remove and release). Indexes outside the
// range may belong to another daemon on the host and are left alone.
func (p *Provider) removeOrphanNetworks(ctx context.Context) error {
	lister, ok := p.cfg.NodeNetworks.(OrphanLister)
	if !ok {
		return nil
	}
	owned, err := lister.List(ctx)
	if err != nil {
		return err
	}
	_, table, err := p.leases.load(ctx)
	if err != nil {
		return err
	}
	held := table.Networks()
	for _, i := range owned.Indexes() {
		if i < p.cfg.Networks.Lo || i > p.cfg.Networks.Hi || held[i] {
			continue
		}
		plan, err := nodenet.ForIndex(i)
		if err != nil {
			continue
		}
		p.log.Info("removing the node network of a cluster that no longer exists", "index", i)
		if err := p.cfg.NodeNetworks.Remove(ctx, fmt.Sprintf("orphan-%d", i), plan); err != nil {
			return err
		}
	}
	return nil
}

func (p *Provider) ensureNetwork(ctx context.Context, c *v1.Cluster, l lease.Lease) error {
	if p.cfg.NodeNetworks == nil {
		return nil
	}
	cluster := c.Name
	plan, err := nodenet.ForIndex(l.Network)
	if err != nil {
		return err
	}
	// Nodes dial the apiserver on the gateway at the cluster's leased port
	// (join.Minter.APIServer), the registry at RegistryPort, and job Pods the build
	// cache at BuildCachePort.
	served := nodenet.Served{APIServer: l.Port, Registry: nodeservice.RegistryPort}
	if p.cfg.BuildCache != nil && p.cfg.BuildCache.On() {
		served.BuildCache = nodeservice.BuildCachePort
	}
	narrow, err := EgressNarrowing(c.Spec)
	if err != nil {
		// The CRD refuses what ValidateEgress does; an object that got past it
		// is walled off entirely rather than opened.
		p.log.Error("the cluster's egress narrowing is invalid: forwarding nothing for it", "cluster", cluster, "err", err)
	}
	if err := p.cfg.NodeNetworks.Ensure(ctx, cluster, plan, served, narrow); err != nil {
		return err
	}
	// Its control plane's reach follows the egress (the internet or not).
	if err := p.wallControlPlane(ctx, c, l); err != nil {
		return err
	}
	p.failMu.Lock()
	p.egressApplied[cluster] = egressKey(c.Spec)
	p.failMu.Unlock()
	return nil
}

// cached is the Cluster name in the informer's cache.
func (p *Provider) cached(name string) (*v1.Cluster, error) {
	obj, err := p.lister.Get(name)
	if err != nil {
		return nil, err
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("cluster %s in the cache is a %T", name, obj)
	}
	return v1.FromUnstructured(u)
}

// latest is the cached Cluster named as c is (its egress may have changed since
// c was read), or c.
func (p *Provider) latest(c *v1.Cluster) *v1.Cluster {
	if p.lister == nil {
		return c
	}
	if got, err := p.cached(c.Name); err == nil {
		return got
	}
	return c
}

// wallControlPlane writes the kernel's wall around the new connections of c's
// control plane (nodenet.ControlPlaneRuleset): its loopback port, its nodes and
// Pods, its datastore server and, as its egress says, the internet. A control
// plane that runs as root (uid base 0), or a host without node networks, has
// only the apiserver's egress proxy.
func (p *Provider) wallControlPlane(ctx context.Context, c *v1.Cluster, l lease.Lease) error {
	owner, err := p.owner(l)
	if err != nil || owner.Root() || p.cfg.NodeNetworks == nil {
		return err
	}
	reach := nodenet.ControlPlaneReach{UID: owner.UID, Port: l.Port}
	if l.HasNetwork() {
		plan, err := nodenet.ForIndex(l.Network)
		if err != nil {
			return err
		}
		reach.Plan = &plan
	}
	cfg, err := controlplane.ReadConfig(filepath.Join(ClusterDir(p.cfg.StateDir, c.Name), controlplane.ConfigFile))
	if err != nil {
		return fmt.Errorf("walling the control plane of %s: %w", c.Name, err)
	}
	if reach.Datastore, err = datastore.Servers(ctx, cfg.Datastore); err != nil {
		return fmt.Errorf("walling the control plane of %s: %w", c.Name, err)
	}
	if reach.Resolvers, err = nodenet.HostResolvers("/etc/resolv.conf"); err != nil {
		return fmt.Errorf("walling the control plane of %s: %w", c.Name, err)
	}
	narrow, _ := EgressNarrowing(c.Spec) // invalid: nothing forwarded (ensureNetwork logs it)
	return p.cfg.NodeNetworks.WallControlPlane(ctx, c.Name, reach, narrow)
}

// EgressNarrowing is what spec takes away from the host's egress policy. An invalid
// spec (v1.ValidateEgress) narrows to nothing forwarded, with the error.
func EgressNarrowing(spec v1.ClusterSpec) (nodenet.Narrowing, error) {
	if err := v1.ValidateEgress(spec, nil); err != nil {
		return nodenet.Narrowing{None: true}, err
	}
	deny, err := nodenet.ParsePrefixes(spec.EgressDeny)
	if err != nil {
		return nodenet.Narrowing{None: true}, err
	}
	return nodenet.Narrowing{None: spec.Egress == v1.EgressNone, Deny: deny}, nil
}

// egressKey names spec's egress narrowing, to tell when it changed.
func egressKey(spec v1.ClusterSpec) string {
	return spec.Egress + "|" + strings.Join(spec.EgressDeny, ",")
}

// removeNetwork deletes the cluster's node network (bridge, addresses, rules),
// if its lease holds one, and the wall of its control plane, which is stopped.
func (p *Provider) removeNetwork(ctx context.Context, cluster string, l *lease.Lease) error {
	if l == nil || p.cfg.NodeNetworks == nil {
		return nil
	}
	if err := p.cfg.NodeNetworks.UnwallControlPlane(ctx, l.Port); err != nil {
		return err
	}
	if !l.HasNetwork() {
		return nil
	}
	plan, err := nodenet.ForIndex(l.Network)
	if err != nil {
		return err
	}
	return p.cfg.NodeNetworks.Remove(ctx, cluster, plan)
}

func (p *Provider) removeData(ctx context.Context, c *v1.Cluster) error {
	l, err := p.leases.Get(ctx, c.Name)
	if err != nil {
		return err
	}
	if err := p.removeNetwork(ctx, c.Name, l); err != nil {
		return err
	}
	dir := ClusterDir(p.cfg.StateDir, c.Name)
	if err := p.store.Remove(ctx, c.Name, dir); err != nil {
		return err
	}
	if err := p.removeCgroup(c.Name); err != nil {
		p.log.Warn("control-plane cgroup not removed", "cluster", c.Name, "err", err)
	}
	// Its images go with it: a later cluster of the same name starts with none.
	if err := registry.ForgetCluster(filepath.Join(p.cfg.StateDir, "registry"), c.Name); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := p.removeStagedRestore(c); err != nil {
		return err
	}
	if err := p.removeBuildCache(ctx, c.Name); err != nil {
		return err
	}
	if err := p.deleteSecret(ctx, PKISecretName(c.Name)); err != nil {
		return err
	}
	return p.deleteSecret(ctx, AdminSecretName(c.Name))
}

func (p *Provider) writeStatus(ctx context.Context, c *v1.Cluster, obs Observed, plan Plan) error {
	if c.DeletionTimestamp != nil && len(plan.Ops) == 0 && !slices.Contains(c.Finalizers, v1.Finalizer) {
		return nil
	}
	want := c.Status
	want.Phase = plan.Phase
	want.ObservedGeneration = c.Generation
	want.Restarts = int32(obs.Process.Restarts)
	if p.cfg.Ownership != nil {
		want.Host = p.cfg.Ownership.Name()
	}
	if obs.Lease != nil {
		want.Port = int32(obs.Lease.Port)
		want.URL = fmt.Sprintf("https://127.0.0.1:%d", obs.Lease.Port)
		// A cluster without a node network (asleep) shows none.
		want.Gateway, want.NodeCIDR, want.PodCIDR, want.ServiceCIDR = "", "", "", ""
		if net, err := nodenet.ForIndex(obs.Lease.Network); err == nil && obs.Lease.HasNetwork() {
			want.Gateway = net.Gateway.String()
			want.NodeCIDR = net.NodeCIDR.String()
			want.PodCIDR = net.PodCIDR.String()
			want.ServiceCIDR = net.ServiceCIDR.String()
		}
	}
	want.AsleepSince, want.NextWake = nil, nil
	if plan.Phase == v1.PhaseAsleep {
		want.AsleepSince = c.Status.AsleepSince
		if want.AsleepSince == nil {
			t := metav1.NewTime(obs.Now)
			want.AsleepSince = &t
		}
		want.NextWake = p.nextWake(c.Name)
		// The stored time went through JSON: the same instant is no change.
		if old := c.Status.NextWake; old != nil && want.NextWake != nil && old.Unix() == want.NextWake.Unix() {
			want.NextWake = old
		}
	}
	want.Conditions = slices.Clone(c.Status.Conditions)
	for _, cond := range plan.Conditions {
		meta.SetStatusCondition(&want.Conditions, cond)
	}
	if reflect.DeepEqual(want, c.Status) {
		return nil
	}
	c = c.DeepCopy()
	c.Status = want
	u, err := c.ToUnstructured()
	if err != nil {
		return err
	}
	_, err = p.dyn.Resource(v1.ClusterResource).UpdateStatus(ctx, u, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
