// Package daemon is `socialweb serve`: it brings up the management API (a
// kube-apiserver over kine in a supervised child process), installs the
// Cluster type, and runs the cluster provider until it is told to stop.
package daemon

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/buildcache"
	"github.com/socialweb-computer/socialweb/internal/buildinfo"
	"github.com/socialweb-computer/socialweb/internal/cgroup"
	"github.com/socialweb-computer/socialweb/internal/controlplane"
	"github.com/socialweb-computer/socialweb/internal/datastore"
	"github.com/socialweb-computer/socialweb/internal/frontdoor"
	"github.com/socialweb-computer/socialweb/internal/lease"
	"github.com/socialweb-computer/socialweb/internal/logrotate"
	"github.com/socialweb-computer/socialweb/internal/nodeimage"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodes/qemu"
	"github.com/socialweb-computer/socialweb/internal/nodeservice"
	"github.com/socialweb-computer/socialweb/internal/pki"
	"github.com/socialweb-computer/socialweb/internal/provider"
	"github.com/socialweb-computer/socialweb/internal/registry"
	"github.com/socialweb-computer/socialweb/internal/sdnotify"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
	"github.com/socialweb-computer/socialweb/internal/tenantuid"
)

// AdminKubeconfig is the management API's admin kubeconfig in the state dir.
const AdminKubeconfig = "admin.kubeconfig"

// DefaultCgroupParent is --cgroup-parent's default.
const DefaultCgroupParent = "socialweb"

// Options configure the daemon; cmd/socialweb maps flags onto them.
type Options struct {
	StateDir     string
	Datastore    string
	APIPort      int
	PortRange    string
	NetworkRange string
	NodeNetwork  bool
	// Egress is where nodes' forwarded traffic may go: internet (the public
	// internet; private, link-local and the host's own networks walled off) or
	// none. EgressAllow opens IPv4 CIDRs walled off (or all, under none);
	// EgressDeny closes more, and wins over EgressAllow.
	Egress      string
	EgressAllow []string
	EgressDeny  []string
	// GatewayTCPAllow are TCP ports on each gateway opened to every tenant's
	// nodes for a service the operator runs on the host.
	GatewayTCPAllow []string
	// Registry* configure the pull-through cache nodes pull from: a mirror per
	// upstream registry (REGISTRY=URL), extra CA files for upstream TLS, the
	// registries fetched from (Allow, empty all) and never (Deny, wins), how long
	// a pulled tag is trusted, and Offline (serve only what was pushed).
	RegistryMirrors []string
	RegistryCAs     []string
	RegistryAllow   []string
	RegistryDeny    []string
	RegistryTagTTL  time.Duration
	RegistryOffline bool
	// ImageCacheSize is the registry's byte budget (0 none); ImageClusterQuota caps
	// what each cluster brings into it (0 none).
	ImageCacheSize    int64
	ImageClusterQuota int64
	// BuildCache serves each cluster an S3 build cache on its gateway
	// (nodeservice.BuildCachePort); BuildCacheBudget is each cluster's bytes (0:
	// buildcache.DefaultBudget).
	BuildCache       bool
	BuildCacheBudget int64
	// NodeImage is a built node image directory; empty keeps clusters at
	// zero nodes.
	NodeImage string
	// NodeBootTimeout is how long a node VM may take to register before it is reported
	// on its Cluster (NodeBoot condition, Event, console lines) and deleted.
	NodeBootTimeout time.Duration
	// Accel is the node accelerator asked for: auto (KVM if a guest of the node image
	// boots under it, else TCG), kvm (refused at start where it does not) or tcg.
	Accel string
	// TCGCacheMiB is each TCG node VM's translation cache (qemu tb-size); 0 is qemu's.
	TCGCacheMiB int64
	// TCGGuestASLR keeps address space randomization in TCG node VMs, which otherwise
	// boot with norandmaps so that TCG reuses what it translated (qemu.Config).
	TCGGuestASLR bool
	// VMUIDBase runs each node VM's qemu as a user and group of its own from this id
	// up (qemu.Config.VMUIDBase); 0 keeps qemu root.
	VMUIDBase int
	// SharedLayers unpacks every image layer of the host registry once, on the host, and
	// gives each node VM the unpacked layers read-only through virtio-fs; false leaves
	// nodes pulling and unpacking every layer themselves.
	SharedLayers bool
	// WarmPool is how many node VMs of the default node size (Defaults' NodeCPUs,
	// NodeMemory, NodeDisk) are kept booted for no cluster, handed to the first clusters
	// that want a node of that size; 0 keeps none.
	WarmPool int
	// WarmPoolPrewarm has each pool VM run, while it waits, the programs a Pod's start
	// runs (runc, its shim, the CNI plugins), so a claimed node's first Pod does not pay
	// for their first run under TCG.
	WarmPoolPrewarm bool
	// WarmPoolRefillDelay is how long after a claim the pool boots the replacement.
	WarmPoolRefillDelay time.Duration
	MetricsAddress      string
	// FrontDoor is host:port of the one listener every tenant is reached
	// through, by SNI; empty leaves each tenant on its own loopback port only.
	FrontDoor string
	// FrontDoorDomain: cluster NAME is NAME.FrontDoorDomain, the TLS server
	// name its clients send through the door or to its own port.
	FrontDoorDomain string
	// ServiceAddress is host:port kubeconfigs and runner credentials name
	// instead of this host's door: one name for every host's door.
	ServiceAddress string
	// FrontDoorMaxConnsPerSource and FrontDoorMaxConns bound the connections
	// the door carries at once from one source and from everyone.
	FrontDoorMaxConnsPerSource int
	FrontDoorMaxConns          int
	Executable                 string
	Defaults                   provider.Defaults
	// ControlPlaneEnv is added to every control-plane process.
	ControlPlaneEnv []string
	// ControlPlaneLog bounds each control plane's controlplane.log (the management
	// API's too): rotated past MaxSize bytes (0 never), Keep old files kept.
	ControlPlaneLog logrotate.Rotation
	// ControlPlaneUIDBase: a tenant's control plane runs as uid and gid this plus
	// its apiserver port (tenantuid.For); 0 runs them as root.
	ControlPlaneUIDBase int64
	// Upgrade is what this daemon does with a control plane an earlier daemon left
	// running on another build or configuration (supervisor.Upgrade).
	Upgrade supervisor.Upgrade
	// BuiltinImages is a directory with the built-in images' tars (nodeservice.Config);
	// empty builds them.
	BuiltinImages string
	// KeepControlPlanes leaves the control planes (the management API's too)
	// running when the daemon stops: the next serve adopts them, and tenants see
	// no outage across a restart; down stops them.
	KeepControlPlanes bool
	// CgroupParent is the cgroup each control plane gets a group of its own under
	// (cgroup.Open); "" runs them without limits.
	CgroupParent string
	// HostName names this host in the service (its Host object and Lease); ""
	// is this machine's hostname. HostAddress is where other hosts reach it.
	HostName    string
	HostAddress string
	// RegistryPeerAddress is host:port of the registry's peer listener, where
	// other hosts fetch the images pushed here (mutual TLS; peers.go); "" is
	// HostAddress:7444 with a HostAddress, else off.
	RegistryPeerAddress string
	// ClusterKeyFile holds the key the service's shared bootstrap is sealed
	// with (PostgreSQL only); "" is STATE/cluster.key, made on first start.
	ClusterKeyFile string
	// MaxTenants caps the tenants placed on this host; 0 is no cap.
	MaxTenants int
	// HostLeaseDuration is how long a silent host keeps its tenants; 0 is
	// hosts.DefaultLeaseDuration.
	HostLeaseDuration time.Duration
}

