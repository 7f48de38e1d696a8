// Package scaledriver runs the scale decision for one tenant cluster: it watches the
// tenant through shared informers, calls scale.Decide, carries the Decision out against
// a nodes.NodeProvider, and records it (an Event on the tenant, the Cluster status via a
// StatusRecorder, Prometheus metrics). Between passes it keeps only each node's
// idle-since time, and advances it only when the action succeeded, so a failed
// teardown is retried rather than forgotten. For each node it boots it also records
// where the start went, from its first Pod's creation to that Pod's containers running
// (starts.go).
package scaledriver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/scale"
	"github.com/socialweb-computer/socialweb/internal/window"
)

// Config is one cluster's scaling policy. Zero durations take the defaults below.
type Config struct {
	// Cluster is the tenant cluster's name; node names and metrics labels derive from it.
	Cluster string
	// NodeSize is the smallest node booted (and MaxPods of every node; 0 means 110, the
	// kubelet default), MaxNodeSize the largest (a field of 0 is NodeSize's: a fixed
	// size). Each node's size is chosen between them from the Pods it is for.
	NodeSize    scale.NodeSize
	MaxNodeSize scale.NodeSize
	// Reserve is what a node keeps from its Pods (scale.DefaultReserve for socialweb's
	// node image); the zero value takes a node to give Pods its whole size, as the fake
	// provider's Nodes do.
	Reserve scale.Reserve
	// MaxNodes caps registered + booting nodes.
	MaxNodes int
	// IdleNodes are kept up with nothing on them while IdleSchedule (window.Parse; ""
	// is always) is open (scale.Observed.IdleNodes). A schedule that does not parse keeps
	// none: the driver runs all the same, and says why (RecordIdleSchedule).
	IdleNodes    int
	IdleSchedule string
	// FreshNodePerJob: a node a CI job Pod was bound to is sealed (cordoned) and removed
	// once the job is over, without the hold (scale.Observed.FreshNodePerJob).
	FreshNodePerJob bool
	// Hold is how long a node must have had no workload Pod before removal (default 1m).
	Hold time.Duration
	// Resync is the period of passes without events, so holds expire (default 5s).
	Resync time.Duration
	// Batch is how long a pass waits after the first event, so a burst of Pods is seen
	// in one pass (default 100ms). It is the floor of the pending-to-create latency.
	Batch time.Duration
	// NotReadyGrace: a not-Ready node younger than this counts as coming capacity
	// (default 2m).
	NotReadyGrace time.Duration
	// BootTimeout: a machine whose Node has not registered after this is no longer
	// counted as booting, and is deleted (default 5m). A registered Node gets as long
	// again to turn Ready (or, once Ready, to turn Ready again): past it, with no
	// workload Pod, it is removed without the hold (scale.Observed.RepairAfter).
	BootTimeout time.Duration
	// CreateParallelism bounds concurrent provider calls in one pass (default 8).
	CreateParallelism int
	// EventNamespace is where Events go (default "default").
	EventNamespace string
}

const (
	defaultHold          = time.Minute
	defaultResync        = 5 * time.Second
	defaultBatch         = 100 * time.Millisecond
	defaultNotReadyGrace = 2 * time.Minute
	defaultBootTimeout   = 5 * time.Minute
	defaultParallelism   = 8
	defaultMaxPods       = 110
)

func (c Config) withDefaults() (Config, error) {
	if c.Cluster == "" {
		return c, errors.New("scaledriver: config has no cluster name")
	}
	if c.NodeSize.MaxPods == 0 {
		c.NodeSize.MaxPods = defaultMaxPods
	}
	if c.NodeSize.CPUs <= 0 || c.NodeSize.MemoryMiB <= 0 || c.NodeSize.MaxPods < 0 {
		return c, fmt.Errorf("scaledriver: cluster %s: node size %+v must be positive", c.Cluster, c.NodeSize)
	}
	if err := scale.ValidateRange(c.NodeSize, c.NodeSize.Upto(c.MaxNodeSize)); err != nil {
		return c, fmt.Errorf("scaledriver: cluster %s: %w", c.Cluster, err)
	}
	if c.MaxNodes < 0 || c.IdleNodes < 0 {
		return c, fmt.Errorf("scaledriver: cluster %s: max nodes %d or idle nodes %d is negative", c.Cluster, c.MaxNodes, c.IdleNodes)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Hold, defaultHold)
	def(&c.Resync, defaultResync)
	def(&c.Batch, defaultBatch)
	def(&c.NotReadyGrace, defaultNotReadyGrace)
	def(&c.BootTimeout, defaultBootTimeout)
	if c.CreateParallelism <= 0 {
		c.CreateParallelism = defaultParallelism
	}
	if c.EventNamespace == "" {
		c.EventNamespace = "default"
	}
	return c, nil
}

