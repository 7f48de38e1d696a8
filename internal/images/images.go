// Package images builds, on the host and without any registry, the container images
// socialweb's nodes need, as OCI image layout tars that internal/registry imports:
//
//   - pause (registry.k8s.io/pause:3.10): one static binary, /pause, built from the Go
//     program in ./pause (CGO_ENABLED=0 with the host's Go toolchain). It sleeps until
//     SIGTERM or SIGINT and reaps zombies, like the upstream C program. Go rather than
//     busybox: no busybox applet exits on SIGTERM as PID 1 and reaps, a shell loop would
//     need a 1 MB busybox plus a script, and the Go toolchain is already on any host that
//     builds socialweb (Options.Go names it). Entrypoint ["/pause"], User 65535:65535,
//     like upstream.
//   - busybox (docker.io/library/busybox:stable and :latest): Debian's busybox-static,
//     fetched with apt-get download and unpacked with dpkg-deb -x (it need not be
//     installed on the host); one layer with /bin/busybox, a /bin symlink per applet
//     (busybox --list), /usr/bin/env, minimal /etc/passwd and /etc/group, /tmp (1777),
//     /root, /home, /var; Cmd ["sh"].
//   - Large (socialweb.test/large:<n>mib): busybox plus n MiB of seeded random data in
//     /data, for pull tests of big images.
//   - Builder and Debian: images debootstrapped from Debian packages, layer by layer, plus
//     host files (builder.go, debian.go); Debian takes a DebianSpec (bench/conformance
//     makes the e2e test images with it).
//
// Builds are reproducible: layers are uncompressed tars (media type
// application/vnd.oci.image.layer.v1.tar, so digest == diff_id) with sorted entries,
// uid/gid 0 and every time set to the Unix epoch; configs and manifests are JSON of
// structs. Building the same inputs twice gives the same manifest digest. A build is
// cached by a fingerprint of its inputs (format version, architecture, references, and the
// Debian package version or the Go version and pause source hash):
//
//	<CacheDir>/<image>-<fingerprint[:16]>.tar    the OCI layout tar
//	<CacheDir>/<image>-<fingerprint[:16]>.json   digest, references and inputs
//	<CacheDir>/debs/*.deb                        downloaded Debian packages
//
// CacheDir defaults to $XDG_CACHE_HOME/socialweb/images-oci (~/.cache/... when unset).
package images

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/socialweb-computer/socialweb/internal/atomicfile"
)

// FormatVersion changes whenever the image layout this package writes changes, so cached
// builds of an older layout are not reused.
const FormatVersion = 1

// Image names Build accepts, and the references each is tagged with.
const (
	Pause   = "pause"
	Busybox = "busybox"
	// BusyboxBash is busybox with bash-static as /bin/sh, for suites that need the
	// environment passing of upstream's busybox (see busyboxBashFiles).
	BusyboxBash = "busybox-bash"
)

// Builtin are the images every registry is seeded with (nodes pull the pause image
// for every Pod; busybox for the demo and the tests).
func Builtin() []string { return []string{Pause, Busybox} }

// Refs are the references each image is tagged with in its layout's index.json (and so
// in the registry after Import).
var Refs = map[string][]string{
	Pause:       {"registry.k8s.io/pause:3.10"},
	Busybox:     {"docker.io/library/busybox:stable", "docker.io/library/busybox:latest"},
	BusyboxBash: {"socialweb.test/busybox-bash:latest"},
}

// Options tune Build and Large.
type Options struct {
	// CacheDir holds built layouts and downloaded packages; DefaultCacheDir() if empty.
	CacheDir string
	// Go is the go command that builds pause; "go" from PATH if empty.
	Go string
	// Rebuild ignores a cached layout (downloaded packages are still reused).
	Rebuild bool
	// Logger receives progress; slog.Default() if nil.
	Logger *slog.Logger
}

// DefaultCacheDir is $XDG_CACHE_HOME/socialweb/images-oci, or ~/.cache/socialweb/images-oci
// (os.UserCacheDir), or /var/cache/socialweb/images-oci when neither is known.
func DefaultCacheDir() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "socialweb", "images-oci")
	}
	return "/var/cache/socialweb/images-oci"
}

func (o Options) cacheDir() string {
	if o.CacheDir != "" {
		return o.CacheDir
	}
	return DefaultCacheDir()
}

func (o Options) log() *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	return slog.Default()
}

