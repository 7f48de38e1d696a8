// Package integration runs the real socialweb binary: a daemon with real
// kube-apiservers, controller-managers and schedulers over kine.
package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/socialweb-computer/socialweb/internal/boottimeline"
	swdaemon "github.com/socialweb-computer/socialweb/internal/daemon"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
)

// binary is the socialweb binary under test, built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "socialweb-bin-")
	if err != nil {
		panic(err)
	}
	binary = os.Getenv("SOCIALWEB_BIN")
	if binary == "" {
		binary = filepath.Join(dir, "socialweb")
		build := exec.Command("../../hack/build", binary)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "building socialweb: %v\n", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type daemon struct {
	t         *testing.T
	stateDir  string
	apiPort   int
	portRange string
	extra     []string
	// binary, if set, is the socialweb build this daemon runs (an upgrade); else
	// the build under test.
	binary string
	// netns, if set, is the network namespace the daemon and its CLI run in:
	// one host of several on this machine.
	netns   string
	cmd     *exec.Cmd
	exited  chan struct{}
	logPath string
	// lastWords, if a test sets it, is logged after the daemon's log when
	// the test fails: the end of the output is what a CI summary keeps.
	lastWords func() string
}

// portBlock finds n consecutive loopback ports that are free now.
func portBlock(t *testing.T, n int) (int, int) {
	t.Helper()
	for range 100 {
		lo := 10000 + rand.IntN(22000-n) // below the ephemeral range (see livetest.FreePort)
		ok := true
		for p := lo; p < lo+n && ok; p++ {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				ok = false
				continue
			}
			l.Close()
		}
		if ok {
			return lo, lo + n - 1
		}
	}
	t.Fatal("no free port block")
	return 0, 0
}

// stateTempDir is a temporary state dir a tenant control plane's uid can reach:
// the test's temporary dir above it, 0700, is made 0711 (serve refuses a state
// dir under a directory others cannot search).
func stateTempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	return dir
}

func newDaemon(t *testing.T, ports int, extra ...string) *daemon {
	lo, hi := portBlock(t, ports)
	d := &daemon{
		t:         t,
		stateDir:  stateTempDir(t),
		apiPort:   livetest.FreePort(t),
		portRange: fmt.Sprintf("%d-%d", lo, hi),
		extra:     extra,
	}
	d.logPath = filepath.Join(t.TempDir(), "daemon.log")
	t.Cleanup(func() {
		// Delete what is left, so the host keeps no bridges or rules.
		if d.running() {
			out, _, _ := d.cli("cluster", "list")
			for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
				if f := strings.Fields(line); len(f) > 0 {
					if _, errOut, code := d.cli("cluster", "delete", f[0], "--wait"); code != 0 {
						t.Errorf("cleanup: deleting %s: %s", f[0], errOut)
					}
				}
			}
		}
		d.stop(syscall.SIGTERM)
		if mgmtRunning(d.stateDir) {
			// --control-planes-on-exit keep, or a daemon killed: down stops what it left.
			if _, errOut, code := run("down", "--state-dir", d.stateDir); code != 0 {
				t.Errorf("cleanup: socialweb down: %s", errOut)
			}
		}
		assertNoProcessesLeft(t, d.stateDir) // first: a leftover's failure gets the daemon's log too
		if t.Failed() {
			b, _ := os.ReadFile(d.logPath)
			t.Logf("daemon log (tail):\n%s", tail(string(b), 40))
			if notes := consoleNotes(d.stateDir); notes != "" {
				t.Logf("node consoles (notable lines):\n%s", notes)
			}
			if d.lastWords != nil {
				t.Logf("at the failure:\n%s", d.lastWords())
			}
		}
	})
	return d
}

func (d *daemon) args() []string {
	return append([]string{"serve", "--state-dir", d.stateDir, "--api-port", strconv.Itoa(d.apiPort),
		"--port-range", d.portRange, "--network-range", "1-150", "--metrics-address", ""}, d.extra...)
}

