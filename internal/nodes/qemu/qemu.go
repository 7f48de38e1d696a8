// Package qemu is a nodes.NodeProvider that boots each node as a qemu `-M microvm` guest
// (KVM where /dev/kvm is usable, TCG everywhere else) from a node image built by
// internal/nodeimage.
//
// Every node has a directory under Config.StateDir, named after the node:
//
//	<state>/<node>/instance.json   the record: request, address, tap, MAC, created, and the
//	                               qemu process identity (pid + start time + cmdline);
//	                               written atomically, removed first on Delete
//	<state>/<node>/rootfs.ext4     the node's own clone of the image's root disk (/dev/vda, rw)
//	<state>/<node>/identity.img    its identity disk (/dev/vdb, read-only), see internal/identity
//	<state>/<node>/console.log     the guest's serial console
//	<state>/<node>/qemu.log        qemu's own stdout and stderr
//	<state>/<node>/qmp.sock        qemu's QMP socket (Delete asks for system_powerdown there)
//	<state>/<node>/virtiofs.sock   with Config.Layers: the vhost-user socket of the node's
//	                               virtiofsd, which serves the layer store read-only
//	<state>/<node>/virtiofsd.log   its output
//	<state>/.lock                  held by the Provider (one daemon per state dir)
//	<state>/pool-<random>/         a warm-pool VM (pool.go): the same files, its record
//	                               marked Pool; renamed to <state>/<node> when a node
//	                               claims it
//
// qemu processes are not children that die with the daemon: a daemon restart finds them
// again with Recover, which adopts a VM whose recorded identity still runs and cleans up
// (tap, directory) after one that does not. See Recover for why adopting, not killing.
package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/socialweb-computer/socialweb/internal/cgroup"
	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/layershare"
	"github.com/socialweb-computer/socialweb/internal/nodeimage"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodes"
)

// DefaultQemu is the qemu binary looked up in PATH when Config.QemuPath is empty.
const DefaultQemu = "qemu-system-x86_64"

// Accel is qemu's accelerator.
type Accel string

const (
	AccelAuto Accel = ""    // kvm if a guest of the image boots under it (ProbeKVM), else tcg
	AccelKVM  Accel = "kvm" // hardware virtualization; fails New unless the probe booted a guest
	AccelTCG  Accel = "tcg" // emulation; works everywhere, several times slower
)

// Defaults of Config.
const (
	DefaultStartTimeout   = 30 * time.Second
	DefaultJoinTimeout    = 5 * time.Minute
	DefaultStopGrace      = 5 * time.Second
	DefaultHostReserveMiB = 1024
	DefaultDiskReserveMiB = 1024
	DefaultConsolesKept   = 50
	// DefaultEarlyBootTimeout: a guest whose console shows no kernel progress by then is
	// stuck before its kernel ran (as under nested PVM). A kernel prints its banner well
	// within a second of starting, even under TCG on a loaded host.
	DefaultEarlyBootTimeout = 30 * time.Second
	// kvmStallsBeforeTCG consecutive early-boot stalls under KVM turn KVM off.
	kvmStallsBeforeTCG = 2
)

