package nodeservice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/socialweb-computer/socialweb/internal/buildcache"
	"github.com/socialweb-computer/socialweb/internal/cgroup"
	"github.com/socialweb-computer/socialweb/internal/images"
	"github.com/socialweb-computer/socialweb/internal/layershare"
	"github.com/socialweb-computer/socialweb/internal/layerstore"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodes/qemu"
	"github.com/socialweb-computer/socialweb/internal/podroutes"
	"github.com/socialweb-computer/socialweb/internal/registry"
	"github.com/socialweb-computer/socialweb/internal/scaledriver"
)

// NodeServices gives Ready clusters their nodes: the Host, or without a node
// image a stand-in that says why there are none. The provider calls Start on
// every reconcile of a Ready cluster, Stop and DeleteAll on its delete.
type NodeServices interface {
	Start(ctx context.Context, c Cluster) error
	Stop(name string)
	DeleteAll(ctx context.Context, cluster string) error
}

// Config is the node machinery's part of `socialweb serve`'s validated options.
type Config struct {
	// StateDir is the daemon's: node VMs live under nodes/, the registry under registry/.
	StateDir string
	// NodeImage is a built node image dir; empty boots no nodes (Start returns the stand-in).
	NodeImage string
	// Verdict is the accelerator chosen by probing the image (--accel).
	Verdict     *qemu.Verdict
	TCGCacheMiB int64
	// TCGGuestASLR keeps ASLR in TCG guests (qemu.Config.TCGGuestASLR).
	TCGGuestASLR bool
	// VMUIDBase gives each VM's qemu a user of its own (qemu.Config.VMUIDBase).
	VMUIDBase int
	// BootTimeout is the Host's (0: the scale driver's defaults).
	BootTimeout time.Duration
	// SharedLayers prepares every registry image's layers under <StateDir>/layers and
	// gives each node VM that store read-only (virtio-fs); Executable is the socialweb
	// binary, re-run to start virtiofsd read-only.
	SharedLayers bool
	Executable   string
	// WarmPool is how many node VMs of WarmPoolShape (the default node size) the qemu
	// provider keeps booted for no cluster; 0 keeps none.
	WarmPool      int
	WarmPoolShape qemu.PoolShape
	// WarmPoolPrewarm: pool VMs run the programs of a Pod start while they wait.
	WarmPoolPrewarm bool
	// WarmPoolRefillDelay: how long after a claim the replacement pool VM boots
	// (qemu.Config.PoolRefillDelay; 0 at once).
	WarmPoolRefillDelay time.Duration
	// Upstream makes the registry a pull-through cache of other registries; nil
	// serves only pushed images.
	Upstream *registry.Upstream
	// ImageCacheSize is the registry's budget, kept by garbage collection every
	// GCInterval (0: no budget; only blobs nothing references are removed).
	// ClusterQuota caps what each cluster brings into the registry
	// (registry.Server.ClusterQuota).
	ImageCacheSize int64
	ClusterQuota   int64
	// Cgroups holds each VM's qemu in a group of its own (qemu.Config.Cgroups); nil none.
	Cgroups *cgroup.Hierarchy
	// BuildCache, if on, is served to each cluster on its gateway (Host.BuildCache).
	BuildCache *buildcache.Cache
	// BuiltinImages, if set, is a directory holding the built-in images as OCI
	// layout tars (pause.tar, busybox.tar: `socialweb image builtin`), loaded into
	// the registry as they are; empty builds them (which needs the Go toolchain and
	// Debian's mirror). The package ships them, for a host without Go.
	BuiltinImages string
	// RegistryPeers lists the other hosts' registries, asked for a pushed image the
	// registry lacks before upstream is (registry.Server.Peers); nil asks none.
	RegistryPeers func() []registry.Peer
}

// GCInterval is how often the registry is garbage collected.
const GCInterval = 5 * time.Minute

// LayersDir is the host layer store under a daemon's state dir.
func LayersDir(stateDir string) string { return filepath.Join(stateDir, "layers") }

