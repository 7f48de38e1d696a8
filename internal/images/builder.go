package images

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/socialweb-computer/socialweb/internal/nodeimage"
)

// Builder image: a CI builder made on the host from Debian packages and Go modules, for
// jobs that build real projects (issue 11). No container registry is reachable here, so
// it is debootstrapped rather than pulled.
const (
	// BuilderSuite is the Debian suite of the builder image.
	BuilderSuite = "bookworm"
	// JUnitModule is the junit converter built from the Go module proxy into the image
	// (go test -v output on stdin, a junit XML report on stdout).
	JUnitModule = "github.com/jstemmer/go-junit-report/v2"
	// JUnitVersion is the version of JUnitModule built.
	JUnitVersion = "v2.1.0"
)

// BuilderRef is the reference the builder image is tagged with.
func BuilderRef() string { return "socialweb.test/builder:" + BuilderSuite }

// builderLayer is one image layer: the Debian packages installed on top of the ones below.
type builderLayer struct {
	Name     string   `json:"name"`
	Packages []string `json:"packages"`
	// Script runs in the chroot after the packages are installed (sh -e).
	Script string `json:"script,omitempty"`
}

// builderLayers are the layers above the debootstrap base, split the way builder images
// usually are (base, compilers, language toolchains) so they are fetched in parallel
// and a change to one does not invalidate the others' blobs.
func builderLayers() []builderLayer {
	return []builderLayer{
		{Name: "build tools", Packages: []string{"ca-certificates", "git", "make", "gcc", "g++", "libc6-dev"}},
		{Name: "go toolchain", Packages: []string{"golang-go"}},
		{Name: "rust toolchain", Packages: []string{"rustc", "cargo"}},
	}
}

// builderRecipe changes whenever Builder makes its layers differently, so cached builds
// of an older recipe are not reused.
const builderRecipe = 2

type builderIn struct {
	Recipe     int               `json:"recipe"`
	Suite      string            `json:"suite"`
	Mirror     string            `json:"mirror"`
	Debootstap string            `json:"debootstrap"`
	Layers     []builderLayer    `json:"layers"`
	Versions   map[string]string `json:"versions"` // apt candidate of every named package
	JUnit      string            `json:"junit"`    // module@version
	GoVersion  string            `json:"goVersion"`
	Excluded   []string          `json:"excluded"`
}

// builderExcluded are paths left out of every layer: host state debootstrap copies in
// (resolv.conf, hostname), logs with timestamps, and kernel filesystems.
func builderExcluded() []string {
	return []string{"etc/resolv.conf", "etc/hostname", "var/log/*", "proc/*", "sys/*", "dev/*", "run/*", "tmp/*"}
}

func builderInputs(ctx context.Context, opts Options) (builderIn, error) {
	in := builderIn{Recipe: builderRecipe, Suite: BuilderSuite, Mirror: nodeimage.HostMirror(BuilderSuite), Layers: builderLayers(),
		JUnit: JUnitModule + "@" + JUnitVersion, Excluded: builderExcluded(), Versions: map[string]string{}}
	out, err := run(ctx, "", "debootstrap", "--version")
	if err != nil {
		return in, err
	}
	in.Debootstap = strings.TrimSpace(string(out))
	var pkgs []string
	for _, l := range in.Layers {
		pkgs = append(pkgs, l.Packages...)
	}
	if in.Versions, err = aptCandidates(ctx, pkgs); err != nil {
		return in, err
	}
	gov, err := run(ctx, "", opts.goCmd(), "env", "GOVERSION")
	if err != nil {
		return in, err
	}
	in.GoVersion = strings.TrimSpace(string(gov))
	return in, nil
}

// aptCandidates asks the host's apt which version of each package it would install (the
// host's lists stand for the mirror's, as for busybox).
func aptCandidates(ctx context.Context, pkgs []string) (map[string]string, error) {
	out, err := run(ctx, "", "apt-cache", append([]string{"policy"}, pkgs...)...)
	if err != nil {
		return nil, err
	}
	vers := parseAptPolicy(string(out))
	for _, p := range pkgs {
		if vers[p] == "" {
			return nil, fmt.Errorf("images: apt has no candidate version of %s: run apt-get update on the host", p)
		}
	}
	return vers, nil
}