// Config configures a Provider. Zero values mean the defaults above.
type Config struct {
	// StateDir holds one directory per node (see the package comment). It must be on a
	// filesystem that can hold the nodes' root disks (B7): a node may fill its clone up
	// to the image's disk size, so /tmp on a tmpfs is a poor choice.
	StateDir string
	// ImageDir is a node image: manifest.json, vmlinuz, initramfs.cpio.gz, rootfs.ext4.
	ImageDir string
	// QemuPath is the qemu binary; "" means qemu-system-x86_64 from PATH.
	QemuPath string
	// Accel chooses the accelerator; AccelAuto picks kvm when ProbeKVM boots a guest of
	// the image under it. Ignored when Verdict is set.
	Accel Accel
	// Verdict, if set, is an accelerator already chosen (SelectAccel), used as is.
	Verdict *Verdict
	// TCGCacheMiB is each TCG guest's translation cache (qemu's tb-size); 0 leaves
	// qemu's default (1 GiB). Under TCG most of a VMM's own memory is this cache.
	TCGCacheMiB int64
	// TCGGuestASLR keeps address space randomization in TCG guests. By default they boot
	// with norandmaps, so that translated code is reused across processes (kernelCmdline).
	TCGGuestASLR bool
	// ProbeCacheDir keeps KVM probe verdicts (default: nodeimage.DefaultCacheDir()).
	ProbeCacheDir string
	// EarlyBootTimeout: a VM whose console shows no kernel progress after this is
	// reported by EarlyBootStall (default DefaultEarlyBootTimeout).
	EarlyBootTimeout time.Duration
	// StartTimeout bounds how long Create waits for qemu to run the guest (its QMP
	// socket answers and reports "running"). Booting and joining take longer and are
	// not waited for.
	StartTimeout time.Duration
	// JoinTimeout is how long the daemon's watchdog should wait for a node to register
	// before giving up on it (Delete, and report Exited/ConsoleTail). The provider does
	// not enforce it; Info reports the deadline.
	JoinTimeout time.Duration
	// StopGrace is how long Delete waits for the guest to power off after QMP
	// system_powerdown before it terminates qemu.
	StopGrace time.Duration
	// HostReserveMiB is memory kept for the host: a node may ask for at most MemTotal
	// minus this, and a node is booted only while MemAvailable, less this and what
	// running nodes may still take, holds its guest memory and the VMM's overhead.
	HostReserveMiB int64
	// DiskReserveMiB is space kept free in StateDir: a node is booted only while the
	// rest holds its root clone and data disk beside what running nodes may still fill
	// (default DefaultDiskReserveMiB).
	DiskReserveMiB int64
	// HostCPUs and HostMemoryMiB override what the host reports (0: detect). Meant for
	// tests and for operators who want to cap node sizes below the machine's.
	HostCPUs      int
	HostMemoryMiB int64
	// ConsolesKept is how many deleted nodes' serial console logs stay in
	// <StateDir>/consoles/<node>.log, the oldest removed first (default 50; -1 keeps none).
	ConsolesKept int
	// Layers, if set, gives every new VM the host layer store, read-only, as virtio-fs
	// (tag layershare.Tag), served by a virtiofsd of its own; nil attaches nothing.
	Layers *layershare.Config
	// PoolSize is how many unclaimed warm-pool VMs of PoolShape the provider keeps booted
	// (pool.go): a Create of that size takes one instead of booting. 0 keeps none; at most
	// MaxPoolSize.
	PoolSize int
	// PoolPrewarm tells the pool's VMs to run, while they wait, the programs a Pod's
	// start runs (identity.Pool): under TCG the first Pod after a claim then does not
	// pay for their first run.
	PoolPrewarm bool
	// PoolShape is the size of the pool's VMs: the daemon's default node size.
	PoolShape PoolShape
	// PoolRefillDelay is how long the pool waits after a claim before it boots the
	// replacement (DefaultPoolRefillDelay in the daemon; 0: at once). Under TCG a boot
	// takes a host core for many seconds, the core the claimed node needs to start.
	PoolRefillDelay time.Duration
	// Cgroups, if set, holds each VM's qemu in a group of its own (VMGroup) with a
	// memory cap (guest memory, its TCG cache and some overhead) and a pids cap: an
	// escape from a guest, or a qemu gone wrong, takes that much of the host and no more.
	Cgroups *cgroup.Hierarchy
	// VMUIDBase, if not 0, runs each VM's qemu as a user and group of its own,
	// VMUIDBase plus the lowest slot below VMUIDSlots no other VM of this provider holds:
	// qemu opens its disks, tap, sockets and accelerator as root and then drops to it
	// (-runas), and its disks and console belong to it. An escape from one guest into
	// its qemu is then that user, who owns nothing else on the host and can signal no
	// other VM. No passwd entry is needed. 0 keeps qemu root.
	VMUIDBase int
}

// VMUIDSlots is how many users from Config.VMUIDBase up the VMs of one host use at most.
const VMUIDSlots = 65536

