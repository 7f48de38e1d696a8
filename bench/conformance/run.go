package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/socialweb-computer/socialweb/internal/images"
)

// clusterName is the tenant the suite runs against.
const clusterName = "conformance"

// placeholderNamespace holds the Deployment that keeps -mode nodes' nodes up.
const placeholderNamespace = "socialweb-conformance-placeholder"

// sandboxImage is socialweb's pause image under its own name, the node's sandbox image
// (internal/agent's default): the placeholder Pods pull nothing else.
func sandboxImage() string { return images.Refs[images.Pause][0] }

// sel is what the suite runs: ginkgo's focus, skip and label filter.
type sel struct {
	focus, skip, labels string
	// skipped explains each skip pattern: why those tests cannot run here.
	skipped []skipReason
}

type skipReason struct{ pattern, reason string }

// labelFilter is the conformance subset a CI-like run takes: no Serial tests (they
// need the whole cluster), no Slow or Disruptive ones.
const labelFilter = "Conformance && !Serial && !Slow && !Disruptive"

func selection(c config) sel {
	s := sel{labels: labelFilter, focus: `\[sig-api-machinery\]`}
	if c.mode == "nodes" {
		s.focus = `\[sig-network\]|\[sig-node\]`
	}
	if c.focus != "" {
		s.focus = c.focus
	}
	for _, m := range missingImages() {
		for _, t := range m.tests {
			s.skipped = append(s.skipped, skipReason{t, "needs " + m.ref + " (" + m.reason + ")"})
		}
	}
	// Also by name: a tag written into a Describe's text may not be a label.
	pats := []string{`\[(Serial|Slow|Disruptive)\]`}
	for _, r := range s.skipped {
		pats = append(pats, "(?:"+r.pattern+")")
	}
	s.skip = strings.Join(pats, "|")
	return s
}

// ginkgoSettings are the run's ginkgo flags without their prefix: e2e.test takes
// them as --ginkgo.NAME, the ginkgo CLI (-procs) as --NAME.
func ginkgoSettings(c config, s sel) []string {
	a := []string{"focus=" + s.focus, "label-filter=" + s.labels, "timeout=" + c.timeout.String(), "no-color", "v"}
	if s.skip != "" {
		a = append(a, "skip="+s.skip)
	}
	return a
}

// e2eFlags are e2e.test's own flags for a run (or a dry run).
func e2eFlags(c config, bins binaries, kubeconfig, reportDir string) []string {
	args := []string{
		"--provider=skeleton", // no cloud: the generic provider
		"--kubeconfig=" + kubeconfig,
		"--kubectl-path=" + bins.Kubectl,
		"--report-dir=" + reportDir,
		"--disable-log-dump", // it would ssh to nodes as a cloud provider does
		// The suite waits for kube-system Pods and nodes at start: TCG is slow.
		"--system-pods-startup-timeout=20m",
		"--node-schedulable-timeout=30m",
	}
	if c.mode == "api" {
		// No nodes: do not wait for any, and do not count them (auto-detection fails
		// on zero schedulable nodes).
		args = append(args, "--allowed-not-ready-nodes=-1", "--num-nodes=0")
	} else {
		args = append(args, "--allowed-not-ready-nodes=0")
	}
	return args
}

// e2eArgs are e2e.test's flags when it runs alone: its own and ginkgo's.
func e2eArgs(c config, bins binaries, s sel, kubeconfig, reportDir string) []string {
	args := e2eFlags(c, bins, kubeconfig, reportDir)
	for _, g := range ginkgoSettings(c, s) {
		args = append(args, "--ginkgo."+g)
	}
	return args
}

// suiteCommand is the program and arguments of a run: e2e.test alone, or with -procs
// above 1 the ginkgo CLI running that many e2e.test processes that share out the specs
// (the suite's non-Serial specs are written to run in parallel; most of their time
// under TCG is waiting on Pods).
func suiteCommand(c config, bins binaries, s sel, kubeconfig, reportDir string) (string, []string) {
	if c.procs <= 1 {
		return bins.E2E, e2eArgs(c, bins, s, kubeconfig, reportDir)
	}
	// Output interception off: specs start kubectl, whose inherited stdout would keep
	// ginkgo's interceptor waiting.
	args := []string{"--procs=" + strconv.Itoa(c.procs), "--output-interceptor-mode=none"}
	for _, g := range ginkgoSettings(c, s) {
		args = append(args, "--"+g)
	}
	args = append(args, bins.E2E, "--")
	return bins.Ginkgo, append(args, e2eFlags(c, bins, kubeconfig, reportDir)...)
}

