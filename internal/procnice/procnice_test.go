package procnice

import (
	"os"
	"os/exec"
	"testing"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

func TestStatNice(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       int
		wantErr    bool
	}{
		{"qemu", "4242 (qemu-system-x86) S 1 4242 4242 0 -1 4194560 1 0 0 0 5 3 0 0 30 10 7 0 100 0 0\n", 10, false},
		{"a command with spaces and parentheses", "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 -5 1 0 1 0 0", -5, false},
		{"no command", "4242 qemu S 1", 0, true},
		{"cut short", "4242 (qemu) S 1 2 3", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := statNice([]byte(tc.stat))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("statNice = %d, %v; want %d, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// Set reaches every thread of a running process, down and back up (raising needs root).
func TestSetAndThreads(t *testing.T) {
	if os.Geteuid() != 0 {
		livetest.Skip(t, "raising a process's priority back to 0 needs root (CAP_SYS_NICE)")
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	for _, want := range []int{10, 0} {
		if err := Set(cmd.Process.Pid, want); err != nil {
			t.Fatal(err)
		}
		got, err := Threads(cmd.Process.Pid)
		if err != nil || len(got) == 0 {
			t.Fatalf("Threads: %v, %v", got, err)
		}
		for tid, n := range got {
			if n != want {
				t.Errorf("thread %d at nice %d, want %d", tid, n, want)
			}
		}
	}
	if err := Set(1<<30, 0); err == nil {
		t.Error("Set of a process that does not exist: no error")
	}
}