// DefaultVMUIDBase is serve's --vm-uid-base: far above the users a host's passwd hands
// out (and above the ranges container runtimes map), below the largest id (2^32-2).
const DefaultVMUIDBase = 2000100000

// ValidateUIDBase says what is wrong with base as Config.VMUIDBase.
func ValidateUIDBase(base int) error {
	const maxID = 1<<32 - 2
	if base != 0 && (base < 1000 || base > maxID-VMUIDSlots) {
		return fmt.Errorf("%d: want 0 (qemu stays root) or a first id from 1000 to %d, clear of the host's users (e.g. %d)", base, maxID-VMUIDSlots, DefaultVMUIDBase)
	}
	return nil
}

// Networks is the part of nodenet.Manager the provider uses. The cluster's bridge must
// exist (nodenet.Manager.Ensure) before Create.
type Networks interface {
	AddTap(ctx context.Context, cluster string, plan nodenet.Plan, node string) (nodenet.Tap, error)
	// RemoveTap removes a node's tap or a pool tap; a missing one is not an error.
	RemoveTap(ctx context.Context, name string) error
	// AddPoolTap makes a warm-pool VM's tap (nodenet.PoolTapName of owner and vm), down
	// and on no bridge.
	AddPoolTap(ctx context.Context, owner, vm string) (nodenet.Tap, error)
	// ClaimTap renames a pool tap to node's tap of cluster (nodenet.TapName), attaches it
	// to the cluster's bridge and sets it up. The VM keeps its pool MAC.
	ClaimTap(ctx context.Context, poolTap, cluster string, plan nodenet.Plan, node string) (nodenet.Tap, error)
	// PoolTaps lists owner's pool taps on the host (swp<owner>-...), claimed or not by a
	// running VM; never another owner's.
	PoolTaps(ctx context.Context, owner string) ([]string, error)
}

// Joiner makes a node's identity. The daemon implements it: it mints the bootstrap token
// and fills the API server URL, CA and registry. Fields it leaves empty that the provider
// knows (cluster, node name, providerID, address, gateway, DNS, cluster DNS, max pods,
// labels, MAC) are filled in; fields it sets must agree with the provider's.
type Joiner interface {
	Identity(ctx context.Context, req nodes.NodeRequest, addr net.IP, mac string) (identity.Identity, error)
}

// Deps are the provider's collaborators.
type Deps struct {
	Networks Networks
	Joiner   Joiner
	// Plan returns a cluster's network plan (nodenet.ForIndex of its network lease).
	Plan func(cluster string) (nodenet.Plan, error)
	// Log may be nil (discard).
	Log *slog.Logger
	// Now may be nil (time.Now).
	Now func() time.Time
	// MemAvailable may be nil (the host's MemAvailable, in MiB); tests set it.
	MemAvailable func() (int64, error)
}

// host is what the provider knows of the machine it runs on.
type host struct {
	CPUs      int
	MemoryMiB int64 // MemTotal
	TSCkHz    int64 // for tsc_early_khz= under TCG; 0 if unknown
	// probe is what trying KVM showed; nil if it was not tried (see New).
	probe   *ProbeResult
	cpuinfo string // for messages
}

// Provider is the qemu NodeProvider. Create, Delete, List, Exited, ConsoleTail and Info
// are safe for concurrent use; Recover must run once, first.
type Provider struct {
	cfg  Config
	deps Deps
	log  *slog.Logger
	now  func() time.Time
	// memAvailable is the host's MemAvailable in MiB (Deps.MemAvailable).
	memAvailable func() (int64, error)
	qemu         string // resolved binary path
	host         host
	image        *nodeimage.Manifest
	imageDir     string
	lock         *os.File

	mu          sync.Mutex
	accel       Accel  // kvm or tcg; KVM falls back to TCG after repeated early-boot stalls
	accelReason string // why, for logs and each Cluster's NodeAccelerator condition
	kvmStalls   int    // consecutive KVM boots that stalled early
	recovered   bool
	closed      bool
	insts       map[string]*instance

	pool *pool // the warm pool; nil or size 0 when off
}