// parseAptPolicy reads the candidate version of each package from apt-cache policy's
// output; packages without one are left out.
func parseAptPolicy(out string) map[string]string {
	vers := map[string]string{}
	cur := ""
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, " ") && strings.HasSuffix(line, ":") {
			cur = strings.TrimSuffix(line, ":")
			continue
		}
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Candidate:"); ok && cur != "" {
			if v = strings.TrimSpace(v); v != "" && v != "(none)" {
				vers[cur] = v
			}
		}
	}
	return vers
}

// Builder returns the OCI layout tar of the builder image (BuilderRef) and its manifest
// digest, building it unless the cache holds one with the same fingerprint. Layers: a
// debootstrap --variant=minbase base, then one per builderLayers() entry (apt-get install
// in a chroot), then go-junit-report built from the module proxy with the host's Go.
// Building needs root (debootstrap, chroot, mount) and network to the Debian mirror and
// the Go module proxy; it takes several minutes.
func Builder(ctx context.Context, opts Options) (tarPath, digest string, err error) {
	in, err := builderInputs(ctx, opts)
	if err != nil {
		return "", "", err
	}
	return cached(ctx, "builder-"+BuilderSuite, in, []string{BuilderRef()}, opts, func(ctx context.Context, work string) (imageSpec, error) {
		return builderImage(ctx, work, in, opts)
	})
}

func builderImage(ctx context.Context, work string, in builderIn, opts Options) (imageSpec, error) {
	spec, err := debianLayers(ctx, work, "builder", in.Suite, in.Mirror, in.Layers, in.Excluded, opts)
	if err != nil {
		return imageSpec{}, err
	}
	junit, err := junitLayer(ctx, work, opts)
	if err != nil {
		return imageSpec{}, err
	}
	spec.layers = append(spec.layers, junit)
	spec.history = append(spec.history, "go install "+in.JUnit+" (host Go "+in.GoVersion+", CGO_ENABLED=0) -> /usr/local/bin/go-junit-report")
	spec.config = containerConfig{
		Env: append(append([]string{}, defaultEnv...), "LANG=C.UTF-8"),
		Cmd: []string{"bash"},
		Labels: map[string]string{"computer.socialweb.image.source": "images.Builder",
			"computer.socialweb.image.suite": in.Suite},
	}
	return spec, nil
}

