// Package guestbuild builds, on the host, the programs a node image carries
// besides its Debian packages: the node agent (cmd/socialweb-node, with the
// kubelet in it) and containerd 2.x with its runc shim. Everything is built
// static (CGO_ENABLED=0), because it runs in a guest whose libc is whatever
// debootstrap installed.
//
// The agent is built from this module's source tree with the Kubernetes
// version stamped in (as hack/build does for the host binary), so the kubelet
// reports v1.37.x. containerd is built from the Go module proxy with `go
// install <pkg>@<version>`, i.e. with containerd's own go.mod, not ours, and
// cached by version and build flags.
//
// Both share the machine's Go build cache: a cold agent build compiles the
// kubelet (10-15 minutes on two cores), a warm one links in seconds.
package guestbuild

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/socialweb-computer/socialweb/internal/filelock"
)

// ModulePath is the module the agent is built from.
const ModulePath = "github.com/socialweb-computer/socialweb"

// AgentPackage is the agent's main package.
const AgentPackage = ModulePath + "/cmd/socialweb-node"

// Guest paths of what this package builds (nodeimage.Options.ExtraFiles keys).
const (
	GuestAgent      = "/usr/local/bin/socialweb-node"
	GuestContainerd = "/usr/local/bin/containerd"
	GuestShim       = "/usr/local/bin/containerd-shim-runc-v2"
	// GuestSandboxImage is the sandbox (pause) image's OCI layout tar, which the
	// agent imports into containerd before the kubelet runs (agent.Layout's
	// SandboxImageArchive).
	GuestSandboxImage = "/usr/local/share/socialweb/sandbox-image.oci.tar"
)

// DefaultContainerdVersion is the containerd release Containerd builds.
const DefaultContainerdVersion = "v2.4.2"

// ContainerdTags are the build tags of a static containerd without cgo
// (compare containerd's Makefile with STATIC=1): no btrfs (needs cgo), no
// devmapper and zfs snapshotters (no tools for them in the guest), pure-Go
// user and network lookups.
var ContainerdTags = []string{"urfave_cli_no_docs", "osusergo", "netgo", "static_build", "no_btrfs", "no_devmapper", "no_zfs"}

// Builder runs the builds. The zero value builds from the module that
// contains the working directory, with the go on PATH.
type Builder struct {
	// ModuleDir is the root of this module's source tree; "" finds it from
	// the working directory upwards.
	ModuleDir string
	// Go is the go command; "" is "go" from PATH.
	Go string
	// Progress receives one line per notable event; nil discards.
	Progress func(msg string)
}

func (b Builder) goCmd() string {
	if b.Go != "" {
		return b.Go
	}
	return "go"
}

func (b Builder) progress(format string, a ...any) {
	if b.Progress != nil {
		b.Progress(fmt.Sprintf(format, a...))
	}
}

// moduleDir finds the directory of go.mod declaring ModulePath.
func (b Builder) moduleDir() (string, error) {
	if b.ModuleDir != "" {
		return b.ModuleDir, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(data, []byte("module "+ModulePath+"\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("building the node agent needs the %s source tree: run from inside it or set Builder.ModuleDir", ModulePath)
		}
		dir = parent
	}
}

func (b Builder) run(ctx context.Context, dir string, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, b.goCmd(), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// VersionLDFlags are the -X flags that stamp a Kubernetes version (e.g.
// v1.37.2) into component-base and client-go, as hack/build does.
func VersionLDFlags(kubeVersion string) (string, error) {
	parts := strings.SplitN(strings.TrimPrefix(kubeVersion, "v"), ".", 3)
	if !strings.HasPrefix(kubeVersion, "v") || len(parts) < 2 || parts[0] == "" || parts[1] == "" {
		return "", fmt.Errorf("%q is not a Kubernetes version like v1.37.2", kubeVersion)
	}
	var f []string
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		f = append(f, "-X", pkg+".gitVersion="+kubeVersion, "-X", pkg+".gitMajor="+parts[0],
			"-X", pkg+".gitMinor="+parts[1], "-X", pkg+".gitTreeState=clean")
	}
	return strings.Join(f, " "), nil
}

// Agent builds cmd/socialweb-node, static, to outPath.
func Agent(ctx context.Context, outPath string) error { return Builder{}.Agent(ctx, outPath) }

// Agent builds cmd/socialweb-node, static and stripped, with the version of
// k8s.io/kubernetes in go.mod stamped in, to outPath (written atomically).
func (b Builder) Agent(ctx context.Context, outPath string) error {
	dir, err := b.moduleDir()
	if err != nil {
		return err
	}
	out, err := b.run(ctx, dir, nil, "list", "-m", "-f", "{{.Version}}", "k8s.io/kubernetes")
	if err != nil {
		return err
	}
	kver := strings.TrimSpace(out)
	ld, err := VersionLDFlags(kver)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(outPath), 0o755); err != nil {
		return err
	}
	tmp := outPath + ".tmp"
	defer os.Remove(tmp)
	t0 := time.Now()
	b.progress("building %s (Kubernetes %s, static); a cold build compiles the kubelet and takes 10-15 minutes", AgentPackage, kver)
	// No -trimpath or tags: the flags match a plain CGO_ENABLED=0 build of
	// the kubelet, so the two share the build cache.
	if _, err := b.run(ctx, dir, []string{"CGO_ENABLED=0", "GOWORK=off"},
		"build", "-ldflags", "-s -w "+ld, "-o", tmp, "./cmd/socialweb-node"); err != nil {
		return err
	}
	if err := CheckStatic(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, outPath); err != nil {
		return err
	}
	b.progress("built %s in %s", outPath, time.Since(t0).Round(time.Millisecond))
	return nil
}