// StatusRecorder writes a decision where operators read it; the daemon implements it
// with the Cluster object's status. nodes is the node count after the action.
type StatusRecorder interface {
	RecordDecision(ctx context.Context, cluster string, d scale.Decision, nodes int) error
	// RecordNodeBoot reports how the last node boot went: ok when a node joined, not ok
	// (with a reason such as JoinTimeout and a message) when one failed.
	RecordNodeBoot(ctx context.Context, cluster string, ok bool, reason, message string) error
	// RecordNodeNetwork reports the nodes' own network health (nodehealth conditions):
	// ok when no node reports a problem, else the problems, one per line.
	RecordNodeNetwork(ctx context.Context, cluster string, ok bool, reason, message string) error
	// RecordNodeAccelerator reports the accelerator new nodes boot under (kvm, tcg) and
	// why; called when the provider implements nodes.AcceleratorReporter and it changed.
	RecordNodeAccelerator(ctx context.Context, cluster, accel, reason string) error
	// RecordPodsProvisionable reports whether every Pod that wants a node gets one: not
	// ok when some fit no node size the cluster may boot (PodsExceedNodeSize) or wait
	// for host capacity (WaitingForHostCapacity), one Pod per line; called when it changed.
	RecordPodsProvisionable(ctx context.Context, cluster string, ok bool, reason, message string) error
	// RecordWarmStart reports how the last node tried warm started: ok when it was
	// handed a pre-booted VM, not ok (WarmStartFailed, with why) when it booted cold
	// instead; called after each Create that tried (nodes.Instance.Warm).
	RecordWarmStart(ctx context.Context, cluster string, ok bool, reason, message string) error
	// RecordIdleNodes reports the idle nodes wanted now, spare and claimed; called when
	// they changed, with a cluster that has spec.idleNodes.
	RecordIdleNodes(ctx context.Context, cluster string, idle v1.IdleNodesStatus) error
	// RecordIdleSchedule reports how the driver read spec.idleSchedule: not ok
	// (v1.ReasonBadIdleSchedule, with what was wrong and what would be right) when it does
	// not parse and no idle nodes are kept, else ok. Called once per driver, on its first
	// pass; an ok report may write nothing where no problem was reported before.
	RecordIdleSchedule(ctx context.Context, cluster string, ok bool, reason, message string) error
	// RecordPodStarts reports the percentiles of the cluster's Pod starts over the last
	// hour, per path; called when they changed.
	RecordPodStarts(ctx context.Context, cluster string, starts []v1.PodStartPercentiles) error
}

