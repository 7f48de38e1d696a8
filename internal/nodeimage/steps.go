package nodeimage

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/socialweb-computer/socialweb/internal/filelock"
)

// Build is the state shared by the steps of one image build. Steps read the inputs and
// fill in the outputs; a custom step may read or set any of them.
type Build struct {
	Spec        Spec
	Resolved    Resolved
	Fingerprint string
	Options     Options
	// OutDir receives vmlinuz, initramfs.cpio.gz, rootfs.ext4 and manifest.json. It is a
	// temporary directory that Ensure renames into the cache when every step succeeded.
	OutDir string
	// WorkDir is scratch space, removed after the build.
	WorkDir string
	Started time.Time

	// Set by the kernel step.
	KernelRelease string // uname -r, e.g. 6.1.0-57-cloud-amd64
	KernelTree    string // the extracted linux-image package
	BusyboxPath   string // busybox from busybox-static, for the initramfs
	// Set by the rootfs step.
	RootfsTree  string            // the staged root filesystem tree
	LayerKey    string            // key of the debootstrap layer used
	LayerReused bool              // the debootstrap layer came from the cache
	Installed   map[string]string // packages dpkg installed in the rootfs
	// Set by the initramfs step.
	LoadedModules  []string // .ko files the initramfs loads, in order
	BuiltinModules []string // wanted modules that are built into the kernel
	// Set by the mkfs step.
	Ext4 Ext4Result
	// Set by the manifest step.
	Manifest *Manifest
}

// Progress reports a message for a step through Options.Progress.
func (b *Build) Progress(step, format string, a ...any) {
	if b.Options.Progress != nil {
		b.Options.Progress(step, fmt.Sprintf(format, a...))
	}
}

func (b *Build) runner(step string) *runner {
	return &runner{tools: b.Options.Tools, progress: b.Options.Progress, step: step}
}

// Step is one named stage of a build.
type Step struct {
	Name string
	Run  func(ctx context.Context, b *Build) error
}

// Steps is an ordered, editable chain of build steps (compare firecracker-go-sdk's
// Handlers): Ensure runs them in order and stops at the first error.
type Steps []Step

// Step names of DefaultSteps.
const (
	StepKernel    = "kernel"
	StepRootfs    = "rootfs"
	StepInitramfs = "initramfs"
	StepMkfs      = "mkfs"
	StepManifest  = "manifest"
)

// DefaultSteps returns a new copy of the standard chain: kernel, rootfs, initramfs, mkfs,
// manifest. The manifest step must stay last: a manifest marks a complete image.
func DefaultSteps() Steps {
	return Steps{
		{StepKernel, stepKernel},
		{StepRootfs, stepRootfs},
		{StepInitramfs, stepInitramfs},
		{StepMkfs, stepMkfs},
		{StepManifest, stepManifest},
	}
}

// Index returns the position of the named step, or -1.
func (s Steps) Index(name string) int {
	for i, st := range s {
		if st.Name == name {
			return i
		}
	}
	return -1
}

// InsertBefore returns a copy of s with st inserted before the named step.
func (s Steps) InsertBefore(name string, st Step) (Steps, error) {
	i := s.Index(name)
	if i < 0 {
		return s, fmt.Errorf("no step %q (steps: %s)", name, s.names())
	}
	return append(append(append(Steps{}, s[:i]...), st), s[i:]...), nil
}

// InsertAfter returns a copy of s with st inserted after the named step.
func (s Steps) InsertAfter(name string, st Step) (Steps, error) {
	i := s.Index(name)
	if i < 0 {
		return s, fmt.Errorf("no step %q (steps: %s)", name, s.names())
	}
	return append(append(append(Steps{}, s[:i+1]...), st), s[i+1:]...), nil
}

