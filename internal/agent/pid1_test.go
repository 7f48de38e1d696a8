package agent

import (
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestReaperLeavesWaitedChildrenAlone checks the reaper's promise: children
// someone waits for through os/exec keep their exit status (no ECHILD from
// Wait), and children nobody waits for are reaped within a few seconds.
func TestReaperLeavesWaitedChildrenAlone(t *testing.T) {
	startReaper(slog.New(slog.NewTextHandler(io.Discard, nil)))

	// Unwaited: a zombie of this process until the reaper takes it.
	p, err := os.StartProcess("/bin/sh", []string{"sh", "-c", "exit 3"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	orphan, started := p.Pid, time.Now()

	// Waited: many short commands, each must report its own exit status.
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			err := exec.Command("/bin/sh", "-c", "exit "+strconv.Itoa(i%2)).Run()
			if i%2 == 0 && err != nil {
				errs <- err
			}
			if ee, ok := err.(*exec.ExitError); i%2 == 1 && (!ok || ee.ExitCode() != 1) {
				errs <- err
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a waited child lost its exit status: %v", err)
	}

	// Not before reapAfter: it might have a waiter that is just late.
	if time.Since(started) < reapAfter/2 {
		if _, err := readStat(orphan); err != nil {
			t.Errorf("unwaited child reaped %s after it started, before %s", time.Since(started), reapAfter)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := readStat(orphan)
		if err != nil { // gone from /proc: reaped
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("unwaited child %d still there (state %c) after 10s", orphan, st.state)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
