// Package cgroup puts a host process in a cgroup of its own, with memory, CPU and
// process-count limits, and reads back whether the kernel OOM-killed in it. It works
// on cgroup v2 (one unified hierarchy) and v1 (a hierarchy per controller, as some
// of our hosts still mount), because a tenant's control plane must be walled in on
// either: without a limit one tenant can take the host's memory, and the OOM killer
// may then pick the daemon or another tenant.
package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Limits of one group. A zero field sets no limit (the kernel's default).
type Limits struct {
	MemoryMax int64 // bytes: memory.max (v2), memory.limit_in_bytes (v1)
	PIDsMax   int64 // pids.max
	// CPUWeight is cpu.weight (v2), 1 to 10000, 100 being an ordinary process's
	// share; v1 gets cpu.shares = weight * 1024 / 100.
	CPUWeight int64
	// CPUMaxMilli caps the group at this many thousandths of a core, however idle the
	// host (cpu.max on v2, cpu.cfs_quota_us on v1); 0 is no cap.
	CPUMaxMilli int64
}

// cpuPeriodMicros is the period CPUMaxMilli's quota is counted over (the kernel's default).
const cpuPeriodMicros = 100000

// Validate says what is wrong with l, naming each field as a flag would.
func (l Limits) Validate() error {
	var problems []string
	if l.MemoryMax < 0 || (l.MemoryMax > 0 && l.MemoryMax < 32<<20) {
		problems = append(problems, fmt.Sprintf("memory %d bytes: want 0 (no limit) or at least 32Mi", l.MemoryMax))
	}
	if l.PIDsMax < 0 || (l.PIDsMax > 0 && l.PIDsMax < 16) {
		problems = append(problems, fmt.Sprintf("pids %d: want 0 (no limit) or at least 16", l.PIDsMax))
	}
	if l.CPUWeight < 0 || l.CPUWeight > 10000 {
		problems = append(problems, fmt.Sprintf("cpu weight %d: want 1 to 10000 (100 is an ordinary process), or 0 for the default", l.CPUWeight))
	}
	if l.CPUMaxMilli < 0 || (l.CPUMaxMilli > 0 && l.CPUMaxMilli < 10) {
		problems = append(problems, fmt.Sprintf("cpu max %d millicores: want 0 (no cap) or at least 10", l.CPUMaxMilli))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// controllers are what socialweb limits, by their v1 hierarchy names; memory first
// (Contains and OOMKills read it).
func controllers() []string { return []string{"memory", "pids", "cpu"} }

// Hierarchy is where groups are made: Parent under a v2 mount, or under each v1
// controller's mount.
type Hierarchy struct {
	root   string // the cgroup mount, /sys/fs/cgroup
	parent string // the directory socialweb's groups go in, relative to each mount
	v2     bool
}

// Open finds the cgroup version mounted at root (normally /sys/fs/cgroup) and
// returns the hierarchy whose groups live under parent (e.g. "socialweb").
func Open(root, parent string) (*Hierarchy, error) {
	if parent == "" || strings.Contains(parent, "..") || filepath.IsAbs(parent) {
		return nil, fmt.Errorf("cgroup parent %q: want a relative path such as socialweb", parent)
	}
	h := &Hierarchy{root: root, parent: parent}
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		h.v2 = true
		// Now, not at the first Ensure: a host that cannot delegate says so at start.
		if err := h.enableV2(); err != nil {
			return nil, err
		}
		return h, nil
	}
	for _, c := range controllers() {
		if _, err := os.Stat(filepath.Join(root, c, "cgroup.procs")); err != nil {
			return nil, fmt.Errorf("no cgroup v2 at %s and no v1 %s controller (%v): cannot limit tenant processes", root, c, err)
		}
	}
	return h, nil
}

// Version is 1 or 2.
func (h *Hierarchy) Version() int {
	if h.v2 {
		return 2
	}
	return 1
}

// Group is one process's cgroup.
type Group struct {
	Name string
	dirs []string // v2: one; v1: one per controller, in controllers' order
	v2   bool
}

// Ensure makes (or keeps) the group name with limits l and returns it. It is
// idempotent: a second call sets the limits again.
func (h *Hierarchy) Ensure(name string, l Limits) (*Group, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return nil, fmt.Errorf("cgroup name %q: want one path component", name)
	}
	if h.v2 {
		// Again: the parent may have been removed since Open.
		if err := h.enableV2(); err != nil {
			return nil, err
		}
	}
	g := h.Lookup(name)
	for _, d := range g.dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("making cgroup %s: %w", d, err)
		}
	}
	for file, value := range g.limitFiles(l) {
		if err := os.WriteFile(file, []byte(value), 0o644); err != nil {
			return nil, fmt.Errorf("setting %s to %s: %w", file, value, err)
		}
	}
	return g, nil
}