// Replace returns a copy of s with the named step's function replaced.
func (s Steps) Replace(name string, run func(context.Context, *Build) error) (Steps, error) {
	i := s.Index(name)
	if i < 0 {
		return s, fmt.Errorf("no step %q (steps: %s)", name, s.names())
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

func (s Steps) names() string {
	var n []string
	for _, st := range s {
		n = append(n, st.Name)
	}
	return strings.Join(n, ", ")
}

func (s Steps) validate() error {
	seen := map[string]bool{}
	for _, st := range s {
		if st.Name == "" || st.Run == nil {
			return errors.New("build steps need a name and a function")
		}
		if seen[st.Name] {
			return fmt.Errorf("build step %q appears twice", st.Name)
		}
		seen[st.Name] = true
	}
	if len(s) == 0 || s[len(s)-1].Name != StepManifest {
		return fmt.Errorf("the last build step must be %q (steps: %s)", StepManifest, s.names())
	}
	return nil
}

// Run runs the steps in order, reporting each start and end through b.Progress.
func (s Steps) Run(ctx context.Context, b *Build) error {
	if err := s.validate(); err != nil {
		return err
	}
	for _, st := range s {
		if err := ctx.Err(); err != nil {
			return err
		}
		t0 := time.Now()
		b.Progress(st.Name, "start")
		if err := st.Run(ctx, b); err != nil {
			return fmt.Errorf("step %s: %w", st.Name, err)
		}
		b.Progress(st.Name, "done in %s", time.Since(t0).Round(time.Millisecond))
	}
	return nil
}

// SlogProgress adapts a slog.Logger to Options.Progress.
func SlogProgress(l *slog.Logger) func(step, msg string) {
	return func(step, msg string) { l.Info(msg, "step", step) }
}

// ---- kernel ----

// fetchDeb returns the path of pkg at its exact version in the deb cache, downloading it
// with apt-get download when it is not there yet.
func (b *Build) fetchDeb(ctx context.Context, step string, pkg PackageRef) (string, error) {
	dir := filepath.Join(b.Options.layerDir(), "debs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	name := pkg.Name + "_" + strings.ReplaceAll(pkg.Version, ":", "%3a") + ".deb"
	final := filepath.Join(dir, name)
	r := b.runner(step)
	if _, err := os.Stat(final); err == nil {
		out, err := r.run(ctx, false, "dpkg-deb", "-f", final, "Package", "Version")
		if err == nil && strings.Contains(string(out), "Package: "+pkg.Name) && strings.Contains(string(out), "Version: "+pkg.Version) {
			b.Progress(step, "using cached %s", name)
			return final, nil
		}
		os.Remove(final)
	}
	tmp, err := os.MkdirTemp(dir, ".dl-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	r.dir = tmp
	args := []string{"download", "-q"}
	if os.Geteuid() == 0 {
		args = append(args, "-o", "APT::Sandbox::User=root")
	}
	b.Progress(step, "apt-get download %s=%s", pkg.Name, pkg.Version)
	if _, err := r.run(ctx, false, "apt-get", append(args, pkg.Name+"="+pkg.Version)...); err != nil {
		return "", err
	}
	got, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(got) != 1 {
		return "", fmt.Errorf("apt-get download %s=%s left %d .deb files", pkg.Name, pkg.Version, len(got))
	}
	if err := os.Rename(got[0], final); err != nil {
		return "", err
	}
	return final, nil
}

func stepKernel(ctx context.Context, b *Build) error {
	r := b.runner(StepKernel)
	deb, err := b.fetchDeb(ctx, StepKernel, b.Resolved.KernelImage)
	if err != nil {
		return err
	}
	b.KernelTree = filepath.Join(b.WorkDir, "kernel")
	if _, err := r.run(ctx, false, "dpkg-deb", "-x", deb, b.KernelTree); err != nil {
		return err
	}
	vm, _ := filepath.Glob(filepath.Join(b.KernelTree, "boot", "vmlinuz-*"))
	if len(vm) != 1 {
		return fmt.Errorf("%s has %d /boot/vmlinuz-* files, want 1: is %s a linux-image package?", filepath.Base(deb), len(vm), b.Resolved.KernelImage.Name)
	}
	b.KernelRelease = strings.TrimPrefix(filepath.Base(vm[0]), "vmlinuz-")
	if _, err := kernelModulesDir(b.KernelTree, b.KernelRelease); err != nil {
		return err
	}
	if err := copyFile(vm[0], filepath.Join(b.OutDir, "vmlinuz"), 0o644); err != nil {
		return err
	}
	b.Progress(StepKernel, "kernel %s from %s %s", b.KernelRelease, b.Resolved.KernelImage.Name, b.Resolved.KernelImage.Version)

	bbDeb, err := b.fetchDeb(ctx, StepKernel, b.Resolved.Busybox)
	if err != nil {
		return err
	}
	bbTree := filepath.Join(b.WorkDir, "busybox")
	if _, err := r.run(ctx, false, "dpkg-deb", "-x", bbDeb, bbTree); err != nil {
		return err
	}
	b.BusyboxPath = filepath.Join(bbTree, "bin", "busybox")
	if _, err := os.Stat(b.BusyboxPath); err != nil {
		return fmt.Errorf("busybox-static package has no /bin/busybox: %w", err)
	}
	return nil
}

// kernelModulesDir finds lib/modules/<release> (or usr/lib/modules) under root.
func kernelModulesDir(root, release string) (string, error) {
	for _, d := range []string{"lib/modules", "usr/lib/modules"} {
		p := filepath.Join(root, d, release)
		if st, err := os.Lstat(p); err == nil && st.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("no lib/modules/%s in the kernel package", release)
}

// ---- rootfs ----

type layerInfo struct {
	Key       string            `json:"key"`
	Suite     string            `json:"suite"`
	Mirror    string            `json:"mirror"`
	Include   []string          `json:"include"`
	Installed map[string]string `json:"installed"`
	Created   time.Time         `json:"created"`
	Seconds   float64           `json:"seconds"`
}

// ensureLayer returns the tree of the debootstrap layer for this build, running
// debootstrap only when the layer cache has no result for its key.
func (b *Build) ensureLayer(ctx context.Context) (string, *layerInfo, error) {
	key := LayerKey(b.Spec, b.Resolved)
	b.LayerKey = key
	base := filepath.Join(b.Options.layerDir(), "debootstrap")
	final := filepath.Join(base, key)
	read := func() (*layerInfo, bool) {
		data, err := os.ReadFile(filepath.Join(final, "layer.json"))
		if err != nil {
			return nil, false
		}
		var li layerInfo
		if json.Unmarshal(data, &li) != nil || li.Key != key {
			return nil, false
		}
		if st, err := os.Stat(filepath.Join(final, "tree", "usr")); err != nil || !st.IsDir() {
			return nil, false
		}
		return &li, true
	}
	if li, ok := read(); ok {
		b.LayerReused = true
		b.Progress(StepRootfs, "reusing debootstrap layer %s", key[:16])
		return filepath.Join(final, "tree"), li, nil
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", nil, err
	}
	unlock, err := filelock.Wait(ctx, filepath.Join(base, "."+key+".lock"))
	if err != nil {
		return "", nil, err
	}
	defer unlock()
	if li, ok := read(); ok { // built by someone else meanwhile
		b.LayerReused = true
		return filepath.Join(final, "tree"), li, nil
	}
	if err := removeTree(final); err != nil {
		return "", nil, err
	}
	stale, _ := filepath.Glob(filepath.Join(base, ".tmp-"+key[:16]+"-*"))
	for _, s := range stale {
		if err := removeTree(s); err != nil {
			return "", nil, err
		}
	}
	tmp, err := os.MkdirTemp(base, ".tmp-"+key[:16]+"-")
	if err != nil {
		return "", nil, err
	}
	ok := false
	defer func() {
		if !ok {
			if err := removeTree(tmp); err != nil {
				b.Progress(StepRootfs, "cleanup: %v", err)
			}
		}
	}()
	tree := filepath.Join(tmp, "tree")
	inc := b.Spec.IncludePackages()
	t0 := time.Now()
	b.Progress(StepRootfs, "debootstrap %s from %s (minbase + %d packages); this takes a minute or two", b.Spec.Suite, b.Spec.Mirror, len(inc))
	r := b.runner(StepRootfs)
	if _, err := r.run(ctx, true, "debootstrap", "--variant=minbase", "--components=main",
		"--include="+strings.Join(inc, ","), b.Spec.Suite, tree, b.Spec.Mirror); err != nil {
		return "", nil, err
	}
	// The .debs and apt indexes are dead weight in a node image.
	for _, g := range []string{"var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*_*"} {
		m, _ := filepath.Glob(filepath.Join(tree, g))
		for _, f := range m {
			os.Remove(f)
		}
	}
	installed, err := dpkgInstalled(ctx, r, tree)
	if err != nil {
		return "", nil, err
	}
	var stale2 []string
	for p, want := range b.Resolved.Include {
		if got := installed[p]; got != want {
			stale2 = append(stale2, fmt.Sprintf("%s %q (apt lists say %q)", p, got, want))
		}
	}
	if len(stale2) > 0 {
		sort.Strings(stale2)
		return "", nil, fmt.Errorf("debootstrap installed versions that differ from the host's apt lists, which the fingerprint was computed from: %s; run apt-get update on the host and build again",
			strings.Join(stale2, ", "))
	}
	li := &layerInfo{Key: key, Suite: b.Spec.Suite, Mirror: b.Spec.Mirror, Include: inc,
		Installed: installed, Created: time.Now().UTC(), Seconds: time.Since(t0).Seconds()}
	if err := writeJSONAtomic(filepath.Join(tmp, "layer.json"), li); err != nil {
		return "", nil, err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", nil, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", nil, err
	}
	ok = true
	b.Progress(StepRootfs, "debootstrap layer %s built in %s", key[:16], time.Since(t0).Round(time.Second))
	return filepath.Join(final, "tree"), li, nil
}

func dpkgInstalled(ctx context.Context, r *runner, tree string) (map[string]string, error) {
	out, err := r.run(ctx, false, "dpkg-query", "--admindir="+filepath.Join(tree, "var/lib/dpkg"),
		"-W", "-f", "${Package}\t${Version}\t${db:Status-Abbrev}\n")
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Split(l, "\t")
		if len(f) == 3 && strings.HasPrefix(f[2], "ii") {
			m[f[0]] = f[1]
		}
	}
	return m, nil
}

func stepRootfs(ctx context.Context, b *Build) error {
	if b.KernelTree == "" || b.KernelRelease == "" {
		return errors.New("the kernel step must run before rootfs")
	}
	layer, li, err := b.ensureLayer(ctx)
	if err != nil {
		return err
	}
	b.Installed = li.Installed
	r := b.runner(StepRootfs)
	b.RootfsTree = filepath.Join(b.WorkDir, "rootfs")
	if err := os.Mkdir(b.RootfsTree, 0o755); err != nil {
		return err
	}
	if _, err := r.run(ctx, false, "cp", "-a", "--reflink=auto", layer+"/.", b.RootfsTree+"/"); err != nil {
		return err
	}

	// kernel modules, then depmod inside the rootfs (the kmod there matches the suite)
	src, err := kernelModulesDir(b.KernelTree, b.KernelRelease)
	if err != nil {
		return err
	}
	dstParent := filepath.Join(b.RootfsTree, "usr/lib/modules")
	if st, err := os.Lstat(filepath.Join(b.RootfsTree, "lib")); err == nil && st.IsDir() {
		dstParent = filepath.Join(b.RootfsTree, "lib/modules") // not merged-/usr
	}
	if err := os.MkdirAll(dstParent, 0o755); err != nil {
		return err
	}
	if _, err := r.run(ctx, false, "cp", "-a", src, dstParent+"/"); err != nil {
		return err
	}
	if _, err := r.run(ctx, false, "chroot", b.RootfsTree, "depmod", "-a", b.KernelRelease); err != nil {
		return fmt.Errorf("depmod in the rootfs: %w", err)
	}
	if err := checkRootfsModules(b, filepath.Join(dstParent, b.KernelRelease)); err != nil {
		return err
	}

	for _, f := range b.Resolved.ExtraFiles {
		sum, _, err := SHA256File(f.Host)
		if err != nil {
			return err
		}
		if sum != f.SHA256 {
			return fmt.Errorf("extra file %s (for %s) changed after the fingerprint was computed; build again", f.Host, f.Guest)
		}
		dst := filepath.Join(b.RootfsTree, filepath.FromSlash(f.Guest))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := copyFile(f.Host, dst, os.FileMode(f.Mode)); err != nil {
			return err
		}
		b.Progress(StepRootfs, "staged %s (%d bytes)", f.Guest, f.Size)
	}
	return checkInit(b.RootfsTree, b.Spec.Init)
}

// checkRootfsModules fails unless the kernel in the rootfs has every module of
// RootfsModules (with its dependencies) or has it built in.
func checkRootfsModules(b *Build, modDir string) error {
	ix, err := loadModuleIndex(modDir)
	if err != nil {
		return err
	}
	order, builtin, err := ix.loadOrder(RootfsModules)
	if err != nil {
		return fmt.Errorf("the agent's modules: %w", err)
	}
	b.Progress(StepRootfs, "modules the agent loads: %s (built in: %s)", strings.Join(order, " "), strings.Join(builtin, " "))
	return nil
}

// checkInit fails unless init resolves (following symlinks inside the tree) to an
// executable regular file.
func checkInit(tree, init string) error {
	p := init
	for range 16 {
		full := filepath.Join(tree, filepath.FromSlash(p))
		st, err := os.Lstat(full)
		if err != nil {
			return fmt.Errorf("init %s is not in the rootfs (debootstrap --variant=minbase installs no init system): set \"init\" in nodeimage.json to a program staged with ExtraFiles (e.g. the node agent), or add an init system to \"packages\"", init)
		}
		if st.Mode()&os.ModeSymlink != 0 {
			t, err := os.Readlink(full)
			if err != nil {
				return err
			}
			if !filepath.IsAbs(t) {
				t = filepath.Join(filepath.Dir(p), t)
			}
			p = filepath.Clean(t)
			continue
		}
		if !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
			return fmt.Errorf("init %s (%s in the rootfs) is not an executable file", init, p)
		}
		return nil
	}
	return fmt.Errorf("init %s: too many symlinks", init)
}

// ---- initramfs ----

// initScript is /init of the initramfs, run by busybox sh as PID 1.
const initScript = `#!/bin/sh
# socialweb node initramfs: load the virtio drivers, mount the root disk, switch_root.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
log() { echo "socialweb-initramfs: $*"; }
fail() {
	log "FATAL: $*"
	log "rebooting (with qemu -no-reboot the VM exits)"
	sleep 1
	reboot -f
	echo b >/proc/sysrq-trigger
}
root=/dev/vda
rootfstype=ext4
rootflags=rw
init=/sbin/init
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	root=*) root="${arg#root=}" ;;
	rootfstype=*) rootfstype="${arg#rootfstype=}" ;;
	ro) rootflags=ro ;;
	rw) rootflags=rw ;;
	socialweb.init=*) init="${arg#socialweb.init=}" ;;
	socialweb.debug=1) set -x ;;
	esac
done
while read -r m; do
	[ -n "$m" ] || continue
	insmod "/lib/modules/$m" || log "insmod $m failed"
done </etc/socialweb/modules
i=0
while [ ! -b "$root" ]; do
	i=$((i + 1))
	[ "$i" -le 100 ] || fail "root device $root did not appear within 10s"
	usleep 100000
done
mkdir -p /newroot
mount -t "$rootfstype" -o "$rootflags" "$root" /newroot || fail "cannot mount $root ($rootfstype, $rootflags) on /newroot"
[ -x "/newroot$init" ] || [ -L "/newroot$init" ] || fail "init $init is not executable in the root filesystem"
for d in dev proc sys; do
	if [ -d "/newroot/$d" ]; then mount -o move "/$d" "/newroot/$d"; else umount -l "/$d"; fi
done
log "switching to $init on $root"
exec switch_root /newroot "$init"
`

var initramfsApplets = []string{"sh", "mount", "umount", "insmod", "switch_root", "mkdir",
	"cat", "sleep", "usleep", "reboot", "poweroff", "ls", "dmesg", "echo"}

func stepInitramfs(ctx context.Context, b *Build) error {
	if b.RootfsTree == "" || b.BusyboxPath == "" {
		return errors.New("the kernel and rootfs steps must run before initramfs")
	}
	modDir, err := kernelModulesDir(b.RootfsTree, b.KernelRelease)
	if err != nil {
		return err
	}
	ix, err := loadModuleIndex(modDir)
	if err != nil {
		return err
	}
	order, builtin, err := ix.loadOrder(InitramfsModules)
	if err != nil {
		return err
	}
	b.BuiltinModules = builtin
	bb, err := os.ReadFile(b.BusyboxPath)
	if err != nil {
		return err
	}
	entries := []cpioEntry{
		{Name: "bin", Mode: cpioDir | 0o755},
		{Name: "dev", Mode: cpioDir | 0o755},
		{Name: "dev/console", Mode: cpioChar | 0o600, Major: 5, Minor: 1},
		{Name: "etc", Mode: cpioDir | 0o755},
		{Name: "etc/socialweb", Mode: cpioDir | 0o755},
		{Name: "lib", Mode: cpioDir | 0o755},
		{Name: "lib/modules", Mode: cpioDir | 0o755},
		{Name: "newroot", Mode: cpioDir | 0o755},
		{Name: "proc", Mode: cpioDir | 0o755},
		{Name: "sys", Mode: cpioDir | 0o755},
		{Name: "bin/busybox", Mode: cpioFile | 0o755, Data: bb},
		{Name: "init", Mode: cpioFile | 0o755, Data: []byte(initScript)},
	}
	for _, a := range initramfsApplets {
		entries = append(entries, cpioEntry{Name: "bin/" + a, Mode: cpioSymlink | 0o777, Data: []byte("busybox")})
	}
	var list bytes.Buffer
	b.LoadedModules = nil
	for _, rel := range order {
		data, err := readModule(ctx, b, filepath.Join(modDir, rel))
		if err != nil {
			return err
		}
		flat := modName(rel) + ".ko"
		entries = append(entries, cpioEntry{Name: "lib/modules/" + flat, Mode: cpioFile | 0o644, Data: data})
		fmt.Fprintln(&list, flat)
		b.LoadedModules = append(b.LoadedModules, flat)
	}
	entries = append(entries, cpioEntry{Name: "etc/socialweb/modules", Mode: cpioFile | 0o644, Data: list.Bytes()})
	b.Progress(StepInitramfs, "modules loaded in order: %s; built in: %s",
		strings.Join(b.LoadedModules, " "), strings.Join(builtin, " "))

	out := filepath.Join(b.OutDir, "initramfs.cpio.gz")
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	zw, _ := gzip.NewWriterLevel(f, gzip.BestCompression)
	if err := writeCpio(zw, entries); err != nil {
		f.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// readModule returns a module's bytes, decompressed (insmod in the initramfs takes plain
// .ko): .gz in Go, .xz with the busybox just extracted, .zst with the host's zstd.
func readModule(ctx context.Context, b *Build, file string) ([]byte, error) {
	switch {
	case strings.HasSuffix(file, ".ko"):
		return os.ReadFile(file)
	case strings.HasSuffix(file, ".gz"):
		f, err := os.Open(file)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, err
		}
		return io.ReadAll(zr)
	case strings.HasSuffix(file, ".xz"):
		return b.runner(StepInitramfs).run(ctx, false, b.BusyboxPath, "xzcat", file)
	case strings.HasSuffix(file, ".zst"):
		return b.runner(StepInitramfs).run(ctx, false, "zstd", "-dc", file)
	}
	return nil, fmt.Errorf("unknown kernel module format: %s", file)
}

// ---- mkfs ----

func stepMkfs(ctx context.Context, b *Build) error {
	if b.RootfsTree == "" {
		return errors.New("the rootfs step must run before mkfs")
	}
	res, err := MakeExt4(ctx, b.RootfsTree, filepath.Join(b.OutDir, "rootfs.ext4"), Ext4Options{
		SizeBytes:   int64(b.Spec.DiskMiB) << 20,
		HeadroomMiB: b.Spec.HeadroomMiB,
		Label:       "rootfs",
		Method:      b.Options.Ext4Method,
		Tools:       b.Options.Tools,
		Progress:    b.Options.Progress,
	})
	b.Ext4 = res
	return err
}

// ---- manifest ----

func stepManifest(ctx context.Context, b *Build) error {
	m := &Manifest{
		FormatVersion:        FormatVersion,
		Fingerprint:          b.Fingerprint,
		BuiltAt:              time.Now().UTC().Truncate(time.Second),
		BuildSeconds:         time.Since(b.Started).Seconds(),
		VCPU:                 b.Spec.VCPU,
		MemMiB:               b.Spec.MemMiB,
		DiskMiB:              int(b.Ext4.ImageBytes >> 20),
		HeadroomMiB:          b.Spec.HeadroomMiB,
		Cmdline:              b.Spec.FullCmdline(),
		Init:                 b.Spec.Init,
		KernelPackage:        b.Resolved.KernelImage.Name,
		KernelPackageVersion: b.Resolved.KernelImage.Version,
		KernelVersion:        b.KernelRelease,
		Busybox:              b.Resolved.Busybox.Version,
		Suite:                b.Spec.Suite,
		Mirror:               b.Spec.Mirror,
		Packages:             b.Installed,
		InitramfsModules:     b.LoadedModules,
		BuiltinModules:       b.BuiltinModules,
		ExtraFiles:           b.Resolved.ExtraFiles,
		Rootfs:               b.Ext4,
		LayerKey:             b.LayerKey,
		Tools:                b.Resolved.Tools,
		Files:                map[string]ManifestFile{},
	}
	for _, name := range []string{FileKernel, FileInitramfs, FileRootfs} {
		mf, err := describeFile(filepath.Join(b.OutDir, name), name != FileRootfs)
		if err != nil {
			return fmt.Errorf("%s: %w (did an earlier step not produce it?)", name, err)
		}
		m.Files[name] = mf
	}
	b.Manifest = m
	return writeJSONAtomic(filepath.Join(b.OutDir, FileManifest), m)
}

// ---- helpers ----

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(mode); err != nil { // umask
		out.Close()
		return err
	}
	return out.Close()
}

// writeJSONAtomic writes v to file via a synced temporary file and a rename, so readers
// see either nothing or the whole file.
func writeJSONAtomic(file string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), file); err != nil {
		return err
	}
	return syncDir(filepath.Dir(file))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