// dryRun lists the tests the selection takes, without a cluster.
func dryRun(ctx context.Context, c config, bins binaries, s sel) error {
	dir, err := os.MkdirTemp("", "socialweb-conformance-dry-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// A kubeconfig that names an unreachable server: a dry run contacts nothing.
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(dryKubeconfig), 0o600); err != nil {
		return err
	}
	args := append(e2eArgs(c, bins, s, kc, dir), "--ginkgo.dry-run")
	cmd := exec.CommandContext(ctx, bins.E2E, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	runErr := cmd.Run()
	r, err := readReport(dir)
	if err != nil {
		return fmt.Errorf("e2e.test --ginkgo.dry-run: %v; %w\n%s", runErr, err, tail(out.String(), 40))
	}
	names := r.selected()
	fmt.Printf("mode %s: %d tests selected (focus %q, labels %q)\n", c.mode, len(names), s.focus, s.labels)
	for _, n := range names {
		fmt.Println("  " + n)
	}
	skipped := r.skippedBy(s)
	fmt.Printf("%d in-focus tests skipped here:\n", len(skipped))
	for _, sk := range skipped {
		fmt.Printf("  %s -- %s\n", sk.name, sk.reason)
	}
	return nil
}

const dryKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: none
  cluster: {server: "https://127.0.0.1:1"}
users:
- name: none
  user: {token: none}
contexts:
- name: none
  context: {cluster: none, user: none}
current-context: none
`

// runSuite is the run: a fresh state dir with the test images in its registry, a
// daemon, a cluster (with nodes kept up in -mode nodes), e2e.test, the summary. The
// daemon is stopped and `socialweb down` run on the way out, whatever happened.
func runSuite(ctx context.Context, c config, bins binaries, imgs []testImage, s sel, log *slog.Logger) (err error) {
	out := c.out
	if out == "" {
		if out, err = os.MkdirTemp("", "socialweb-conformance-"+c.mode+"-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	reportDir := filepath.Join(out, "report")
	// An -out of an earlier run: its reports must not be read as this run's.
	if err := os.RemoveAll(reportDir); err != nil {
		return err
	}
	if err := os.MkdirAll(reportDir, 0o755); err != nil {
		return err
	}
	state, err := os.MkdirTemp("", "socialweb-conformance-state-")
	if err != nil {
		return err
	}
	log.Info("conformance run", "mode", c.mode, "out", out, "state", state)
	d := &daemon{bin: c.bin, state: state, log: log}
	defer func() {
		// Cleanup must run even when ctx was cancelled (Ctrl-C): its own deadline.
		d.teardown()
		if c.keepState {
			log.Info("state dir kept", "state", state)
		} else if rerr := os.RemoveAll(state); rerr != nil {
			log.Warn("removing the state dir", "state", state, "err", rerr)
		}
	}()

	for _, im := range imgs {
		args := []string{"image", "push", im.tar}
		for _, r := range im.refs {
			args = append(args, "--ref", r)
		}
		if o, err := d.cli(ctx, args...); err != nil {
			return fmt.Errorf("pushing %s: %w\n%s", im.name, err, o)
		}
		log.Info("pushed", "image", im.name, "refs", im.refs)
	}
	if err := d.start(ctx, c.image, filepath.Join(out, "daemon.log")); err != nil {
		return err
	}
	// api: the cluster starts at zero nodes and the tests that run a Pod (webhooks, CRD
	// conversion) get nodes booted for them, as any tenant's Pods do.
	maxNodes := c.nodes
	if c.mode == "nodes" {
		maxNodes = c.nodes // no more: the tests' Pods share the kept nodes
	}
	t0 := time.Now()
	if o, err := d.cli(ctx, "cluster", "create", clusterName, "--wait", "--max-nodes", strconv.Itoa(maxNodes), "--hold", "10m",
		"--node-cpus", strconv.Itoa(c.nodeCPUs), "--node-memory", c.nodeMemory); err != nil {
		return fmt.Errorf("cluster create: %w\n%s", err, o)
	}
	d.cluster = true
	log.Info("cluster ready", "took", time.Since(t0).Round(time.Millisecond))
	kcBytes, err := d.cli(ctx, "cluster", "kubeconfig", clusterName)
	if err != nil {
		return fmt.Errorf("cluster kubeconfig: %w\n%s", err, kcBytes)
	}
	kubeconfig := filepath.Join(out, "kubeconfig")
	if err := os.WriteFile(kubeconfig, kcBytes, 0o600); err != nil {
		return err
	}
	if c.mode == "nodes" {
		if err := keepNodes(ctx, kcBytes, c.nodes, c.nodeWait, log); err != nil {
			return fmt.Errorf("%w (the daemon's log: %s)", err, filepath.Join(out, "daemon.log"))
		}
	}

	e2eLog := filepath.Join(out, "e2e.log")
	lf, err := os.Create(e2eLog)
	if err != nil {
		return err
	}
	defer lf.Close()
	prog, args := suiteCommand(c, bins, s, kubeconfig, reportDir)
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Dir = out
	// Ctrl-C reaches this process only (own process group); e2e.test gets SIGINT, on
	// which ginkgo runs the specs' cleanup and writes its report, then SIGKILL.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 5 * time.Minute
	log.Info("running e2e.test", "procs", max(1, c.procs), "log", e2eLog, "focus", s.focus, "labels", s.labels, "skip patterns", len(s.skipped), "timeout", c.timeout)
	t1 := time.Now()
	runErr := cmd.Run()
	log.Info("e2e.test done", "took", time.Since(t1).Round(time.Second), "exit", runErr)

	r, err := readReport(reportDir)
	if err != nil {
		b, _ := os.ReadFile(e2eLog)
		return fmt.Errorf("e2e.test (%v) left no report: %w\n%s", runErr, err, tail(string(b), 40))
	}
	sum := r.summary(s)
	if sum.passed+sum.failed == 0 {
		b, _ := os.ReadFile(e2eLog)
		return fmt.Errorf("e2e.test (%v) ran no test (suite setup failed?):\n%s", runErr, tail(string(b), 40))
	}
	sum.print(os.Stdout)
	fmt.Printf("report: %s\n", reportDir)
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted; the counts above are of a partial run: %w", ctx.Err())
	}
	return nil
}

// daemon is the socialweb daemon the run started, and what it made.
type daemon struct {
	bin, state string
	log        *slog.Logger
	cmd        *exec.Cmd
	exited     chan struct{}
	cluster    bool
}

// cli runs a socialweb command against the state dir and returns its stdout (its
// stderr too on failure).
func (d *daemon) cli(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, d.bin, append(args, "--state-dir", d.state)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return append(stdout.Bytes(), stderr.Bytes()...), err
	}
	return stdout.Bytes(), nil
}

// start runs `socialweb serve` on the state dir and waits until its management API
// answers.
func (d *daemon) start(ctx context.Context, nodeImage, logPath string) error {
	lf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	apiPort, err := freePort()
	if err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	d.cmd = exec.Command(d.bin, "serve", "--state-dir", d.state, "--node-image", nodeImage,
		"--api-port", strconv.Itoa(apiPort), "--port-range", fmt.Sprintf("%d-%d", port, port),
		// Bridges of their own, away from the integration tests' 1-150 and the other
		// benches' 180-189.
		"--network-range", "170-179", "--metrics-address", "")
	d.cmd.Stdout, d.cmd.Stderr = lf, lf
	// Its own process group: a Ctrl-C stops it through teardown, after the cluster.
	// Pdeathsig: should this process be killed outright, the daemon stops too (its VMs
	// stay, for `socialweb down --state-dir`).
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := d.cmd.Start(); err != nil {
		lf.Close()
		return fmt.Errorf("starting the daemon: %w", err)
	}
	d.exited = make(chan struct{})
	go func() { _ = d.cmd.Wait(); lf.Close(); close(d.exited) }()
	d.log.Info("daemon started", "pid", d.cmd.Process.Pid, "log", logPath)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if _, err := d.cli(ctx, "cluster", "list"); err == nil {
			return nil
		}
		select {
		case <-d.exited:
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("the daemon exited during start (%s):\n%s", d.cmd.ProcessState, tail(string(b), 30))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the daemon's management API did not answer within 3m; see %s", logPath)
		}
	}
}

// teardown deletes the cluster (its VMs and networks), stops the daemon and runs
// `socialweb down` on the state dir for whatever the daemon left. Each step has its own
// deadline; none depends on the run's context, which may be cancelled.
func (d *daemon) teardown() {
	running := false
	if d.exited != nil {
		select {
		case <-d.exited:
		default:
			running = true
		}
	}
	if running && d.cluster {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		if o, err := d.cli(ctx, "cluster", "delete", clusterName, "--wait"); err != nil {
			d.log.Warn("cluster delete", "err", err, "output", strings.TrimSpace(string(o)))
		}
		cancel()
	}
	if running {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(2 * time.Minute):
			d.log.Warn("the daemon did not stop within 2m of SIGTERM; killing it", "pid", d.cmd.Process.Pid)
			_ = d.cmd.Process.Kill()
			<-d.exited
		}
		d.log.Info("daemon stopped")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if o, err := d.cli(ctx, "down"); err != nil {
		d.log.Warn("socialweb down", "err", err, "output", strings.TrimSpace(string(o)))
	} else {
		d.log.Info("socialweb down done", "state", d.state)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// keepNodes boots n nodes and keeps them: a Deployment of n pause Pods that must not
// share a node, in a namespace of its own. It returns once n nodes are Ready without
// taints (the suite counts schedulable untainted nodes when it starts) and the n Pods
// run.
func keepNodes(ctx context.Context, kubeconfig []byte, n int, timeout time.Duration, log *slog.Logger) error {
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	k, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if _, err := k.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: placeholderNamespace}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("placeholder namespace: %w", err)
	}
	if _, err := k.AppsV1().Deployments(placeholderNamespace).Create(ctx, placeholder(n), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("placeholder deployment: %w", err)
	}
	log.Info("waiting for nodes", "nodes", n, "timeout", timeout)
	t0 := time.Now()
	last := ""
	for {
		ready, running, state := 0, 0, ""
		if nl, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil {
			for _, node := range nl.Items {
				if nodeReady(node) && len(node.Spec.Taints) == 0 && !node.Spec.Unschedulable {
					ready++
				}
			}
			state = fmt.Sprintf("%d nodes, %d Ready and untainted", len(nl.Items), ready)
		}
		if pl, err := k.CoreV1().Pods(placeholderNamespace).List(ctx, metav1.ListOptions{}); err == nil {
			for _, p := range pl.Items {
				if p.Status.Phase == corev1.PodRunning {
					running++
				}
			}
			state += fmt.Sprintf(", %d/%d placeholder Pods running", running, n)
		}
		if state != last {
			log.Info("nodes", "state", state, "after", time.Since(t0).Round(time.Second))
			last = state
		}
		if ready >= n && running >= n {
			return nil
		}
		if time.Since(t0) > timeout {
			return fmt.Errorf("%d nodes not Ready within %s (-node-timeout): %s", n, timeout, state)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

func nodeReady(n corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// prepulled are the big test images, pulled onto each kept node before the suite starts
// (the placeholder's init containers): first pulls of a 250 MiB image under TCG take
// minutes, which the tests' own Pod start timeouts do not allow for.
func prepulled() []string { return []string{agnhostRef, glibcDNSRef, nginxRef, busyboxRef} }

// placeholder is the Deployment that keeps n nodes: one pause Pod per node (required
// anti-affinity on the hostname), no requests, so the tests' Pods fit beside them. Its
// init containers pull the prepulled images and exit.
func placeholder(n int) *appsv1.Deployment {
	var pulls []corev1.Container
	for i, ref := range prepulled() {
		pulls = append(pulls, corev1.Container{Name: fmt.Sprintf("pull-%d", i), Image: ref, Command: []string{"/bin/sh", "-c", "true"}})
	}
	labels := map[string]string{"app": "socialweb-conformance-placeholder"}
	replicas := int32(n)
	zero := int64(0)
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "keep-nodes", Namespace: placeholderNamespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: &zero,
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
							LabelSelector: &metav1.LabelSelector{MatchLabels: labels}, TopologyKey: corev1.LabelHostname}}}},
					InitContainers: pulls,
					Containers:     []corev1.Container{{Name: "pause", Image: sandboxImage()}},
				},
			},
		},
	}
}
