package qemu

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A warm-pool VM runs at a lower CPU priority (PoolNice) than nodes until it is claimed:
// its boot, and its idle TCG vCPU, get the host's cores only when nodes leave them free.
// Without it, five claims at once met five refills booting beside them on two cores,
// and the five claimed nodes' Pods took minutes instead of seconds (docs/benchmarks.md).
// A claim puts the VM back at the default (0) before its guest reads its identity.

// PoolNice is the nice value of an unclaimed warm-pool VM's qemu threads: a weight of
// about a tenth of a node's (CFS weights 110 against 1024), so a refill still boots on a
// busy host, only slower.
const PoolNice = 10

// setNice sets the nice value of every thread of process pid: setpriority(2) on Linux
// sets one thread's, and qemu's vCPUs are threads of their own.
func setNice(pid, nice int) error {
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

// ThreadNices returns the nice value of each thread of process pid (field 19 of
// /proc/PID/task/TID/stat), by thread id.
func ThreadNices(pid int) (map[int]int, error) {
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
