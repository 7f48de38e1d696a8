package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

const daemonEnv = "SUPERVISOR_TEST_DAEMON"

// wireSpec is what the test daemon is told of a Spec.
type wireSpec struct {
	Name, Path                       string
	Args                             []string
	LogPath, RecordPath, Fingerprint string
}

// TestMain plays a daemon when asked: it supervises the spec in $SUPERVISOR_TEST_DAEMON
// until it is killed, as serve does its control planes.
func TestMain(m *testing.M) {
	if js := os.Getenv(daemonEnv); js != "" {
		var w wireSpec
		if err := json.Unmarshal([]byte(js), &w); err != nil {
			os.Exit(2)
		}
		New(quietLog(), DefaultBackoff(), "", nil).Start(Spec{Name: w.Name, Path: w.Path, Args: w.Args,
			LogPath: w.LogPath, RecordPath: w.RecordPath, Fingerprint: w.Fingerprint})
		select {}
	}
	os.Exit(m.Run())
}

// earlierDaemon runs a daemon process that starts sp, waits until sp's process
// is recorded, then kills the daemon with SIGKILL, as a crash would. It returns
// the process the daemon left.
func earlierDaemon(t *testing.T, sp Spec) Identity {
	t.Helper()
	js, err := json.Marshal(wireSpec{Name: sp.Name, Path: sp.Path, Args: sp.Args, LogPath: sp.LogPath,
		RecordPath: sp.RecordPath, Fingerprint: sp.Fingerprint})
	if err != nil {
		t.Fatal(err)
	}
	d := exec.Command(os.Args[0], "-test.run=^$")
	d.Env = append(os.Environ(), daemonEnv+"="+string(js))
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	var rec Record
	waitFor(t, "the earlier daemon's process", func() bool {
		rec, err = readRecord(sp.RecordPath)
		return err == nil && rec.Alive()
	})
	_ = d.Process.Kill()
	_ = d.Wait()
	time.Sleep(100 * time.Millisecond)
	if !rec.Alive() {
		t.Fatalf("the process died with its daemon (kill -9): it must outlive it")
	}
	t.Cleanup(func() { _ = terminate(rec.Identity, time.Second) })
	return rec.Identity
}

func TestAdoptedAcrossADaemonKilled(t *testing.T) {
	sp := spec(t, "cp", "-c", "echo started; "+loop)
	sp.Fingerprint = "build-1"
	old := earlierDaemon(t, sp)

	s := New(quietLog(), Backoff{Initial: 20 * time.Millisecond, Max: 50 * time.Millisecond, Reset: time.Minute}, "", nil)
	s.Start(sp)
	waitFor(t, "adopted", func() bool { st, _ := s.State("cp"); return st.Running })
	st, _ := s.State("cp")
	if !st.Adopted || st.PID != old.PID {
		t.Fatalf("state %+v: want the earlier process %d adopted", st, old.PID)
	}
	// Its exit is seen (it is no child of ours), and a new run starts.
	_ = syscall.Kill(old.PID, syscall.SIGKILL)
	waitFor(t, "a new run", func() bool { st, _ := s.State("cp"); return st.Running && st.PID != old.PID })
	st, _ = s.State("cp")
	if st.Restarts != 1 || st.Adopted || !strings.Contains(st.LastExit, "earlier daemon") {
		t.Errorf("after the adopted process died: %+v", st)
	}
	s.Stop("cp", time.Second)
	if b, _ := os.ReadFile(sp.LogPath); strings.Count(string(b), "started\n") != 2 {
		t.Errorf("the log holds %q: want both runs' output appended", b)
	}
}

func TestAdoptedProcessIsStopped(t *testing.T) {
	sp := spec(t, "cp", "-c", "trap '' TERM; "+loop)
	old := earlierDaemon(t, sp)
	s := New(quietLog(), DefaultBackoff(), "", nil)
	s.Start(sp)
	waitFor(t, "adopted", func() bool { st, _ := s.State("cp"); return st.Running })
	s.Stop("cp", 200*time.Millisecond)
	if old.Alive() {
		t.Errorf("the adopted process survived Stop")
	}
	if _, err := os.Stat(sp.RecordPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("record left: %v", err)
	}
}

