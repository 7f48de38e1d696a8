package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// parsePssKiB returns the Pss line of a /proc/PID/smaps_rollup, in KiB.
func parsePssKiB(smapsRollup []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(smapsRollup))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "Pss:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing Pss %q: %w", f[1], err)
			}
			return kb, nil
		}
	}
	return 0, errors.New("no Pss line in smaps_rollup")
}

// parseStatPPID returns the parent PID from /proc/PID/stat. The comm field
// may hold spaces and parentheses, so fields are counted after the last ')'.
func parseStatPPID(stat string) (int, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("no comm in stat %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 2 {
		return 0, fmt.Errorf("short stat %q", stat)
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return 0, fmt.Errorf("parsing ppid in stat: %w", err)
	}
	return ppid, nil
}

// parseMemAvailableKiB returns MemAvailable from /proc/meminfo, in KiB.
func parseMemAvailableKiB(meminfo []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(meminfo))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing MemAvailable %q: %w", f[1], err)
			}
			return kb, nil
		}
	}
	return 0, errors.New("no MemAvailable line in meminfo")
}

// memAvailableMiB reads the host's MemAvailable.
func memAvailableMiB() (float64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("reading meminfo: %w", err)
	}
	kb, err := parseMemAvailableKiB(b)
	return float64(kb) / 1024, err
}

// pids lists the numeric entries of /proc.
func pids() ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing /proc: %w", err)
	}
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out, nil
}

// descendants returns root and every process below it, from one /proc scan.
func descendants(root int) ([]int, error) {
	all, err := pids()
	if err != nil {
		return nil, err
	}
	children := map[int][]int{}
	for _, pid := range all {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // exited meanwhile
		}
		ppid, err := parseStatPPID(string(b))
		if err != nil {
			continue
		}
		children[ppid] = append(children[ppid], pid)
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out, nil
}

// treePssMiB sums the PSS of root and all its descendants. A process that
// exits between the scan and the read is skipped: it no longer costs memory.
func treePssMiB(root int) (float64, error) {
	tree, err := descendants(root)
	if err != nil {
		return 0, err
	}
	var kb int64
	for _, pid := range tree {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			if pid == root {
				return 0, fmt.Errorf("reading memory of %d: %w", pid, err)
			}
			continue
		}
		v, err := parsePssKiB(b)
		if err != nil {
			return 0, fmt.Errorf("memory of %d: %w", pid, err)
		}
		kb += v
	}
	return float64(kb) / 1024, nil
}

// killNaming SIGKILLs every process (but this one) whose command line
// contains s, so no control plane of a thrown-away state dir outlives the run.
// It returns the PIDs it killed.
func killNaming(s string) []int {
	all, _ := pids()
	var killed []int
	for _, pid := range all {
		if pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !namesDir(b, s) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed = append(killed, pid)
		}
	}
	return killed
}

// namesDir reports whether a NUL-separated /proc/PID/cmdline names dir or a
// path below it: /tmp/socialweb-density-12 must not match .../socialweb-density-123.
func namesDir(cmdline []byte, dir string) bool {
	d := []byte(dir)
	for _, arg := range bytes.Split(cmdline, []byte{0}) {
		for off := 0; ; {
			i := bytes.Index(arg[off:], d)
			if i < 0 {
				break
			}
			end := off + i + len(d)
			if end == len(arg) || !isNameByte(arg[end]) {
				return true
			}
			off = end
		}
	}
	return false
}

// isNameByte is a byte that would continue a temp dir's name.
func isNameByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_'
}

// waitGone waits until no process's command line contains s.
func waitGone(s string, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		all, _ := pids()
		found := false
		for _, pid := range all {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if err == nil && pid != os.Getpid() && namesDir(b, s) {
				found = true
				break
			}
		}
		if !found {
			return true
		}
	}
	return false
}

// ephemeralRange reads the kernel's range for outgoing ports: a tenant port
// inside it could be taken by any client's connection meanwhile.
func ephemeralRange() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		f := strings.Fields(string(b))
		if len(f) == 2 {
			l, e1 := strconv.Atoi(f[0])
			h, e2 := strconv.Atoi(f[1])
			if e1 == nil && e2 == nil {
				return l, h
			}
		}
	}
	return 32768, 60999
}