// start runs the daemon and waits until its management API answers.
func (d *daemon) start() {
	d.t.Helper()
	// A control plane of a daemon killed a moment ago may still be exiting with its
	// listener open: its cmdline reads empty once its memory is gone, before its files
	// are closed, so no process scan sees it. Its management port is what matters.
	livetest.Eventually(d.t, 30*time.Second, 100*time.Millisecond, "the management API port to be free", func() bool {
		if mgmtRunning(d.stateDir) {
			return true // left serving (a kill -9, or keep): the daemon adopts it
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(d.apiPort)))
		if err != nil {
			return false
		}
		l.Close()
		return true
	})
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		d.t.Fatal(err)
	}
	bin := binary
	if d.binary != "" {
		bin = d.binary
	}
	d.cmd = exec.Command(bin, d.args()...)
	if d.netns != "" {
		// ip execs the daemon: its pid is the daemon's.
		d.cmd = exec.Command("ip", append([]string{"netns", "exec", d.netns, bin}, d.args()...)...)
	}
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.exited = make(chan struct{})
	go func() { _ = d.cmd.Wait(); logf.Close(); close(d.exited) }()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if _, _, code := d.cli("cluster", "list"); code == 0 {
			return
		}
		select {
		case <-d.exited:
			b, _ := os.ReadFile(d.logPath)
			d.t.Fatalf("daemon exited during start: %s\n%s", d.cmd.ProcessState, tail(string(b), 30))
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.t.Fatal("management API did not come up in 3m")
		}
	}
}

func (d *daemon) running() bool {
	if d.cmd == nil {
		return false
	}
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// stop signals the daemon and waits for it to exit.
func (d *daemon) stop(sig syscall.Signal) {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	select {
	case <-d.exited:
		return
	default:
	}
	_ = d.cmd.Process.Signal(sig)
	select {
	case <-d.exited:
	case <-time.After(90 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
		d.t.Errorf("daemon did not exit within 90s of %v", sig)
	}
}

// cli runs a socialweb CLI command against this daemon.
func (d *daemon) cli(args ...string) (stdout, stderr string, code int) {
	if d.netns != "" {
		return runIn(d.netns, append(args, "--state-dir", d.stateDir)...)
	}
	return run(append(args, "--state-dir", d.stateDir)...)
}

func run(args ...string) (stdout, stderr string, code int) {
	return runExec(exec.Command(binary, args...))
}

// runExec runs cmd and returns what it wrote and its exit code (-1: it did not run).
func runExec(cmd *exec.Cmd) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code = 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		code = -1
	}
	return out.String(), errb.String(), code
}

