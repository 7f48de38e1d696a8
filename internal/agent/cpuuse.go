package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The CPU report: once a minute the agent logs where the guest's CPU went (busy share, and
// the processes that used the most). Under TCG every guest cycle costs the host a core's
// many cycles, so an idle node's periodic work is what several nodes on a small host
// starve each other with; this line is how to see it without a shell in the guest.

// cpuSample is one look at /proc: the guest's busy and total jiffies, and the CPU jiffies
// used by each process name so far.
type cpuSample struct {
	busy, total uint64
	forks       uint64 // processes created since boot
	byName      map[string]uint64
}

// readCPUSample reads /proc/stat and every /proc/<pid>/stat under root.
func readCPUSample(root string) (cpuSample, error) {
	s := cpuSample{byName: map[string]uint64{}}
	b, err := os.ReadFile(filepath.Join(root, "stat"))
	if err != nil {
		return s, err
	}
	line, rest, _ := strings.Cut(string(b), "\n")
	for _, l := range strings.Split(rest, "\n") {
		if v, ok := strings.CutPrefix(l, "processes "); ok {
			s.forks, _ = strconv.ParseUint(v, 10, 64)
		}
	}
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return s, fmt.Errorf("%s/stat: unexpected first line %q", root, line)
	}
	for i, v := range f[1:] {
		n, _ := strconv.ParseUint(v, 10, 64)
		s.total += n
		if i != 3 && i != 4 { // idle, iowait
			s.busy += n
		}
	}
	procs, _ := filepath.Glob(filepath.Join(root, "[0-9]*", "stat"))
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // exited
		}
		name, used, children, ok := parseProcStat(string(b))
		if !ok {
			continue
		}
		if filepath.Base(filepath.Dir(p)) == "1" {
			name += " (pid 1)" // the agent and its in-process kubelet, apart from its children
		}
		s.byName[name] += used
		if children > 0 {
			// Reaped children (iptables, CNI plugins, runc) count under their parent.
			s.byName[name+"'s children"] += children
		}
	}
	return s, nil
}

// parseProcStat returns a process's name, its utime+stime and its reaped children's
// cutime+cstime in jiffies from the text of /proc/<pid>/stat. The name is between the
// first "(" and the last ")": it may hold both.
func parseProcStat(stat string) (name string, own, children uint64, ok bool) {
	open, end := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
	if open < 0 || end < open {
		return "", 0, 0, false
	}
	f := strings.Fields(stat[end+1:])
	if len(f) < 15 { // state is f[0]; utime, stime, cutime, cstime are f[11] to f[14]
		return "", 0, 0, false
	}
	var v [4]uint64
	for i := range v {
		n, err := strconv.ParseUint(f[11+i], 10, 64)
		if err != nil {
			return "", 0, 0, false
		}
		v[i] = n
	}
	return stat[open+1 : end], v[0] + v[1], v[2] + v[3], true
}

// cpuReport describes the interval between two samples: the guest's busy share and the
// top processes by share of one CPU, e.g. "busy 18% of 1 CPU, 40 processes started;
// socialweb-node (pid 1) 9.0%, containerd 4.0%".
func cpuReport(prev, cur cpuSample, cpus, top int) string {
	dt := cur.total - prev.total
	if dt == 0 || cpus < 1 {
		return "no time passed"
	}
	perCPU := float64(dt) / float64(cpus) // jiffies of one CPU in the interval
	type use struct {
		name string
		j    uint64
	}
	var uses []use
	for name, j := range cur.byName {
		if d := j - min(j, prev.byName[name]); d > 0 {
			uses = append(uses, use{name, d})
		}
	}
	sort.Slice(uses, func(i, k int) bool {
		if uses[i].j != uses[k].j {
			return uses[i].j > uses[k].j
		}
		return uses[i].name < uses[k].name
	})
	var b strings.Builder
	fmt.Fprintf(&b, "busy %.0f%% of %d CPU, %d processes started", 100*float64(cur.busy-prev.busy)/float64(dt), cpus, cur.forks-min(cur.forks, prev.forks))
	for i, u := range uses {
		if i == top {
			break
		}
		sep := ", "
		if i == 0 {
			sep = "; "
		}
		fmt.Fprintf(&b, "%s%s %.1f%%", sep, u.name, 100*float64(u.j)/perCPU)
	}
	return b.String()
}

// stepCPUReport starts the minutely CPU report for the agent's life.
func stepCPUReport(ctx context.Context, a *Agent) error {
	go a.reportCPU(time.Minute, runtime.NumCPU())
	return nil
}

// reportCPU logs cpuReport every interval for as long as the agent runs.
func (a *Agent) reportCPU(interval time.Duration, cpus int) {
	prev, err := readCPUSample("/proc")
	if err != nil {
		a.Log.Warn("cpu report: off", "err", err)
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for range t.C {
		cur, err := readCPUSample("/proc")
		if err != nil {
			a.Log.Warn("cpu report: off", "err", err)
			return
		}
		a.Log.Info("cpu use", "interval", interval, "report", cpuReport(prev, cur, cpus, 6))
		prev = cur
	}
}
