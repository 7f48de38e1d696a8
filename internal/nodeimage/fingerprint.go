package nodeimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// FormatVersion is the builder's own version: bump it whenever a change to this package
// changes what it produces (steps, init script, layout), so old cache entries are not
// reused for the new format.
const FormatVersion = 1

// InitramfsModules are loaded by the initramfs, in this order, before it mounts the root
// device. Modules built into the kernel (modules.builtin) are skipped; dependencies and
// soft pre-dependencies are loaded first.
var InitramfsModules = []string{
	"virtio_ring", "virtio", "virtio_mmio", "virtio_blk", "failover", "net_failover",
	"virtio_net", "ext4",
}

// RootfsModules are modules the node agent loads from the root filesystem with modprobe
// that the kernel must have, as modules or built in: overlay (containerd's snapshots),
// br_netfilter (the pod bridge's netfilter sysctls) and virtiofs with fuse (the host's
// read-only layer share, mounted when the VM has a virtio-fs device). The rootfs step
// fails when one is missing, rather than a node finding out at boot.
var RootfsModules = []string{"overlay", "br_netfilter", "fuse", "virtiofs"}

// PackageRef is a Debian package at an exact version.
type PackageRef struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// FileDigest identifies a file staged into the rootfs.
type FileDigest struct {
	Guest  string `json:"guest"`
	Host   string `json:"-"`
	Mode   uint32 `json:"mode"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Resolved holds everything Resolve learned from the host that decides the artifact.
type Resolved struct {
	// KernelMeta is Spec.KernelPackage at its candidate version; KernelImage is the
	// linux-image-<abi> package it depends on (the same as KernelMeta when the spec names
	// a concrete image package).
	KernelMeta  PackageRef `json:"kernelMeta"`
	KernelImage PackageRef `json:"kernelImage"`
	Busybox     PackageRef `json:"busybox"`
	// Include maps every debootstrap --include package to its version in Suite at Mirror.
	Include map[string]string `json:"include"`
	// ReleaseSHA256 hashes the suite's InRelease as the host's apt lists hold it; it
	// changes with any package in the suite, including the ones debootstrap pulls in as
	// required or as dependencies.
	ReleaseSHA256 string `json:"releaseSHA256"`
	// Tools are versions of host tools whose output ends up in the image.
	Tools map[string]string `json:"tools"`
	// ExtraFiles are the files from Options.ExtraFiles, sorted by guest path.
	ExtraFiles []FileDigest `json:"extraFiles"`
}

type fingerprintInput struct {
	Format           int      `json:"format"`
	Spec             Spec     `json:"spec"`
	InitramfsModules []string `json:"initramfsModules"`
	RootfsModules    []string `json:"rootfsModules"`
	InitScript       string   `json:"initScriptSHA256"`
	Resolved         Resolved `json:"resolved"`
}

// Fingerprint is the sha256 (hex) over every input that changes the image: the completed
// spec (including vcpu, memMiB and the sizes, which the manifest records), the resolved
// package versions, the suite's release, tool versions, the hashes of extra files, the
// initramfs module list and init script, the modules the rootfs must have, and
// FormatVersion.
func Fingerprint(spec Spec, r Resolved) string {
	return hashJSON(fingerprintInput{
		Format:           FormatVersion,
		Spec:             spec,
		InitramfsModules: InitramfsModules,
		RootfsModules:    RootfsModules,
		InitScript:       sha256Hex([]byte(initScript)),
		Resolved:         r,
	})
}

type layerInput struct {
	Format      int               `json:"format"`
	Suite       string            `json:"suite"`
	Mirror      string            `json:"mirror"`
	Packages    []string          `json:"packages"`
	Include     map[string]string `json:"include"`
	Release     string            `json:"release"`
	Debootstrap string            `json:"debootstrap"`
}

// LayerKey keys the cached debootstrap result: only the inputs of debootstrap itself, so a
// change of kernel, sizes or extra files (the guest agent) reuses it.
func LayerKey(spec Spec, r Resolved) string {
	return hashJSON(layerInput{
		Format:      FormatVersion,
		Suite:       spec.Suite,
		Mirror:      spec.Mirror,
		Packages:    spec.IncludePackages(),
		Include:     r.Include,
		Release:     r.ReleaseSHA256,
		Debootstrap: r.Tools["debootstrap"],
	})
}

func hashJSON(v any) string {
	b, err := json.Marshal(v) // maps marshal with sorted keys: deterministic
	if err != nil {
		panic(err)
	}
	return sha256Hex(b)
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// SHA256File is the hex SHA-256 of file's contents, and its size.
func SHA256File(file string) (string, int64, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// digestExtraFiles validates and hashes Options.ExtraFiles (guest path -> host path).
func digestExtraFiles(extra map[string]string) ([]FileDigest, error) {
	var out []FileDigest
	var errs []error
	for guest, host := range extra {
		if !path.IsAbs(guest) || path.Clean(guest) != guest || guest == "/" {
			errs = append(errs, fmt.Errorf("extra file guest path %q must be a clean absolute file path", guest))
			continue
		}
		st, err := os.Stat(host)
		if err != nil {
			errs = append(errs, fmt.Errorf("extra file for %s: %w", guest, err))
			continue
		}
		if !st.Mode().IsRegular() {
			errs = append(errs, fmt.Errorf("extra file for %s: %s is not a regular file", guest, host))
			continue
		}
		sum, n, err := SHA256File(host)
		if err != nil {
			errs = append(errs, fmt.Errorf("extra file for %s: %w", guest, err))
			continue
		}
		out = append(out, FileDigest{Guest: guest, Host: host, Mode: uint32(st.Mode().Perm()), Size: n, SHA256: sum})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Guest < out[j].Guest })
	return out, errors.Join(errs...)
}

// aptListsDir is apt's Dir::State::lists; tests may point it elsewhere.
var aptListsDir = "/var/lib/apt/lists"

// aptListName reproduces apt's URItoFileName for a mirror URI.
func aptListName(uri string) string {
	u := uri
	if i := strings.Index(u, "://"); i >= 0 {
		u = u[i+3:]
	}
	if i := strings.IndexByte(u, '@'); i >= 0 && i < strings.IndexByte(u+"/", '/') {
		u = u[i+1:]
	}
	const bad = "\\|{}[]<>\"^~_=!@#$%^&*"
	var b strings.Builder
	for i := 0; i < len(u); i++ {
		c := u[i]
		if strings.IndexByte(bad, c) >= 0 || c <= 0x20 || c >= 0x7f {
			fmt.Fprintf(&b, "%%%02x", c)
		} else {
			b.WriteByte(c)
		}
	}
	return strings.ReplaceAll(strings.TrimRight(b.String(), "/"), "/", "_")
}

// Resolve asks apt on the host for every version that decides the image, and hashes the
// extra files. It needs the host's apt lists to be current (apt-get update); it never
// updates them itself. The apt part is cached under <CacheDir>/resolve, keyed by the spec
// and the sizes and times of the apt lists, apt configuration, dpkg status and mkfs.ext4,
// because every apt-cache call parses all lists (about a second each when, as in Debian
// container images, apt's binary cache is disabled).
func Resolve(ctx context.Context, spec Spec, opts Options) (Resolved, error) {
	res, err := resolveHostCached(ctx, spec, opts)
	if err != nil {
		return res, err
	}
	res.ExtraFiles, err = digestExtraFiles(opts.ExtraFiles)
	return res, err
}

// resolveStateKey hashes everything resolveHost's answer depends on.
func resolveStateKey(spec Spec, opts Options) string {
	type fileState struct {
		Name  string
		Size  int64
		MTime int64
	}
	var files []fileState
	add := func(paths ...string) {
		for _, p := range paths {
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
				files = append(files, fileState{p, st.Size(), st.ModTime().UnixNano()})
			}
		}
	}
	glob := func(pattern string) {
		m, _ := filepath.Glob(pattern)
		sort.Strings(m)
		add(m...)
	}
	glob(filepath.Join(aptListsDir, "*"))
	etc := filepath.Join(aptSourcesRoot, "etc/apt")
	add(filepath.Join(etc, "sources.list"), filepath.Join(etc, "preferences"))
	for _, d := range []string{"sources.list.d", "preferences.d", "apt.conf.d"} {
		glob(filepath.Join(etc, d, "*"))
	}
	add("/var/lib/dpkg/status")
	mkfs, _ := toolPath(opts.Tools, "mkfs.ext4")
	add(mkfs)
	return hashJSON(struct {
		Format int
		Spec   Spec
		Files  []fileState
		Tools  map[string]string
	}{FormatVersion, spec, files, opts.Tools})
}

func resolveHostCached(ctx context.Context, spec Spec, opts Options) (Resolved, error) {
	dir := filepath.Join(opts.cacheDir(), "resolve")
	file := filepath.Join(dir, resolveStateKey(spec, opts)+".json")
	if data, err := os.ReadFile(file); err == nil {
		var res Resolved
		if json.Unmarshal(data, &res) == nil && res.KernelImage.Version != "" && res.ReleaseSHA256 != "" {
			return res, nil
		}
	}
	res, err := resolveHost(ctx, spec, opts)
	if err != nil {
		return res, err
	}
	if err := os.MkdirAll(dir, 0o755); err == nil {
		_ = writeJSONAtomic(file, res)
		// entries for states that are gone are never read again: prune old ones
		old, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		for _, f := range old {
			if st, err := os.Stat(f); err == nil && time.Since(st.ModTime()) > 30*24*time.Hour {
				os.Remove(f)
			}
		}
	}
	return res, nil
}

func resolveHost(ctx context.Context, spec Spec, opts Options) (Resolved, error) {
	r := &runner{tools: opts.Tools, progress: opts.Progress, step: "resolve"}
	var res Resolved

	// 1: the kernel metapackage's candidate and the linux-image package it depends on
	meta, image, err := kernelImage(ctx, r, spec.KernelPackage)
	if err != nil {
		return res, err
	}
	// 2: one policy call for candidates and per-suite versions of everything else
	inc := spec.IncludePackages()
	pkgs := append([]string{spec.KernelPackage, image.Name, "busybox-static"}, inc...)
	out, err := r.run(ctx, false, "apt-cache", append([]string{"policy"}, pkgs...)...)
	if err != nil {
		return res, err
	}
	pol := parsePolicy(out)
	for _, p := range []string{spec.KernelPackage, image.Name, "busybox-static"} {
		if c := pol[p].Candidate; c == "" || c == "(none)" {
			return res, fmt.Errorf("apt has no candidate version of %s: check the name, or run apt-get update on the host", p)
		}
	}
	if c := pol[spec.KernelPackage].Candidate; c != meta.Version {
		return res, fmt.Errorf("apt-cache show and apt-cache policy disagree on %s (%s vs %s); run apt-get update and try again", meta.Name, meta.Version, c)
	}
	if image.Version == "" {
		image.Version = pol[image.Name].Candidate
	}
	res.KernelMeta, res.KernelImage = meta, image
	res.Busybox = PackageRef{"busybox-static", pol["busybox-static"].Candidate}

	res.Include = map[string]string{}
	var missing []string
	for _, p := range inc {
		if v := pol[p].versionIn(spec.Mirror, spec.Suite); v != "" {
			res.Include[p] = v
		} else {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return res, fmt.Errorf("the host's apt lists have no %s in %s at %s: check the names, or add that source and run apt-get update",
			strings.Join(missing, ", "), spec.Suite, spec.Mirror)
	}

	base := filepath.Join(aptListsDir, aptListName(spec.Mirror)+"_dists_"+spec.Suite)
	var rel []byte
	for _, f := range []string{base + "_InRelease", base + "_Release"} {
		if rel, err = os.ReadFile(f); err == nil {
			break
		}
	}
	if err != nil {
		return res, fmt.Errorf("the host's apt lists have no release file for %s %s (looked for %s_InRelease): add that source to /etc/apt and run apt-get update",
			spec.Mirror, spec.Suite, base)
	}
	res.ReleaseSHA256 = sha256Hex(rel)

	res.Tools = map[string]string{}
	out, err = r.run(ctx, false, "dpkg-query", "-W", "-f", "${Package} ${Version}\n", "debootstrap")
	if err != nil {
		return res, fmt.Errorf("reading the debootstrap version: %w", err)
	}
	if k, v, ok := strings.Cut(strings.TrimSpace(string(out)), " "); ok {
		res.Tools[k] = v
	}
	// mkfs.ext4 may be overridden or not come from a Debian package: ask it.
	if p, err := toolPath(opts.Tools, "mkfs.ext4"); err == nil {
		res.Tools["mkfs.ext4"] = mke2fsVersion(ctx, p)
	}
	return res, nil
}

type policyVersion struct {
	Version string
	Sources []string // "<uri> <dist>/<component>"
}

type policyEntry struct {
	Candidate string
	Versions  []policyVersion
}

// versionIn returns the version the entry has in suite at mirror (what debootstrap, which
// only sees that suite, installs), or "".
func (e policyEntry) versionIn(mirror, suite string) string {
	for _, v := range e.Versions {
		for _, s := range v.Sources {
			f := strings.Fields(s)
			if len(f) == 2 && strings.TrimRight(f[0], "/") == mirror && strings.HasPrefix(f[1], suite+"/") {
				return v.Version
			}
		}
	}
	return ""
}

// parsePolicy parses `apt-cache policy pkg...`.
func parsePolicy(out []byte) map[string]policyEntry {
	got := map[string]policyEntry{}
	var cur string
	var e policyEntry
	flush := func() {
		if cur != "" {
			got[cur] = e
		}
	}
	for _, l := range strings.Split(string(out), "\n") {
		if l == "" {
			continue
		}
		if !strings.HasPrefix(l, " ") && strings.HasSuffix(l, ":") {
			flush()
			cur, e = strings.TrimSuffix(l, ":"), policyEntry{}
			continue
		}
		t := strings.TrimSpace(l)
		if v, ok := strings.CutPrefix(t, "Candidate:"); ok {
			e.Candidate = strings.TrimSpace(v)
			continue
		}
		if strings.HasPrefix(t, "Installed:") || strings.HasPrefix(t, "Version table:") {
			continue
		}
		f := strings.Fields(strings.TrimPrefix(t, "***"))
		switch {
		case len(f) >= 5 && f[len(f)-1] == "Packages" && len(e.Versions) > 0: // 500 <uri> <dist/comp> <arch> Packages
			last := &e.Versions[len(e.Versions)-1]
			last.Sources = append(last.Sources, f[1]+" "+f[2])
		case len(f) == 2 && !strings.HasPrefix(f[1], "/"): // <version> <priority>
			e.Versions = append(e.Versions, policyVersion{Version: f[0]})
		}
	}
	flush()
	return got
}

var linuxImageDepRE = regexp.MustCompile(`^(linux-image-[a-z0-9.+-]+)\s*(?:\(\s*=\s*([^)\s]+)\s*\))?$`)

// kernelImage reads the candidate of a kernel package and follows a metapackage to the
// linux-image-<abi> package it depends on (image.Version is "" when the dependency does
// not pin one). A concrete image package is its own image.
func kernelImage(ctx context.Context, r *runner, pkg string) (meta, image PackageRef, err error) {
	out, err := r.run(ctx, false, "apt-cache", "show", "--no-all-versions", pkg)
	if err != nil {
		return meta, image, fmt.Errorf("kernel package %s: %w (check the name, or run apt-get update on the host)", pkg, err)
	}
	meta.Name = pkg
	var deps string
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "Version:"); ok && meta.Version == "" {
			meta.Version = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(l, "Depends:"); ok && deps == "" {
			deps = v
		}
		if l == "" && meta.Version != "" {
			break // first stanza only
		}
	}
	if meta.Version == "" {
		return meta, image, fmt.Errorf("apt-cache show %s printed no Version", pkg)
	}
	for _, d := range strings.Split(deps, ",") {
		alt := strings.TrimSpace(strings.Split(d, "|")[0])
		if m := linuxImageDepRE.FindStringSubmatch(alt); m != nil {
			return meta, PackageRef{Name: m[1], Version: m[2]}, nil
		}
	}
	return meta, meta, nil
}

var mke2fsVersionRE = regexp.MustCompile(`mke2fs (\d+\.\d+(?:\.\d+)?)`)

// mke2fsVersion returns e.g. "1.47.0", or "unknown".
func mke2fsVersion(ctx context.Context, mkfs string) string {
	out, _ := exec.CommandContext(ctx, mkfs, "-V").CombinedOutput()
	if m := mke2fsVersionRE.FindSubmatch(out); m != nil {
		return string(m[1])
	}
	return "unknown"
}
