package agent

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"
)

// The start profile: socialweb.start-profile=<duration> on the kernel command line (an
// image copy's manifest) profiles a node's start from its identity (a pool VM: its
// claim) for that long; socialweb.start-profile-after=<duration> starts it that much
// later instead (to see where an idle node's CPU goes). Under TCG a start is guest CPU, and most of it runs in PID 1 (the
// agent and its in-process kubelet), so its Go CPU profile says where a start goes; the
// CPU report over the same window says how much went to other processes (containerd,
// shims, runc). The profile reaches the console as base64 lines; hack/start-profile
// turns a console back into a file for `go tool pprof`.

// StartProfileLine is the message of the console lines that carry the profile.
const StartProfileLine = "start profile"

// startProfileChunk is how many base64 characters one console line carries.
const startProfileChunk = 3072

// startProfileFor parses socialweb.start-profile (a duration from 1s to 10m) and
// socialweb.start-profile-after (0 to 1h, default 0).
func startProfileFor(kernelArg func(string) (string, bool)) (d, after time.Duration, err error) {
	v, ok := kernelArg("socialweb.start-profile")
	if !ok {
		return 0, 0, nil
	}
	d, err = time.ParseDuration(v)
	if err != nil || d < time.Second || d > 10*time.Minute {
		return 0, 0, fmt.Errorf("socialweb.start-profile=%q: want a duration from 1s to 10m, such as 8s", v)
	}
	if v, ok := kernelArg("socialweb.start-profile-after"); ok {
		after, err = time.ParseDuration(v)
		if err != nil || after < 0 || after > time.Hour {
			return 0, 0, fmt.Errorf("socialweb.start-profile-after=%q: want a duration from 0s to 1h, such as 2m", v)
		}
	}
	return d, after, nil
}

// startProfile profiles PID 1 for d in the background and logs the profile and a CPU
// report of the window. It is a diagnostic: a failure is logged, never fatal.
func (a *Agent) startProfile() {
	d, after, err := startProfileFor(KernelArg)
	if err != nil {
		a.Log.Warn("start profile: off", "err", err)
		return
	}
	if d == 0 {
		return
	}
	if after > 0 {
		time.AfterFunc(after, func() { a.profile(d) })
		return
	}
	a.profile(d)
}

// profile runs the profile's window of d.
func (a *Agent) profile(d time.Duration) {
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		a.Log.Warn("start profile: off", "err", err)
		return
	}
	acctErr := startAcct(startAcctFile)
	if acctErr != nil {
		a.Log.Warn("start profile: no process accounting", "err", acctErr)
	}
	go func() {
		// A CPU report each second of the window: which processes the start's seconds went to.
		first, err := readCPUSample("/proc")
		prev := first
		for end := time.Now().Add(d); err == nil && time.Now().Before(end); {
			time.Sleep(time.Second)
			var cur cpuSample
			if cur, err = readCPUSample("/proc"); err == nil {
				a.Log.Info("start profile cpu", "uptime", fmt.Sprintf("%.1fs", a.Uptime().Seconds()), "report", cpuReport(prev, cur, runtime.NumCPU(), 8))
				prev = cur
			}
		}
		if err == nil {
			a.Log.Info("start profile cpu", "window", d, "report", cpuReport(first, prev, runtime.NumCPU(), 12))
		}
		pprof.StopCPUProfile()
		if acctErr == nil {
			a.logAcct(startAcctFile)
		}
		chunks := splitChunks(base64.StdEncoding.EncodeToString(buf.Bytes()), startProfileChunk)
		for i, c := range chunks {
			a.Log.Info(StartProfileLine, "part", i+1, "of", len(chunks), "data", c)
		}
	}()
}

// splitChunks cuts s into pieces of at most n bytes.
func splitChunks(s string, n int) []string {
	var out []string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	return append(out, s)
}

// startAcctFile is where the window's process accounting goes (tmpfs).
const startAcctFile = "/run/socialweb-start.acct"

// startAcct turns process accounting on into file (acct(2) wants it to exist).
func startAcct(file string) error {
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		return err
	}
	return syscall.Acct(file)
}

// logAcct turns process accounting off and logs what the window's exited processes used.
func (a *Agent) logAcct(file string) {
	if _, _, e := syscall.Syscall(syscall.SYS_ACCT, 0, 0, 0); e != 0 {
		a.Log.Warn("start profile: turning process accounting off", "err", e)
	}
	b, err := os.ReadFile(file)
	os.Remove(file)
	if err == nil {
		var recs []acctRecord
		if recs, err = parseAcct(b); err == nil {
			a.Log.Info("start profile exited", "processes", len(recs), "byName", strings.Join(acctSummary(recs), ", "))
			names := map[uint32]string{1: "pid 1"}
			for _, r := range recs {
				names[r.PID] = r.Comm
			}
			for _, r := range recs {
				if r.CPU >= 0.05 {
					parent := names[r.PPID]
					if parent == "" {
						parent = procComm(r.PPID)
					}
					a.Log.Info("start profile process", "comm", r.Comm, "pid", r.PID, "parent", fmt.Sprintf("%s (%d)", parent, r.PPID),
						"cpu", fmt.Sprintf("%.2fs", r.CPU), "elapsed", fmt.Sprintf("%.2fs", r.Elapsed))
				}
			}
		}
	}
	if err != nil {
		a.Log.Warn("start profile: process accounting", "err", err)
	}
}

// procComm is a live process's name, or "?".
func procComm(pid uint32) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}