// validateSizeDefaults checks the default node size range: no size negative, and each
// maximum 0 (the same as its minimum) or at least that minimum.
func validateSizeDefaults(d provider.Defaults) error {
	var errs []error
	if d.MaxNodeCPUs < 0 || d.MaxNodeCPUs != 0 && d.MaxNodeCPUs < d.NodeCPUs {
		errs = append(errs, fmt.Errorf("--default-max-node-cpus %d: want 0 (the same as --default-node-cpus) or %d or more", d.MaxNodeCPUs, d.NodeCPUs))
	}
	for _, q := range []struct {
		flag, minFlag string
		v, min        resource.Quantity
	}{
		{"--default-max-node-memory", "--default-node-memory", d.MaxNodeMemory, d.NodeMemory},
		{"--default-max-node-disk", "--default-node-disk", d.MaxNodeDisk, d.NodeDisk},
	} {
		if q.v.Sign() < 0 || q.v.Sign() > 0 && q.v.Cmp(q.min) < 0 {
			errs = append(errs, fmt.Errorf("%s %s: want 0 (the same as %s) or %s or more", q.flag, q.v.String(), q.minFlag, q.min.String()))
		}
	}
	if d.NodeDisk.Sign() < 0 {
		errs = append(errs, fmt.Errorf("--default-node-disk %s: want a size such as 10Gi, or 0 for nodes without a disk of their own", d.NodeDisk.String()))
	}
	return errors.Join(errs...)
}

// MaxWarmPoolRefillDelay bounds --warm-pool-refill-delay: a longer one leaves the pool
// empty for longer than a pool is worth.
const MaxWarmPoolRefillDelay = time.Hour

// DefaultWarmPoolRefillDelay is --warm-pool-refill-delay's default.
const DefaultWarmPoolRefillDelay = qemu.DefaultPoolRefillDelay

