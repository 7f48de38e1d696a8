package nodeimage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/socialweb-computer/socialweb/internal/filelock"
)

// Files of an image directory.
const (
	FileKernel    = "vmlinuz"
	FileInitramfs = "initramfs.cpio.gz"
	FileRootfs    = "rootfs.ext4"
	FileManifest  = "manifest.json"
)

// Options configure Ensure, Lookup and Resolve.
type Options struct {
	// CacheDir is the cache root (see the package comment); "" means DefaultCacheDir().
	CacheDir string
	// LayerCacheDir holds debootstrap layers and downloaded .debs; "" means
	// <CacheDir>/layers. Tests point CacheDir at a temporary directory and keep the
	// shared layer cache.
	LayerCacheDir string
	// ExtraFiles are staged into the rootfs: guest path -> host path. Their contents,
	// modes and guest paths are part of the fingerprint.
	ExtraFiles map[string]string
	// Progress receives a line per notable event of each step; nil discards them.
	// SlogProgress adapts a *slog.Logger.
	Progress func(step, msg string)
	// Steps replaces DefaultSteps(); it must end with the manifest step.
	Steps Steps
	// Ext4Method chooses how rootfs.ext4 is filled; "" is Ext4Auto.
	Ext4Method Ext4Method
	// Rebuild makes Ensure build even when an image with the fingerprint exists; the new
	// image replaces it.
	Rebuild bool
	// Tools overrides host tool paths by name (e.g. "mkfs.ext4": "/opt/e2fsprogs/...").
	Tools map[string]string
}

func (o Options) cacheDir() string {
	if o.CacheDir != "" {
		return o.CacheDir
	}
	return DefaultCacheDir()
}

func (o Options) layerDir() string {
	if o.LayerCacheDir != "" {
		return o.LayerCacheDir
	}
	return filepath.Join(o.cacheDir(), "layers")
}

// ImagesDir is where images are cached, one directory per fingerprint.
func (o Options) ImagesDir() string { return filepath.Join(o.cacheDir(), "images") }

// DefaultCacheDir is $XDG_CACHE_HOME/socialweb, or ~/.cache/socialweb when XDG_CACHE_HOME
// is unset (os.UserCacheDir), the same rule for root and other users; /var/cache/socialweb
// only when neither is available.
func DefaultCacheDir() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "socialweb")
	}
	return "/var/cache/socialweb"
}

// Image states reported in Result.State.
const (
	// StatePresent: Lookup found a complete image; nothing was built.
	StatePresent = "present"
	// StateReused: Ensure found a complete image for the fingerprint; nothing was built.
	StateReused = "reused"
	// StateBuilt: Ensure built the image now (Result.LayerReused says whether debootstrap
	// ran or its cached result was used).
	StateBuilt = "built"
)

// Result describes the image Ensure or Lookup settled on.
type Result struct {
	State       string
	Fingerprint string
	// Dir holds vmlinuz, initramfs.cpio.gz, rootfs.ext4 and manifest.json.
	Dir         string
	Manifest    *Manifest
	LayerReused bool
	Duration    time.Duration
}

// ManifestFile describes one artifact; SHA256 is omitted for rootfs.ext4 (too big to hash
// on every reuse check) and its size is verified instead.
type ManifestFile struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256,omitempty"`
}

