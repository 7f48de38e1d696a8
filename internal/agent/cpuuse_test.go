package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestParseProcStat(t *testing.T) {
	for _, tc := range []struct {
		stat          string
		name          string
		own, children uint64
		ok            bool
	}{
		{"1 (socialweb-node) S 0 1 1 0 -1 4194560 100 200 0 0 150 50 7 3 20 0 30 0 1 0", "socialweb-node", 200, 10, true},
		{"42 (a (b) c) R 1 42 42 0 -1 0 0 0 0 0 5 6 0 0 20 0 1 0 9 0", "a (b) c", 11, 0, true},
		{"42 (short) R 1 42", "", 0, 0, false},
		{"no parens", "", 0, 0, false},
		{"42 (x) R 1 42 42 0 -1 0 0 0 0 0 five 6 0 0 20", "", 0, 0, false},
	} {
		name, own, children, ok := parseProcStat(tc.stat)
		if name != tc.name || own != tc.own || children != tc.children || ok != tc.ok {
			t.Errorf("parseProcStat(%q) = %q, %d, %d, %v; want %q, %d, %d, %v", tc.stat, name, own, children, ok, tc.name, tc.own, tc.children, tc.ok)
		}
	}
}

func TestCPUReport(t *testing.T) {
	root := t.TempDir()
	write := func(rel, text string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	proc := func(pid, name string, utime, cutime int) {
		write(pid+"/stat", pid+" ("+name+") S 0 1 1 0 -1 0 0 0 0 0 "+strconv.Itoa(utime)+" 0 "+strconv.Itoa(cutime)+" 0 20 0 1 0 1 0")
	}
	// user nice system idle iowait irq softirq
	write("stat", "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 100 0 50 800 50 0 0 0 0 0\nprocesses 400\n")
	proc("1", "socialweb-node", 100, 0)
	proc("7", "containerd", 20, 5)
	prev, err := readCPUSample(root)
	if err != nil {
		t.Fatal(err)
	}
	// 1000 more jiffies, 250 of them busy: the agent used 200, containerd 10 and its
	// reaped children 30; a new process 5.
	write("stat", "cpu  300 0 100 1500 100 0 0 0 0 0\nprocesses 442\n")
	proc("1", "socialweb-node", 300, 0)
	proc("7", "containerd", 30, 35)
	proc("9", "runc", 5, 0)
	cur, err := readCPUSample(root)
	if err != nil {
		t.Fatal(err)
	}
	want := "busy 25% of 1 CPU, 42 processes started; socialweb-node (pid 1) 20.0%, containerd's children 3.0%, containerd 1.0%"
	if got := cpuReport(prev, cur, 1, 3); got != want {
		t.Errorf("cpuReport = %q\nwant %q", got, want)
	}
	if got := cpuReport(cur, cur, 1, 3); got != "no time passed" {
		t.Errorf("cpuReport over no time = %q", got)
	}
	if _, err := readCPUSample(t.TempDir()); err == nil {
		t.Error("readCPUSample of a directory without stat: no error")
	}
}
