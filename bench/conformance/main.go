// Command conformance runs the Kubernetes e2e conformance suite against a fresh tenant
// cluster of a fresh daemon (issue 14, part 2).
//
// It builds, from the k8s.io/kubernetes module at the version go.mod pins, e2e.test,
// agnhost, nnp and kubectl, and sample-apiserver (k8s.io/sample-apiserver of that release)
// and etcd (go.etcd.io/etcd/server/v3 as the module graph has it) (go test -c / go build
// with a copy of go.mod and go.sum, so the repository's own are never edited), and the
// test images the in-focus tests pull: agnhost, glibc-dns-testing and nginx as Debian
// images (internal/images.Debian), agnhost's with the Go-built agnhost, nonewprivs,
// sample-apiserver and etcd as their static program alone, busybox and pause as
// socialweb's own. Binaries and images are cached by a fingerprint of their inputs
// (<cache>/socialweb/conformance, <cache>/socialweb/images-oci), so a second run builds
// nothing. Then it pushes the images into the host registry of a new state dir under the
// names the suite asks for, starts `socialweb serve` there, creates a cluster, runs
// e2e.test against its admin kubeconfig and prints
//
//	conformance: N passed, M failed
//	skipped: ...
//	FAILED: <name>          (one line per failure)
//
// Modes:
//
//	-mode api     a cluster at zero nodes: the [sig-api-machinery] conformance tests; the
//	              ones that run a Pod get up to -nodes nodes booted for them
//	-mode nodes   -nodes N nodes booted first and kept up by a placeholder Deployment of
//	              N pause Pods with required hostname anti-affinity: [sig-network] and
//	              [sig-node] conformance
//	-focus REGEX  replaces the mode's focus (e.g. 'DNS|Services'); the label filter
//	              (Conformance, not Serial, Slow or Disruptive) and the skips still apply
//
// Tests that need an image not built here are skipped with the reason (missingImages). The daemon is always stopped and `socialweb down`
// run on the state dir at the end, also on failure and on SIGINT/SIGTERM.
//
//	go run ./bench/conformance -bin bin/socialweb -image DIR [-mode api|nodes] [-focus RE] [-nodes 2]
//	go run ./bench/conformance -build-only     # build and cache everything, print paths
//	go run ./bench/conformance -dry-run        # list the tests the mode selects (no cluster)
//
// The exit status is non-zero only when the run could not happen (a build, the daemon,
// the cluster, the nodes, or e2e.test that ran no test); failed tests are in the output.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/socialweb-computer/socialweb/internal/images"
	"github.com/socialweb-computer/socialweb/internal/nodeimage"
)

// config is the command line.
type config struct {
	mode       string
	focus      string
	nodes      int
	procs      int
	nodeCPUs   int
	nodeMemory string
	timeout    time.Duration
	nodeWait   time.Duration
	bin        string
	image      string
	out        string
	goCmd      string
	buildOnly  bool
	dryRun     bool
	keepState  bool
}

