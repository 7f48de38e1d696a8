package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/socialweb-computer/socialweb/internal/images"
)

// The references the e2e suite of k8s.io/kubernetes v1.37.2 pulls
// (test/utils/image/manifest.go), for the images this program provides.
const (
	agnhostRef     = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	agnhostPrevRef = "registry.k8s.io/e2e-test-images/agnhost:2.55"
	glibcDNSRef    = "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1"
	busyboxRef     = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"
	nonewprivsRef  = "registry.k8s.io/e2e-test-images/nonewprivs:1.4"
	// The node's sandbox image is registry.k8s.io/pause:3.10 (internal/agent); the suite
	// also runs pause:3.10.2 as a container image.
	pauseRef = "registry.k8s.io/pause:3.10.2"
	// The Aggregator test's Pod: the sample apiserver and the etcd it stores in.
	sampleAPIServerRef = "registry.k8s.io/e2e-test-images/sample-apiserver:1.29.2"
	etcdRef            = "registry.k8s.io/etcd:3.7.0-0"
)

// testImage is one OCI layout tar to push into the host registry, under refs.
type testImage struct {
	name   string
	tar    string
	digest string
	refs   []string
	took   time.Duration
}

// missingImage is an image some in-focus conformance tests run that this program does
// not build; the tests that need it are skipped, with the reason, in the run.
type missingImage struct {
	ref    string
	reason string
	// tests are regular expressions (ginkgo --ginkgo.skip) of the tests that need it.
	tests []string
}

// missingImages are the images in-focus conformance tests of sig-network, sig-node and
// sig-api-machinery need and that are not built here. Found by reading the tests the
// focus selects (the dry run) against their imageutils references.
func missingImages() []missingImage {
	return []missingImage{
		{ref: "registry.k8s.io/e2e-test-images/kitten:1.8", reason: "the test reads the image's /etc/os-release and wants Alpine Linux; images here are Debian",
			tests: []string{`\[sig-node\] ImageVolume should succeed with pod and pull policy of Always`}},
	}
}

// The e2e suite's nginx images (Nginx, NginxNew): one Debian nginx image under both.
const (
	nginxRef    = "registry.k8s.io/e2e-test-images/nginx:1.27.0-2"
	nginxNewRef = "registry.k8s.io/e2e-test-images/nginx:1.28.0-2"
)

// agnhostSpec is the agnhost image: upstream's is alpine with bind-tools, curl,
// netcat-openbsd, iproute2, iperf, bash (test/images/agnhost/Dockerfile); ours is Debian
// with the same tools and the agnhost of this k8s.io/kubernetes, so its dig, nc and
// shell are glibc's and dash rather than musl's and busybox's.
func agnhostSpec(bins binaries, kubeDir string) images.DebianSpec {
	porter := filepath.Join(kubeDir, "test", "images", "agnhost", "porter")
	return images.DebianSpec{
		Name: "e2e-agnhost",
		Refs: []string{agnhostRef, agnhostPrevRef},
		Layers: []images.PackageLayer{
			// The DNS probes run `dig +search` loops; the Service tests curl, wget (a
			// busybox applet upstream) and nc; NodePort tests ss.
			{Name: "network tools", Packages: []string{"bind9-dnsutils", "curl", "wget", "netcat-openbsd", "iproute2", "bash", "ca-certificates", "iputils-ping", "procps"}},
			// A user and group the image defines, as upstream's (supplemental groups tests).
			{Name: "image user", Script: "groupadd -g 50000 group-defined-in-image; " +
				"useradd -u 1000 -U -m -s /bin/sh -G group-defined-in-image user-defined-in-image"},
		},
		Files: []images.File{
			{Path: "agnhost", HostPath: bins.Agnhost, Mode: 0o755},
			// The entrypoint tests run /agnhost-2 to tell an overridden command apart.
			{Path: "agnhost-2", Link: "agnhost"},
			{Path: "uploads", Dir: true},
			// porter's TLS port serves these.
			{Path: "localhost.crt", HostPath: filepath.Join(porter, "localhost.crt")},
			{Path: "localhost.key", HostPath: filepath.Join(porter, "localhost.key")},
		},
		Entrypoint: []string{"/agnhost"},
		Cmd:        []string{"pause"},
		Labels: map[string]string{"computer.socialweb.image.source": "bench/conformance: Debian + agnhost of k8s.io/kubernetes " + bins.KubeVersion,
			"computer.socialweb.image.libc": "glibc (upstream's agnhost is alpine, musl)"},
	}
}

// nonewprivsSpec is the nonewprivs image: upstream's is alpine with a setuid-root
// /usr/local/bin/nnp that prints its effective uid (the AllowPrivilegeEscalation tests).
// The static nnp is all the tests run, so the image is nnp alone.
func nonewprivsSpec(bins binaries) images.DebianSpec {
	return images.DebianSpec{
		Name:    "e2e-nonewprivs",
		Refs:    []string{nonewprivsRef},
		Scratch: true,
		Files:   []images.File{{Path: "usr/local/bin/nnp", HostPath: bins.NNP, Mode: 0o4755}},
		Cmd:     []string{"nnp"},
		Labels:  map[string]string{"computer.socialweb.image.source": "bench/conformance: nnp of k8s.io/kubernetes " + bins.KubeVersion},
	}
}

