// Package agent is socialweb-node, the node agent: PID 1 of a socialweb
// microVM. It turns a booted kernel + root filesystem into a Kubernetes node
// of the tenant cluster named on the identity disk.
//
// # Lifecycle
//
// Run goes through three phases and never returns on a real node (it powers
// the machine off):
//
//  1. Boot: the Steps chain, in order (DefaultSteps):
//     mounts, limits, modules, sysctls, data-disk, layer-share (the host's
//     unpacked layers over virtio-fs, when the VM has them), snapshotter (the
//     socialweb snapshotter that takes layers from that share, see
//     layershare), containerd-config, containerd (started, not waited for),
//     identity, hostname, network, registry, kubelet-config, containerd-ready
//     (its socket answers), kubelet, and the steps after it.
//     Each step logs one timeline line when it is done,
//     `msg=agent step=<name> uptime=<s>s took=<d>`, where uptime is the
//     guest's /proc/uptime (seconds since the kernel started), so the host
//     can read kernel init -> agent up -> containerd up -> kubelet started
//     from the serial console. A last line `step=up` closes the phase; the
//     boot-timeline step then puts the same uptimes on the node's Node object
//     (boottimeline.Annotation) for the host's start breakdown. A
//     failing step is logged with its error and goes straight to shutdown.
//     The modules step loads only overlay and br_netfilter; the netfilter
//     modules the kubelet and the CNI plugins use load in the background
//     (DefaultBackgroundModules), and the power button watcher loads its own.
//     The identity disk is socialweb.identity=<dev> from the kernel command
//     line, else the disk with virtio serial "socialweb-identity", else
//     /dev/vdb. A warm-pool VM, booted before any cluster needs it, finds
//     the pool document there (identity.ErrUnclaimed): the identity step
//     logs that once, marks step=identity-wait on the timeline (console and
//     Node annotation: the host's breakdown counts only what follows the
//     claim) and reads the disk every 50 ms with O_DIRECT (past the page
//     cache) until the host has rewritten it in place with a node's
//     identity, its claim; then the boot goes on. Stop ends the wait.
//  2. Run: wait for a reason to stop: SIGTERM or SIGINT (the kernel sends
//     SIGINT to PID 1 on Ctrl-Alt-Del, which the agent enables, so
//     firecracker's SendCtrlAltDel works), the ACPI power button (qemu's
//     QMP system_powerdown), the kubelet returning, containerd exiting more
//     often than Config.ContainerdRestarts allows, or ctx.
//  3. Shutdown: the ShutdownSteps chain (DefaultShutdownSteps): stop the
//     kubelet, stop containerd, stop the snapshotter, SIGTERM then SIGKILL
//     every other process, sync and unmount, then Final (power off).
//
// While it runs as PID 1 the agent also reaps orphans (see reaper). The
// kubelet runs in this process (RunKubelet); the few kubelet paths that
// call os.Exit end PID 1, which panics the kernel, and with panic=-1 the VM
// resets: the host sees the VM exit either way.
//
// Steps are a named, editable chain like nodeimage's (compare
// firecracker-go-sdk's Handlers): a caller may insert, replace or remove
// steps before Run.
//
// # Pod network
//
// The node's pod CIDR is not known at boot: the controller-manager's node
// IPAM assigns spec.podCIDR when the Node object is created. The kubelet
// (run without --pod-cidr) reads it from its Node object and passes it to
// containerd through the CRI UpdateRuntimeConfig call; containerd's CRI
// plugin then renders the conflist template (conf_template, see
// CNITemplate) into the CNI config directory: bridge + host-local on that
// CIDR + portmap, with loopback added by containerd. Until then the node
// reports NetworkReady=false and no Pod is scheduled onto it.
//
// # Trust
//
// Identity.CACert verifies the apiserver; Identity.ClientCACert is the
// kubelet's client CA (x509 authentication of the apiserver's kubelet client
// certificate, for logs/exec/port-forward). They are kept apart so a
// certificate from the client CA can never pass for the apiserver. The
// kubelet's serving certificate from the host (Identity.KubeletServingCert)
// is from the server CA, which the apiserver verifies the kubelet against.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/kubernetes/cmd/kubelet/app/options"

	"github.com/socialweb-computer/socialweb/internal/agent/layershare"
	"github.com/socialweb-computer/socialweb/internal/boottimeline"
	"github.com/socialweb-computer/socialweb/internal/identity"
)