// ContainerdBinaries are a cached containerd build.
type ContainerdBinaries struct {
	Version    string
	Containerd string // host path
	Shim       string // host path of containerd-shim-runc-v2
}

// ExtraFiles maps the guest paths to the host paths, for
// nodeimage.Options.ExtraFiles.
func (c ContainerdBinaries) ExtraFiles() map[string]string {
	return map[string]string{GuestContainerd: c.Containerd, GuestShim: c.Shim}
}

// Containerd builds DefaultContainerdVersion into cacheDir (or returns the
// cached build).
func Containerd(ctx context.Context, cacheDir string) (ContainerdBinaries, error) {
	return Builder{}.Containerd(ctx, cacheDir, DefaultContainerdVersion)
}

// Containerd returns containerd and containerd-shim-runc-v2 of version,
// static, building them with `go install ...@version` into
// <cacheDir>/containerd/<version>-<key>/ unless that holds them already.
// The key covers the Go version and the build flags.
func (b Builder) Containerd(ctx context.Context, cacheDir, version string) (ContainerdBinaries, error) {
	if !strings.HasPrefix(version, "v2.") {
		return ContainerdBinaries{}, fmt.Errorf("containerd %s: only 2.x releases are built (the Debian package covers 1.x)", version)
	}
	goVersion, err := b.run(ctx, os.TempDir(), nil, "env", "GOVERSION")
	if err != nil {
		return ContainerdBinaries{}, err
	}
	const pkg = "github.com/containerd/containerd/v2"
	tags := strings.Join(ContainerdTags, " ")
	shimTags := tags + " no_grpc"
	ld := "-s -w -X " + pkg + "/version.Version=" + version + " -X " + pkg + "/version.Package=" + pkg
	sum := sha256.Sum256([]byte(strings.Join([]string{version, strings.TrimSpace(goVersion), tags, shimTags, ld}, "\n")))
	key := version + "-" + hex.EncodeToString(sum[:])[:12]
	res := ContainerdBinaries{Version: version}
	dir, err := b.cachedBuild(ctx, filepath.Join(cacheDir, "containerd"), key, []string{"containerd", "containerd-shim-runc-v2"}, func(bin string) error {
		// Outside any module, with containerd's go.mod; GOTOOLCHAIN=local so a
		// newer go directive fails here instead of downloading a toolchain.
		env := []string{"CGO_ENABLED=0", "GOBIN=" + bin, "GOWORK=off", "GOFLAGS=", "GOTOOLCHAIN=local"}
		b.progress("building containerd %s from the module proxy (static, tags %s); takes several minutes cold", version, tags)
		if _, err := b.run(ctx, bin, env, "install", "-trimpath", "-tags", tags, "-ldflags", ld, pkg+"/cmd/containerd@"+version); err != nil {
			return err
		}
		_, err := b.run(ctx, bin, env, "install", "-trimpath", "-tags", shimTags, "-ldflags", ld, pkg+"/cmd/containerd-shim-runc-v2@"+version)
		return err
	})
	if err != nil {
		return res, err
	}
	res.Containerd, res.Shim = filepath.Join(dir, "containerd"), filepath.Join(dir, "containerd-shim-runc-v2")
	return res, nil
}

// cachedBuild returns <base>/<key>, where build has put files (executables, each
// checked static), building them unless that directory holds them already. build
// installs into the directory it is given (empty, outside any module); one build per
// key runs at a time, also across processes, and a failed one leaves nothing.
func (b Builder) cachedBuild(ctx context.Context, base, key string, files []string, build func(bin string) error) (string, error) {
	final := filepath.Join(base, key)
	complete := func() bool {
		for _, f := range files {
			if st, err := os.Stat(filepath.Join(final, f)); err != nil || !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
				return false
			}
		}
		return true
	}
	if complete() {
		b.progress("using cached %s in %s", strings.Join(files, ", "), final)
		return final, nil
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", err
	}
	unlock, err := filelock.Wait(ctx, filepath.Join(base, "."+key+".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if complete() {
		return final, nil
	}
	tmp, err := os.MkdirTemp(base, ".build-"+key+"-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		return "", err
	}
	t0 := time.Now()
	if err := build(bin); err != nil {
		return "", err
	}
	for _, f := range files {
		if err := CheckStatic(filepath.Join(bin, f)); err != nil {
			return "", err
		}
	}
	if err := os.RemoveAll(final); err != nil {
		return "", err
	}
	if err := os.Rename(bin, final); err != nil {
		return "", err
	}
	b.progress("built %s in %s", strings.Join(files, ", "), time.Since(t0).Round(time.Second))
	return final, nil
}