// record is the .json beside a cached layout.
type record struct {
	Digest  string   `json:"digest"`
	Refs    []string `json:"refs"`
	TarSize int64    `json:"tarSize"`
	Inputs  any      `json:"inputs"`
}

// Build returns the OCI layout tar of image name ("pause" or "busybox", or one of their
// references) and its manifest digest, building it unless the cache holds a build with
// the same fingerprint.
func Build(ctx context.Context, name string, opts Options) (tarPath, digest string, err error) {
	name = canonicalImage(name)
	switch name {
	case Pause:
		in, err := pauseInputs(ctx, opts)
		if err != nil {
			return "", "", err
		}
		return cached(ctx, Pause, in, Refs[Pause], opts, func(ctx context.Context, work string) (imageSpec, error) {
			return pauseImage(ctx, work, in, opts)
		})
	case Busybox:
		in, err := busyboxInputs(ctx)
		if err != nil {
			return "", "", err
		}
		return cached(ctx, Busybox, in, Refs[Busybox], opts, func(ctx context.Context, work string) (imageSpec, error) {
			return busyboxImage(ctx, work, in, opts)
		})
	case BusyboxBash:
		in, err := busyboxBashInputs(ctx)
		if err != nil {
			return "", "", err
		}
		return cached(ctx, BusyboxBash, in, Refs[BusyboxBash], opts, func(ctx context.Context, work string) (imageSpec, error) {
			return busyboxBashImage(ctx, work, in, opts)
		})
	}
	return "", "", fmt.Errorf("images: unknown image %q (known: %s, %s, %s)", name, Pause, Busybox, BusyboxBash)
}

func canonicalImage(name string) string {
	for n, refs := range Refs {
		for _, r := range refs {
			if name == r {
				return n
			}
		}
	}
	return name
}

// cached returns the layout of image for inputs in from the cache, or builds it with
// build in a scratch directory and caches it.
func cached(ctx context.Context, image string, in any, refs []string, opts Options, build func(context.Context, string) (imageSpec, error)) (string, string, error) {
	fpInput, err := json.Marshal(struct {
		Format int      `json:"format"`
		Image  string   `json:"image"`
		Arch   string   `json:"arch"`
		Refs   []string `json:"refs"`
		Inputs any      `json:"inputs"`
	}{FormatVersion, image, runtime.GOARCH, refs, in})
	if err != nil {
		return "", "", err
	}
	sum := sha256.Sum256(fpInput)
	fp := hex.EncodeToString(sum[:])
	dir := opts.cacheDir()
	base := filepath.Join(dir, image+"-"+fp[:16])
	tarPath, recPath := base+".tar", base+".json"
	log := opts.log()
	if !opts.Rebuild {
		if rec, ok := readRecord(recPath, tarPath); ok {
			log.Debug("image cached", "image", image, "digest", rec.Digest, "path", tarPath)
			return tarPath, rec.Digest, nil
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("images: %w", err)
	}
	work, err := os.MkdirTemp(dir, ".build-"+image+"-")
	if err != nil {
		return "", "", fmt.Errorf("images: %w", err)
	}
	defer os.RemoveAll(work)
	log.Info("building image", "image", image, "fingerprint", fp[:16])
	spec, err := build(ctx, work)
	if err != nil {
		return "", "", err
	}
	spec.arch, spec.refs = runtime.GOARCH, refs
	digest, err := writeLayout(tarPath, spec)
	if err != nil {
		return "", "", err
	}
	st, err := os.Stat(tarPath)
	if err != nil {
		return "", "", err
	}
	rb, _ := json.MarshalIndent(record{Digest: digest, Refs: refs, TarSize: st.Size(), Inputs: in}, "", "  ")
	if err := atomicfile.Write(recPath, append(rb, '\n'), 0o644); err != nil {
		return "", "", err
	}
	log.Info("image built", "image", image, "digest", digest, "path", tarPath, "bytes", st.Size())
	return tarPath, digest, nil
}

func readRecord(recPath, tarPath string) (record, bool) {
	var rec record
	b, err := os.ReadFile(recPath)
	if err != nil || json.Unmarshal(b, &rec) != nil || !strings.HasPrefix(rec.Digest, "sha256:") {
		return rec, false
	}
	st, err := os.Stat(tarPath)
	return rec, err == nil && st.Size() == rec.TarSize
}

// errNoTool marks a missing host tool (the go command, apt-get, dpkg-deb).
var errNoTool = errors.New("missing host tool")