// freePortBlock finds n consecutive loopback ports free now, outside the
// ephemeral range where one fits, starting at start.
func freePortBlock(start, n int) (int, error) {
	elo, ehi := ephemeralRange()
	for lo := start; lo+n <= 65535; {
		hi := lo + n - 1
		if hi >= elo && lo <= ehi {
			lo = ehi + 1
			continue
		}
		busy := -1
		for p := lo; p <= hi; p++ {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				busy = p
				break
			}
			_ = l.Close()
		}
		if busy < 0 {
			return lo, nil
		}
		lo = busy + 1
	}
	return 0, fmt.Errorf("no %d consecutive free loopback ports from %d", n, start)
}

// percentile is the nearest-rank p-th percentile (0 < p <= 100) of d.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := int(math.Ceil(float64(len(s)) * p / 100))
	rank = max(1, min(rank, len(s)))
	return s[rank-1]
}

// removeAll removes the state dir; sockets and files of killed processes may
// appear late, so it retries once.
func removeAll(dir string) error {
	err := os.RemoveAll(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		time.Sleep(time.Second)
		err = os.RemoveAll(dir)
	}
	if err != nil {
		return fmt.Errorf("removing %s: %w", filepath.Clean(dir), err)
	}
	return nil
}

// parts is the PSS of a daemon's process tree by part, in MiB.
type parts struct {
	daemon float64 // the serve process itself
	mgmt   float64 // the management API's control plane
	other  float64 // anything else below the daemon (node VMs, helpers)
	// tenants is the PSS of each tenant's processes and procs how many
	// there are: those naming the tenant's dir, state/clusters/NAME.
	tenants map[string]float64
	procs   map[string]int
}

func (p parts) total() float64 {
	t := p.daemon + p.mgmt + p.other
	for _, v := range p.tenants {
		t += v
	}
	return t
}

// clusterOf returns the tenant whose dir (clusters/NAME under state) a
// NUL-separated cmdline names, and whether it names the management API's dir.
func clusterOf(cmdline []byte, state string) (cluster string, mgmt bool) {
	clusters := state + "/clusters/"
	for _, arg := range bytes.Split(cmdline, []byte{0}) {
		s := string(arg)
		if i := strings.Index(s, clusters); i >= 0 {
			rest := s[i+len(clusters):]
			if j := strings.IndexByte(rest, '/'); j >= 0 {
				rest = rest[:j]
			}
			if rest != "" {
				return rest, false
			}
		}
		if namesDir(arg, state+"/mgmt") {
			mgmt = true
		}
	}
	return "", mgmt
}

// breakdown reads the PSS of root's tree by part; state is the daemon's state dir.
func breakdown(root int, state string) (parts, error) {
	tree, err := descendants(root)
	if err != nil {
		return parts{}, err
	}
	p := parts{tenants: map[string]float64{}, procs: map[string]int{}}
	for _, pid := range tree {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			if pid == root {
				return parts{}, fmt.Errorf("reading memory of %d: %w", pid, err)
			}
			continue // exited meanwhile: it no longer costs memory
		}
		kb, err := parsePssKiB(b)
		if err != nil {
			return parts{}, fmt.Errorf("memory of %d: %w", pid, err)
		}
		mib := float64(kb) / 1024
		if pid == root {
			p.daemon += mib
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		switch cluster, mgmt := clusterOf(cmdline, state); {
		case cluster != "":
			p.tenants[cluster] += mib
			p.procs[cluster]++
		case mgmt:
			p.mgmt += mib
		default:
			p.other += mib
		}
	}
	return p, nil
}

// medianParts reads the breakdown n times, gap apart, and keeps each part's
// median: one read can land on either side of a garbage collection of the
// daemon or the management API, tens of MiB apart.
func medianParts(root int, state string, n int, gap time.Duration) (parts, error) {
	var samples []parts
	for i := range n {
		if i > 0 {
			time.Sleep(gap)
		}
		p, err := breakdown(root, state)
		if err != nil {
			return parts{}, err
		}
		samples = append(samples, p)
	}
	med := func(get func(parts) float64) float64 {
		v := make([]float64, len(samples))
		for i, s := range samples {
			v[i] = get(s)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	out := parts{daemon: med(func(p parts) float64 { return p.daemon }), mgmt: med(func(p parts) float64 { return p.mgmt }),
		other: med(func(p parts) float64 { return p.other }), tenants: map[string]float64{}, procs: map[string]int{}}
	last := samples[len(samples)-1]
	for name := range last.tenants {
		out.tenants[name] = med(func(p parts) float64 { return p.tenants[name] })
		out.procs[name] = last.procs[name]
	}
	return out, nil
}