// debianLayers debootstraps suite (minbase) into work/rootfs and returns an image of
// its layers: the base, then one per entry of layers (its packages installed with
// apt-get in a chroot, then its script run there). what names the image in progress
// lines and errors. Needs root (debootstrap, chroot, mount).
func debianLayers(ctx context.Context, work, what, suite, mirror string, layers []builderLayer, excl []string, opts Options) (imageSpec, error) {
	if os.Geteuid() != 0 {
		return imageSpec{}, fmt.Errorf("images: building the %s image needs root (debootstrap, chroot)", what)
	}
	log := opts.log()
	root := filepath.Join(work, "rootfs")
	log.Info(what+": debootstrap", "suite", suite, "mirror", mirror)
	if _, err := run(ctx, "", "debootstrap", "--variant=minbase", "--components=main", suite, root, mirror); err != nil {
		return imageSpec{}, err
	}
	chroot := func(script string) error {
		if err := os.MkdirAll(filepath.Join(root, "proc"), 0o555); err != nil {
			return fmt.Errorf("images: %w", err)
		}
		if _, err := run(ctx, "", "mount", "-t", "proc", "proc", filepath.Join(root, "proc")); err != nil {
			return err
		}
		defer func() { _, _ = run(context.Background(), "", "umount", "-l", filepath.Join(root, "proc")) }()
		_, err := run(ctx, "", "chroot", root, "/bin/sh", "-ec", script)
		return err
	}
	// Apt state is removed at the end of every step so no layer carries package lists.
	const clean = "apt-get clean; rm -rf /var/lib/apt/lists/*"
	const noServices = `printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d`
	if err := chroot(clean); err != nil {
		return imageSpec{}, err
	}
	prev, err := scanTree(root, excl)
	if err != nil {
		return imageSpec{}, err
	}
	base, err := diffLayer(root, nil, prev, filepath.Join(work, "layer-0.tar"))
	if err != nil {
		return imageSpec{}, err
	}
	spec := imageSpec{layers: []blob{base}, history: []string{fmt.Sprintf("debootstrap --variant=minbase %s %s", suite, mirror)}}
	for i, l := range layers {
		log.Info(what+": layer", "name", l.Name, "packages", l.Packages)
		var script, history string
		if len(l.Packages) > 0 {
			// policy-rc.d forbids maintainer scripts to start services: the chroot shares
			// the host's network (a web server's postinst would listen on its port 80).
			script = "export DEBIAN_FRONTEND=noninteractive; " + noServices + "; apt-get update -q; apt-get install -y -q --no-install-recommends " +
				strings.Join(l.Packages, " ") + "; rm -f /usr/sbin/policy-rc.d; " + clean
			history = fmt.Sprintf("apt-get install --no-install-recommends %s # %s", strings.Join(l.Packages, " "), l.Name)
		}
		if l.Script != "" {
			script = strings.TrimPrefix(script+"; "+l.Script, "; ")
			history = strings.TrimPrefix(history+"; "+l.Script, "; ")
		}
		if err := chroot(script); err != nil {
			return imageSpec{}, fmt.Errorf("images: %s layer %q: %w", what, l.Name, err)
		}
		cur, err := scanTree(root, excl)
		if err != nil {
			return imageSpec{}, err
		}
		b, err := diffLayer(root, prev, cur, filepath.Join(work, fmt.Sprintf("layer-%d.tar", i+1)))
		if err != nil {
			return imageSpec{}, err
		}
		spec.layers = append(spec.layers, b)
		spec.history = append(spec.history, history)
		prev = cur
	}
	return spec, nil
}

// junitLayer builds go-junit-report from the module proxy with the host's Go.
func junitLayer(ctx context.Context, work string, opts Options) (blob, error) {
	bin := filepath.Join(work, "gobin")
	cmd := exec.CommandContext(ctx, opts.goCmd(), "install", "-trimpath", JUnitModule+"@"+JUnitVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+bin, "CGO_ENABLED=0", "GOFLAGS=-mod=mod", "GOWORK=off")
	cmd.Dir = work
	if out, err := cmd.CombinedOutput(); err != nil {
		return blob{}, fmt.Errorf("images: go install %s@%s: %w: %s", JUnitModule, JUnitVersion, err, strings.TrimSpace(string(out)))
	}
	b, err := os.ReadFile(filepath.Join(bin, "go-junit-report"))
	if err != nil {
		return blob{}, fmt.Errorf("images: %w", err)
	}
	return layerTar([]tarFile{
		{path: "usr", mode: 0o755, typ: tar.TypeDir},
		{path: "usr/local", mode: 0o755, typ: tar.TypeDir},
		{path: "usr/local/bin", mode: 0o755, typ: tar.TypeDir},
		{path: "usr/local/bin/go-junit-report", mode: 0o755, typ: tar.TypeReg, data: b},
	})
}

// node is what scanTree records of one path: enough to tell that a step changed it.
type node struct {
	mode     fs.FileMode
	size     int64
	mtime    int64
	ctime    int64
	ino      uint64
	uid, gid int
	link     string
}

