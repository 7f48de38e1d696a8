// Package supervisor runs child processes, restarts them with backoff when
// they crash, and records each one's identity and fingerprint on disk. The
// processes outlive the daemon (no parent-death signal, a log file of their
// own): a later daemon adopts one of the same fingerprint and replaces one of
// another build or configuration as its Upgrade says, and reaps one no longer
// wanted.
package supervisor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Identity names one process unambiguously: a pid alone is reused by the
// kernel, so the start time and command line must match too.
type Identity struct {
	PID       int      `json:"pid"`
	StartTime uint64   `json:"startTime"` // clock ticks after boot, /proc/PID/stat field 22
	Cmdline   []string `json:"cmdline"`
}

// Observe reads the identity of a running process.
func Observe(pid int) (Identity, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Identity{}, err
	}
	// The command name (field 2) may hold spaces and parentheses; the
	// fields after it start past the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return Identity{}, fmt.Errorf("unparsable /proc/%d/stat", pid)
	}
	fields := strings.Fields(string(stat[i+1:]))
	// fields[0] is field 3 (state); start time is field 22.
	if len(fields) < 20 {
		return Identity{}, fmt.Errorf("short /proc/%d/stat", pid)
	}
	if fields[0] == "Z" {
		return Identity{}, fmt.Errorf("process %d is a zombie: %w", pid, os.ErrNotExist)
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return Identity{}, fmt.Errorf("start time of %d: %w", pid, err)
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return Identity{}, err
	}
	cmdline := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	return Identity{PID: pid, StartTime: start, Cmdline: cmdline}, nil
}

// ObserveStarted reads the identity of a child that exec.Cmd.Start just returned. Start
// returns once the kernel has switched the child to the new program but possibly before it
// has copied the arguments, and /proc/PID/cmdline reads empty in that window; an identity
// recorded then would never match again. So it waits (up to two seconds) for a cmdline.
func ObserveStarted(pid int) (Identity, error) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		id, err := Observe(pid)
		if err != nil || len(id.Cmdline) > 0 && id.Cmdline[0] != "" {
			return id, err
		}
		if time.Now().After(deadline) {
			return id, fmt.Errorf("process %d still has no command line two seconds after it started", pid)
		}
		time.Sleep(time.Millisecond)
	}
}

// Same reports whether two identities name the same process.
func (a Identity) Same(b Identity) bool {
	if a.PID != b.PID || a.StartTime != b.StartTime || len(a.Cmdline) != len(b.Cmdline) {
		return false
	}
	for i := range a.Cmdline {
		if a.Cmdline[i] != b.Cmdline[i] {
			return false
		}
	}
	return true
}

// Alive reports whether the process the identity names still runs.
func (a Identity) Alive() bool {
	cur, err := Observe(a.PID)
	return err == nil && cur.Same(a)
}

// Record is an instance record: the process and what it runs (Spec.Fingerprint).
type Record struct {
	Identity
	Fingerprint string `json:"fingerprint,omitempty"`
}

func writeRecord(path string, rec Record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		return fmt.Errorf("writing instance record: %w", err)
	}
	return os.Rename(path+".tmp", path)
}

func readRecord(path string) (Record, error) {
	var rec Record
	b, err := os.ReadFile(path)
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("parsing instance record %s: %w", path, err)
	}
	return rec, nil
}

// Reap kills the process an instance record names, if that exact process
// still runs, and removes the record: a process no cluster wants any more
// (deleted while no daemon ran, or stopped by down). It returns whether a
// process was killed.
func Reap(recordPath string, grace time.Duration) (bool, error) {
	rec, err := readRecord(recordPath)
	id := rec.Identity
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		_ = os.Remove(recordPath)
		return false, err
	}
	killed := false
	if id.Alive() {
		killed = true
		if err := terminate(id, grace); err != nil {
			return true, err
		}
	}
	return killed, removeRecord(recordPath)
}

func removeRecord(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// terminate sends SIGTERM, waits up to grace, then SIGKILLs. It checks the
// identity before each signal so a recycled pid is never hit.
func terminate(id Identity, grace time.Duration) error {
	if !id.Alive() {
		return nil
	}
	_ = syscall.Kill(id.PID, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !id.Alive() {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	if id.Alive() {
		_ = syscall.Kill(id.PID, syscall.SIGKILL)
	}
	for i := 0; i < 100 && id.Alive(); i++ {
		time.Sleep(20 * time.Millisecond)
	}
	if id.Alive() {
		return fmt.Errorf("process %d survived SIGKILL", id.PID)
	}
	return nil
}

// Running reports the process an instance record names if that exact process still
// runs. A missing record is not running.
func Running(recordPath string) (Identity, bool, error) {
	rec, err := readRecord(recordPath)
	id := rec.Identity
	if errors.Is(err, os.ErrNotExist) {
		return id, false, nil
	}
	if err != nil {
		return id, false, err
	}
	return id, id.Alive(), nil
}

// RecordSelf writes this process's instance record to path.
func RecordSelf(path string) error {
	id, err := Observe(os.Getpid())
	if err != nil {
		return err
	}
	return writeRecord(path, Record{Identity: id})
}