// Deps are the daemon's collaborators the node machinery uses.
type Deps struct {
	// Networks makes and routes each cluster's bridge; a node image needs it.
	Networks *nodenet.Manager
	// Plan returns a cluster's network plan (provider.Plan, from its lease).
	Plan func(cluster string) (nodenet.Plan, error)
	// Status is where scale decisions and node conditions land (provider.ScaleStatus).
	Status  scaledriver.StatusRecorder
	Metrics prometheus.Registerer
	Log     *slog.Logger
}

// Start brings up the node machinery: the qemu provider (recovering the VMs of an
// earlier run), the host registry seeded with the images nodes pull, and the Host
// that runs each Ready cluster's node services. Without a node image it returns a
// stand-in that reports, on each cluster, why it gets no nodes.
func Start(ctx context.Context, cfg Config, deps Deps) (NodeServices, error) {
	log := deps.Log
	if cfg.NodeImage == "" {
		log.Info("no --node-image: clusters stay at zero nodes (build one with `socialweb image build`)")
		return newNoNodeImage(deps.Status), nil
	}
	if deps.Networks == nil {
		return nil, errors.New("--node-image needs --node-network: nodes live on their cluster's bridge")
	}
	// Built first and handed to both: the provider asks it for each booting node's
	// identity, the Host registers each running cluster's minter in it.
	joiners := &Joiners{}
	var layers *layershare.Config
	var store *layerstore.Store
	if cfg.SharedLayers {
		var err error
		if store, err = layerstore.Open(LayersDir(cfg.StateDir)); err != nil {
			return nil, err
		}
		layers = &layershare.Config{Dir: store.Dir(), Executable: cfg.Executable}
	}
	qp, err := qemu.New(qemu.Config{StateDir: filepath.Join(cfg.StateDir, "nodes"), ImageDir: cfg.NodeImage, Verdict: cfg.Verdict, TCGCacheMiB: cfg.TCGCacheMiB, TCGGuestASLR: cfg.TCGGuestASLR, VMUIDBase: cfg.VMUIDBase, Layers: layers,
		PoolSize: cfg.WarmPool, PoolShape: cfg.WarmPoolShape, PoolPrewarm: cfg.WarmPoolPrewarm, PoolRefillDelay: cfg.WarmPoolRefillDelay, Cgroups: cfg.Cgroups},
		qemu.Deps{Networks: deps.Networks, Joiner: joiners, Plan: deps.Plan, Log: log.With("component", "qemu")})
	if err != nil {
		return nil, fmt.Errorf("starting the node provider: %w", err)
	}
	if deps.Metrics != nil {
		if err := deps.Metrics.Register(qp.PoolCollector()); err != nil {
			qp.Close()
			return nil, fmt.Errorf("registering the warm pool's metrics: %w", err)
		}
	}
	res, err := qp.Recover(ctx)
	if err != nil {
		return nil, fmt.Errorf("recovering node VMs: %w", err)
	}
	log.Info("node VMs recovered", "result", fmt.Sprintf("%+v", res))
	regDir := filepath.Join(cfg.StateDir, "registry")
	if err := os.MkdirAll(regDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the registry dir: %w", err)
	}
	rs := &registry.Server{Dir: regDir, Logger: log.With("component", "registry"), Upstream: cfg.Upstream, ClusterQuota: cfg.ClusterQuota, Peers: cfg.RegistryPeers}
	if deps.Metrics != nil {
		if err := deps.Metrics.Register(rs.Collector()); err != nil {
			qp.Close()
			return nil, fmt.Errorf("registering the registry's metrics: %w", err)
		}
	}
	if cfg.Upstream != nil {
		log.Info("registry pulls through from upstream registries", "mirrors", cfg.Upstream.MirrorList(), "allow", cfg.Upstream.Allow, "deny", cfg.Upstream.Deny, "tagTTL", cfg.Upstream.TagTTL)
	} else {
		log.Info("registry is offline: nodes get only images pushed with `socialweb image push`")
	}
	if store != nil {
		if err := startPreparer(ctx, store, rs, deps); err != nil {
			return nil, err
		}
	}
	go seedImages(ctx, rs, cfg.BuiltinImages, log)
	go collectGarbage(ctx, rs, cfg.ImageCacheSize, log.With("component", "registry"))
	// qp itself, not a wrapper: the node services find its optional sides (Addresser,
	// Diagnoser, EarlyBootWatcher, AcceleratorReporter) by type assertion.
	host := New(qp, joiners, rs.NodeHandlerFor, deps.Status, deps.Metrics, log.With("component", "nodes"))
	host.BootTimeout = cfg.BootTimeout
	host.PullFailures = rs.LastFailure
	host.BuildCache = cfg.BuildCache
	nets := deps.Networks
	host.PodRoutes = func(c Cluster) podroutes.Table { return clusterRoutes{nets, c.Minter.Plan} }
	return host, nil
}