// validateWarmPool checks --warm-pool (its size, and that its VMs, of the default node
// size, fit this host) and --warm-pool-refill-delay.
func validateWarmPool(o Options) error {
	if err := qemu.ValidatePoolSize(o.WarmPool); err != nil {
		return fmt.Errorf("--warm-pool %d: want 0 (no pool) to %d pre-booted node VMs", o.WarmPool, qemu.MaxPoolSize)
	}
	if o.WarmPoolRefillDelay < 0 || o.WarmPoolRefillDelay > MaxWarmPoolRefillDelay {
		return fmt.Errorf("--warm-pool-refill-delay %s: want 0 (boot a claimed VM's replacement at once) to %s", o.WarmPoolRefillDelay, MaxWarmPoolRefillDelay)
	}
	if o.WarmPool == 0 {
		return nil
	}
	if err := qemu.CheckHostFits(int64(o.Defaults.NodeCPUs), o.Defaults.NodeMemory.Value()>>20); err != nil {
		return fmt.Errorf("--warm-pool %d: its VMs have the default node size (--default-node-cpus, --default-node-memory), which this host cannot run: %w", o.WarmPool, err)
	}
	return nil
}

// warmPoolShape is the size of the warm pool's VMs: the default node size, what a cluster
// created without node size flags asks for.
func warmPoolShape(d provider.Defaults) qemu.PoolShape {
	return qemu.PoolShape{CPUs: int64(d.NodeCPUs), MemoryMiB: d.NodeMemory.Value() >> 20, DiskMiB: d.NodeDisk.Value() >> 20}
}

// validateUpstream reads the --registry-* flags; nil is offline.
func validateUpstream(o Options) (*registry.Upstream, error) {
	if o.RegistryOffline {
		if len(o.RegistryMirrors)+len(o.RegistryCAs)+len(o.RegistryAllow)+len(o.RegistryDeny) > 0 {
			return nil, errors.New("--registry-offline fetches from no registry: drop --registry-mirror, --registry-ca, --registry-allow and --registry-deny, or drop --registry-offline")
		}
		return nil, nil
	}
	mirrors, err := registry.ParseMirrors(o.RegistryMirrors)
	if err != nil {
		return nil, fmt.Errorf("--registry-mirror %w", err)
	}
	u := &registry.Upstream{Mirrors: mirrors, Allow: o.RegistryAllow, Deny: o.RegistryDeny, TagTTL: o.RegistryTagTTL}
	if o.RegistryTagTTL == 0 {
		u.TagTTL = registry.DefaultTagTTL
	}
	if len(o.RegistryCAs) > 0 {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		for _, f := range o.RegistryCAs {
			b, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("--registry-ca %s: %w", f, err)
			}
			if !pool.AppendCertsFromPEM(b) {
				return nil, fmt.Errorf("--registry-ca %s: no PEM certificate in it; want a CA bundle in PEM", f)
			}
		}
		u.RootCAs = pool
	}
	if err := u.Validate(); err != nil {
		return nil, fmt.Errorf("--registry-*: %w", err)
	}
	return u, nil
}

// validateEgress reads --egress, --egress-allow and --egress-deny.
func validateEgress(o Options) (nodenet.EgressPolicy, error) {
	var p nodenet.EgressPolicy
	var err error
	if p.Mode, err = nodenet.ParseEgress(o.Egress); err != nil {
		return p, fmt.Errorf("--egress %w", err)
	}
	if p.Allow, err = nodenet.ParsePrefixes(o.EgressAllow); err != nil {
		return p, fmt.Errorf("--egress-allow %w", err)
	}
	if p.Deny, err = nodenet.ParsePrefixes(o.EgressDeny); err != nil {
		return p, fmt.Errorf("--egress-deny %w", err)
	}
	if p.HostTCP, err = nodenet.ParsePorts(o.GatewayTCPAllow); err != nil {
		return p, fmt.Errorf("--gateway-tcp-allow %w", err)
	}
	return p, nil
}

// validated is Options after every check that can fail without side effects.
type validated struct {
	Options
	ports    lease.Range
	networks lease.Range
	egress   nodenet.EgressPolicy
	upstream *registry.Upstream // nil: offline
	store    datastore.Store
	// verdict is the node accelerator chosen by probing (nil without a node image).
	verdict *qemu.Verdict
	// cgroups holds the control planes (nil: --cgroup-parent "").
	cgroups *cgroup.Hierarchy
	// hostName is --host-name or the machine's.
	hostName string
	// registryPeer is where other hosts reach the registry's peer listener once
	// it listens ("" none).
	registryPeer string
}

