package integration

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// TestDemoInterruptedLeavesNothing runs the README's main job (hack/demo) and presses
// Ctrl-C (SIGINT to its process group) once its node VM runs: the demo's exit path must
// leave the host as it found it: no qemu or socialweb process of its state dir, the same
// interfaces, routes and nftables ruleset, and no state dir.
func TestDemoInterruptedLeavesNothing(t *testing.T) {
	nodeImage(t) // built (or reused) here, so the demo's own --ensure only finds it
	if _, err := exec.LookPath("nft"); err != nil {
		livetest.Skip(t, "nft not installed: apt-get install nftables")
	}
	state := filepath.Join(stateTempDir(t), "state")
	before := hostNetwork(t)

	var out bytes.Buffer
	cmd := exec.Command("bash", "../../hack/demo")
	cmd.Env = append(os.Environ(), "SOCIALWEB_BIN="+binary, "SOCIALWEB_STATE_DIR="+state)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a terminal's Ctrl-C reaches the whole group
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if t.Failed() {
			t.Logf("demo output (tail):\n%s", tail(out.String(), 60))
			if b, err := os.ReadFile(state + ".log"); err == nil {
				t.Logf("daemon log (tail):\n%s", tail(string(b), 30))
			}
		}
		os.Remove(state + ".log")
	}()

	// The first run builds kubectl into bin/ (a few minutes), hence the long wait.
	deadline := time.After(30 * time.Minute)
	var vms []int
wait:
	for {
		select {
		case err := <-exited:
			t.Fatalf("the demo ended before its node VM started: %v", err)
		case <-deadline:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			t.Fatal("no node VM of the demo within 30 minutes")
		case <-time.After(250 * time.Millisecond):
			if vms = qemusOf(state); len(vms) > 0 {
				break wait
			}
		}
	}
	t.Logf("node VM running (pid %v); sending SIGINT to the demo's process group", vms)
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if err == nil || !errors.As(err, &ee) || ee.ExitCode() == 0 {
			t.Errorf("interrupted demo exited with %v; want a non-zero status", err)
		}
	case <-time.After(3 * time.Minute):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Fatal("the interrupted demo did not exit within 3 minutes")
	}

	if left := processesMentioning(state); len(left) > 0 {
		t.Errorf("processes of the demo's state dir left: %v", left)
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	for _, pid := range vms {
		if running(pid) {
			t.Errorf("the node VM (pid %d) still runs", pid)
		}
	}
	after := hostNetwork(t)
	for what, lines := range before {
		if !slices.Equal(lines, after[what]) {
			t.Errorf("%s after the interrupted demo:\n%s\nbefore it:\n%s", what,
				strings.Join(after[what], "\n"), strings.Join(lines, "\n"))
		}
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("state dir %s: %v; want it removed", state, err)
	}
	// Who stopped the VM depends on the moment: `down` when it was running, the daemon's
	// own undo when the interrupt came while its Create was still waiting for qemu (seen in
	// CI). Either way the checks above hold; say which for the log.
	t.Logf("stopped by down: %v", strings.Contains(out.String(), "stopped node VMs:"))
}