// Config configures an Agent. Zero values mean the defaults of DefaultConfig.
type Config struct {
	// IdentityDevice is the raw read-only identity disk. The kernel command
	// line's socialweb.identity=<path> overrides it.
	IdentityDevice string
	// IdentityWait bounds the wait for the identity device to appear.
	IdentityWait time.Duration
	// Modules are loaded with modprobe from the root filesystem; a module
	// that fails to load is logged, not fatal.
	Modules []string
	// BackgroundModules are loaded in the background, in order, from the
	// modules step on (failures are logged).
	BackgroundModules []string
	// PowerButtonModules are loaded in the background before watching for
	// the ACPI power button; empty means no power button.
	PowerButtonModules []string
	// Sysctls are written under /proc/sys (keys with dots, as sysctl(8)).
	Sysctls map[string]string

	// ContainerdBinaries are tried in order; the first that exists is run.
	ContainerdBinaries []string
	// OCIRuntimes are the OCI runtimes the runc shim may drive, tried in order (a
	// path, or a name looked up on PATH); the first found is used. First the runc the
	// node image carries (guestbuild.GuestRunc: static, and it runs each container's
	// init from its own file where Debian's runc 1.1 copies itself into memory first,
	// which a TCG guest must translate again every time), then Debian's.
	OCIRuntimes []string
	// ContainerdMajor forces the config format (1 or 2); 0 asks the binary.
	ContainerdMajor    int
	ContainerdLogLevel string
	// ContainerdRestarts is how often an exited containerd is started again
	// before the node shuts down.
	ContainerdRestarts int
	SandboxImage       string
	// NoLayerShare keeps containerd on its overlayfs snapshotter even when
	// the host shares its unpacked layers (see stepLayerShare).
	NoLayerShare bool
	CNI          CNIOptions
	Kubelet      KubeletOptions

	// ShutdownGrace is how long processes get between SIGTERM and SIGKILL.
	ShutdownGrace time.Duration
	// Layout names the files; zero means DefaultLayout().
	Layout Layout
	// Steps and ShutdownSteps replace the default chains when non-nil.
	Steps         Steps
	ShutdownSteps Steps
	// Final runs after the shutdown steps; nil powers the machine off
	// (reboot(2) POWER_OFF, falling back to RESTART, which qemu -no-reboot
	// and firecracker turn into the VM exiting).
	Final func(a *Agent, reason string)
	// Log receives the timeline and every event; nil logs text to stdout,
	// which is /dev/console under the initramfs.
	Log *slog.Logger
}

// DefaultModules are loaded at boot, before containerd: overlayfs for the
// snapshotter and br_netfilter (with bridge) for the bridge-nf sysctls.
var DefaultModules = []string{"overlay", "br_netfilter"}

// DefaultBackgroundModules are loaded in the background from the modules
// step on, in this order: what kube-proxy's nftables rules use (measured on a
// booted node: /proc/modules after its first sync), then the first Pod's
// veth. The kernel would load each on demand anyway, but then through a
// modprobe process per request while kube-proxy starts (28 of them, 3.4 s
// of a TCG vCPU); a module costs about 0.3 s under TCG (signature check),
// and one modprobe loading them while containerd starts (a pool VM: before
// its claim) takes that off the path to the first Pod.
var DefaultBackgroundModules = []string{
	"nf_tables", "nf_conntrack", "nft_ct", "nft_chain_nat", "nft_nat", "nft_masq",
	"nft_reject_ipv4", "nft_reject", "veth",
}

// DefaultPowerButtonModules are loaded in the background for the ACPI power
// button (qemu's system_powerdown): no udev loads them.
var DefaultPowerButtonModules = []string{"button", "evdev"}