// mustCLI runs a command that must succeed.
func (d *daemon) mustCLI(args ...string) string {
	d.t.Helper()
	out, errOut, code := d.cli(args...)
	if code != 0 {
		d.t.Fatalf("socialweb %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// tenant returns a client of a tenant cluster with its admin kubeconfig.
func (d *daemon) tenant(name string) (*rest.Config, kubernetes.Interface) {
	d.t.Helper()
	kc := d.mustCLI("cluster", "kubeconfig", name)
	cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(kc))
	if err != nil {
		d.t.Fatalf("parsing kubeconfig of %s: %v", name, err)
	}
	return cfg, kubernetes.NewForConfigOrDie(cfg)
}

// management returns a client of the management API as kubectl reaches it, with the
// daemon's admin kubeconfig.
func (d *daemon) management() dynamic.Interface {
	d.t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(d.stateDir, swdaemon.AdminKubeconfig))
	if err != nil {
		d.t.Fatalf("the management API's kubeconfig: %v", err)
	}
	return dynamic.NewForConfigOrDie(cfg)
}

// mgmtRunning says whether the management API of stateDir runs (its record names a
// live process).
func mgmtRunning(stateDir string) bool {
	return controlPlaneRunning(filepath.Join(stateDir, "mgmt", "instance.json")) != 0
}

// controlPlaneRunning is the pid of the live process the instance record names, or 0.
func controlPlaneRunning(record string) int {
	id, alive, err := supervisor.Running(record)
	if err != nil || !alive {
		return 0
	}
	return id.PID
}

// assertNoProcessesLeft fails if any process still names the state dir.
func assertNoProcessesLeft(t *testing.T, stateDir string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		left := processesMentioning(stateDir)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			var what []string
			for _, pid := range left {
				cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
				what = append(what, fmt.Sprintf("%d (stat %s): %s", pid, strings.TrimSpace(string(stat)), strings.ReplaceAll(string(cmdline), "\x00", " ")))
			}
			t.Errorf("processes left behind:\n%s", strings.Join(what, "\n"))
			for _, pid := range left {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func processesMentioning(s string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(s)) {
			continue
		}
		if !running(pid) {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

// notableConsoleLine matches what tells why a node failed: a panic, the OOM killer, an
// eviction, a fatal kubelet line, or an agent error.
var notableConsoleLine = regexp.MustCompile(`(?i:kernel panic|out of memory|oom-kill|evicting|evicted|attempting to reclaim)|^F\d{4} |^level=ERROR`)

// consoleNotes is, per node console of a daemon (live nodes' and deleted nodes' kept
// copies), its last notable lines and its last CPU report, each cut to a line's width.
func consoleNotes(stateDir string) string {
	cut := func(l string) string {
		if len(l) > 240 {
			return l[:240] + "..."
		}
		return l
	}
	var b strings.Builder
	eachConsole(stateDir, func(f string, data []byte) {
		var notable []string
		cpu := ""
		for _, l := range strings.Split(string(data), "\n") {
			switch {
			case strings.Contains(l, `msg="cpu use"`):
				cpu = l
			case notableConsoleLine.MatchString(l):
				notable = append(notable, l)
			}
		}
		fmt.Fprintf(&b, "%s:\n", strings.TrimPrefix(f, stateDir+"/"))
		for _, l := range append(notable[max(0, len(notable)-4):], cpu) {
			if l != "" {
				fmt.Fprintf(&b, "  %s\n", cut(strings.TrimSpace(l)))
			}
		}
	})
	return b.String()
}

// eachConsole calls f with each node console of a daemon that it can read: live nodes'
// and deleted nodes' kept copies.
func eachConsole(stateDir string, f func(path string, data []byte)) {
	live, _ := filepath.Glob(filepath.Join(stateDir, "nodes", "*", "console.log"))
	kept, _ := filepath.Glob(filepath.Join(stateDir, "nodes", "consoles", "*.log"))
	for _, p := range append(live, kept...) {
		if data, err := os.ReadFile(p); err == nil {
			f(p, data)
		}
	}
}

// consoleLines is, per node console of a daemon, its last n lines that match re.
func consoleLines(stateDir string, re *regexp.Regexp, n int) string {
	var b strings.Builder
	eachConsole(stateDir, func(f string, data []byte) {
		var hits []string
		for _, l := range strings.Split(string(data), "\n") {
			if re.MatchString(l) {
				hits = append(hits, strings.TrimSpace(l))
			}
		}
		fmt.Fprintf(&b, "%s (%d matching lines, the last %d):\n", strings.TrimPrefix(f, stateDir+"/"), len(hits), min(n, len(hits)))
		for _, l := range hits[max(0, len(hits)-n):] {
			if len(l) > 400 {
				l = l[:400] + "..."
			}
			fmt.Fprintf(&b, "  %s\n", l)
		}
	})
	return b.String()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// failureLog is a test's TB that keeps its failure messages, so they can be repeated at
// the end of a long failing test's output: that end is what a CI summary shows.
type failureLog struct {
	testing.TB
	mu   sync.Mutex
	msgs []string
}

func (f *failureLog) keep(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}

func (f *failureLog) Errorf(format string, args ...any) {
	f.TB.Helper()
	f.keep(format, args...)
	f.TB.Errorf(format, args...)
}

func (f *failureLog) Fatalf(format string, args ...any) {
	f.TB.Helper()
	f.keep(format, args...)
	f.TB.Fatalf(format, args...)
}

// summary is the kept messages, one "failed: " line each (empty when none).
func (f *failureLog) summary() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, m := range f.msgs {
		fmt.Fprintf(&b, "failed: %s\n", m)
	}
	return b.String()
}

// running reports whether pid is a live process: not gone and not a zombie (a VM whose
// daemon died is reparented to PID 1, which may reap it late). A zombie whose other
// threads still run is live: its leader has exited, but the threads still hold its
// sockets (a killed control plane's port was still in use while it looked like that).
func running(pid int) bool {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || len(stat) <= i+2 || stat[i+2] != 'Z' {
		return true
	}
	tasks, err := os.ReadDir(filepath.Join(dir, "task"))
	return err == nil && len(tasks) > 1
}

// oneReadyNode waits (5 min) until the tenant has exactly one node and it is Ready, and
// returns it.
// nodeBootTimeline is the boot timeline node's agent published on its Node.
func nodeBootTimeline(t *testing.T, ctx context.Context, k kubernetes.Interface, node string) boottimeline.Timeline {
	t.Helper()
	var tl boottimeline.Timeline
	livetest.Eventually(t, time.Minute, time.Second, "node "+node+"'s boot timeline", func() bool {
		n, err := k.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false
		}
		tl, err = boottimeline.Parse(n.Annotations[boottimeline.Annotation])
		return err == nil && len(tl) > 0
	})
	return tl
}

func oneReadyNode(t *testing.T, ctx context.Context, k kubernetes.Interface) corev1.Node {
	t.Helper()
	var node corev1.Node
	livetest.Eventually(t, 5*time.Minute, time.Second, "a Ready node with a socialweb providerID", func() bool {
		nl, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil || len(nl.Items) != 1 {
			return false
		}
		node = nl.Items[0]
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue
			}
		}
		return false
	})
	return node
}
