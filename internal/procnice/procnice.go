// Package procnice reads and sets the nice value of all of a process's threads.
package procnice

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Set sets the nice value of every thread of process pid: setpriority(2) on Linux sets
// one thread's, and a process's threads (qemu's vCPUs, a Go program's) are each their own.
// Threads started later inherit the value of the thread that starts them.
func Set(pid, nice int) error {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return fmt.Errorf("listing the threads of process %d: %w", pid, err)
	}
	var errs []error
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("thread %d: %w", tid, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("setting process %d to nice %d: %w", pid, nice, err)
	}
	return nil
}

// Threads returns the nice value of each thread of process pid (field 19 of
// /proc/PID/task/TID/stat), by thread id.
func Threads(pid int) (map[int]int, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[int]int{}
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(dir + "/" + e.Name() + "/stat")
		if err != nil {
			continue // the thread ended
		}
		n, err := statNice(b)
		if err != nil {
			return nil, fmt.Errorf("thread %d: %w", tid, err)
		}
		out[tid] = n
	}
	return out, nil
}

// statNice reads the nice value from a /proc stat line: the fields after the command,
// which is in parentheses and may hold spaces, start with the state (field 3); nice is
// field 19.
func statNice(stat []byte) (int, error) {
	s := string(stat)
	i := len(s) - 1
	for i >= 0 && s[i] != ')' {
		i--
	}
	if i < 0 {
		return 0, fmt.Errorf("stat line %.60q has no command in parentheses", s)
	}
	fields := strings.Fields(s[i+1:])
	const niceField = 19 - 3 // fields[0] is field 3
	if len(fields) <= niceField {
		return 0, fmt.Errorf("stat line has %d fields after the command, want more than %d", len(fields), niceField)
	}
	return strconv.Atoi(fields[niceField])
}
