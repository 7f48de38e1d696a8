package qemu

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStopAll: the VMs a daemon left running (for adoption) are stopped, their taps
// removed and their directories gone; consoles are kept; nothing is touched while a
// provider holds the state dir.
func TestStopAll(t *testing.T) {
	e := newFakeEnv(t)
	ctx := t.Context()
	p := e.provider(t)
	var pids []int
	for _, n := range []string{"a-one", "b-two"} {
		if _, err := p.Create(ctx, req(n[:1], n)); err != nil {
			t.Fatal(err)
		}
		info, _ := p.Info(n)
		pids = append(pids, info.PID)
	}
	if _, err := StopAll(ctx, e.cfg.StateDir, e.net, testLogger(t)); err == nil || !strings.Contains(err.Error(), "in use by another provider") {
		t.Fatalf("StopAll while a provider runs: %v; want a refusal", err)
	}
	if got := len(e.net.taps); got != 2 {
		t.Fatalf("the refused StopAll changed the taps: %d left", got)
	}
	if err := p.Close(); err != nil { // the daemon stops; its VMs run on
		t.Fatal(err)
	}
	stopped, err := StopAll(ctx, e.cfg.StateDir, e.net, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(stopped, ",") != "a-one,b-two" {
		t.Errorf("stopped %q, want a-one,b-two", stopped)
	}
	for _, pid := range pids {
		// The fake qemus are this test's children: one that StopAll ended may be a zombie
		// for a moment, until the first provider's reaper collects it.
		waitFor(t, 5*time.Second, fmt.Sprintf("qemu pid %d to end", pid), func() bool { return !runningPID(pid) })
	}
	if len(e.net.taps) != 0 {
		t.Errorf("taps left: %v", e.net.taps)
	}
	for _, n := range []string{"a-one", "b-two"} {
		if _, err := os.Stat(filepath.Join(e.cfg.StateDir, n)); !os.IsNotExist(err) {
			t.Errorf("node dir %s: %v; want it removed", n, err)
		}
		if _, err := os.Stat(filepath.Join(e.cfg.StateDir, dirConsoles, n+".log")); err != nil {
			t.Errorf("console of %s not kept: %v", n, err)
		}
	}
	if again, err := StopAll(ctx, e.cfg.StateDir, e.net, nil); err != nil || len(again) != 0 {
		t.Errorf("second StopAll: %v, %v; want nothing to do", again, err)
	}
	if none, err := StopAll(ctx, filepath.Join(t.TempDir(), "never"), e.net, nil); err != nil || len(none) != 0 {
		t.Errorf("StopAll of a missing dir: %v, %v", none, err)
	}
}

// runningPID reports whether pid is a process that is neither gone nor a zombie.
func runningPID(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || len(stat) <= i+2 || stat[i+2] != 'Z'
}