var _ nodes.NodeProvider = (*Provider)(nil)

// New validates cfg against this host and the image (nothing is booted), takes the state
// dir's lock and returns a Provider. Call Recover before anything else.
//
// Unless cfg.Verdict or cfg.Accel tcg says otherwise, New probes KVM (ProbeKVM, cached
// per host boot): a usable /dev/kvm is not enough, a guest of the image has to boot.
func New(cfg Config, deps Deps) (*Provider, error) {
	h, err := detectHost()
	if err != nil {
		return nil, err
	}
	if cfg.ProbeCacheDir == "" {
		cfg.ProbeCacheDir = nodeimage.DefaultCacheDir()
	}
	if cfg.Verdict == nil && cfg.Accel != AccelTCG {
		// A probe that cannot run (no qemu, no image) leaves h.probe nil; newProvider
		// reports those causes itself.
		if r, err := ProbeKVM(context.Background(), ProbeConfig{Qemu: cfg.QemuPath, ImageDir: cfg.ImageDir, CacheDir: cfg.ProbeCacheDir, Log: deps.Log}); err == nil {
			h.probe = &r
		}
	}
	return newProvider(cfg, deps, h)
}

func newProvider(cfg Config, deps Deps, h host) (*Provider, error) {
	if deps.Networks == nil || deps.Joiner == nil || deps.Plan == nil {
		return nil, errors.New("qemu provider: Deps.Networks, Deps.Joiner and Deps.Plan are required")
	}
	if err := ValidateTCGCache(cfg.TCGCacheMiB); err != nil {
		return nil, err
	}
	if err := ValidatePoolSize(cfg.PoolSize); err != nil {
		return nil, err
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.ConsolesKept == 0 {
		cfg.ConsolesKept = DefaultConsolesKept
	}
	if cfg.JoinTimeout <= 0 {
		cfg.JoinTimeout = DefaultJoinTimeout
	}
	if cfg.EarlyBootTimeout <= 0 {
		cfg.EarlyBootTimeout = DefaultEarlyBootTimeout
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = DefaultStopGrace
	}
	if cfg.HostReserveMiB <= 0 {
		cfg.HostReserveMiB = DefaultHostReserveMiB
	}
	if cfg.DiskReserveMiB <= 0 {
		cfg.DiskReserveMiB = DefaultDiskReserveMiB
	}
	if cfg.HostCPUs > 0 {
		h.CPUs = cfg.HostCPUs
	}
	if cfg.HostMemoryMiB > 0 {
		h.MemoryMiB = cfg.HostMemoryMiB
	}
	p := &Provider{cfg: cfg, deps: deps, log: deps.Log, now: deps.Now, host: h, insts: map[string]*instance{}, pool: newPool(cfg)}
	if p.log == nil {
		p.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if p.now == nil {
		p.now = time.Now
	}
	p.memAvailable = deps.MemAvailable
	if p.memAvailable == nil {
		p.memAvailable = memAvailableMiB
	}

	var (
		errs []error
		err  error
	)
	if p.qemu, err = findQemu(cfg.QemuPath); err != nil {
		errs = append(errs, err)
	}
	if p.imageDir, p.image, err = checkImage(cfg.ImageDir); err != nil {
		errs = append(errs, err)
	}
	if err := checkStateDir(&p.cfg); err != nil {
		errs = append(errs, err)
	}
	if cfg.PoolSize > 0 {
		if err := checkPoolShape(cfg.PoolShape, h, cfg.HostReserveMiB); err != nil {
			errs = append(errs, err)
		}
	}
	if p.cfg.Layers != nil {
		l := *p.cfg.Layers
		if err := l.Validate(); err != nil {
			errs = append(errs, err)
		}
		p.cfg.Layers = &l
	}
	if len(errs) == 0 {
		v, err := resolveAccel(cfg, h)
		if err != nil {
			errs = append(errs, err)
		}
		p.accel, p.accelReason = v.Accel, v.Reason
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if p.accel == AccelTCG && h.TSCkHz == 0 {
		p.log.Warn("no cpu MHz in /proc/cpuinfo: booting TCG guests without tsc_early_khz=; on a loaded host their TSC calibration may fail and stall the boot")
	}
	if isTmpfs(p.cfg.StateDir) {
		p.log.Warn("the qemu state dir is on a tmpfs: every node's root disk will use host memory as it fills", "stateDir", p.cfg.StateDir)
	}
	if p.lock, err = lockStateDir(p.cfg.StateDir); err != nil {
		return nil, err
	}
	return p, nil
}

// Accel reports the accelerator new guests run with (kvm or tcg).
func (p *Provider) Accel() Accel {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accel
}

// Accelerator implements nodes.AcceleratorReporter: the accelerator new guests run with
// and why.
func (p *Provider) Accelerator() (string, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return string(p.accel), p.accelReason
}

// JoinTimeout is Config.JoinTimeout with the default applied.
func (p *Provider) JoinTimeout() time.Duration { return p.cfg.JoinTimeout }

// Close stops the warm pool, destroying its unclaimed VMs, and releases the state dir's
// lock. Nodes are left running: a later Provider's Recover adopts them. Use Delete to
// stop a node.
func (p *Provider) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.stopPool()
	_ = syscall.Flock(int(p.lock.Fd()), syscall.LOCK_UN)
	return p.lock.Close()
}

func findQemu(path string) (string, error) {
	if path == "" {
		path = DefaultQemu
	}
	found, err := exec.LookPath(path)
	if err != nil {
		return "", fmt.Errorf("%s not found: apt-get install qemu-system-x86 (or set the qemu path to the binary)", path)
	}
	return found, nil
}

// resolveAccel is the accelerator of a new provider: the caller's verdict, or the choice
// from cfg.Accel and the host's probe.
func resolveAccel(cfg Config, h host) (Verdict, error) {
	if cfg.Verdict != nil {
		if cfg.Verdict.Accel != AccelKVM && cfg.Verdict.Accel != AccelTCG {
			return Verdict{}, fmt.Errorf("accelerator verdict %q: want kvm or tcg", string(cfg.Verdict.Accel))
		}
		return *cfg.Verdict, nil
	}
	if cfg.Accel != AccelTCG && h.probe == nil {
		return Verdict{}, errors.New("accelerator: KVM could not be probed on this host: use accel tcg")
	}
	return ChooseAccel(cfg.Accel, h.probe)
}

// checkImage names the first thing missing from an image dir and says how to get one.
func checkImage(dir string) (string, *nodeimage.Manifest, error) {
	if dir == "" {
		return "", nil, errors.New("no node image dir configured: build one with `socialweb image build` and configure its directory")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", nil, err
	}
	if strings.ContainsAny(abs, ",\n") {
		return "", nil, fmt.Errorf("node image dir %q contains a comma or newline, which qemu's option syntax cannot carry: move the image", abs)
	}
	for _, f := range []string{nodeimage.FileKernel, nodeimage.FileInitramfs, nodeimage.FileRootfs, nodeimage.FileManifest} {
		if _, err := os.Stat(filepath.Join(abs, f)); err != nil {
			return "", nil, fmt.Errorf("node image %s has no %s (%v): build the image with `socialweb image build`", abs, f, err)
		}
	}
	m, err := nodeimage.ReadManifest(abs)
	if err != nil {
		return "", nil, fmt.Errorf("node image %s is not usable (%v): rebuild it with `socialweb image build`", abs, err)
	}
	return abs, m, nil
}

// maxNodeNameLen is a DNS label's length; node names are hostnames.
const maxNodeNameLen = 63

// sockName is the QMP socket in the node dir. qemu is given it relative to its working
// directory (the node dir), and the provider dials it through /proc/self/fd when the
// absolute path is longer than a unix socket path may be, so the state dir's length is
// not limited.
const sockName = "qmp.sock"

func checkStateDir(cfg *Config) error {
	if cfg.StateDir == "" {
		return errors.New("no qemu state dir configured: set one on a disk with room for the nodes' root disks")
	}
	abs, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return err
	}
	cfg.StateDir = abs
	if strings.ContainsAny(abs, ",\n") {
		return fmt.Errorf("qemu state dir %q contains a comma or newline, which qemu's option syntax cannot carry: use another path", abs)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return fmt.Errorf("creating qemu state dir: %w", err)
	}
	return nil
}

func lockStateDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		owner, _ := os.ReadFile(f.Name())
		f.Close()
		return nil, fmt.Errorf("qemu state dir %s is in use by another provider (pid %s): stop it first, or use another state dir",
			dir, string(owner))
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(fmt.Sprint(os.Getpid())), 0)
	return f, nil
}

