package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/nodeimage"
)

// The package's paths on an installed host (hack/package).
const (
	pkgBinary  = "/usr/bin/socialweb"
	pkgUnit    = "/lib/systemd/system/socialweb.service"
	pkgDropIn  = "/etc/systemd/system/socialweb.service.d/package-test.conf"
	pkgConfDir = "/etc/socialweb"
	pkgCache   = "/var/cache/socialweb"
)

// TestPackage is issue 40's package test: the .deb that hack/package builds installs
// on a fresh Debian (a debootstrap chroot: its Depends bring every program serve runs,
// and no Go), then on this host it starts as its unit says, reaches /readyz, serves a
// cluster create and delete through the installed CLI, keeps a node VM across a restart
// (with systemd and a node image), and a purge leaves nothing of it but the state dir.
//
// It installs a package system-wide and debootstraps (network to Debian's mirror, a few
// minutes), so it runs only with SOCIALWEB_TEST_PACKAGE=1, as root.
// SOCIALWEB_TEST_PACKAGE_NODE_IMAGE=DIR ships that node image in the package.
func TestPackage(t *testing.T) {
	if os.Getenv("SOCIALWEB_TEST_PACKAGE") != "1" {
		t.Skip("installs a .deb system-wide and debootstraps a chroot: set SOCIALWEB_TEST_PACKAGE=1 to run it (root)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: dpkg, debootstrap, chroot")
	}
	for _, tool := range []string{"dpkg-deb", "apt-get", "debootstrap", "ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (hack/deps installs it): %v", tool, err)
		}
	}
	if _, err := os.Stat(pkgBinary); err == nil {
		t.Fatalf("%s exists: this host already has socialweb installed; the test would replace it", pkgBinary)
	}
	image := os.Getenv("SOCIALWEB_TEST_PACKAGE_NODE_IMAGE")
	deb := buildPackage(t, image)

	t.Run("fresh host", func(t *testing.T) { packageOnFreshHost(t, deb) })
	t.Run("serve, purge", func(t *testing.T) { packageServeAndPurge(t, deb, image != "") })
}

// buildPackage runs hack/package on the binary under test and returns the .deb.
func buildPackage(t *testing.T, image string) string {
	t.Helper()
	args := []string{"../../hack/package", "--binary", binary, "--out", t.TempDir()}
	if image != "" {
		args = append(args, "--node-image", image)
	}
	cmd := exec.Command("bash", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("hack/package: %v", err)
	}
	deb := strings.TrimSpace(lastLineOf(out.String()))
	st, err := os.Stat(deb)
	if err != nil {
		t.Fatalf("hack/package printed %q: %v", deb, err)
	}
	t.Logf("built %s (%d MiB) in %s", filepath.Base(deb), st.Size()>>20, time.Since(start).Round(time.Second))
	return deb
}