// DefaultSysctls make the guest a router for its pods. IPv6 is off: clusters are
// IPv4-only, and with it on kube-proxy runs dual-stack, doubling its rule syncs (a
// large share of a starting node's CPU under TCG).
var DefaultSysctls = map[string]string{
	"net.ipv4.ip_forward":                 "1",
	"net.ipv6.conf.all.disable_ipv6":      "1",
	"net.ipv6.conf.default.disable_ipv6":  "1",
	"net.bridge.bridge-nf-call-iptables":  "1",
	"net.bridge.bridge-nf-call-ip6tables": "1",
	"fs.inotify.max_user_instances":       "8192",
	"fs.inotify.max_user_watches":         "524288",
	// The agent is PID 1, and the kernel reports every SIGSEGV of PID 1 on the console,
	// also the nil dereferences Go turns into panics that the kubelet recovers: two
	// lines each on the serial console, a dozen in a node's first seconds.
	"debug.exception-trace": "0",
}

// DefaultConfig returns the configuration of a node.
func DefaultConfig() Config {
	sys := map[string]string{}
	for k, v := range DefaultSysctls {
		sys[k] = v
	}
	return Config{
		IdentityDevice:     "/dev/vdb",
		IdentityWait:       10 * time.Second,
		Modules:            append([]string(nil), DefaultModules...),
		BackgroundModules:  append([]string(nil), DefaultBackgroundModules...),
		PowerButtonModules: append([]string(nil), DefaultPowerButtonModules...),
		Sysctls:            sys,
		ContainerdBinaries: []string{"/usr/local/bin/containerd", "/usr/bin/containerd"},
		OCIRuntimes:        []string{"/usr/local/sbin/runc", "runc"},
		ContainerdLogLevel: "warn",
		ContainerdRestarts: 3,
		SandboxImage:       "registry.k8s.io/pause:3.10",
		CNI:                CNIOptions{Bridge: "cni0"},
		ShutdownGrace:      5 * time.Second,
		Layout:             DefaultLayout(),
	}
}

func (c *Config) complete() {
	d := DefaultConfig()
	if c.IdentityDevice == "" {
		c.IdentityDevice = d.IdentityDevice
	}
	if c.IdentityWait == 0 {
		c.IdentityWait = d.IdentityWait
	}
	if c.Modules == nil {
		c.Modules = d.Modules
	}
	if c.BackgroundModules == nil {
		c.BackgroundModules = d.BackgroundModules
	}
	if c.PowerButtonModules == nil {
		c.PowerButtonModules = d.PowerButtonModules
	}
	if c.Sysctls == nil {
		c.Sysctls = d.Sysctls
	}
	if c.ContainerdBinaries == nil {
		c.ContainerdBinaries = d.ContainerdBinaries
	}
	if c.OCIRuntimes == nil {
		c.OCIRuntimes = d.OCIRuntimes
	}
	if c.ContainerdLogLevel == "" {
		c.ContainerdLogLevel = d.ContainerdLogLevel
	}
	if c.SandboxImage == "" {
		c.SandboxImage = d.SandboxImage
	}
	if c.CNI.Bridge == "" {
		c.CNI.Bridge = d.CNI.Bridge
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = d.ShutdownGrace
	}
	if c.Layout == (Layout{}) {
		c.Layout = d.Layout
	}
	if c.Steps == nil {
		c.Steps = DefaultSteps()
	}
	if c.ShutdownSteps == nil {
		c.ShutdownSteps = DefaultShutdownSteps()
	}
	if c.Final == nil {
		c.Final = powerOff
	}
	if c.Log == nil {
		c.Log = NewConsoleLogger(os.Stdout)
	}
}

// NewConsoleLogger logs text without timestamps (the timeline carries the
// guest's uptime; the host timestamps the console).
func NewConsoleLogger(w *os.File) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
}