// scanTree records every directory, regular file and symlink under root (relative
// paths), leaving out paths matching excl (path.Match patterns) and other file types
// (devices, sockets, fifos: the runtime provides /dev).
func scanTree(root string, excl []string) (map[string]node, error) {
	out := map[string]node{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		for _, e := range excl {
			if ok, _ := path.Match(e, rel); ok {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("no stat of %s", p)
		}
		n := node{mode: fi.Mode(), size: fi.Size(), mtime: fi.ModTime().UnixNano(), ctime: st.Ctim.Nano(), ino: st.Ino, uid: int(st.Uid), gid: int(st.Gid)}
		switch {
		case fi.Mode().IsDir(), fi.Mode().IsRegular():
		case fi.Mode()&fs.ModeSymlink != 0:
			if n.link, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			return nil
		}
		out[rel] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("images: scanning %s: %w", root, err)
	}
	return out, nil
}

// diffPaths returns the paths of cur that are new or changed since prev (with every
// parent directory, so an upper layer's directory keeps its real mode) and the paths of
// prev gone from cur whose parent still exists (one whiteout covers a removed tree).
func diffPaths(prev, cur map[string]node) (changed, removed []string) {
	set := map[string]bool{}
	for p, n := range cur {
		if o, ok := prev[p]; ok && o == n {
			continue
		}
		set[p] = true
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			set[d] = true
		}
	}
	for p := range prev {
		if _, ok := cur[p]; ok {
			continue
		}
		if d := path.Dir(p); d == "." || cur[d] != (node{}) {
			removed = append(removed, p)
			set[path.Dir(p)] = true
		}
	}
	delete(set, ".")
	for p := range set {
		changed = append(changed, p)
	}
	sort.Strings(changed)
	sort.Strings(removed)
	return changed, removed
}

// diffLayer is the layer that turns tree prev into tree cur (files read from root).
// It is written to file at once: later steps change files of the tree (dpkg's status,
// caches), so a layer read back from root at the end would not match its digest.
func diffLayer(root string, prev, cur map[string]node, file string) (blob, error) {
	changed, removed := diffPaths(prev, cur)
	var files []tarFile
	for _, p := range changed {
		files = append(files, fileEntry(root, p, cur[p]))
	}
	for _, p := range removed {
		files = append(files, tarFile{path: path.Join(path.Dir(p), ".wh."+path.Base(p)), mode: 0o644, typ: tar.TypeReg, data: []byte{}})
	}
	b, err := layerTar(files)
	if err != nil {
		return blob{}, err
	}
	f, err := os.Create(file)
	if err != nil {
		return blob{}, fmt.Errorf("images: %w", err)
	}
	h := sha256.New()
	err = b.gen(io.MultiWriter(f, h))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return blob{}, fmt.Errorf("images: writing layer %s: %w", file, err)
	}
	// The tree could change between layerTar's hashing pass and this one.
	if d := "sha256:" + hex.EncodeToString(h.Sum(nil)); d != b.digest {
		return blob{}, fmt.Errorf("images: layer %s changed while it was written (%s, then %s)", file, b.digest, d)
	}
	return blob{digest: b.digest, size: b.size, gen: func(w io.Writer) error {
		r, err := os.Open(file)
		if err != nil {
			return err
		}
		defer r.Close()
		_, err = io.Copy(w, r)
		return err
	}}, nil
}

func fileEntry(root, p string, n node) tarFile {
	mode := int64(n.mode.Perm())
	if n.mode&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if n.mode&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if n.mode&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	f := tarFile{path: p, mode: mode, uid: n.uid, gid: n.gid}
	switch {
	case n.mode.IsDir():
		f.typ = tar.TypeDir
	case n.mode&fs.ModeSymlink != 0:
		f.typ, f.link = tar.TypeSymlink, n.link
	default:
		full := filepath.Join(root, filepath.FromSlash(p))
		f.typ, f.size = tar.TypeReg, n.size
		f.gen = func(w io.Writer) error {
			r, err := os.Open(full)
			if err != nil {
				return err
			}
			defer r.Close()
			if _, err := io.CopyN(w, r, n.size); err != nil {
				return fmt.Errorf("%s: %w", full, err)
			}
			return nil
		}
	}
	return f
}
