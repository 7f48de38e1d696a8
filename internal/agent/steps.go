package agent

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"debug/buildinfo"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/component-base/version"

	"github.com/socialweb-computer/socialweb/internal/atomicfile"
	"github.com/socialweb-computer/socialweb/internal/boottimeline"
	"github.com/socialweb-computer/socialweb/internal/identity"
)

func agentVersion() string { return version.Get().GitVersion }

// ---- mounts ----

type mountSpec struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
}

const (
	nosuid = syscall.MS_NOSUID
	nodev  = syscall.MS_NODEV
	noexec = syscall.MS_NOEXEC
)

// baseMounts are the API filesystems; the initramfs already moved proc, sys
// and dev, so those are usually mounted when the agent starts.
var baseMounts = []mountSpec{
	{"proc", "/proc", "proc", nosuid | nodev | noexec, ""},
	{"sysfs", "/sys", "sysfs", nosuid | nodev | noexec, ""},
	{"devtmpfs", "/dev", "devtmpfs", nosuid, "mode=0755"},
	{"devpts", "/dev/pts", "devpts", nosuid | noexec, "gid=5,mode=0620,ptmxmode=0666"},
	{"tmpfs", "/dev/shm", "tmpfs", nosuid | nodev, "mode=1777"},
	{"tmpfs", "/run", "tmpfs", nosuid | nodev, "mode=0755"},
	{"tmpfs", "/tmp", "tmpfs", nosuid | nodev, "mode=1777"},
	{"cgroup2", "/sys/fs/cgroup", "cgroup2", nosuid | nodev | noexec, "nsdelegate"},
}

func mountPoints() map[string]bool {
	m := map[string]bool{}
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return m
	}
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) >= 2 {
			m[unescapeMount(f[1])] = true
		}
	}
	return m
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

func stepMounts(ctx context.Context, a *Agent) error {
	var mounted map[string]bool
	for _, m := range baseMounts {
		if m.target != "/proc" && mounted == nil {
			mounted = mountPoints()
		}
		if mounted[m.target] {
			continue
		}
		if _, err := os.Stat("/proc/self"); err == nil && m.target == "/proc" {
			continue
		}
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			return err
		}
		if err := syscall.Mount(m.source, m.target, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err)
		}
	}
	// Mount propagation: the kubelet and containerd need / shared.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_SHARED, ""); err != nil {
		return fmt.Errorf("making / rshared: %w", err)
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if _, err := os.Lstat("/dev/" + name); errors.Is(err, os.ErrNotExist) {
			_ = os.Symlink(target, "/dev/"+name)
		}
	}
	// Every controller the kernel offers, for the kubelet's QoS and pod
	// cgroups (cgroupfs driver) below the root.
	ctrl, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
	if err != nil {
		return fmt.Errorf("cgroup2: %w", err)
	}
	var enable []string
	for _, c := range strings.Fields(string(ctrl)) {
		enable = append(enable, "+"+c)
	}
	if len(enable) > 0 {
		if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte(strings.Join(enable, " ")), 0o644); err != nil {
			return fmt.Errorf("enabling cgroup controllers %v: %w", enable, err)
		}
	}
	return nil
}

// ---- data disk ----

// DataMount is where the data disk is mounted; DataDirs are bound from it.
const DataMount = "/var/lib/socialweb-data"

// DataDirs maps a directory of the data disk to where it is bound: containerd's content
// and snapshots, the kubelet's root (emptyDirs, volumes) and the Pods' logs. Together
// they are the node's ephemeral storage, which the kubelet then measures on this disk.
func DataDirs(l Layout) map[string]string {
	return map[string]string{"containerd": l.ContainerdRoot, "kubelet": l.KubeletRoot, "pod-logs": "/var/log/pods"}
}