// Agent is one run of the node agent. Steps read and fill in its fields.
type Agent struct {
	Config Config
	Layout Layout
	Log    *slog.Logger

	// Set by the identity step.
	Identity identity.Identity
	// IdentityDevice is the disk Identity was read from; "" until then.
	IdentityDevice string
	// Set by the network step: the interface that got Identity.Address.
	Link string
	// Set by the containerd steps.
	ContainerdBinary string
	ContainerdMajor  int
	// OCIRuntime is the path of the OCI runtime (Config.OCIRuntimes) the shim
	// and the prewarm run; empty when none was found (the shim then fails as
	// it would without runc).
	OCIRuntime string
	// Set by the layer-share step when the host's layer share is mounted
	// (Layout.LayerShare).
	LayerShare string
	// Set by the kubelet-config step: what the kubelet runs with.
	KubeletServer *options.KubeletServer
	KubeletFlags  []string

	started time.Time
	stop    chan string // reasons to shut down
	// stopAsked is closed by the first Stop: a boot step that waits (a warm-pool VM
	// waiting for its claim) gives way to it.
	stopAsked chan struct{}
	stopOnce  sync.Once
	// boot is this run's boot timeline: Run adds each boot step, and a step may add a
	// point of its own (mark).
	boot boottimeline.Timeline
	// booted gets the boot timeline once the boot steps are done (buffered: Run never
	// waits for the boot-timeline step's publisher).
	booted chan boottimeline.Timeline
	reaper *reaper
	// bg ends with the run phase: background work (the power button
	// watcher) stops there.
	bg     context.Context
	bgStop context.CancelFunc

	mu            sync.Mutex
	containerd    *exec.Cmd
	containerdEnd chan struct{} // closed when the current containerd exited
	stopping      bool
	kubeletCancel context.CancelFunc
	kubeletDone   chan error
	// sandboxImported: importSandboxImage is done on this boot; the uptime it
	// imported the image at, 0 if it did not
	sandboxImported   bool
	sandboxImportedAt time.Duration
	// proxyPrestart is kube-proxy's process started ahead, until stepProxy takes it
	proxyPrestart *proxyPrestart
	// the socialweb snapshotter, when the layer share is mounted
	snapshotter       *layershare.Snapshotter
	snapshotterServer *layershare.Server
}

// New returns an agent for cfg (defaults filled in).
func New(cfg Config) *Agent {
	cfg.complete()
	bg, stop := context.WithCancel(context.Background())
	return &Agent{Config: cfg, Layout: cfg.Layout, Log: cfg.Log, started: time.Now(), stop: make(chan string, 8),
		stopAsked: make(chan struct{}), boot: boottimeline.Timeline{},
		booted: make(chan boottimeline.Timeline, 1), bg: bg, bgStop: stop}
}

// Step is one named stage of the boot or shutdown chain.
type Step struct {
	Name string
	Run  func(ctx context.Context, a *Agent) error
}

// Steps is an ordered, editable chain of steps.
type Steps []Step

// Index returns the position of the named step, or -1.
func (s Steps) Index(name string) int {
	for i, st := range s {
		if st.Name == name {
			return i
		}
	}
	return -1
}

// Names lists the steps in order.
func (s Steps) Names() []string {
	var n []string
	for _, st := range s {
		n = append(n, st.Name)
	}
	return n
}

// InsertBefore returns a copy of s with st inserted before the named step.
func (s Steps) InsertBefore(name string, st Step) (Steps, error) {
	i := s.Index(name)
	if i < 0 {
		return s, fmt.Errorf("no step %q (steps: %s)", name, strings.Join(s.Names(), ", "))
	}
	return append(append(append(Steps{}, s[:i]...), st), s[i:]...), nil
}

// InsertAfter returns a copy of s with st inserted after the named step.
func (s Steps) InsertAfter(name string, st Step) (Steps, error) {
	i := s.Index(name)
	if i < 0 {
		return s, fmt.Errorf("no step %q (steps: %s)", name, strings.Join(s.Names(), ", "))
	}
	return append(append(append(Steps{}, s[:i+1]...), st), s[i+1:]...), nil
}

// Replace returns a copy of s with the named step's function replaced.
func (s Steps) Replace(name string, run func(context.Context, *Agent) error) (Steps, error) {
	i := s.Index(name)
	if i < 0 {
		return s, fmt.Errorf("no step %q (steps: %s)", name, strings.Join(s.Names(), ", "))
	}
	out := append(Steps{}, s...)
	out[i].Run = run
	return out, nil
}

// Remove returns a copy of s without the named step.
func (s Steps) Remove(name string) Steps {
	var out Steps
	for _, st := range s {
		if st.Name != name {
			out = append(out, st)
		}
	}
	return out
}