// Manifest is manifest.json, written last: an image directory without a valid manifest is
// not an image.
type Manifest struct {
	FormatVersion int       `json:"formatVersion"`
	Fingerprint   string    `json:"fingerprint"`
	BuiltAt       time.Time `json:"builtAt"`
	BuildSeconds  float64   `json:"buildSeconds"`
	VCPU          int       `json:"vcpu"`
	MemMiB        int       `json:"memMiB"`
	// DiskMiB is the size of rootfs.ext4 (the spec's diskMiB, or tree + headroom).
	DiskMiB     int    `json:"diskMiB"`
	HeadroomMiB int    `json:"headroomMiB"`
	Cmdline     string `json:"cmdline"`
	Init        string `json:"init"`
	// KernelPackage is the linux-image-<abi> package; KernelVersion is its uname -r.
	KernelPackage        string                  `json:"kernelPackage"`
	KernelPackageVersion string                  `json:"kernelPackageVersion"`
	KernelVersion        string                  `json:"kernelVersion"`
	Busybox              string                  `json:"busyboxVersion"`
	Suite                string                  `json:"suite"`
	Mirror               string                  `json:"mirror"`
	Packages             map[string]string       `json:"packages"`
	InitramfsModules     []string                `json:"initramfsModules"`
	BuiltinModules       []string                `json:"builtinModules,omitempty"`
	ExtraFiles           []FileDigest            `json:"extraFiles,omitempty"`
	Rootfs               Ext4Result              `json:"rootfs"`
	LayerKey             string                  `json:"layerKey"`
	Tools                map[string]string       `json:"tools"`
	Files                map[string]ManifestFile `json:"files"`
}

func describeFile(file string, hash bool) (ManifestFile, error) {
	if !hash {
		st, err := os.Stat(file)
		if err != nil {
			return ManifestFile{}, err
		}
		return ManifestFile{Size: st.Size()}, nil
	}
	sum, n, err := SHA256File(file)
	return ManifestFile{Size: n, SHA256: sum}, err
}

// ReadManifest reads dir/manifest.json and checks that the artifacts it describes are
// present and unchanged (sizes, and hashes of vmlinuz and the initramfs).
func ReadManifest(dir string) (*Manifest, error) {
	data, err := os.ReadFile(filepath.Join(dir, FileManifest))
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, FileManifest), err)
	}
	if m.FormatVersion != FormatVersion {
		return nil, fmt.Errorf("%s: format %d, this builder writes %d", dir, m.FormatVersion, FormatVersion)
	}
	for _, name := range []string{FileKernel, FileInitramfs, FileRootfs} {
		want, ok := m.Files[name]
		if !ok {
			return nil, fmt.Errorf("%s: manifest lists no %s", dir, name)
		}
		got, err := describeFile(filepath.Join(dir, name), want.SHA256 != "")
		if err != nil {
			return nil, err
		}
		if got != want {
			return nil, fmt.Errorf("%s: %s does not match the manifest (size %d, want %d)", dir, name, got.Size, want.Size)
		}
	}
	return &m, nil
}

// ErrNotBuilt is returned by Lookup when the cache has no image for the fingerprint.
var ErrNotBuilt = errors.New("no node image with this fingerprint has been built")

// prepare completes the spec, resolves versions and computes the fingerprint.
func prepare(ctx context.Context, spec Spec, opts Options) (Spec, Resolved, string, error) {
	if err := spec.Complete(); err != nil {
		return spec, Resolved{}, "", err
	}
	if err := CheckTools(opts.Tools, "apt-cache", "dpkg-query"); err != nil {
		return spec, Resolved{}, "", err
	}
	res, err := Resolve(ctx, spec, opts)
	if err != nil {
		return spec, res, "", err
	}
	return spec, res, Fingerprint(spec, res), nil
}

// Lookup resolves the spec's fingerprint and reports the cached image, or ErrNotBuilt. It
// never builds and does not need root.
func Lookup(ctx context.Context, spec Spec, opts Options) (Result, error) {
	t0 := time.Now()
	_, _, fp, err := prepare(ctx, spec, opts)
	if err != nil {
		return Result{}, err
	}
	dir := filepath.Join(opts.ImagesDir(), fp)
	m, err := ReadManifest(dir)
	if err != nil {
		return Result{Fingerprint: fp, Dir: dir}, fmt.Errorf("%w (%s): %v", ErrNotBuilt, fp, err)
	}
	if m.Fingerprint != fp {
		return Result{Fingerprint: fp, Dir: dir}, fmt.Errorf("%w: %s holds fingerprint %s", ErrNotBuilt, dir, m.Fingerprint)
	}
	return Result{State: StatePresent, Fingerprint: fp, Dir: dir, Manifest: m, Duration: time.Since(t0)}, nil
}

