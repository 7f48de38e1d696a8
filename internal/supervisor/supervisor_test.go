package supervisor

import (
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

func spec(t *testing.T, name string, args ...string) Spec {
	dir := t.TempDir()
	return Spec{
		Name: name, Path: "/bin/sh", Args: args,
		LogPath: filepath.Join(dir, name+".log"), RecordPath: filepath.Join(dir, name+".instance"),
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCrashedProcessIsRestartedWithBackoff(t *testing.T) {
	s := New(quietLog(), Backoff{Initial: 50 * time.Millisecond, Max: 100 * time.Millisecond, Reset: time.Minute}, "", nil)
	sp := spec(t, "crasher", "-c", "exit 3")
	s.Start(sp)
	defer s.Stop("crasher", time.Second)
	waitFor(t, "three restarts", func() bool { st, _ := s.State("crasher"); return st.Restarts >= 3 })
	st, _ := s.State("crasher")
	if st.LastExit != "exited: exit status 3" {
		t.Errorf("LastExit = %q", st.LastExit)
	}
}

func TestStopKillsAndRemovesRecord(t *testing.T) {
	s := New(quietLog(), DefaultBackoff(), "", nil)
	sp := spec(t, "sleeper", "-c", "trap '' TERM; sleep 30")
	s.Start(sp)
	waitFor(t, "running", func() bool { st, _ := s.State("sleeper"); return st.Running })
	rec, err := readRecord(sp.RecordPath)
	if err != nil {
		t.Fatalf("no instance record: %v", err)
	}
	if !rec.Alive() {
		t.Fatalf("record names a process that is not alive: %+v", rec)
	}
	start := time.Now()
	s.Stop("sleeper", 200*time.Millisecond)
	if rec.Alive() {
		t.Errorf("process survived Stop")
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("Stop took %v", time.Since(start))
	}
	if _, err := os.Stat(sp.RecordPath); !os.IsNotExist(err) {
		t.Errorf("record left behind: %v", err)
	}
	if _, ok := s.State("sleeper"); ok {
		t.Errorf("stopped process still supervised")
	}
}

func TestReap(t *testing.T) {
	tests := []struct {
		name       string
		tamper     func(*Identity)
		wantKilled bool
	}{
		{"the exact process is reaped", func(*Identity) {}, true},
		{"a recycled pid (other start time) is left alone", func(id *Identity) { id.StartTime++ }, false},
		{"another command line is left alone", func(id *Identity) { id.Cmdline = []string{"something-else"} }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command("sleep", "30")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			defer func() { _ = cmd.Process.Kill(); <-exited }()
			// As the supervisor records its children: Observe alone may read the
			// empty cmdline of a child that has not copied its arguments yet.
			id, err := ObserveStarted(cmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			tt.tamper(&id)
			path := filepath.Join(t.TempDir(), "instance")
			if err := writeRecord(path, Record{Identity: id}); err != nil {
				t.Fatal(err)
			}
			killed, err := Reap(path, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if killed != tt.wantKilled {
				t.Errorf("killed = %v, want %v", killed, tt.wantKilled)
			}
			select {
			case <-exited:
				if !tt.wantKilled {
					t.Errorf("an unrelated process was killed")
				}
			case <-time.After(300 * time.Millisecond):
				if tt.wantKilled {
					t.Errorf("reaped process still running")
				}
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Errorf("record not removed")
			}
		})
	}
}

// fakeJail records the pids it holds and reports OOM kills as told.
type fakeJail struct {
	mu    sync.Mutex
	pids  []int
	ooms  int64
	fail  error
	onAdd func(j *fakeJail)
}

func (j *fakeJail) Add(pid int) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.fail != nil {
		return j.fail
	}
	j.pids = append(j.pids, pid)
	if j.onAdd != nil {
		j.onAdd(j)
	}
	return nil
}

func (j *fakeJail) OOMKills() (int64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.ooms, nil
}

func TestJail(t *testing.T) {
	for _, tc := range []struct {
		name     string
		jail     *fakeJail
		want     string // in LastExit
		wantPids bool
	}{
		// The kernel's OOM kill in the jail is what the exit is said to be.
		{"an OOM kill is named", &fakeJail{onAdd: func(j *fakeJail) { j.ooms++ }}, "OOM-killed at its memory limit", true},
		{"another exit is not", &fakeJail{}, "exited: exit status 3", true},
		// A process that cannot be held is not let run.
		{"a jail that refuses", &fakeJail{fail: errors.New("no cgroup")}, "limiting the process: no cgroup", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(quietLog(), Backoff{Initial: 50 * time.Millisecond, Max: 100 * time.Millisecond, Reset: time.Minute}, "", nil)
			sp := spec(t, "jailed", "-c", "sleep 0.3; exit 3") // past its recording
			sp.Jail = tc.jail
			s.Start(sp)
			defer s.Stop("jailed", time.Second)
			waitFor(t, "an exit", func() bool { st, _ := s.State("jailed"); return st.LastExit != "" })
			st, _ := s.State("jailed")
			if !strings.Contains(st.LastExit, tc.want) {
				t.Errorf("LastExit = %q, want it to say %q", st.LastExit, tc.want)
			}
			tc.jail.mu.Lock()
			defer tc.jail.mu.Unlock()
			if got := len(tc.jail.pids) > 0; got != tc.wantPids {
				t.Errorf("jail holds pids %v; want some: %v", tc.jail.pids, tc.wantPids)
			}
		})
	}
}

// TestCredential: a run of another uid starts from an executable in a directory
// that uid cannot search (exec through the daemon's fd), with no other group, and
// its log is a file of that uid; a symlink in the log's place stops the start.
func TestCredential(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the run changes its uid")
	}
	const id = 2_000_007_500
	sp := spec(t, "tenant", "-c", "id -u; id -G; sleep 30")
	hidden := t.TempDir() // 0700 above it: not searchable by id
	sh := filepath.Join(hidden, "sh")
	b, err := os.ReadFile("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sh, b, 0o755); err != nil {
		t.Fatal(err)
	}
	sp.Path = sh
	sp.Credential = &syscall.Credential{Uid: id, Gid: id}
	// The log's directory is root's alone: the run writes to the fd it inherits.
	s := New(quietLog(), Backoff{Initial: 50 * time.Millisecond, Max: 100 * time.Millisecond, Reset: time.Minute}, "", nil)
	s.Start(sp)
	defer s.Stop("tenant", time.Second)
	waitFor(t, "its uid and groups in its log", func() bool {
		b, _ := os.ReadFile(sp.LogPath)
		return strings.Count(string(b), "\n") >= 2
	})
	b, _ = os.ReadFile(sp.LogPath)
	if want := "2000007500\n2000007500\n"; string(b) != want {
		t.Errorf("the run says %q, want %q (its uid, then its only group)", b, want)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(sp.LogPath, &st); err != nil || st.Uid != id {
		t.Errorf("the log is uid %d's (%v), want %d's", st.Uid, err, id)
	}
	rec, err := readRecord(sp.RecordPath)
	if err != nil || len(rec.Cmdline) == 0 || rec.Cmdline[0] != sh {
		t.Errorf("the record's command line is %q (%v), want argv[0] %s", rec.Cmdline, err, sh)
	}

	// A symlink where the log is: the next start refuses it.
	s.Stop("tenant", time.Second)
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(sp.LogPath); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, sp.LogPath); err != nil {
		t.Fatal(err)
	}
	s.Start(sp)
	defer s.Stop("tenant", time.Second)
	waitFor(t, "the start to fail", func() bool { st, _ := s.State("tenant"); return strings.Contains(st.LastExit, "opening the log") })
	if fi, _ := os.Stat(victim); fi.Size() != 0 {
		t.Errorf("the run wrote through the symlink")
	}
}