// sampleAPIServerSpec is the sample-apiserver image: upstream's is alpine with
// /sample-apiserver as the entrypoint (test/images/sample-apiserver); the test gives the
// container arguments only. The static program is all it runs: it serves the
// certificate the test mounts, stores in the etcd beside it, and reaches the apiserver
// with the Pod's service-account token and CA. /tmp is there for anything that wants
// a temporary file.
func sampleAPIServerSpec(bins binaries) images.DebianSpec {
	return images.DebianSpec{
		Name:    "e2e-sample-apiserver",
		Refs:    []string{sampleAPIServerRef},
		Scratch: true,
		Files: []images.File{
			{Path: "sample-apiserver", HostPath: bins.SampleAPIServer, Mode: 0o755},
			{Path: "tmp", Dir: true, Mode: 0o1777},
		},
		Entrypoint: []string{"/sample-apiserver"},
		Labels:     map[string]string{"computer.socialweb.image.source": "bench/conformance: k8s.io/sample-apiserver of k8s.io/kubernetes " + bins.KubeVersion},
	}
}

// etcdSpec is the etcd image under the name the suite asks for: the test runs
// /usr/local/bin/etcd with client URLs on loopback and the defaults otherwise (its data
// in default.etcd under the working directory). Upstream's etcd image is distroless
// with etcd, etcdctl and etcdutl; the test runs etcd alone. The etcd is the one this
// module's graph selects (the 3.7 series that k8s.io/kubernetes requires), whatever the
// tag's patch version.
func etcdSpec(bins binaries) images.DebianSpec {
	return images.DebianSpec{
		Name:    "e2e-etcd",
		Refs:    []string{etcdRef},
		Scratch: true,
		Files: []images.File{
			{Path: "usr/local/bin/etcd", HostPath: bins.Etcd, Mode: 0o755},
			{Path: "tmp", Dir: true, Mode: 0o1777},
			{Path: "var/lib/etcd", Dir: true, Mode: 0o700},
		},
		WorkingDir: "/var/lib/etcd",
		Cmd:        []string{"/usr/local/bin/etcd"},
		Labels:     map[string]string{"computer.socialweb.image.source": "bench/conformance: go.etcd.io/etcd/server/v3 " + bins.EtcdVersion},
	}
}

// otherSpecs are the Debian images that need no Go-built binary, so they can be built
// while the e2e suite compiles.
func otherSpecs() []images.DebianSpec {
	return []images.DebianSpec{
		{
			Name: "e2e-glibc-dns-testing",
			Refs: []string{glibcDNSRef},
			// Upstream: debian:bookworm-slim plus dnsutils; the DNS tests' glibc prober.
			Layers: []images.PackageLayer{{Name: "dns tools", Packages: []string{"bind9-dnsutils"}}},
			Cmd:    []string{"bash"},
			Labels: map[string]string{"computer.socialweb.image.source": "bench/conformance: Debian + bind9-dnsutils"},
		},
		{
			Name: "e2e-nginx",
			Refs: []string{nginxRef, nginxNewRef},
			// Upstream: nginx's own image, serving its welcome page on port 80. Debian's
			// default site also listens on [::]:80, which fails where IPv6 is off (the
			// nodes' guests), so that line goes.
			Layers: []images.PackageLayer{{Name: "nginx", Packages: []string{"nginx"},
				Script: "sed -i '/listen \\[::\\]:80/d' /etc/nginx/sites-available/default"}},
			Files: []images.File{
				// Logs to the container's output, as upstream's.
				{Path: "var/log/nginx", Dir: true},
				{Path: "var/log/nginx/access.log", Link: "/dev/stdout"},
				{Path: "var/log/nginx/error.log", Link: "/dev/stderr"},
			},
			Cmd:    []string{"nginx", "-g", "daemon off;"},
			Labels: map[string]string{"computer.socialweb.image.source": "bench/conformance: Debian nginx"},
		},
	}
}

// buildImages builds (or takes from the cache) the Debian images specs and, with
// withOwn, socialweb's busybox (the variant whose sh is bash: the envFrom-prefix tests
// need upstream ash's passing of variables that are not identifiers, which Debian's
// busybox drops) and pause, which are pushed under the e2e suite's names as well.
func buildImages(ctx context.Context, specs []images.DebianSpec, withOwn bool, opts images.Options, log *slog.Logger) ([]testImage, error) {
	var out []testImage
	for _, s := range specs {
		t0 := time.Now()
		tarPath, digest, err := images.Debian(ctx, s, opts)
		if err != nil {
			return nil, fmt.Errorf("building the %s image: %w", s.Name, err)
		}
		out = append(out, testImage{name: s.Name, tar: tarPath, digest: digest, refs: s.Refs, took: time.Since(t0)})
	}
	if withOwn {
		for _, b := range []struct {
			name string
			ref  string
		}{{images.BusyboxBash, busyboxRef}, {images.Pause, pauseRef}} {
			t0 := time.Now()
			tarPath, digest, err := images.Build(ctx, b.name, opts)
			if err != nil {
				return nil, fmt.Errorf("building the %s image: %w", b.name, err)
			}
			// Pushed with --ref under the suite's name and its own (the daemon seeds those
			// too, but in the background: the placeholder Pods must not wait for it).
			refs := append(append([]string{}, images.Refs[b.name]...), b.ref)
			out = append(out, testImage{name: b.name, tar: tarPath, digest: digest, refs: refs, took: time.Since(t0)})
		}
	}
	for _, im := range out {
		st, err := os.Stat(im.tar)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", im.name, err)
		}
		log.Info("test image ready", "image", im.name, "refs", strings.Join(im.refs, ","), "digest", im.digest,
			"MiB", fmt.Sprintf("%.1f", float64(st.Size())/(1<<20)), "took", im.took.Round(time.Millisecond), "tar", im.tar)
	}
	return out, nil
}