// A process of another fingerprint, as each strategy has it.
func TestUpgrade(t *testing.T) {
	for _, tc := range []struct {
		upgrade     Upgrade
		newArgs     string // the new build's run
		wantSamePID bool
		want        func(RolloutState) bool
	}{
		{UpgradeManual, loop, true, func(r RolloutState) bool { return slices.Equal(r.Kept, []string{"cp"}) }},
		{UpgradeOnRestart, loop, false, func(r RolloutState) bool { return len(r.Replaced)+len(r.Kept) == 0 }},
		{UpgradeRolling, loop, false, func(r RolloutState) bool { return slices.Equal(r.Replaced, []string{"cp"}) && r.Halted == "" }},
	} {
		t.Run(string(tc.upgrade), func(t *testing.T) {
			sp := spec(t, "cp", "-c", loop)
			sp.Fingerprint = "build-1"
			old := earlierDaemon(t, sp)
			sp.Fingerprint, sp.Args = "build-2", []string{"-c", tc.newArgs}
			s := New(quietLog(), DefaultBackoff(), tc.upgrade, nil)
			s.Start(sp)
			defer s.Stop("cp", time.Second)
			waitFor(t, "settled", func() bool {
				st, _ := s.State("cp")
				r := s.Rollout()
				return st.Running && (st.PID == old.PID) == tc.wantSamePID && tc.want(r)
			})
			if got := old.Alive(); got != tc.wantSamePID {
				t.Errorf("the earlier process alive: %v, want %v", got, tc.wantSamePID)
			}
			rec, err := readRecord(sp.RecordPath)
			wantFP := "build-2"
			if tc.wantSamePID {
				wantFP = "build-1"
			}
			if err != nil || rec.Fingerprint != wantFP {
				t.Errorf("record %+v, %v: want fingerprint %s", rec, err, wantFP)
			}
		})
	}
}

// A rolling upgrade goes one at a time, each once the one before is ready, and
// stops at a new build that crashes: the processes after it keep their build.
func TestRollingUpgradeStopsAtACrash(t *testing.T) {
	ready := map[string]bool{}
	specs := make([]Spec, 3)
	olds := make([]Identity, 3)
	for i, name := range []string{"a", "b", "c"} {
		specs[i] = spec(t, name, "-c", loop)
		specs[i].Fingerprint = "build-1"
		olds[i] = earlierDaemon(t, specs[i])
		specs[i].Fingerprint = "build-2"
		ready[name] = true
	}
	specs[1].Args = []string{"-c", "sleep 0.2; exit 3"} // b's new build crashes
	s := New(quietLog(), Backoff{Initial: time.Hour, Max: time.Hour, Reset: time.Hour}, UpgradeRolling, nil)
	for i := range specs {
		specs[i].Ready = func(context.Context) error { return nil }
		s.Start(specs[i])
		// In order: the next queues behind this one.
		time.Sleep(50 * time.Millisecond)
		defer s.Stop(specs[i].Name, time.Second)
	}
	waitFor(t, "the rollout to stop", func() bool { return s.Rollout().Halted != "" && len(s.Rollout().Kept) == 1 })
	r := s.Rollout()
	if !slices.Equal(r.Replaced, []string{"a"}) || !slices.Equal(r.Kept, []string{"c"}) || !strings.Contains(r.Halted, "b exited before it served") {
		t.Errorf("rollout %+v: want a replaced, halted at b, c kept", r)
	}
	if olds[0].Alive() || olds[1].Alive() || !olds[2].Alive() {
		t.Errorf("earlier processes alive: a %v b %v c %v; want only c", olds[0].Alive(), olds[1].Alive(), olds[2].Alive())
	}
}

// A new daemon takes back the socket an earlier one gave its process.
func TestTakeFile(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command("sleep", "30")
	cmd.ExtraFiles = []*os.File{f}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	id, err := ObserveStarted(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "instance.json")
	if err := writeRecord(path, Record{Identity: id}); err != nil {
		t.Fatal(err)
	}
	got, err := TakeFile(path, 3, "listener")
	if err != nil {
		t.Fatal(err)
	}
	l2, err := net.FileListener(got)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if l2.Addr().String() != addr {
		t.Errorf("took a socket on %s, want %s", l2.Addr(), addr)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dialing the taken socket: %v", err)
	}
	c.Close()
	if _, err := TakeFile(filepath.Join(t.TempDir(), "none.json"), 3, "x"); err == nil {
		t.Errorf("TakeFile of no record: no error")
	}
}

// loop runs until killed, its command line constant (an exec would change it,
// and the recorded identity with it).
const loop = "while :; do sleep 0.1; done"