func (s Steps) validate() error {
	seen := map[string]bool{}
	for _, st := range s {
		if st.Name == "" || st.Run == nil {
			return errors.New("agent steps need a name and a function")
		}
		if seen[st.Name] {
			return fmt.Errorf("agent step %q appears twice", st.Name)
		}
		seen[st.Name] = true
	}
	return nil
}

// Step names of DefaultSteps and DefaultShutdownSteps.
const (
	StepMounts           = "mounts"
	StepLimits           = "limits"
	StepModules          = "modules"
	StepSysctls          = "sysctls"
	StepDataDisk         = "data-disk"
	StepLayerShare       = "layer-share"
	StepSnapshotter      = "snapshotter"
	StepProxyPrestart    = "proxy-prestart"
	StepIdentity         = "identity"
	StepHostname         = "hostname"
	StepNetwork          = "network"
	StepContainerdConfig = "containerd-config"
	StepContainerd       = "containerd"
	StepRegistry         = "registry"
	StepKubeletConfig    = "kubelet-config"
	StepContainerdReady  = "containerd-ready"
	StepKubelet          = "kubelet"
	StepRegister         = "register-node"
	StepProxy            = "proxy"
	StepDNS              = "dns"
	StepHealth           = "health"
	StepCPUReport        = "cpu-report"
	StepTimeline         = "boot-timeline"

	StepStopKubelet     = "stop-kubelet"
	StepStopContainerd  = "stop-containerd"
	StepStopSnapshotter = "stop-snapshotter"
	StepStopProcesses   = "stop-processes"
	StepUnmount         = "unmount"
)

// DefaultSteps returns a new copy of the boot chain.
func DefaultSteps() Steps {
	return Steps{
		{StepMounts, stepMounts},
		{StepLimits, stepLimits},
		{StepModules, stepModules},
		{StepSysctls, stepSysctls},
		{StepDataDisk, stepDataDisk},
		{StepLayerShare, stepLayerShare},
		{StepSnapshotter, stepSnapshotter},
		{StepContainerdConfig, stepContainerdConfig},
		{StepContainerd, stepContainerd},
		{StepProxyPrestart, stepProxyPrestart},
		{StepIdentity, stepIdentity},
		{StepHostname, stepHostname},
		{StepNetwork, stepNetwork},
		{StepRegistry, stepRegistry},
		{StepKubeletConfig, stepKubeletConfig},
		{StepContainerdReady, stepContainerdReady},
		{StepKubelet, stepKubelet},
		{StepRegister, stepRegister},
		{StepProxy, stepProxy},
		{StepDNS, stepDNS},
		{StepHealth, stepHealth},
		{StepCPUReport, stepCPUReport},
		{StepTimeline, stepTimeline},
	}
}

// DefaultShutdownSteps returns a new copy of the shutdown chain.
func DefaultShutdownSteps() Steps {
	return Steps{
		{StepStopKubelet, stepStopKubelet},
		{StepStopContainerd, stepStopContainerd},
		{StepStopSnapshotter, stepStopSnapshotter},
		{StepStopProcesses, stepStopProcesses},
		{StepUnmount, stepUnmount},
	}
}

// Uptime is the guest's uptime (/proc/uptime), or the time since the agent
// started when /proc is not mounted yet.
func (a *Agent) Uptime() time.Duration {
	if b, err := os.ReadFile("/proc/uptime"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if s, err := strconv.ParseFloat(f[0], 64); err == nil {
				return time.Duration(s * float64(time.Second))
			}
		}
	}
	return time.Since(a.started)
}

// Timeline logs one timeline line: msg=agent step=<name> uptime=<s>s.
func (a *Agent) Timeline(step string, attrs ...any) { a.timeline(step, attrs...) }

// timeline is Timeline, returning the uptime it logged.
func (a *Agent) timeline(step string, attrs ...any) time.Duration {
	up := a.Uptime()
	args := append([]any{"step", step, "uptime", fmt.Sprintf("%.2fs", up.Seconds())}, attrs...)
	a.Log.Info("agent", args...)
	return up
}