// Validate checks everything that can be checked before anything is
// created, so bad input changes nothing.
func Validate(ctx context.Context, o Options, log *slog.Logger) (validated, error) {
	v := validated{Options: o}
	if o.StateDir == "" {
		return v, errors.New("--state-dir is required (or $SOCIALWEB_STATE_DIR)")
	}
	if o.APIPort < 1 || o.APIPort > 65535 {
		return v, fmt.Errorf("--api-port %d: want 1-65535", o.APIPort)
	}
	if o.ControlPlaneLog.MaxSize < 0 {
		return v, fmt.Errorf("--controlplane-log-max-size %d: want a size such as 50Mi, or 0 to never rotate", o.ControlPlaneLog.MaxSize)
	}
	if k := o.ControlPlaneLog.Keep; k < 0 || k > logrotate.MaxKeep {
		return v, fmt.Errorf("--controlplane-log-keep %d: want 0-%d (0 keeps no rotated log)", k, logrotate.MaxKeep)
	}
	if err := tenantuid.ValidateBase(o.ControlPlaneUIDBase); err != nil {
		return v, fmt.Errorf("--control-plane-uid-base %w", err)
	}
	if err := uidRangesApart(o.ControlPlaneUIDBase, int64(o.VMUIDBase)); err != nil {
		return v, err
	}

	var err error
	if v.hostName, err = hostName(o); err != nil {
		return v, err
	}
	if err := validateHosts(o); err != nil {
		return v, err
	}
	if err := validateRegistryPeer(o); err != nil {
		return v, err
	}
	if _, err := supervisor.ParseUpgrade(string(o.Upgrade)); o.Upgrade != "" && err != nil {
		return v, fmt.Errorf("--upgrade-strategy: %w", err)
	}
	r, err := lease.ParseRange(o.PortRange)
	if err != nil {
		return v, fmt.Errorf("--port-range: %w", err)
	}
	if o.APIPort >= r.Lo && o.APIPort <= r.Hi {
		return v, fmt.Errorf("--api-port %d lies inside --port-range %s: pick a port outside the tenant range", o.APIPort, r)
	}
	v.ports = r
	if v.networks, err = lease.ParseRange(o.NetworkRange); err != nil {
		return v, fmt.Errorf("--network-range: %w", err)
	}
	if v.networks.Hi > nodenet.MaxIndex {
		return v, fmt.Errorf("--network-range %s: the highest network index is %d", v.networks, nodenet.MaxIndex)
	}
	if v.egress, err = validateEgress(o); err != nil {
		return v, err
	}
	if v.upstream, err = validateUpstream(o); err != nil {
		return v, err
	}
	if o.Defaults.MaxNodes < 0 || o.Defaults.NodeCPUs < 1 || o.Defaults.PodsPerNode < 1 || o.Defaults.Hold < 0 || o.Defaults.NodeMemory.Sign() <= 0 {
		return v, errors.New("cluster defaults must be positive: max nodes >= 0, node cpus >= 1, pods per node >= 1, hold >= 0, node memory > 0")
	}
	if err := validateSizeDefaults(o.Defaults); err != nil {
		return v, err
	}
	if err := v1.ValidateSleepAfter("--default-sleep-after", o.Defaults.SleepAfter); err != nil {
		return v, err
	}
	if err := v1.ValidateControlPlaneLimits(v1.ClusterSpec{
		ControlPlaneMemory: o.Defaults.ControlPlaneMemory, ControlPlanePIDs: o.Defaults.ControlPlanePIDs, ControlPlaneCPUWeight: o.Defaults.ControlPlaneCPUWeight,
	}, func(f string) string {
		return map[string]string{"controlPlaneMemory": "--default-control-plane-memory", "controlPlanePIDs": "--default-control-plane-pids",
			"controlPlaneCPUWeight": "--default-control-plane-cpu-weight"}[f]
	}); err != nil {
		return v, err
	}
	if o.CgroupParent != "" {
		v.cgroups, err = cgroup.Open("/sys/fs/cgroup", o.CgroupParent)
		switch {
		case err != nil && o.CgroupParent == DefaultCgroupParent:
			// The default on a host that cannot give us cgroups (a container without
			// delegation): serve, loudly, rather than not at all.
			log.Warn("control planes run WITHOUT memory, pids and CPU limits: this host gives no cgroups to socialweb; "+
				"delegate them (systemd: Delegate=yes) or pass --cgroup-parent \"\" to say so", "err", err)
			v.cgroups = nil
		case err != nil:
			return v, fmt.Errorf("--cgroup-parent %q: %w; pass --cgroup-parent \"\" to run control planes without limits", o.CgroupParent, err)
		}
	}
	if err := frontdoor.ValidateDomain(o.FrontDoorDomain); err != nil {
		return v, fmt.Errorf("--front-door-domain %w", err)
	}
	// Checked with the door off too: a bad value is bad input either way.
	if err := frontdoor.ValidateMaxConns(o.FrontDoorMaxConns); err != nil {
		return v, fmt.Errorf("--front-door-max-conns %w", err)
	}
	if err := frontdoor.ValidateMaxConnsPerSource(o.FrontDoorMaxConnsPerSource, o.FrontDoorMaxConns); err != nil {
		return v, fmt.Errorf("--front-door-max-conns-per-source %w", err)
	}
	if o.FrontDoor != "" {
		if err := frontdoor.ValidateAddress(o.FrontDoor); err != nil {
			return v, fmt.Errorf("--front-door %w", err)
		}
		if o.ServiceAddress != "" {
			if err := frontdoor.ValidateAddress(o.ServiceAddress); err != nil {
				return v, fmt.Errorf("--service-address %w", err)
			}
		}
		door := frontdoor.Config{Address: o.FrontDoor}
		if p := door.Port(); p == o.APIPort || p >= r.Lo && p <= r.Hi {
			return v, fmt.Errorf("--front-door %s: port %d is the management API's (--api-port) or a tenant's (--port-range %s); pick another port", o.FrontDoor, p, r)
		}
	}
	if o.NodeBootTimeout < 0 {
		return v, fmt.Errorf("--node-boot-timeout %s: want a positive duration such as 5m (0 means the default)", o.NodeBootTimeout)
	}
	mode, err := qemu.ParseAccel(o.Accel)
	if err != nil {
		return v, fmt.Errorf("--accel: %w", err)
	}
	if err := qemu.ValidateTCGCache(o.TCGCacheMiB); err != nil {
		return v, fmt.Errorf("--tcg-cache-mib: %w", err)
	}
	if err := qemu.ValidateUIDBase(o.VMUIDBase); err != nil {
		return v, fmt.Errorf("--vm-uid-base: %w", err)
	}
	if err := validateWarmPool(o); err != nil {
		return v, err
	}
	if o.NodeImage != "" {
		if _, err := nodeimage.ReadManifest(o.NodeImage); err != nil {
			return v, fmt.Errorf("--node-image %s is not a node image (%v): build one with `socialweb image build` and pass the dir it prints", o.NodeImage, err)
		}
	}
	if v.store, err = datastore.Open(o.Datastore); err != nil {
		return v, fmt.Errorf("--datastore: %w", err)
	}
	if err := v.store.Check(ctx); err != nil {
		return v, err
	}
	if o.Executable == "" {
		if v.Executable, err = os.Executable(); err != nil {
			return v, fmt.Errorf("finding own executable: %w", err)
		}
	}
	if o.NodeImage != "" {
		// Last, as the slowest check, and before anything is created: --accel kvm where
		// no guest of the image boots under KVM is refused here.
		verdict, err := qemu.SelectAccel(ctx, mode, qemu.ProbeConfig{ImageDir: o.NodeImage, CacheDir: nodeimage.DefaultCacheDir(), Log: log})
		if err != nil {
			return v, err
		}
		v.verdict = &verdict
		attrs := []any{"accel", verdict.Accel, "reason", verdict.Reason}
		if r := verdict.Probe; r != nil {
			attrs = append(attrs, "probeBooted", r.Booted, "probeTook", r.Took.Round(time.Millisecond), "probeCached", r.Cached,
				"kernel", r.Kernel, "qemu", r.Qemu, "console", lastLine(r.Console))
		}
		log.Info("node accelerator chosen", attrs...)
	} else if mode == qemu.AccelKVM {
		log.Warn("--accel kvm without --node-image: there is no node kernel to probe, and no node will boot")
	}
	if o.WarmPool > 0 && o.NodeImage == "" {
		log.Warn("--warm-pool without --node-image: there is no node image to boot pool VMs from; no pool is kept")
	}
	// Last: a state dir's place is checked once everything said is.
	if o.ControlPlaneUIDBase != 0 {
		if err := reachableByTenants(o.StateDir); err != nil {
			return v, err
		}
	}
	return v, nil
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// Run serves until ctx ends, then stops every process it started.
func Run(ctx context.Context, o Options, log *slog.Logger) error {
	v, err := Validate(ctx, o, log)
	if err != nil {
		return err
	}
	// The door's address is taken before anything is created: a port in use
	// is refused like any other bad input.
	var doorListener net.Listener
	if v.FrontDoor != "" {
		if doorListener, err = net.Listen("tcp", v.FrontDoor); err != nil {
			return fmt.Errorf("--front-door %s: %w: stop what listens there or pick another address", v.FrontDoor, err)
		}
		defer doorListener.Close()
	}
	info := buildinfo.Read()
	log.Info("socialweb", "version", info.Version, "commit", info.CommitString(), "kubernetes", info.Kubernetes, "go", info.Go)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfoCollector(info))
	checks := []string{checkManagementAPI, checkProvider}
	if v.NodeImage != "" {
		checks = append(checks, checkRegistry) // without a node image there is no registry
	}
	ready := newReadiness(checks...)
	// Before anything is created, like the door: a port in use is bad input, and
	// /healthz answers (and /readyz says what is still starting) from the first.
	if v.MetricsAddress != "" {
		stop, err := serveMetrics(ctx, v.MetricsAddress, reg, ready, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	if err := stateDirModes(v.StateDir, v.ControlPlaneUIDBase != 0); err != nil {
		return err
	}
	stopRecord, err := recordDaemon(v.StateDir)
	if err != nil {
		return err
	}
	defer stopRecord()
	cgroupParent := ""
	if v.cgroups != nil {
		cgroupParent = v.CgroupParent
	}
	if err := recordCgroups(v.StateDir, "/sys/fs/cgroup", cgroupParent); err != nil {
		return fmt.Errorf("recording the cgroup parent: %w", err)
	}
	// The build the control planes run: one an earlier daemon left running on
	// this build is adopted, and one on another is upgraded.
	digest, _, err := nodeimage.SHA256File(v.Executable)
	if err != nil {
		return fmt.Errorf("reading the build of %s: %w", v.Executable, err)
	}

	var prov *provider.Provider
	sup := supervisor.New(log, supervisor.DefaultBackoff(), v.Upgrade, func(name string) {
		if prov != nil {
			prov.SupervisorHook(name)
		}
	})
	defer func() {
		if v.KeepControlPlanes {
			log.Info("leaving the control planes running (--control-planes-on-exit keep): the next serve adopts them; socialweb down stops them")
			return
		}
		log.Info("stopping every control plane")
		sup.StopAll(10 * time.Second)
		if err := removeControlPlaneGroups(v.cgroups, v.StateDir); err != nil {
			log.Warn("control-plane cgroups not removed", "err", err)
		}
		log.Info("stopped")
	}()

	reg.MustRegister(rolloutCollectors(sup)...)

	mgmt, err := startManagement(ctx, v, digest, sup, log)
	if err != nil {
		return err
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", mgmt)
	if err != nil {
		return err
	}
	restCfg.QPS, restCfg.Burst = 50, 100
	apiReady, err := managementAPICheck(restCfg, filepath.Join(v.StateDir, "mgmt", "controlplane.log"))
	if err != nil {
		return err
	}
	ready.set(checkManagementAPI, apiReady)
	kube := kubernetes.NewForConfigOrDie(restCfg)
	dyn := dynamic.NewForConfigOrDie(restCfg)
	if err := installAPI(ctx, restCfg, kube); err != nil {
		return err
	}
	// Before joining: the Host object names the peer listener once it listens.
	peerListener, err := listenRegistryPeers(&v, log)
	if err != nil {
		return err
	}
	// The provider is made later, and read from membership's goroutine: until
	// it is there, membership has nothing to tell it.
	var provRef atomic.Pointer[provider.Provider]
	members, err := joinHosts(ctx, v, v.hostName, info.Version, kube, dyn, hostHooks{
		tenants: func() (int, int) {
			if p := provRef.Load(); p != nil {
				return p.Tenants()
			}
			return 0, 0
		},
		hostLost: func(h string) {
			if p := provRef.Load(); p != nil {
				p.HostLost(h)
			}
		},
		fenced: func() {
			if p := provRef.Load(); p != nil {
				p.EnqueueAll()
			}
		},
	}, log)
	if err != nil {
		return err
	}

	peers, err := startRegistryPeers(ctx, v, peerListener, members, dyn, log)
	if err != nil {
		return err
	}

	cache, err := openBuildCache(v, reg, log)
	if err != nil {
		return err
	}

	var (
		networks provider.Networks
		nets     *nodenet.Manager
	)
	if v.NodeNetwork {
		nets = nodenet.NewManager(nil, log.With("component", "nodenet"))
		nets.Egress = v.egress
		networks = nets
		reg.MustRegister(nets.Collector())
	}
	plan := func(cluster string) (nodenet.Plan, error) { return prov.Plan(cluster) }
	var door *frontdoor.Door
	if doorListener != nil {
		// The door looks clusters up in the provider's cache; it serves
		// once the provider exists.
		door = frontdoor.New(frontdoor.Config{Address: v.FrontDoor, Domain: v.FrontDoorDomain,
			MaxConnsPerSource: v.FrontDoorMaxConnsPerSource, MaxConns: v.FrontDoorMaxConns,
			ServiceAddress: v.ServiceAddress, IsPeer: members.IsPeer},
			frontdoor.BackendsFunc(func(cluster string, fromPeer bool) (string, bool) { return prov.Backend(cluster, fromPeer) }),
			log.With("component", "frontdoor"))
		reg.MustRegister(door.Collector())
	}
	nodeServices, err := nodeservice.Start(ctx,
		nodeservice.Config{StateDir: v.StateDir, NodeImage: v.NodeImage, Verdict: v.verdict, TCGCacheMiB: v.TCGCacheMiB, TCGGuestASLR: v.TCGGuestASLR, VMUIDBase: v.VMUIDBase, BootTimeout: v.NodeBootTimeout,
			SharedLayers: v.SharedLayers, Executable: v.Executable, WarmPool: v.WarmPool, WarmPoolShape: warmPoolShape(v.Defaults),
			WarmPoolPrewarm: v.WarmPoolPrewarm, WarmPoolRefillDelay: v.WarmPoolRefillDelay, Upstream: v.upstream,
			ImageCacheSize: v.ImageCacheSize, ClusterQuota: v.ImageClusterQuota, Cgroups: v.cgroups, BuildCache: cache,
			BuiltinImages: v.BuiltinImages, RegistryPeers: peers.List},
		nodeservice.Deps{Networks: nets, Plan: plan, Status: provider.ScaleStatus{Client: dyn}, Metrics: reg, Log: log})
	if err != nil {
		return err
	}
	if v.NodeImage != "" {
		// nodeservice.Start's registry store.
		ready.set(checkRegistry, registryCheck(filepath.Join(v.StateDir, "registry")))
	}
	if c, ok := nodeServices.(io.Closer); ok {
		// Before the control planes stop (deferred earlier, so run later): the node
		// provider destroys its unclaimed warm-pool VMs; nodes keep running for the next
		// serve to adopt.
		defer func() {
			if err := c.Close(); err != nil {
				log.Error("closing the node provider", "err", err)
			}
		}()
	}
	prov = provider.New(provider.Config{
		NodeNetworks:     networks,
		NodeServices:     nodeServices,
		StateDir:         v.StateDir,
		Executable:       v.Executable,
		Ports:            v.ports,
		Networks:         v.networks,
		Defaults:         v.Defaults,
		Env:              v.ControlPlaneEnv,
		ExecutableDigest: digest,
		ControlPlaneLog:  v.ControlPlaneLog,
		UIDBase:          v.ControlPlaneUIDBase,
		FrontDoor:        door,
		Cgroups:          v.cgroups,
		Domain:           v.FrontDoorDomain,
		BuildCache:       cache,
		Ownership:        members,
		SharePKI:         v.store.Kind() == "postgres",
	}, log.With("component", "provider"), dyn, kube, v.store, sup)
	provRef.Store(prov)
	reg.MustRegister(members.Collector())
	ready.set(checkProvider, providerCheck(prov.Synced))
	reg.MustRegister(prov.Collector())
	reg.MustRegister(prov.SleepCollectors()...)
	if door != nil {
		go func() {
			if err := door.Serve(ctx, doorListener); err != nil {
				log.Error("front door stopped", "err", err)
			}
		}()
		log.Info("front door", "address", doorListener.Addr().String(), "domain", v.FrontDoorDomain, "kubeconfigServer", door.Server())
	}
	log.Info("serving", "managementAPI", restCfg.Host, "kubeconfig", mgmt, "datastore", v.store.Describe(), "portRange", v.ports.String())
	sdnotify.Serving(ctx, log) // systemd Type=notify: READY=1 now, STOPPING=1 when ctx ends
	return prov.Run(ctx)
}

// buildCacheKeyPath is the build cache's key in the state dir.
func buildCacheKeyPath(stateDir string) string { return filepath.Join(stateDir, "buildcache.key") }

// openBuildCache opens the host's build cache under the state dir, its key made on
// first use. Off, it still opens: a deleted cluster's objects are removed whatever
// the switch says now.
func openBuildCache(v validated, reg prometheus.Registerer, log *slog.Logger) (*buildcache.Cache, error) {
	var key []byte
	if v.BuildCache {
		k, err := buildcache.LoadOrCreateKey(buildCacheKeyPath(v.StateDir))
		if err != nil {
			return nil, fmt.Errorf("the build cache's key: %w (serve --build-cache=false runs without a cache)", err)
		}
		key = k
	}
	cache, err := buildcache.New(buildcache.Config{Dir: filepath.Join(v.StateDir, "buildcache"), Budget: v.BuildCacheBudget,
		Key: key, Off: !v.BuildCache, Metrics: reg, Logger: log.With("component", "buildcache")})
	if err != nil {
		return nil, err
	}
	log.Info("build cache", "on", cache.On(), "budgetPerCluster", v.BuildCacheBudget, "port", nodeservice.BuildCachePort)
	return cache, nil
}

// startManagement runs the management API and returns its admin kubeconfig.
func startManagement(ctx context.Context, v validated, digest string, sup *supervisor.Supervisor, log *slog.Logger) (string, error) {
	dir := filepath.Join(v.StateDir, "mgmt")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	endpoint, err := v.store.Ensure(ctx, "mgmt", dir)
	if err != nil {
		return "", fmt.Errorf("preparing management datastore: %w", err)
	}
	cfg := controlplane.Config{
		Name: "mgmt", Dir: dir, Components: []string{controlplane.APIServer},
		Datastore: endpoint, Port: v.APIPort, AdvertiseAddress: "127.0.0.1",
		ServiceCIDR: "10.252.0.0/24",
		// A fresh management API captures the datastore seed, so even the
		// first tenant of a new state dir starts seeded.
		SeedDir: controlplane.SeedDirIn(v.StateDir),
	}
	var clusterKey []byte
	if v.store.Kind() == "postgres" {
		if clusterKey, err = loadClusterKey(v.Options); err != nil {
			return "", err
		}
		cfg.EncryptionConfig = filepath.Join(dir, "encryption.yaml")
		if err := writeEncryptionConfig(cfg.EncryptionConfig, clusterKey); err != nil {
			return "", fmt.Errorf("writing the management API's encryption config: %w", err)
		}
	}
	spec := provider.ControlPlaneSpec("mgmt", dir, v.Executable, v.ControlPlaneEnv, v.ControlPlaneLog)
	// The port is the management API's if an earlier daemon left it running.
	if _, alive, _ := supervisor.Running(spec.RecordPath); !alive && !portFree(v.APIPort) {
		return "", fmt.Errorf("--api-port %d is in use on 127.0.0.1: stop what listens there (another socialweb serve?) or pick another port", v.APIPort)
	}
	if err := controlplane.Prepare(cfg); err != nil {
		return "", err
	}
	if v.store.Kind() == "postgres" {
		// Every host's management API is one API: the same CAs and service-account
		// key on each, from the datastore they share.
		changed, err := shareBootstrap(ctx, v, clusterKey, cfg.PKI(), log)
		if err != nil {
			return "", err
		}
		if changed { // leaves signed by this host's own CAs are issued again
			if err := controlplane.Prepare(cfg); err != nil {
				return "", err
			}
		}
	}
	if spec.Fingerprint, err = provider.Fingerprint(digest, spec.Args, spec.Env, filepath.Join(dir, controlplane.ConfigFile), tenantuid.Owner{}); err != nil {
		return "", err
	}
	sup.Start(spec)
	client, err := controlplane.AdminHTTPClient(cfg)
	if err != nil {
		return "", err
	}
	start := time.Now()
	log.Info("starting the management API", "url", cfg.URL())
	for last := time.Now(); ; {
		if err := controlplane.ProbeUp(ctx, client, cfg); err == nil {
			break
		} else if time.Since(start) > 2*time.Minute {
			return "", fmt.Errorf("management API at %s not ready after 2m: %v; see %s", cfg.URL(), err, filepath.Join(dir, "controlplane.log"))
		} else if time.Since(last) > 5*time.Second {
			log.Info("waiting for the management API", "elapsed", time.Since(start).Round(time.Second), "last", err.Error())
			last = time.Now()
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	log.Info("management API ready", "elapsed", time.Since(start).Round(time.Millisecond))
	path := filepath.Join(v.StateDir, AdminKubeconfig)
	if err := pki.WriteKubeconfig(path, cfg.PKI(), pki.Admin, "socialweb", cfg.URL()); err != nil {
		return "", err
	}
	return path, nil
}

// installAPI creates the system namespace and the Cluster CRD, and waits
// until the CRD is served.
func installAPI(ctx context.Context, restCfg *rest.Config, kube kubernetes.Interface) error {
	_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: v1.SystemNamespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", v1.SystemNamespace, err)
	}
	ext, err := apiextensionsclient.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	for _, want := range []*apiextensionsv1.CustomResourceDefinition{v1.CRD(), v1.HostCRD()} {
		if err := installCRD(ctx, ext, want); err != nil {
			return err
		}
	}
	return nil
}

// installCRD creates or updates one CRD and waits until it is served. Other
// hosts may install it at the same moment: a lost race is tried again.
func installCRD(ctx context.Context, ext apiextensionsclient.Interface, want *apiextensionsv1.CustomResourceDefinition) error {
	crds := ext.ApiextensionsV1().CustomResourceDefinitions()
	err := retry.OnError(retry.DefaultRetry, func(err error) bool { return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) }, func() error {
		want := want.DeepCopy()
		cur, err := crds.Get(ctx, want.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = crds.Create(ctx, want, metav1.CreateOptions{})
		case err == nil:
			want.ResourceVersion = cur.ResourceVersion
			_, err = crds.Update(ctx, want, metav1.UpdateOptions{})
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("installing the %s CRD: %w", want.Spec.Names.Kind, err)
	}
	for range 300 {
		cur, err := crds.Get(ctx, want.Name, metav1.GetOptions{})
		if err == nil {
			for _, c := range cur.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					// The apiextensions server holds every create of a CRD
					// established less than 2 s ago for 2 s (for HA peers that
					// have not seen it yet): wait that out here, once, rather
					// than in the first `cluster create`.
					holdLeft := 2*time.Second + 100*time.Millisecond - time.Since(c.LastTransitionTime.Time)
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(holdLeft):
					}
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("the %s CRD was not established within 30s", want.Spec.Names.Kind)
}

// serveMetrics serves /metrics, /healthz and /readyz on addr until ctx ends or
// stop is called.
func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry, ready *readiness, log *slog.Logger) (stop func(), err error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-address %s: %w: stop what listens there or pick another address", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/healthz", healthzHandler())
	mux.Handle("/readyz", readyzHandler(ready.list, readyTimeout))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	go func() { _ = srv.Serve(l) }()
	log.Info("metrics", "address", l.Addr().String(), "paths", "/metrics /healthz /readyz")
	return func() { _ = srv.Close() }, nil
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// daemonRecord is the running daemon's instance record in its state dir: down
// refuses while it names a live process (the control planes may outlive it).
func daemonRecord(stateDir string) string { return filepath.Join(stateDir, "daemon.json") }

// recordDaemon writes this process's record; the returned func removes it. A
// live daemon of the state dir already there is refused.
func recordDaemon(stateDir string) (func(), error) {
	path := daemonRecord(stateDir)
	if id, alive, err := supervisor.Running(path); err == nil && alive {
		return nil, fmt.Errorf("a daemon serves %s already (pid %d): stop it first, or give this one another --state-dir", stateDir, id.PID)
	}
	if err := supervisor.RecordSelf(path); err != nil {
		return nil, fmt.Errorf("recording the daemon: %w", err)
	}
	return func() { _ = os.Remove(path) }, nil
}