// Deps are the driver's collaborators. Tenant and Provider are required.
type Deps struct {
	Tenant   kubernetes.Interface
	Provider nodes.NodeProvider
	// Status, if set, is told every decision that changed something.
	Status StatusRecorder
	// Metrics, if set, gets the driver's collectors. Drivers of several clusters may
	// share one Registerer: the collectors are shared and labelled by cluster.
	Metrics prometheus.Registerer
	// Clock is "now" for decisions (default time.Now). Timers use the real clock.
	Clock func() time.Time
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// ErrNotSynced is returned by a pass before the informer caches have synced.
var ErrNotSynced = errors.New("scaledriver: informer caches not synced")

// Driver scales one tenant cluster. Create it with New.
//
// Lifecycle: New does no I/O. Start (once) starts the informers, bound to its context,
// and waits for their caches; Run (once) calls Start if it was not called, then passes
// on every relevant event (after Batch) and every Resync until its context ends, then
// stops the informers and returns nil. RunPass runs one pass by hand (tests, harnesses
// that drive scaling explicitly); passes never overlap.
type Driver struct {
	cfg      Config
	tenant   kubernetes.Interface
	provider nodes.NodeProvider
	status   StatusRecorder
	metrics  *metrics
	now      func() time.Time
	log      *slog.Logger

	factory      informers.SharedInformerFactory
	pods         corelisters.PodLister
	nodeLister   corelisters.NodeLister
	jobs         batchlisters.JobLister
	deployments  appslisters.DeploymentLister
	statefulSets appslisters.StatefulSetLister
	daemonSets   appslisters.DaemonSetLister
	synced       []cache.InformerSynced
	kick         chan struct{}
	starts       *starts
	podStarts    *podStarts

	// bootedFor are the Pods (or workloads) each machine this driver created was booted
	// for, until it joins or fails, so a failure is told to them.
	forMu     sync.Mutex
	bootedFor map[string][]scale.Ref
	// waitTold are the Pods told they wait for a machine already booting, and which.
	waitTold map[scale.Ref]string

	lifeMu  sync.Mutex
	started bool
	running bool

	passMu    sync.Mutex
	idleSince map[string]time.Time // guarded by passMu
	booting   map[string]time.Time // machines seen booting (name -> created); guarded by passMu
	// network is the node network report last recorded ("" before the first); guarded by passMu.
	network string
	// accel is the accelerator report last recorded ("" before the first); guarded by passMu.
	accel string
	// waiting are the nodes the last provisioning could not boot for host capacity;
	// guarded by passMu.
	waiting []capacityWait
	// told are the Pod Events written for the problems still current (ref and reason), so
	// each is told once; provisionable is the PodsProvisionable report last recorded.
	// Guarded by passMu.
	told          map[podProblemKey]bool
	provisionable string
	// podStartsReport is the PodStarts summary last recorded, at podStartsAt. Guarded by
	// passMu.
	podStartsReport []v1.PodStartPercentiles
	podStartsAt     time.Time
	// idleReport is the idle nodes report last recorded; guarded by passMu.
	idleReport string
	// wereIdle are the nodes the last decision counted spare or claimed (scale.Decision.
	// Idle); guarded by passMu.
	wereIdle []string
	// idleWindow is cfg.IdleSchedule parsed; badSchedule why it did not parse (then no
	// idle nodes are kept), and scheduleTold whether that was recorded. scheduleTold is
	// guarded by passMu.
	idleWindow   window.Window
	badSchedule  error
	scheduleTold bool
}

// New builds a driver; it registers metrics but does no I/O.
func New(cfg Config, deps Deps) (*Driver, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if deps.Tenant == nil || deps.Provider == nil {
		return nil, fmt.Errorf("scaledriver: cluster %s: tenant client and node provider are required", cfg.Cluster)
	}
	m, err := newMetrics(deps.Metrics)
	if err != nil {
		return nil, err
	}
	d := &Driver{
		cfg: cfg, tenant: deps.Tenant, provider: deps.Provider, status: deps.Status, metrics: m,
		now: deps.Clock, log: deps.Logger, kick: make(chan struct{}, 1), idleSince: map[string]time.Time{},
		told: map[podProblemKey]bool{}, bootedFor: map[string][]scale.Ref{},
	}
	if d.now == nil {
		d.now = time.Now
	}
	d.starts = newStarts(d.now)
	if d.log == nil {
		d.log = slog.Default()
	}
	d.log = d.log.With("cluster", cfg.Cluster)
	// A bad schedule (a zone this host does not know, or an object from before the CRD
	// checked it) turns idle nodes off rather than stopping the cluster's scaling.
	if d.idleWindow, d.badSchedule = window.Parse(cfg.IdleSchedule); d.badSchedule != nil {
		d.log.Warn("idle schedule does not parse: no idle nodes are kept", "schedule", cfg.IdleSchedule, "idleNodes", cfg.IdleNodes, "err", d.badSchedule)
	}

	// Managed fields are most of a cached object's size and nothing here reads them.
	d.factory = informers.NewSharedInformerFactoryWithOptions(d.tenant, 0, informers.WithTransform(func(obj any) (any, error) {
		if a, err := meta.Accessor(obj); err == nil {
			a.SetManagedFields(nil)
		}
		return obj, nil
	}))
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { d.trigger() },
		UpdateFunc: func(any, any) { d.trigger() },
		DeleteFunc: func(any) { d.trigger() },
	}
	for _, inf := range []cache.SharedIndexInformer{
		d.factory.Core().V1().Pods().Informer(),
		d.factory.Core().V1().Nodes().Informer(),
		d.factory.Batch().V1().Jobs().Informer(),
		d.factory.Apps().V1().Deployments().Informer(),
		d.factory.Apps().V1().StatefulSets().Informer(),
		d.factory.Apps().V1().DaemonSets().Informer(),
	} {
		reg, err := inf.AddEventHandler(handler)
		if err != nil {
			return nil, fmt.Errorf("scaledriver: cluster %s: %w", cfg.Cluster, err)
		}
		d.synced = append(d.synced, inf.HasSynced, reg.HasSynced)
	}
	// The start breakdown's own handlers: they stamp changes as they arrive, not at the
	// next pass.
	if _, err := d.factory.Core().V1().Pods().Informer().AddEventHandler(d.starts.podHandler()); err != nil {
		return nil, fmt.Errorf("scaledriver: cluster %s: %w", cfg.Cluster, err)
	}
	if _, err := d.factory.Core().V1().Nodes().Informer().AddEventHandler(d.starts.nodeHandler()); err != nil {
		return nil, fmt.Errorf("scaledriver: cluster %s: %w", cfg.Cluster, err)
	}
	if jf, ok := d.provider.(nodes.JoinForgetter); ok {
		if _, err := d.factory.Core().V1().Nodes().Informer().AddEventHandler(newJoinForgetter(jf, d.log).nodeHandler()); err != nil {
			return nil, fmt.Errorf("scaledriver: cluster %s: %w", cfg.Cluster, err)
		}
	}
	d.pods = d.factory.Core().V1().Pods().Lister()
	d.nodeLister = d.factory.Core().V1().Nodes().Lister()
	d.podStarts = newPodStarts(d.now, d.nodeLister.Get, func(path string, took time.Duration) {
		d.metrics.podStarted(cfg.Cluster, path, took)
	})
	if _, err := d.factory.Core().V1().Pods().Informer().AddEventHandler(d.podStarts.handler()); err != nil {
		return nil, fmt.Errorf("scaledriver: cluster %s: %w", cfg.Cluster, err)
	}
	d.jobs = d.factory.Batch().V1().Jobs().Lister()
	d.deployments = d.factory.Apps().V1().Deployments().Lister()
	d.statefulSets = d.factory.Apps().V1().StatefulSets().Lister()
	d.daemonSets = d.factory.Apps().V1().DaemonSets().Lister()
	return d, nil
}