var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// Validate reports whether req can be booted on this host, without booting anything:
// the request itself, a name usable as a hostname and directory, and a size that fits
// the host. The daemon can call it when a cluster's node size is configured.
func (p *Provider) Validate(req nodes.NodeRequest) error {
	if err := req.Validate(); err != nil {
		return err
	}
	if len(req.Name) > maxNodeNameLen || !nodeNameRE.MatchString(req.Name) {
		return fmt.Errorf("node request: name %q is not a DNS label (lower-case letters, digits and '-', at most %d characters): make it with nodes.NewNodeName", req.Name, maxNodeNameLen)
	}
	return checkSize(req, p.host, p.cfg.HostReserveMiB)
}

// CheckHostFits reports whether a node of cpus vCPUs and memMiB MiB fits this host (with
// DefaultHostReserveMiB kept for the host), in the words Validate uses. Zero values are
// not checked. The CLI calls it so an impossible size fails at cluster create.
func CheckHostFits(cpus, memMiB int64) error {
	h, err := detectHost()
	if err != nil {
		return err
	}
	var errs []error
	if cpus > 0 && cpus > int64(h.CPUs) {
		errs = append(errs, fmt.Errorf("nodes of %d vCPUs do not fit this host's %d CPUs: use --node-cpus %d or fewer", cpus, h.CPUs, h.CPUs))
	}
	if limit := h.MemoryMiB - DefaultHostReserveMiB; memMiB > 0 && memMiB > limit {
		errs = append(errs, fmt.Errorf("nodes of %d MiB do not fit this host's %d MiB (%d MiB kept for the host): use --node-memory %dMi or less",
			memMiB, h.MemoryMiB, DefaultHostReserveMiB, max(limit, 0)))
	}
	if memMiB > 0 && memMiB < nodeimage.MinMemMiB {
		errs = append(errs, fmt.Errorf("nodes of %d MiB are below the %d MiB the node image needs: use --node-memory %dMi or more", memMiB, nodeimage.MinMemMiB, nodeimage.MinMemMiB))
	}
	return errors.Join(errs...)
}

func checkSize(req nodes.NodeRequest, h host, reserveMiB int64) error {
	var errs []error
	if h.CPUs > 0 && req.CPUs > int64(h.CPUs) {
		errs = append(errs, fmt.Errorf("node %s asks for %d vCPUs but this host has %d CPUs: size nodes at %d vCPUs or fewer",
			req.Name, req.CPUs, h.CPUs, h.CPUs))
	}
	if req.MemoryMiB < nodeimage.MinMemMiB {
		errs = append(errs, fmt.Errorf("node %s asks for %d MiB of memory, below the %d MiB the node image needs: size nodes at %d MiB or more",
			req.Name, req.MemoryMiB, nodeimage.MinMemMiB, nodeimage.MinMemMiB))
	}
	if h.MemoryMiB > 0 {
		limit := h.MemoryMiB - reserveMiB
		if req.MemoryMiB > limit {
			errs = append(errs, fmt.Errorf("node %s asks for %d MiB of memory but this host has %d MiB (%d MiB kept for the host): size nodes at %d MiB or less",
				req.Name, req.MemoryMiB, h.MemoryMiB, reserveMiB, max(limit, 0)))
		}
	}
	return errors.Join(errs...)
}