// Ensure returns the image for spec and opts, building it when the cache has none with the
// same fingerprint. A build happens in a temporary directory next to the final one and is
// renamed into place only when every step succeeded, so an interrupted build leaves
// nothing that looks complete; concurrent Ensure calls for one fingerprint build once.
func Ensure(ctx context.Context, spec Spec, opts Options) (Result, error) {
	t0 := time.Now()
	spec, res, fp, err := prepare(ctx, spec, opts)
	if err != nil {
		return Result{}, err
	}
	images := opts.ImagesDir()
	final := filepath.Join(images, fp)
	reused := func() (Result, bool) {
		m, err := ReadManifest(final)
		if err != nil || m.Fingerprint != fp {
			return Result{}, false
		}
		return Result{State: StateReused, Fingerprint: fp, Dir: final, Manifest: m, Duration: time.Since(t0)}, true
	}
	if r, ok := reused(); ok && !opts.Rebuild {
		return r, nil
	}
	var errs []error
	if err := CheckTools(opts.Tools, BuildTools...); err != nil {
		errs = append(errs, err)
	}
	if os.Geteuid() != 0 {
		errs = append(errs, errors.New("building a node image needs root (debootstrap and chroot); run it as root"))
	}
	if err := errors.Join(errs...); err != nil {
		return Result{Fingerprint: fp}, err
	}
	steps := opts.Steps
	if steps == nil {
		steps = DefaultSteps()
	}
	if err := steps.validate(); err != nil {
		return Result{Fingerprint: fp}, err
	}
	if err := os.MkdirAll(images, 0o755); err != nil {
		return Result{}, err
	}
	unlock, err := filelock.Wait(ctx, filepath.Join(images, "."+fp+".lock"))
	if err != nil {
		return Result{}, err
	}
	defer unlock()
	if r, ok := reused(); ok && !opts.Rebuild { // another process built it while we waited
		return r, nil
	}
	// Leftovers of crashed builds of this fingerprint, and an incomplete final directory
	// (a complete one being rebuilt stays usable until the new one replaces it).
	stale, _ := filepath.Glob(filepath.Join(images, ".build-"+fp[:16]+"-*"))
	if _, ok := reused(); !ok {
		stale = append(stale, final)
	}
	for _, s := range stale {
		if err := removeTree(s); err != nil {
			return Result{}, err
		}
	}
	buildDir, err := os.MkdirTemp(images, ".build-"+fp[:16]+"-")
	if err != nil {
		return Result{}, err
	}
	defer func() {
		if err := removeTree(buildDir); err != nil && opts.Progress != nil {
			opts.Progress("cleanup", err.Error())
		}
	}()
	b := &Build{Spec: spec, Resolved: res, Fingerprint: fp, Options: opts, Started: t0,
		OutDir: filepath.Join(buildDir, "out"), WorkDir: filepath.Join(buildDir, "work")}
	for _, d := range []string{b.OutDir, b.WorkDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return Result{}, err
		}
	}
	b.Progress("ensure", "building image %s in %s", fp[:16], buildDir)
	if err := steps.Run(ctx, b); err != nil {
		return Result{Fingerprint: fp}, err
	}
	if _, err := os.Stat(final); err == nil { // Rebuild: move the old image aside first
		if err := os.Rename(final, filepath.Join(buildDir, "old")); err != nil {
			return Result{}, err
		}
	}
	if err := os.Rename(b.OutDir, final); err != nil {
		return Result{}, err
	}
	if err := syncDir(images); err != nil {
		return Result{}, err
	}
	m, err := ReadManifest(final)
	if err != nil {
		return Result{}, fmt.Errorf("the image just built does not verify: %w", err)
	}
	return Result{State: StateBuilt, Fingerprint: fp, Dir: final, Manifest: m,
		LayerReused: b.LayerReused, Duration: time.Since(t0)}, nil
}