// DataMountOptions mount the data disk. discard: space freed there (deleted layers,
// evicted Pods) goes back to the host's sparse file at once. resuid, resgid: the disk's
// reserved blocks belong to no Pod's user (root included, which ext4 would otherwise
// let in), so only CAP_SYS_RESOURCE holders, containerd and the kubelet, write into
// the reserve once a Pod has filled the rest.
const DataMountOptions = "discard,resuid=" + reserveOwner + ",resgid=" + reserveOwner

// reserveOwner is a uid and gid no Pod is expected to run as (ext4's default is 0).
const reserveOwner = "2147483646"

// stepDataDisk mounts the node's data disk (the host formats it: a sparse file with ext4)
// and binds DataDirs from it, before containerd and the kubelet first write there. A
// node without one keeps that storage in its root disk.
func stepDataDisk(ctx context.Context, a *Agent) error {
	dev := diskBySerial(identity.DataDiskSerial)
	if dev == "" {
		a.Log.Info("no data disk: container storage stays on the root disk")
		return nil
	}
	if err := os.MkdirAll(DataMount, 0o700); err != nil {
		return err
	}
	if err := syscall.Mount(dev, DataMount, "ext4", syscall.MS_NOSUID|syscall.MS_NODEV, DataMountOptions); err != nil {
		return fmt.Errorf("mount data disk %s on %s: %w", dev, DataMount, err)
	}
	for sub, target := range DataDirs(a.Config.Layout) {
		src := filepath.Join(DataMount, sub)
		for _, d := range []string{src, target} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		if err := syscall.Mount(src, target, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on %s: %w", src, target, err)
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(DataMount, &st); err == nil {
		a.Log.Info("data disk mounted", "device", dev, "mount", DataMount, "sizeMiB", int64(st.Blocks)*st.Bsize>>20)
	}
	return nil
}

// ---- limits ----

func stepLimits(ctx context.Context, a *Agent) error {
	os.Setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	if os.Getenv("HOME") == "" {
		os.Setenv("HOME", "/root")
	}
	lim := &syscall.Rlimit{Cur: 1 << 20, Max: 1 << 20}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, lim); err != nil {
		return fmt.Errorf("raising the open files limit: %w", err)
	}
	if os.Getpid() == 1 {
		// Ctrl-Alt-Del becomes SIGINT to PID 1 instead of an immediate reboot.
		if err := syscall.Reboot(syscall.LINUX_REBOOT_CMD_CAD_OFF); err != nil {
			a.Log.Warn("cannot route Ctrl-Alt-Del to the agent", "err", err)
		}
	}
	return nil
}

// ---- modules, sysctls ----

func stepModules(ctx context.Context, a *Agent) error {
	if os.Getpid() == 1 && len(a.Config.PowerButtonModules) > 0 {
		go a.watchPowerButton()
	}
	if len(a.Config.BackgroundModules) > 0 {
		defer func() { go a.loadBackgroundModules() }()
	}
	if len(a.Config.Modules) == 0 {
		return nil
	}
	if _, err := a.run(ctx, "", "modprobe", append([]string{"-a"}, a.Config.Modules...)...); err == nil {
		return nil
	}
	// Say which ones: one at a time.
	var failed []string
	for _, m := range a.Config.Modules {
		if _, err := a.run(ctx, "", "modprobe", m); err != nil {
			failed = append(failed, m)
			a.Log.Warn("module did not load", "module", m, "err", err)
		}
	}
	if len(failed) == len(a.Config.Modules) {
		return fmt.Errorf("no module loaded (is kmod in the root filesystem, and lib/modules/%s?)", kernelRelease())
	}
	return nil
}

func (a *Agent) loadBackgroundModules() {
	t0 := time.Now()
	if _, err := a.run(a.bg, "", "modprobe", append([]string{"-a"}, a.Config.BackgroundModules...)...); err != nil {
		a.Log.Warn("background modules", "err", err)
		return
	}
	a.Log.Info("background modules loaded", "count", len(a.Config.BackgroundModules), "took", time.Since(t0).Round(time.Millisecond),
		"uptime", fmt.Sprintf("%.2fs", a.Uptime().Seconds()))
}

// loadedModules lists /proc/modules in load order (oldest first).
func loadedModules() []string {
	b, err := os.ReadFile("/proc/modules")
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			out = append([]string{f[0]}, out...)
		}
	}
	return out
}

func kernelRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

func stepSysctls(ctx context.Context, a *Agent) error {
	keys := make([]string, 0, len(a.Config.Sysctls))
	for k := range a.Config.Sysctls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var errs []error
	for _, k := range keys {
		p := "/proc/sys/" + strings.ReplaceAll(k, ".", "/")
		if err := os.WriteFile(p, []byte(a.Config.Sysctls[k]), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("sysctl %s=%s: %w", k, a.Config.Sysctls[k], err))
		}
	}
	return errors.Join(errs...)
}

// ---- identity ----

// KernelArg returns the value of name=value on the kernel command line.
func KernelArg(name string) (string, bool) {
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return "", false
	}
	for _, f := range strings.Fields(string(b)) {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// IdentitySerial is the virtio-blk serial the host gives the identity disk
// (qemu -device virtio-blk-device,serial=socialweb-identity).
const IdentitySerial = "socialweb-identity"

// diskBySerial returns /dev/<name> of the block device with this serial.
func diskBySerial(serial string) string {
	ents, _ := os.ReadDir("/sys/block")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "serial"))
		if err == nil && strings.TrimSpace(string(b)) == serial {
			return "/dev/" + e.Name()
		}
	}
	return ""
}

// stepIdentity reads the identity disk: socialweb.identity=<path> from the
// kernel command line if given, else the disk whose serial is
// IdentitySerial, else Config.IdentityDevice (/dev/vdb). A warm-pool VM's
// disk (identity.ErrUnclaimed) is read again until the host claims the VM
// (waitClaim).
func stepIdentity(ctx context.Context, a *Agent) error {
	dev, fixed := a.Config.IdentityDevice, false
	if v, ok := KernelArg("socialweb.identity"); ok && v != "" {
		dev, fixed = v, true
	}
	deadline := time.Now().Add(a.Config.IdentityWait)
	for {
		if !fixed {
			if d := diskBySerial(IdentitySerial); d != "" {
				dev = d
			}
		}
		if _, err := os.Stat(dev); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("identity disk %s did not appear within %s", dev, a.Config.IdentityWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	id, err := identity.Decode(f)
	f.Close()
	if errors.Is(err, identity.ErrUnclaimed) {
		p := claimPoller{
			read:   func() ([]byte, error) { return readDirect(dev, identity.PoolDiskSize) },
			every:  claimPoll,
			settle: claimSettle,
		}
		// Subscribed before the first read, so a claim in between is not missed.
		if w, werr := watchLinks(slices.Sorted(maps.Keys(sysLinks()))); werr != nil {
			a.Log.Warn("warm-pool VM: no link notifications; reading the identity disk every "+claimPoll.String()+" instead", "err", werr)
		} else {
			defer w.Close()
			p.wake, p.every = w.C, claimPollWoken
		}
		id, err = a.waitClaim(ctx, dev, p)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", dev, err)
	}
	a.Identity, a.IdentityDevice = id, dev
	a.startProfile()
	a.Log.Info("identity", "device", dev, "cluster", id.Cluster, "node", id.NodeName, "providerID", id.ProviderID,
		"address", id.Address, "apiServer", id.APIServer, "registry", id.Registry)
	return nil
}

// ---- hostname ----

func stepHostname(ctx context.Context, a *Agent) error {
	id := a.Identity
	if err := syscall.Sethostname([]byte(id.NodeName)); err != nil {
		return fmt.Errorf("sethostname %s: %w", id.NodeName, err)
	}
	sum := sha256.Sum256([]byte(id.ProviderID + "\n" + id.NodeName))
	files := []struct {
		path string
		data []byte
	}{
		{a.Layout.Hostname, []byte(id.NodeName + "\n")},
		{a.Layout.Hosts, Hosts(id)},
		{a.Layout.MachineID, []byte(hex.EncodeToString(sum[:16]) + "\n")},
	}
	for _, f := range files {
		if err := writeFile(f.path, f.data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// ---- network ----

// PickLink chooses the node's interface: the one whose MAC is mac when mac
// is set and present, else the first non-loopback link by name. links maps
// interface names to MAC addresses.
func PickLink(links map[string]string, mac string) (string, error) {
	var names []string
	for n := range links {
		if n != "lo" {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if mac != "" {
		want, err := net.ParseMAC(mac)
		if err != nil {
			return "", fmt.Errorf("identity MAC %q: %w", mac, err)
		}
		for _, n := range names {
			if got, err := net.ParseMAC(links[n]); err == nil && got.String() == want.String() {
				return n, nil
			}
		}
	}
	if len(names) == 0 {
		return "", errors.New("no network interface besides lo (is virtio_net loaded, and does the VM have a NIC?)")
	}
	return names[0], nil
}

func sysLinks() map[string]string {
	out := map[string]string{}
	ents, _ := os.ReadDir("/sys/class/net")
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join("/sys/class/net", e.Name(), "address"))
		out[e.Name()] = strings.TrimSpace(string(b))
	}
	return out
}

// NetworkScript is the `ip -batch` input that configures link.
func NetworkScript(id identity.Identity, link string) string {
	return fmt.Sprintf("link set dev lo up\nlink set dev %[1]s up\naddr replace %[2]s dev %[1]s\nroute replace default via %[3]s dev %[1]s\n",
		link, id.Address, id.Gateway)
}

func stepNetwork(ctx context.Context, a *Agent) error {
	var links map[string]string
	deadline := time.Now().Add(5 * time.Second)
	for {
		links = sysLinks()
		if len(links) > 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	link, err := PickLink(links, a.Identity.MAC)
	if err != nil {
		return err
	}
	if a.Identity.MAC != "" && !strings.EqualFold(links[link], a.Identity.MAC) {
		a.Log.Warn("no interface has the identity's MAC; using the first one", "mac", a.Identity.MAC, "link", link)
	}
	if _, err := a.run(ctx, NetworkScript(a.Identity, link), "ip", "-batch", "-"); err != nil {
		return err
	}
	a.Link = link
	if err := writeFile(a.Layout.ResolvConf, ResolvConf(a.Identity), 0o644); err != nil {
		return err
	}
	a.Log.Info("network", "link", link, "mac", links[link], "address", a.Identity.Address,
		"gateway", a.Identity.Gateway, "dns", a.Identity.DNS)
	return nil
}

// ---- containerd ----

var containerdVersionRE = regexp.MustCompile(`\s+v?(\d+)\.(\d+)\S*`)

// ContainerdMajorOf reads the major version from a containerd binary's Go
// build info: its main module is github.com/containerd/containerd/v2 for
// 2.x and github.com/containerd/containerd for 1.x (Debian builds report
// no module version, so the path decides).
func ContainerdMajorOf(file string) (int, error) {
	bi, err := buildinfo.ReadFile(file)
	if err != nil {
		return 0, err
	}
	switch p := bi.Main.Path; {
	case p == "github.com/containerd/containerd":
		return 1, nil
	case strings.HasPrefix(p, "github.com/containerd/containerd/v"):
		return strconv.Atoi(strings.TrimPrefix(p, "github.com/containerd/containerd/v"))
	case bi.Path == "github.com/containerd/containerd/cmd/containerd":
		return 1, nil
	case strings.HasPrefix(bi.Path, "github.com/containerd/containerd/v"):
		return strconv.Atoi(strings.SplitN(strings.TrimPrefix(bi.Path, "github.com/containerd/containerd/v"), "/", 2)[0])
	}
	return 0, fmt.Errorf("%s: main module %q, package %q: not containerd", file, bi.Main.Path, bi.Path)
}

// ContainerdMajor parses `containerd --version` output.
func ContainerdMajor(versionOutput string) (int, error) {
	m := containerdVersionRE.FindStringSubmatch(versionOutput)
	if m == nil {
		return 0, fmt.Errorf("no version in %q", strings.TrimSpace(versionOutput))
	}
	return strconv.Atoi(m[1])
}

// ociRuntime is the path of the first of names found by lookPath (which takes a path
// as it is, if executable, as exec.LookPath does), or "" when none is.
func ociRuntime(names []string, lookPath func(string) (string, error)) string {
	for _, n := range names {
		if p, err := lookPath(n); err == nil {
			return p
		}
	}
	return ""
}

// stepContainerdConfig writes containerd's config.toml and the CNI
// template. Neither depends on the identity, so containerd can start before
// the identity disk is read; the registry mirror (hosts.toml) is read by
// containerd per pull and is written later by the registry step.
func stepContainerdConfig(ctx context.Context, a *Agent) error {
	for _, b := range a.Config.ContainerdBinaries {
		if st, err := os.Stat(b); err == nil && st.Mode().IsRegular() {
			a.ContainerdBinary = b
			break
		}
	}
	if a.ContainerdBinary == "" {
		return fmt.Errorf("no containerd binary (looked for %s)", strings.Join(a.Config.ContainerdBinaries, ", "))
	}
	a.ContainerdMajor = a.Config.ContainerdMajor
	if a.ContainerdMajor == 0 {
		// Read the Go build info rather than run `containerd --version`:
		// starting a 40 MB binary costs seconds under TCG.
		var err error
		if a.ContainerdMajor, err = ContainerdMajorOf(a.ContainerdBinary); err != nil {
			out, rerr := a.run(ctx, "", a.ContainerdBinary, "--version")
			if rerr != nil {
				return fmt.Errorf("%v; %w", err, rerr)
			}
			if a.ContainerdMajor, err = ContainerdMajor(out); err != nil {
				return fmt.Errorf("%s --version: %w", a.ContainerdBinary, err)
			}
		}
	}
	a.OCIRuntime = ociRuntime(a.Config.OCIRuntimes, exec.LookPath)
	files, err := ContainerdFiles(a.Layout, ContainerdOptions{
		Major: a.ContainerdMajor, SandboxImage: a.Config.SandboxImage, LogLevel: containerdLogLevel(a.Config.ContainerdLogLevel, KernelArg),
		SharedLayers: a.snapshotter != nil, RuntimeBinary: a.OCIRuntime,
	}, a.Config.CNI)
	if err != nil {
		return err
	}
	// The pod CIDR may differ from an earlier boot of this disk: containerd
	// writes the conflist again when the kubelet reports it.
	if ents, err := os.ReadDir(a.Layout.CNIConfDir); err == nil {
		for _, e := range ents {
			os.Remove(filepath.Join(a.Layout.CNIConfDir, e.Name()))
		}
	}
	if err := os.MkdirAll(a.Layout.CNIConfDir, 0o755); err != nil {
		return err
	}
	if err := writeFiles(files); err != nil {
		return err
	}
	snapshotter := "overlayfs"
	if a.snapshotter != nil {
		snapshotter = SharedSnapshotter
	}
	a.Log.Info("containerd config", "binary", a.ContainerdBinary, "major", a.ContainerdMajor, "sandbox", a.Config.SandboxImage,
		"snapshotter", snapshotter, "runtime", a.OCIRuntime)
	return nil
}

// stepRegistry points every registry name at Identity.Registry
// (<config_path>/_default/hosts.toml); without a registry it removes the
// file, and images come from their own registries.
func stepRegistry(ctx context.Context, a *Agent) error {
	f, err := RegistryFile(a.Identity, a.Layout)
	if err != nil {
		return err
	}
	if f == nil {
		err := os.Remove(filepath.Join(a.Layout.ContainerdCerts, "_default", "hosts.toml"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		a.Log.Info("registry", "mirror", "none")
		return nil
	}
	if err := writeFiles([]File{*f}); err != nil {
		return err
	}
	a.Log.Info("registry", "mirror", a.Identity.Registry, "hosts", f.Path)
	return nil
}

// File is a file the agent writes.
type File struct {
	Path string
	Data []byte
	Mode os.FileMode
}

// ContainerdFiles are config.toml and the CNI conflist template.
func ContainerdFiles(l Layout, o ContainerdOptions, cni CNIOptions) ([]File, error) {
	cfg, err := ContainerdConfig(l, o)
	if err != nil {
		return nil, err
	}
	return []File{
		{l.ContainerdConfig, cfg, 0o644},
		{l.CNITemplate, CNITemplate(cni), 0o644},
	}, nil
}

// RegistryFile is the _default hosts.toml for Identity.Registry, or nil when
// the identity names no registry.
func RegistryFile(id identity.Identity, l Layout) (*File, error) {
	if id.Registry == "" {
		return nil, nil
	}
	h, err := HostsTOML(id.Registry)
	if err != nil {
		return nil, err
	}
	return &File{filepath.Join(l.ContainerdCerts, "_default", "hosts.toml"), h, 0o644}, nil
}

// KubeletFiles are the CA bundle, the bootstrap kubeconfig and the kubelet
// configuration; when the host issued the kubelet's client certificate, that
// certificate where the kubelet keeps its current one and the kubeconfig naming it, so
// the kubelet (and everything here that waits for its credentials) starts without a TLS
// bootstrap; and when the host issued its serving certificate, that certificate and key,
// written over whatever an earlier boot of this disk left there.
func KubeletFiles(id identity.Identity, l Layout, o KubeletOptions) ([]File, error) {
	boot, err := BootstrapKubeconfig(id, l)
	if err != nil {
		return nil, err
	}
	kc, err := KubeletConfigurationYAML(id, l, o)
	if err != nil {
		return nil, err
	}
	files := []File{
		{l.CACert, []byte(id.CACert), 0o644},
		{l.ClientCACert, []byte(id.ClientCACert), 0o644},
		{l.BootstrapKubeconfig, boot, 0o600},
		{l.KubeletConfig, kc, 0o644},
	}
	if id.KubeletClientCert != "" {
		current := KubeletClientCurrent(l)
		kubeconfig, err := KubeletKubeconfig(id, l, current)
		if err != nil {
			return nil, err
		}
		files = append(files,
			File{current, []byte(id.KubeletClientCert + id.KubeletClientKey), 0o600},
			File{l.Kubeconfig, kubeconfig, 0o600})
	}
	if id.KubeletServingCert != "" {
		files = append(files,
			File{l.KubeletServingKey, []byte(id.KubeletServingKey), 0o600},
			File{l.KubeletServingCert, []byte(id.KubeletServingCert), 0o644})
	}
	return files, nil
}

// KubeletClientCurrent is the kubelet's current client certificate and key (one PEM file,
// as its certificate store keeps them).
func KubeletClientCurrent(l Layout) string {
	return filepath.Join(l.KubeletCertDir, "kubelet-client-current.pem")
}

func (a *Agent) startContainerd() error {
	cmd := exec.Command(a.ContainerdBinary, "--config", a.Layout.ContainerdConfig)
	// Through a pipe, not the console: containerd colours its log on a
	// terminal; each line goes to the console prefixed with "containerd: ".
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return err
	}
	go prefixLines(r, os.Stdout, "containerd: ")
	end := make(chan struct{})
	a.mu.Lock()
	a.containerd, a.containerdEnd = cmd, end
	a.mu.Unlock()
	go func() {
		err := cmd.Wait()
		close(end)
		a.mu.Lock()
		stopping := a.stopping
		a.mu.Unlock()
		if !stopping {
			a.Log.Error("containerd exited", "err", err, "uptime", fmt.Sprintf("%.2fs", a.Uptime().Seconds()))
			a.containerdExited()
		}
	}()
	return nil
}

func (a *Agent) containerdExited() {
	a.mu.Lock()
	left := a.Config.ContainerdRestarts
	a.Config.ContainerdRestarts--
	a.mu.Unlock()
	if left <= 0 {
		a.Stop("containerd exited")
		return
	}
	time.Sleep(time.Second)
	if err := a.startContainerd(); err != nil {
		a.Log.Error("restarting containerd", "err", err)
		a.Stop("containerd exited")
		return
	}
	a.Log.Info("containerd restarted", "restarts left", left-1)
}

// waitSocket waits until a unix socket accepts connections or end is closed.
func waitSocket(ctx context.Context, path string, timeout time.Duration, end <-chan struct{}) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not accept connections within %s: %w", path, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-end:
			return fmt.Errorf("the process serving %s exited", path)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// stepContainerd starts containerd; stepContainerdReady waits for it, so
// the steps between overlap with its start-up.
func stepContainerd(ctx context.Context, a *Agent) error {
	return a.startContainerd()
}

func stepContainerdReady(ctx context.Context, a *Agent) error {
	a.mu.Lock()
	end := a.containerdEnd
	a.mu.Unlock()
	if err := waitSocket(ctx, a.Layout.ContainerdSocket, 2*time.Minute, end); err != nil {
		return err
	}
	// Before the kubelet: a warm-pool VM has done it while it waited.
	a.importSandboxImage(ctx)
	a.mu.Lock()
	at := a.sandboxImportedAt
	a.mu.Unlock()
	if at > 0 {
		a.boot.Set(boottimeline.StepSandboxImage, at)
	}
	return nil
}

// ---- kubelet ----

func stepKubeletConfig(ctx context.Context, a *Agent) error {
	files, err := KubeletFiles(a.Identity, a.Layout, a.Config.Kubelet)
	if err != nil {
		return err
	}
	if err := writeFiles(files); err != nil {
		return err
	}
	// Without one from the host (KubeletFiles wrote that, and it always wins), a
	// serving certificate from an earlier boot of this disk is kept when it names this
	// node.
	if a.Identity.KubeletServingCert == "" && !servingCertValid(a.Layout, a.Identity) {
		crt, key, err := ServingCert(a.Identity, time.Now())
		if err != nil {
			return err
		}
		if err := writeFiles([]File{{a.Layout.KubeletServingKey, key, 0o600}, {a.Layout.KubeletServingCert, crt, 0o644}}); err != nil {
			return err
		}
	}
	a.KubeletFlags, err = KubeletFlags(a.Identity, a.Layout)
	if err != nil {
		return err
	}
	a.KubeletServer, err = LoadKubeletServer(ctx, a.Layout.KubeletConfig, a.KubeletFlags)
	if err != nil {
		return err
	}
	a.Log.Info("kubelet config", "config", a.Layout.KubeletConfig, "flags", strings.Join(a.KubeletFlags, " "))
	return nil
}

func servingCertValid(l Layout, id identity.Identity) bool {
	pair, err := tls.LoadX509KeyPair(l.KubeletServingCert, l.KubeletServingKey)
	if err != nil || len(pair.Certificate) == 0 {
		return false
	}
	c, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil || time.Now().After(c.NotAfter.Add(-24*time.Hour)) {
		return false
	}
	ip, err := NodeIP(id)
	return err == nil && c.VerifyHostname(id.NodeName) == nil && c.VerifyHostname(ip.String()) == nil
}

func stepKubelet(ctx context.Context, a *Agent) error {
	if a.KubeletServer == nil {
		return errors.New("the kubelet-config step must run before kubelet")
	}
	kctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	a.mu.Lock()
	a.kubeletCancel, a.kubeletDone = cancel, done
	a.mu.Unlock()
	go func() {
		err := RunKubelet(kctx, a.KubeletServer)
		done <- err
		if kctx.Err() == nil {
			a.Log.Error("kubelet ended", "err", err)
			a.Stop("kubelet ended")
		}
	}()
	return nil
}

// ---- shutdown ----

func stepStopKubelet(ctx context.Context, a *Agent) error {
	a.mu.Lock()
	cancel, done := a.kubeletCancel, a.kubeletDone
	a.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		return errors.New("the kubelet did not return within 10s")
	}
	return nil
}

func stepStopContainerd(ctx context.Context, a *Agent) error {
	a.mu.Lock()
	cmd, end := a.containerd, a.containerdEnd
	a.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-end:
		return nil
	case <-time.After(a.Config.ShutdownGrace):
		_ = cmd.Process.Kill()
		return fmt.Errorf("containerd did not stop within %s; killed", a.Config.ShutdownGrace)
	}
}

// userProcesses lists pids other than ours and kernel threads.
func userProcesses() []int {
	self := os.Getpid()
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.ppid == 2 || pid == 2 || st.state == 'Z' {
			continue
		}
		out = append(out, pid)
	}
	return out
}

func stepStopProcesses(ctx context.Context, a *Agent) error {
	if os.Getpid() != 1 {
		return nil // kill(-1) from anything but PID 1 would hit the host
	}
	wait := func(d time.Duration) bool {
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) {
			if len(userProcesses()) == 0 {
				return true
			}
			time.Sleep(50 * time.Millisecond)
		}
		return len(userProcesses()) == 0
	}
	if len(userProcesses()) == 0 {
		return nil
	}
	_ = syscall.Kill(-1, syscall.SIGTERM)
	if wait(a.Config.ShutdownGrace) {
		return nil
	}
	left := userProcesses()
	_ = syscall.Kill(-1, syscall.SIGKILL)
	wait(2 * time.Second)
	a.Log.Warn("processes killed after the grace period", "pids", left)
	return nil
}

func stepUnmount(ctx context.Context, a *Agent) error {
	syscall.Sync()
	if os.Getpid() != 1 {
		return nil
	}
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return err
	}
	var targets []string
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 {
			continue
		}
		t := unescapeMount(f[1])
		switch t {
		case "/", "/proc", "/sys", "/dev":
			continue
		}
		targets = append(targets, t)
	}
	var errs []error
	for i := len(targets) - 1; i >= 0; i-- {
		if err := syscall.Unmount(targets[i], syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("umount %s: %w", targets[i], err))
		}
	}
	if err := syscall.Mount("", "/", "", syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		errs = append(errs, fmt.Errorf("remounting / read-only: %w", err))
	}
	syscall.Sync()
	return errors.Join(errs...)
}

func powerOff(a *Agent, reason string) {
	syscall.Sync()
	if os.Getpid() != 1 {
		a.Log.Info("not PID 1: not powering off", "reason", reason)
		return
	}
	err := syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
	a.Log.Error("power off failed; restarting instead", "err", err)
	_ = syscall.Reboot(syscall.LINUX_REBOOT_CMD_RESTART)
	select {}
}

// ---- helpers ----

// prefixLines copies r to w line by line, each line prefixed.
func prefixLines(r *os.File, w *os.File, prefix string) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		w.Write([]byte(prefix + sc.Text() + "\n"))
	}
}

func writeFile(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(path, data, mode)
}

func writeFiles(files []File) error {
	for _, f := range files {
		if err := writeFile(f.Path, f.Data, f.Mode); err != nil {
			return err
		}
	}
	return nil
}
