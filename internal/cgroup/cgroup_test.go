package cgroup

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

func TestLimitsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    Limits
		want string // "" valid
	}{
		{"none", Limits{}, ""},
		{"all", Limits{MemoryMax: 2 << 30, PIDsMax: 4096, CPUWeight: 100}, ""},
		{"tiny memory", Limits{MemoryMax: 1 << 20}, "at least 32Mi"},
		{"negative memory", Limits{MemoryMax: -1}, "memory -1"},
		{"too few pids", Limits{PIDsMax: 3}, "at least 16"},
		{"weight too high", Limits{CPUWeight: 10001}, "1 to 10000"},
		{"cpu cap too small", Limits{CPUMaxMilli: 5}, "at least 10"},
		{"negative cpu cap", Limits{CPUMaxMilli: -1}, "at least 10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.l.Validate()
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
}

// fakeRoot lays out the files Open looks for, as v1 or v2 mounts them.
func fakeRoot(t *testing.T, v2 bool) string {
	root := t.TempDir()
	touch := func(p string) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if v2 {
		touch(filepath.Join(root, "cgroup.controllers"))
	} else {
		for _, c := range controllers() {
			touch(filepath.Join(root, c, "cgroup.procs"))
		}
	}
	return root
}

func TestEnsureWritesTheLimits(t *testing.T) {
	for _, tc := range []struct {
		name  string
		v2    bool
		l     Limits
		files map[string]string
	}{
		{"v2", true, Limits{MemoryMax: 1 << 30, PIDsMax: 2048, CPUWeight: 50, CPUMaxMilli: 1500}, map[string]string{
			"socialweb/t-a/memory.max": "1073741824", "socialweb/t-a/memory.swap.max": "0",
			"socialweb/t-a/pids.max": "2048", "socialweb/t-a/cpu.weight": "50", "socialweb/t-a/cpu.max": "150000 100000",
			"cgroup.subtree_control": "+memory +pids +cpu", "socialweb/cgroup.subtree_control": "+memory +pids +cpu",
		}},
		{"v2 without limits", true, Limits{}, map[string]string{
			"socialweb/t-a/memory.max": "max", "socialweb/t-a/pids.max": "max", "socialweb/t-a/cpu.weight": "100",
			"socialweb/t-a/cpu.max": "max 100000",
		}},
		{"v1", false, Limits{MemoryMax: 1 << 30, PIDsMax: 2048, CPUWeight: 50, CPUMaxMilli: 250}, map[string]string{
			"memory/socialweb/t-a/memory.limit_in_bytes": "1073741824", "pids/socialweb/t-a/pids.max": "2048",
			"cpu/socialweb/t-a/cpu.shares": "512", "cpu/socialweb/t-a/cpu.cfs_quota_us": "25000",
			"cpu/socialweb/t-a/cpu.cfs_period_us": "100000",
		}},
		{"v1 without limits", false, Limits{}, map[string]string{
			"memory/socialweb/t-a/memory.limit_in_bytes": "-1", "pids/socialweb/t-a/pids.max": "max",
			"cpu/socialweb/t-a/cpu.shares": "1024", "cpu/socialweb/t-a/cpu.cfs_quota_us": "-1",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fakeRoot(t, tc.v2)
			h, err := Open(root, "socialweb")
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{true: 2, false: 1}[tc.v2]; h.Version() != want {
				t.Errorf("version %d, want %d", h.Version(), want)
			}
			if _, err := h.Ensure("t-a", tc.l); err != nil {
				t.Fatal(err)
			}
			for f, want := range tc.files {
				b, err := os.ReadFile(filepath.Join(root, f))
				if err != nil || string(b) != want {
					t.Errorf("%s = %q (%v), want %q", f, b, err, want)
				}
			}
		})
	}
}

func TestBadInputMakesNothing(t *testing.T) {
	root := fakeRoot(t, true)
	if _, err := Open(root, "../escape"); err == nil {
		t.Error("Open with a parent outside the mount: no error")
	}
	h, err := Open(root, "socialweb")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		l    Limits
	}{{"a/b", Limits{}}, {"..", Limits{}}, {"ok", Limits{MemoryMax: 1}}} {
		if _, err := h.Ensure(tc.name, tc.l); err == nil {
			t.Errorf("Ensure(%q, %+v): no error", tc.name, tc.l)
		}
	}
	entries, err := os.ReadDir(filepath.Join(root, "socialweb"))
	for _, e := range entries {
		if e.IsDir() {
			t.Errorf("bad input made group %s", e.Name())
		}
	}
	if err != nil {
		t.Errorf("Open on v2 did not make the parent to delegate in: %v", err)
	}
	if _, err := Open(t.TempDir(), "socialweb"); err == nil || !strings.Contains(err.Error(), "cannot limit") {
		t.Errorf("Open with no cgroup mount: %v, want an error saying it cannot limit", err)
	}
}

// TestMain runs the child of TestLiveOOMKill when asked: it waits for stdin to
// close (it is in the group by then) and allocates past the group's memory.
func TestMain(m *testing.M) {
	if os.Getenv("SOCIALWEB_CGROUP_ALLOCATE") == "1" {
		_, _ = io.ReadAll(os.Stdin)
		b := make([]byte, 256<<20)
		for i := range b {
			b[i] = 1
		}
		fmt.Println("allocated", len(b))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A process past the group's memory is OOM-killed inside it, and the count says so.
func TestLiveOOMKill(t *testing.T) {
	if os.Geteuid() != 0 {
		livetest.Skip(t, "making cgroups needs root")
	}
	h, err := Open("/sys/fs/cgroup", "socialweb-test")
	if err != nil {
		livetest.Skip(t, err.Error())
	}
	g, err := h.Ensure(fmt.Sprintf("oom-%d", os.Getpid()), Limits{MemoryMax: 64 << 20, PIDsMax: 64, CPUWeight: 50})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Remove(); err != nil {
			t.Error(err)
		}
		for _, d := range g.Dirs() {
			_ = os.Remove(filepath.Dir(d)) // the test's parent, if nothing else is in it
		}
	})
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "SOCIALWEB_CGROUP_ALLOCATE=1")
	// It waits on stdin until it is in the group: the allocation must be charged there.
	r, w, _ := os.Pipe()
	cmd.Stdin = r
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	addErr := g.Add(cmd.Process.Pid)
	w.Close()
	if addErr != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal(addErr)
	}
	if in, err := g.Contains(cmd.Process.Pid); err != nil || !in {
		t.Errorf("Contains(%d) = %v, %v; want true", cmd.Process.Pid, in, err)
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the child past 64Mi: %v, want killed by SIGKILL; output:\n%s", err, out)
	}
	if n, err := g.OOMKills(); err != nil || n < 1 {
		t.Errorf("OOMKills = %d, %v; want at least 1", n, err)
	}
	t.Logf("cgroup v%d: child killed (%v), dirs %v", h.Version(), err, g.Dirs())
}
