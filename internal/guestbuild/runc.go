package guestbuild

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/socialweb-computer/socialweb/internal/nodeimage"
)

// DefaultRuncVersion is the runc release Runc builds for the guests.
const DefaultRuncVersion = "v1.4.4"

// GuestRunc is where the node image carries the runc Runc builds; the agent points
// containerd's runc shim at it (agent.Config.OCIRuntimes).
const GuestRunc = "/usr/local/sbin/runc"

// RuncTags are runc's build tags: seccomp (containerd gives every sandbox a seccomp
// profile, and Pods ask for RuntimeDefault), with pure-Go user and network lookups so
// it links static.
var RuncTags = []string{"seccomp", "urfave_cli_no_docs", "netgo", "osusergo"}

// runcStaticLib is a C library linked into runc (its contents are a build input) and
// the Debian package that has it.
type runcStaticLib struct{ file, pkg string }

func runcStaticLibs() []runcStaticLib {
	return []runcStaticLib{{"libseccomp.a", "libseccomp-dev"}, {"libc.a", "libc6-dev"}}
}

// Runc returns runc of version, built with `go install ...@version` into
// <cacheDir>/runc/<version>-<key>/ unless that holds it already. runc needs cgo (its
// nsenter is C), so unlike the other guest programs it is linked static with glibc and
// libseccomp, not built without cgo; static and not position independent, its code sits
// at the same addresses in every run, which a TCG guest translates once. The key covers
// the Go version, the tags and flags, the C compiler's version and the static
// libraries' contents.
func (b Builder) Runc(ctx context.Context, cacheDir, version string) (string, error) {
	if !strings.HasPrefix(version, "v1.") {
		return "", fmt.Errorf("runc %s: want a 1.x release like %s", version, DefaultRuncVersion)
	}
	goVersion, err := b.run(ctx, os.TempDir(), nil, "env", "GOVERSION")
	if err != nil {
		return "", err
	}
	cc, libs, err := cToolchain(ctx)
	if err != nil {
		return "", fmt.Errorf("building runc %s: %w", version, err)
	}
	const pkg = "github.com/opencontainers/runc"
	tags := strings.Join(RuncTags, " ")
	ld := "-s -w -linkmode external -extldflags -static"
	sum := sha256.Sum256([]byte(strings.Join([]string{version, strings.TrimSpace(goVersion), tags, ld, cc, libs}, "\n")))
	key := version + "-" + hex.EncodeToString(sum[:])[:12]
	dir, err := b.cachedBuild(ctx, filepath.Join(cacheDir, "runc"), key, []string{"runc"}, func(bin string) error {
		env := []string{"CGO_ENABLED=1", "GOBIN=" + bin, "GOWORK=off", "GOFLAGS=", "GOTOOLCHAIN=local"}
		b.progress("building runc %s from the module proxy (static, cgo, tags %s)", version, tags)
		_, err := b.run(ctx, bin, env, "install", "-trimpath", "-tags", tags, "-ldflags", ld, pkg+"@"+version)
		return err
	})
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "runc"), nil
}

// cToolchain describes what cgo links runc with: the C compiler's version, and the path
// and SHA-256 of each static library in runcStaticLibs. A missing library is an error
// that says which Debian package has it.
func cToolchain(ctx context.Context) (cc, libs string, err error) {
	gcc := os.Getenv("CC")
	if gcc == "" {
		gcc = "gcc"
	}
	v, err := exec.CommandContext(ctx, gcc, "-dumpfullversion").Output()
	if err != nil {
		return "", "", fmt.Errorf("runc is built with cgo and needs a C compiler (%s: %v): apt-get install build-essential, or run hack/deps", gcc, err)
	}
	cc = gcc + " " + strings.TrimSpace(string(v))
	var b strings.Builder
	for _, lib := range runcStaticLibs() {
		p, err := exec.CommandContext(ctx, gcc, "-print-file-name="+lib.file).Output()
		path := strings.TrimSpace(string(p))
		if err != nil || !filepath.IsAbs(path) {
			return "", "", fmt.Errorf("runc links %s static, which %s does not find: apt-get install %s, or run hack/deps", lib.file, gcc, lib.pkg)
		}
		h, _, err := nodeimage.SHA256File(path)
		if err != nil {
			return "", "", fmt.Errorf("hashing %s: %w", path, err)
		}
		fmt.Fprintf(&b, "%s %s\n", path, h)
	}
	return cc, b.String(), nil
}