// trigger asks for a pass; bursts coalesce into one.
func (d *Driver) trigger() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Start starts the informers (they stop when ctx ends) and waits for their caches.
// It may be called once.
func (d *Driver) Start(ctx context.Context) error {
	d.lifeMu.Lock()
	if d.started {
		d.lifeMu.Unlock()
		return errors.New("scaledriver: already started")
	}
	d.started = true
	d.lifeMu.Unlock()

	d.factory.Start(ctx.Done())
	if err := d.factory.WaitForCacheSyncWithContext(ctx).AsError(); err != nil {
		return fmt.Errorf("scaledriver: cluster %s: %w", d.cfg.Cluster, err)
	}
	if !cache.WaitForCacheSync(ctx.Done(), d.synced...) {
		return fmt.Errorf("scaledriver: cluster %s: %w", d.cfg.Cluster, ErrNotSynced)
	}
	return nil
}

// Run scales the cluster until ctx ends; see Driver for the lifecycle. It returns nil
// when ctx ends, or an error if it could not start.
func (d *Driver) Run(ctx context.Context) error {
	d.lifeMu.Lock()
	if d.running {
		d.lifeMu.Unlock()
		return errors.New("scaledriver: already running")
	}
	d.running = true
	started := d.started
	d.lifeMu.Unlock()

	defer d.factory.Shutdown() // waits for the informer goroutines
	defer d.metrics.forget(d.cfg.Cluster)
	if !started {
		if err := d.Start(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}

	ticker := time.NewTicker(d.cfg.Resync)
	defer ticker.Stop()
	batch := time.NewTimer(0)
	<-batch.C
	d.trigger() // first pass right away
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-d.kick:
			batch.Reset(d.cfg.Batch)
			select {
			case <-ctx.Done():
				return nil
			case <-batch.C:
			}
		}
		// Events that arrive during the pass ask for the next one.
		select {
		case <-d.kick:
		default:
		}
		dec, err := d.RunPass(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			// The next tick retries; a failed action left the state where it was.
			d.log.Error("scale pass failed", "action", dec.Action, "err", err)
		case dec.Action != scale.None && dec.Action != scale.Hold:
			d.log.Info("scale decision carried out", "decision", dec.String())
		}
	}
}

// IdleSince returns a copy of the driver's only between-pass state.
func (d *Driver) IdleSince() map[string]time.Time {
	d.passMu.Lock()
	defer d.passMu.Unlock()
	out := make(map[string]time.Time, len(d.idleSince))
	for k, v := range d.idleSince {
		out[k] = v
	}
	return out
}