// envOr is the environment variable name's value, or def when it is unset: the flags
// that are user-facing knobs take their defaults from SOCIALWEB_CONFORMANCE_*.
func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("conformance", flag.ContinueOnError)
	fs.StringVar(&c.mode, "mode", envOr("SOCIALWEB_CONFORMANCE_MODE", "api"), "api (no nodes, sig-api-machinery) or nodes (sig-network and sig-node on -nodes nodes); env SOCIALWEB_CONFORMANCE_MODE")
	fs.StringVar(&c.focus, "focus", envOr("SOCIALWEB_CONFORMANCE_FOCUS", ""), "regular expression of test names, replacing the mode's focus; env SOCIALWEB_CONFORMANCE_FOCUS")
	nodes, err := strconv.Atoi(envOr("SOCIALWEB_CONFORMANCE_NODES", "2"))
	if err != nil {
		return c, fmt.Errorf("SOCIALWEB_CONFORMANCE_NODES: %w", err)
	}
	fs.IntVar(&c.nodes, "nodes", nodes, "nodes booted and kept up in -mode nodes; env SOCIALWEB_CONFORMANCE_NODES")
	procs, err := strconv.Atoi(envOr("SOCIALWEB_CONFORMANCE_PROCS", "1"))
	if err != nil {
		return c, fmt.Errorf("SOCIALWEB_CONFORMANCE_PROCS: %w", err)
	}
	fs.IntVar(&c.procs, "procs", procs, "e2e.test processes sharing the specs (the ginkgo CLI's --procs); 1 runs e2e.test alone; env SOCIALWEB_CONFORMANCE_PROCS")
	fs.IntVar(&c.nodeCPUs, "node-cpus", 2, "vCPUs of each node (room for the tests' requests beside the node's reservations)")
	fs.StringVar(&c.nodeMemory, "node-memory", "2Gi", "memory of each node")
	timeout, err := time.ParseDuration(envOr("SOCIALWEB_CONFORMANCE_TIMEOUT", "0s"))
	if err != nil {
		return c, fmt.Errorf("SOCIALWEB_CONFORMANCE_TIMEOUT: %w", err)
	}
	fs.DurationVar(&c.timeout, "timeout", timeout, "the suite's whole time (--ginkgo.timeout); 0: 2h in api mode, 10h in nodes mode (TCG); env SOCIALWEB_CONFORMANCE_TIMEOUT")
	fs.DurationVar(&c.nodeWait, "node-timeout", 30*time.Minute, "how long -mode nodes waits for its nodes to be Ready")
	fs.StringVar(&c.bin, "bin", "bin/socialweb", "socialweb binary")
	fs.StringVar(&c.image, "image", "", "node image directory (`socialweb image build --ensure` prints it)")
	fs.StringVar(&c.out, "out", "", "directory for the report (junit XML), e2e.test's and the daemon's logs and the kubeconfig; default a new one under /tmp")
	fs.StringVar(&c.goCmd, "go", "go", "go command")
	fs.BoolVar(&c.buildOnly, "build-only", false, "build (or find cached) the binaries and images, print them, and stop")
	fs.BoolVar(&c.dryRun, "dry-run", false, "build the binaries and list the tests the mode selects (e2e.test --ginkgo.dry-run), no cluster")
	fs.BoolVar(&c.keepState, "keep-state", false, "keep the state dir (registry, node disks) after the run")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.mode != "api" && c.mode != "nodes" {
		return c, fmt.Errorf("-mode %q: want api or nodes", c.mode)
	}
	if c.nodes < 1 {
		return c, fmt.Errorf("-nodes %d: want 1 or more", c.nodes)
	}
	if c.procs < 1 || c.procs > 32 {
		return c, fmt.Errorf("-procs %d: want 1 to 32", c.procs)
	}
	if c.timeout == 0 {
		c.timeout = 2 * time.Hour
		if c.mode == "nodes" {
			c.timeout = 10 * time.Hour
		}
	}
	if c.image == "" && !c.buildOnly && !c.dryRun {
		return c, errors.New("-image is required (`socialweb image build --ensure` prints the directory)")
	}
	return c, nil
}

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	c, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c, log); err != nil {
		log.Error("conformance run failed", "err", err)
		stop()
		os.Exit(1)
	}
}

func run(ctx context.Context, c config, log *slog.Logger) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	gb := goBuild{goCmd: c.goCmd, moduleDir: root, cacheDir: filepath.Join(nodeimage.DefaultCacheDir(), "conformance"), log: log}
	sel := selection(c)
	opts := images.Options{Logger: log}

	// The images that need no Go-built binary are made while the suite compiles: their
	// debootstrap waits mostly on the mirror.
	type built struct {
		imgs []testImage
		err  error
	}
	others := make(chan built, 1)
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if !c.dryRun {
		go func() {
			imgs, err := buildImages(bctx, otherSpecs(), true, opts, log)
			others <- built{imgs, err}
		}()
	}
	t0 := time.Now()
	bins, err := gb.build(ctx)
	if err != nil {
		if !c.dryRun {
			cancel()
			<-others
		}
		return fmt.Errorf("building the e2e binaries: %w", err)
	}
	log.Info("e2e binaries ready", "took", time.Since(t0).Round(time.Millisecond), "e2e", bins.E2E, "agnhost", bins.Agnhost, "kubectl", bins.Kubectl)
	if c.dryRun {
		return dryRun(ctx, c, bins, sel)
	}
	kubeDir, err := gb.kubernetesDir(ctx)
	if err != nil {
		cancel()
		<-others
		return err
	}
	imgs, err := buildImages(ctx, []images.DebianSpec{agnhostSpec(bins, kubeDir), nonewprivsSpec(bins), sampleAPIServerSpec(bins), etcdSpec(bins)}, false, opts, log)
	if err != nil {
		cancel()
		<-others
		return err
	}
	o := <-others
	if o.err != nil {
		return o.err
	}
	imgs = append(imgs, o.imgs...)
	if c.buildOnly {
		fmt.Printf("e2e.test %s\nagnhost  %s\nkubectl  %s\nnnp      %s\nginkgo   %s\nsample-apiserver %s\netcd     %s (%s)\n",
			bins.E2E, bins.Agnhost, bins.Kubectl, bins.NNP, bins.Ginkgo, bins.SampleAPIServer, bins.Etcd, bins.EtcdVersion)
		for _, im := range imgs {
			fmt.Printf("image    %s %s %v\n", im.tar, im.digest, im.refs)
		}
		return nil
	}
	return runSuite(ctx, c, bins, imgs, sel, log)
}