// packageOnFreshHost installs the .deb with apt into a minimal bookworm chroot: what
// apt must pull in is what a fresh host needs. Nothing starts there (no systemd runs in
// a chroot, and a policy-rc.d says no); the maintainer scripts run, the binary runs,
// and a purge keeps the state dir.
func packageOnFreshHost(t *testing.T, deb string) {
	root := filepath.Join(t.TempDir(), "root")
	mirror := nodeimage.HostMirror("bookworm")
	runOK(t, 20*time.Minute, "debootstrap", "--variant=minbase", "bookworm", root, mirror)
	if err := os.WriteFile(filepath.Join(root, "usr/sbin/policy-rc.d"), []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(deb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "tmp/socialweb.deb"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	chroot := func(timeout time.Duration, args ...string) string {
		return runOK(t, timeout, "chroot", append([]string{root, "env", "DEBIAN_FRONTEND=noninteractive",
			"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, args...)...)
	}
	chroot(5*time.Minute, "apt-get", "update", "-qq")
	chroot(15*time.Minute, "apt-get", "install", "-y", "-qq", "--no-install-recommends", "/tmp/socialweb.deb")

	// The binary runs with what its Depends brought (cgo links libc), and every
	// program serve runs is there, without a Go toolchain.
	if out := chroot(time.Minute, pkgBinary, "version"); !strings.Contains(out, "kubernetes:") {
		t.Errorf("socialweb version in the chroot:\n%s", out)
	}
	for _, prog := range []string{"/usr/bin/qemu-system-x86_64", "/usr/lib/qemu/virtiofsd", "/usr/sbin/nft", "/usr/bin/ip",
		"/usr/sbin/sysctl", "/usr/sbin/mkfs.ext4", "/etc/ssl/certs/ca-certificates.crt", pkgUnit, pkgConfDir + "/config.yaml",
		"/usr/lib/socialweb/images/pause.tar", "/usr/lib/socialweb/images/busybox.tar"} {
		if !existsIn(root, prog) && !existsIn(root, strings.Replace(prog, "/usr/", "/", 1)) {
			t.Errorf("%s is missing after apt installed the package and its Depends", prog)
		}
	}
	for _, goTool := range []string{"/usr/bin/go", "/usr/local/go/bin/go", "/usr/lib/go/bin/go"} {
		if existsIn(root, goTool) {
			t.Errorf("%s is installed: the package must need no Go toolchain", goTool)
		}
	}
	if st, err := os.Stat(filepath.Join(root, "var/lib/socialweb")); err != nil {
		t.Errorf("postinst made no state dir: %v", err)
	} else if st.Mode().Perm() != 0o700 {
		t.Errorf("postinst's state dir has mode %v, want 0700", st.Mode().Perm())
	}
	// The conffile is one serve accepts: --print-config reads it and exits.
	out := chroot(time.Minute, pkgBinary, "serve", "--print-config")
	for _, want := range []string{"state-dir: /var/lib/socialweb # file", "builtin-images: /usr/lib/socialweb/images # file",
		"control-planes-on-exit: keep # file"} {
		if !strings.Contains(out, want) {
			t.Errorf("serve --print-config in the chroot lacks %q (from the conffile):\n%s", want, out)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "var/lib/socialweb/keep"), []byte("tenant data"), 0o600); err != nil {
		t.Fatal(err)
	}
	chroot(5*time.Minute, "apt-get", "purge", "-y", "-qq", "socialweb")
	for _, gone := range []string{pkgBinary, pkgUnit, pkgConfDir, "/usr/share/doc/socialweb", "/usr/share/man/man1/socialweb.1.gz", pkgCache,
		"/usr/lib/socialweb"} {
		if existsIn(root, gone) {
			t.Errorf("%s is left after purge", gone)
		}
	}
	if !existsIn(root, "/var/lib/socialweb/keep") {
		t.Errorf("purge removed the state dir; it must keep it")
	}
}

// packageServeAndPurge installs the .deb on this host and runs it. With systemd as PID 1
// the unit runs it; elsewhere (CI's machines boot no systemd) the test runs the unit's
// ExecStart with its Environment= and a NOTIFY_SOCKET of its own, and checks READY=1
// as systemd would. A drop-in (written before the install, so the postinst's start
// already uses it) gives the daemon a state dir and ports of the test's.
func packageServeAndPurge(t *testing.T, deb string, withImage bool) {
	systemd := isDir("/run/systemd/system")
	state := stateTempDir(t)
	apiPort, metricsPort := livetest.FreePort(t), livetest.FreePort(t)
	lo, hi := portBlock(t, 5)
	metrics := net.JoinHostPort("127.0.0.1", strconv.Itoa(metricsPort))
	env := map[string]string{
		"SOCIALWEB_STATE_DIR": state, "SOCIALWEB_API_PORT": strconv.Itoa(apiPort),
		"SOCIALWEB_PORT_RANGE": fmt.Sprintf("%d-%d", lo, hi), "SOCIALWEB_NETWORK_RANGE": "171-172",
		"SOCIALWEB_METRICS_ADDRESS": metrics,
	}
	var dropIn strings.Builder
	dropIn.WriteString("[Service]\n")
	for _, k := range slices.Sorted(maps.Keys(env)) {
		fmt.Fprintf(&dropIn, "Environment=%s=%s\n", k, env[k])
	}
	if err := os.MkdirAll(filepath.Dir(pkgDropIn), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pkgDropIn, []byte(dropIn.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	hadStateDir := isDir("/var/lib/socialweb")
	linksBefore, tablesBefore := hostLinks(t), nftTables(t)
	purged := false
	t.Cleanup(func() {
		if !purged { // a failure halfway: leave the host as it was
			_, _ = runCmd(5*time.Minute, "apt-get", "purge", "-y", "-qq", "socialweb")
		}
		os.RemoveAll(filepath.Dir(pkgDropIn))
		if systemd {
			_, _ = runCmd(time.Minute, "systemctl", "daemon-reload")
		}
	})

	runOK(t, 15*time.Minute, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-qq", "--no-install-recommends", deb)

	var manual *exec.Cmd // the daemon this test runs where no systemd does
	if systemd {
		// postinst enabled and started it; Type=notify: active means READY=1 came.
		livetest.Eventually(t, 5*time.Minute, time.Second, "socialweb.service to be active", func() bool {
			out, _ := runCmd(10*time.Second, "systemctl", "is-active", "socialweb")
			return strings.TrimSpace(out) == "active"
		})
	} else {
		t.Log("no systemd runs here: running the unit's ExecStart with its Environment= and a NOTIFY_SOCKET of the test's")
		manual = startAsUnit(t, env)
	}
	livetest.Eventually(t, 3*time.Minute, time.Second, "/readyz on "+metrics, func() bool {
		resp, err := http.Get("http://" + metrics + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	cli := func(args ...string) string {
		return runOK(t, 10*time.Minute, pkgBinary, append(args, "--state-dir", state)...)
	}
	cli("cluster", "create", "pkg", "--wait", "--hold", "30s")
	if out := cli("cluster", "get", "pkg"); !strings.Contains(out, "Ready") {
		t.Errorf("cluster get pkg:\n%s", out)
	}
	if systemd && withImage {
		// KillMode=process: a node VM outlives systemctl restart and is adopted.
		cli("cluster", "delete", "pkg", "--wait")
		cli("cluster", "create", "pkg", "--wait", "--idle-nodes", "1", "--hold", "30s")
		var pid int
		livetest.Eventually(t, 10*time.Minute, 2*time.Second, "the idle node's qemu", func() bool {
			pid = qemuOf(state)
			return pid != 0
		})
		runOK(t, 5*time.Minute, "systemctl", "restart", "socialweb")
		if got := qemuOf(state); got != pid {
			t.Errorf("qemu pid %d before systemctl restart, %d after: the unit killed the node VM", pid, got)
		}
	}
	cli("cluster", "delete", "pkg", "--wait")

	if manual != nil {
		// prerm stops the unit; the daemon this test started is the test's to stop.
		_ = manual.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- manual.Wait() }()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			_ = manual.Process.Kill()
			t.Errorf("the daemon did not exit within 2m of SIGTERM")
		}
		// control-planes-on-exit: keep left the management API serving; the guide's
		// "systemctl stop socialweb && socialweb down" (prerm's down reads the state
		// dir from the unit's environment, which only systemd shows it).
		cli("down")
	}
	runOK(t, 5*time.Minute, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "purge", "-y", "-qq", "socialweb")
	purged = true

	// Nothing of it is left but the state dir.
	for _, gone := range []string{pkgBinary, pkgUnit, pkgConfDir, "/usr/share/doc/socialweb", "/usr/share/man/man1/socialweb.1.gz",
		"/usr/lib/socialweb", pkgCache} {
		if _, err := os.Stat(gone); err == nil {
			t.Errorf("%s is left after purge", gone)
		}
	}
	if _, err := os.Stat(filepath.Join(state, "admin.kubeconfig")); err != nil {
		t.Errorf("the state dir lost its admin.kubeconfig: %v (purge must keep the state dir)", err)
	}
	if !hadStateDir && !isDir("/var/lib/socialweb") {
		t.Errorf("postinst's /var/lib/socialweb is gone: purge must keep the state dir")
	}
	if systemd {
		if out, _ := runCmd(10*time.Second, "systemctl", "is-active", "socialweb"); strings.TrimSpace(out) == "active" {
			t.Errorf("socialweb.service is still active after purge")
		}
	}
	if left := processesRunning(pkgBinary); len(left) > 0 {
		t.Errorf("processes of %s left after purge: %v", pkgBinary, left)
	}
	assertNoProcessesLeft(t, state)
	if added := subtract(hostLinks(t), linksBefore); len(added) > 0 {
		t.Errorf("network links left after purge: %v", added)
	}
	if added := subtract(nftTables(t), tablesBefore); len(added) > 0 {
		t.Errorf("nftables tables left after purge: %v", added)
	}
}

// startAsUnit runs the installed unit's ExecStart with its Environment= lines, env
// (the drop-in's) and NOTIFY_SOCKET, and waits for READY=1 as systemd would.
func startAsUnit(t *testing.T, env map[string]string) *exec.Cmd {
	t.Helper()
	b, err := os.ReadFile(pkgUnit)
	if err != nil {
		t.Fatal(err)
	}
	var execStart []string
	environ := os.Environ()
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		switch {
		case !ok:
		case k == "ExecStart":
			execStart = strings.Fields(v)
		case k == "Environment":
			environ = append(environ, v)
		}
	}
	if len(execStart) == 0 {
		t.Fatalf("%s has no ExecStart", pkgUnit)
	}
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	sock := filepath.Join(t.TempDir(), "notify")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	logPath := filepath.Join(t.TempDir(), "daemon.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(execStart[0], execStart[1:]...)
	cmd.Env = append(environ, "NOTIFY_SOCKET="+sock)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_, _ = cmd.Process.Wait()
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("daemon log (tail):\n%s", tail(string(b), 40))
		}
	})
	_ = notify.SetReadDeadline(time.Now().Add(5 * time.Minute)) // the unit's TimeoutStartSec
	buf := make([]byte, 4096)
	for {
		n, err := notify.Read(buf)
		if err != nil {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("no READY=1 from the daemon: %v\n%s", err, tail(string(b), 30))
		}
		if slices.Contains(strings.Split(string(buf[:n]), "\n"), "READY=1") {
			return cmd
		}
	}
}

// qemuOf is the pid of a qemu whose command line names stateDir, or 0.
func qemuOf(stateDir string) int {
	for _, pid := range processesMentioning(stateDir) {
		exe, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "exe"))
		if strings.Contains(filepath.Base(exe), "qemu-system") {
			return pid
		}
	}
	return 0
}

// processesRunning lists the processes whose executable is path (or was: deleted).
func processesRunning(path string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err == nil && strings.TrimSuffix(exe, " (deleted)") == path {
			pids = append(pids, pid)
		}
	}
	return pids
}

// hostLinks are the host's network link names (ip -o link).
func hostLinks(t *testing.T) []string {
	t.Helper()
	out := runOK(t, 30*time.Second, "ip", "-o", "link", "show")
	var names []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			names = append(names, strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":"))
		}
	}
	return names
}

// nftTables are the host's nftables tables (nft list tables).
func nftTables(t *testing.T) []string {
	t.Helper()
	return strings.Split(strings.TrimSpace(runOK(t, 30*time.Second, "nft", "list", "tables")), "\n")
}

func subtract(after, before []string) []string {
	var added []string
	for _, a := range after {
		if a != "" && !slices.Contains(before, a) {
			added = append(added, a)
		}
	}
	return added
}

// runCmd runs a command with a deadline and returns its combined output.
func runCmd(timeout time.Duration, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		return out.String(), fmt.Errorf("%s: no exit within %s", name, timeout)
	}
}

// runOK runs a command and fails t, with its output, unless it succeeds.
func runOK(t *testing.T, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	out, err := runCmd(timeout, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, tail(out, 40))
	}
	return out
}

func existsIn(root, path string) bool {
	_, err := os.Lstat(filepath.Join(root, path))
	return err == nil
}

func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

func lastLineOf(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}