// startPreparer makes every image stored in rs from now on prepare its layers, and
// queues those of the images already there that the store lacks (pushed before, or by
// a process that did not prepare them, or that failed).
func startPreparer(ctx context.Context, store *layerstore.Store, rs *registry.Server, deps Deps) error {
	log := deps.Log.With("component", "layerstore")
	prep, err := layerstore.NewPreparer(store, rs, layerstore.PreparerConfig{Log: log, Metrics: deps.Metrics})
	if err != nil {
		return err
	}
	if removed, err := store.Clean(); err != nil || len(removed) > 0 {
		log.Info("removed unfinished layers of an earlier run", "dirs", removed, "err", err)
	}
	prep.Watch(rs)
	prep.Start(ctx)
	go func() {
		n, err := prep.CatchUp(rs)
		if err != nil {
			log.Warn("some registry images could not be read for their layers; nodes pull those", "err", err)
		}
		log.Info("layer store ready", "dir", store.Dir(), "queued", n)
	}()
	return nil
}

// collectGarbage keeps the registry within budget until ctx ends.
func collectGarbage(ctx context.Context, rs *registry.Server, budget int64, log *slog.Logger) {
	t := time.NewTicker(GCInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		res, err := rs.GC(budget, false)
		if err != nil {
			log.Warn("registry garbage collection", "err", err)
		}
		if res.KeptOverBudgetWhy != "" {
			log.Warn("the image cache is over its budget and nothing more may go", "bytes", res.After, "budget", budget, "why", res.KeptOverBudgetWhy)
		}
	}
}

// seedImages loads the pause and busybox images into the registry, from dir
// (BuiltinImages) or built here; nodes pull them from there.
func seedImages(ctx context.Context, rs *registry.Server, dir string, log *slog.Logger) {
	for _, name := range images.Builtin() {
		tarPath, err := BuiltinImage(ctx, name, dir, log)
		if err != nil {
			log.Error("the built-in image is missing from the registry", "image", name, "err", err)
			continue
		}
		f, err := os.Open(tarPath)
		if err != nil {
			log.Error("opening image", "image", name, "err", err)
			continue
		}
		refs, err := rs.Import(ctx, f)
		f.Close()
		if err != nil {
			log.Error("loading image into the registry", "image", name, "err", err)
			continue
		}
		log.Info("image ready in the registry", "image", name, "from", tarPath, "refs", refs)
	}
}

// BuiltinImage is the OCI layout tar of built-in image name: dir/NAME.tar when dir
// is set, else built (or found in the image cache).
func BuiltinImage(ctx context.Context, name, dir string, log *slog.Logger) (string, error) {
	if dir != "" {
		p := filepath.Join(dir, name+".tar")
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("--builtin-images %s: %w (`socialweb image builtin --out %s` writes it)", dir, err, dir)
		}
		return p, nil
	}
	tarPath, _, err := images.Build(ctx, name, images.Options{Logger: log})
	if err != nil {
		return "", fmt.Errorf("building it: %w (a host without the Go toolchain takes them from --builtin-images, as the package does)", err)
	}
	return tarPath, nil
}

// clusterRoutes is one cluster's view of the host route table.
type clusterRoutes struct {
	m    *nodenet.Manager
	plan nodenet.Plan
}

func (r clusterRoutes) PodRoutes(ctx context.Context) (map[string]net.IP, error) {
	return r.m.PodRoutes(ctx, r.plan)
}

func (r clusterRoutes) AddPodRoute(ctx context.Context, cidr string, via net.IP) error {
	return r.m.AddPodRoute(ctx, r.plan, cidr, via)
}

func (r clusterRoutes) RemovePodRoute(ctx context.Context, cidr string, via net.IP) error {
	return r.m.RemovePodRoute(ctx, r.plan, cidr, via)
}