// Lookup returns the group name as Ensure would make it, without making it (to
// Remove a group of an earlier run, or read its counts).
func (h *Hierarchy) Lookup(name string) *Group {
	g := &Group{Name: name, v2: h.v2}
	if h.v2 {
		g.dirs = []string{filepath.Join(h.root, h.parent, name)}
	} else {
		for _, c := range controllers() {
			g.dirs = append(g.dirs, filepath.Join(h.root, c, h.parent, name))
		}
	}
	return g
}

// enableV2 turns the controllers on for the parent's children: a v2 group gets
// a controller's files only when its parent delegates it.
func (h *Hierarchy) enableV2() error {
	parent := filepath.Join(h.root, h.parent)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("making cgroup %s: %w", parent, err)
	}
	rel := strings.Split(h.parent, string(filepath.Separator))
	dir := h.root
	for i := 0; i <= len(rel); i++ {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+memory +pids +cpu"), 0o644); err != nil {
			return fmt.Errorf("delegating memory, pids and cpu in %s: %w (on a systemd host, run socialweb with Delegate=yes)", dir, err)
		}
		if i < len(rel) {
			dir = filepath.Join(dir, rel[i])
		}
	}
	return nil
}

// limitFiles are the files and values that set l.
func (g *Group) limitFiles(l Limits) map[string]string {
	mem, pids := "max", "max"
	if l.MemoryMax > 0 {
		mem = strconv.FormatInt(l.MemoryMax, 10)
	}
	if l.PIDsMax > 0 {
		pids = strconv.FormatInt(l.PIDsMax, 10)
	}
	weight := l.CPUWeight
	if weight == 0 {
		weight = 100
	}
	quota := "max" // v2's "no cap"; v1's is -1
	if l.CPUMaxMilli > 0 {
		quota = strconv.FormatInt(l.CPUMaxMilli*cpuPeriodMicros/1000, 10)
	}
	if g.v2 {
		d := g.dirs[0]
		return map[string]string{
			filepath.Join(d, "cpu.max"):    quota + " " + strconv.Itoa(cpuPeriodMicros),
			filepath.Join(d, "memory.max"): mem,
			// No swap: a tenant past its memory is killed, not paged out slowly.
			filepath.Join(d, "memory.swap.max"): "0",
			filepath.Join(d, "pids.max"):        pids,
			filepath.Join(d, "cpu.weight"):      strconv.FormatInt(weight, 10),
		}
	}
	if mem == "max" {
		mem = "-1"
	}
	if quota == "max" {
		quota = "-1"
	}
	return map[string]string{
		filepath.Join(g.dirs[0], "memory.limit_in_bytes"): mem,
		filepath.Join(g.dirs[1], "pids.max"):              pids,
		filepath.Join(g.dirs[2], "cpu.shares"):            strconv.FormatInt(max(2, weight*1024/100), 10),
		filepath.Join(g.dirs[2], "cpu.cfs_period_us"):     strconv.Itoa(cpuPeriodMicros),
		filepath.Join(g.dirs[2], "cpu.cfs_quota_us"):      quota,
	}
}

// Add moves pid into the group (in every v1 hierarchy).
func (g *Group) Add(pid int) error {
	for _, d := range g.dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("moving process %d into cgroup %s: %w", pid, d, err)
		}
	}
	return nil
}

// Contains reports whether pid is in the group (its memory hierarchy on v1).
func (g *Group) Contains(pid int) (bool, error) {
	b, err := os.ReadFile(filepath.Join(g.dirs[0], "cgroup.procs"))
	if err != nil {
		return false, err
	}
	for _, f := range strings.Fields(string(b)) {
		if f == strconv.Itoa(pid) {
			return true, nil
		}
	}
	return false, nil
}

// OOMKills is how many processes the kernel has OOM-killed in the group since it
// was made: memory.events (v2) or memory.oom_control (v1), key oom_kill.
func (g *Group) OOMKills() (int64, error) {
	file := filepath.Join(g.dirs[0], "memory.events")
	if !g.v2 {
		file = filepath.Join(g.dirs[0], "memory.oom_control")
	}
	f, err := os.Open(file)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s has no oom_kill count (kernel older than 4.13?)", file)
}

// Dirs are the group's directories (one on v2), for messages and tests.
func (g *Group) Dirs() []string { return append([]string(nil), g.dirs...) }

// Remove deletes the group; it must hold no process. A missing group is not an error.
func (g *Group) Remove() error {
	var errs []error
	for _, d := range g.dirs {
		errs = append(errs, RemoveDir(d))
	}
	return errors.Join(errs...)
}

// RemoveDir removes one group directory. A process killed a moment ago (or a child
// that dies with its parent, as virtiofsd's sandbox does) leaves its group a little
// after it is gone: a busy group is tried again for a few seconds. A missing one is not
// an error.
func RemoveDir(d string) error {
	err := os.Remove(d)
	for end := time.Now().Add(3 * time.Second); errors.Is(err, syscall.EBUSY) && time.Now().Before(end); err = os.Remove(d) {
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing cgroup %s: %w", d, err)
	}
	return nil
}