// mark logs a timeline line for a point inside a boot step and puts it in the boot
// timeline the boot-timeline step publishes (the host's start breakdown reads
// identity-wait from it). Only boot steps call it, from Run's goroutine.
func (a *Agent) mark(step string, attrs ...any) { a.boot.Set(step, a.timeline(step, attrs...)) }

// errStopped ends a boot step that gave way to Stop: Run shuts down for Stop's reason,
// not as a failed step.
var errStopped = errors.New("asked to stop")

// Stop asks a running agent to shut down (idempotent; the first reason wins).
func (a *Agent) Stop(reason string) {
	select {
	case a.stop <- reason:
	default:
	}
	a.stopOnce.Do(func() { close(a.stopAsked) })
}

// Run runs the boot chain, waits for a reason to stop, runs the shutdown
// chain and then Config.Final. It returns only when Final returns (tests;
// on a node Final powers off).
func (a *Agent) Run(ctx context.Context) error {
	if err := a.Config.Steps.validate(); err != nil {
		return err
	}
	if err := a.Config.ShutdownSteps.validate(); err != nil {
		return err
	}
	a.boot = boottimeline.Timeline{}
	boot := a.boot
	boot.Set(boottimeline.StepStart, a.timeline(boottimeline.StepStart, "pid", os.Getpid(), "version", agentVersion()))
	if os.Getpid() == 1 {
		a.reaper = startReaper(a.Log)
	}
	stopSignals := a.watchSignals()
	defer stopSignals()

	reason := ""
	var bootErr error
	for _, st := range a.Config.Steps {
		if err := ctx.Err(); err != nil {
			reason = "context done during boot"
			break
		}
		select {
		case r := <-a.stop:
			reason = r + " during boot"
		default:
		}
		if reason != "" {
			break
		}
		t0 := time.Now()
		if err := st.Run(ctx, a); err != nil {
			if errors.Is(err, errStopped) {
				select {
				case r := <-a.stop:
					reason = r + " during boot"
				default:
					reason = "stopped during boot"
				}
				a.Log.Info("agent step stopped", "step", st.Name, "reason", reason)
				break
			}
			a.Log.Error("agent step failed", "step", st.Name, "uptime", fmt.Sprintf("%.2fs", a.Uptime().Seconds()), "err", err)
			bootErr = fmt.Errorf("step %s: %w", st.Name, err)
			reason = "step " + st.Name + " failed"
			break
		}
		boot.Set(st.Name, a.timeline(st.Name, "took", time.Since(t0).Round(time.Millisecond)))
	}
	if reason == "" {
		boot.Set(boottimeline.StepUp, a.timeline(boottimeline.StepUp))
		if a.IdentityDevice != "" && a.Identity.BootstrapToken != "" {
			a.startForgettingJoin(a.IdentityDevice)
		}
		select {
		case a.booted <- boot:
		default: // Run ran before; its timeline is the one published
		}
		select {
		case reason = <-a.stop:
		case <-ctx.Done():
			reason = "context done"
		}
	}
	a.shutdown(reason)
	return bootErr
}

func (a *Agent) shutdown(reason string) {
	a.bgStop()
	a.mu.Lock()
	a.stopping = true
	a.mu.Unlock()
	a.Timeline("shutdown", "reason", reason)
	if mods := loadedModules(); len(mods) > 0 {
		// What the kernel loaded, on demand included: the list to tune
		// Config.Modules and Config.BackgroundModules from.
		a.Log.Info("loaded modules", "count", len(mods), "modules", strings.Join(mods, ","))
	}
	if a.reaper != nil {
		a.reaper.setEager()
	}
	ctx := context.Background()
	for _, st := range a.Config.ShutdownSteps {
		t0 := time.Now()
		if err := st.Run(ctx, a); err != nil {
			a.Log.Warn("agent shutdown step failed", "step", st.Name, "err", err)
			continue
		}
		a.Timeline(st.Name, "took", time.Since(t0).Round(time.Millisecond))
	}
	a.Timeline("final", "reason", reason)
	a.Config.Final(a, reason)
}

// run runs a command from the root filesystem and returns its combined
// output; errors carry the output.
func (a *Agent) run(ctx context.Context, stdin string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
