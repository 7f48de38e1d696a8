package main

import "testing"

func TestProcCPUSeconds(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       float64
	}{
		// pid (comm) state ppid ... utime=1234 stime=66 (fields 14 and 15 of stat(5))
		{"qemu", "4242 (qemu-system-x86) S 1 4242 4242 0 -1 4194560 5000 0 0 0 1234 66 0 0 20 0 3 0 100 0", 13.00},
		{"a command with spaces and parentheses", "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 250 50 0 0", 3.00},
		{"truncated", "7 (x) R 1 7", 0},
		{"empty", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := procCPUSeconds(tc.stat); got != tc.want {
				t.Errorf("procCPUSeconds(%q) = %v, want %v", tc.stat, got, tc.want)
			}
		})
	}
}

func TestStatBusySeconds(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		want       float64
	}{
		// user nice system idle iowait irq softirq steal: busy is user+nice+system+irq+softirq.
		{"busy excludes idle, iowait and steal", "cpu  100161 39 23435 35009 592 11 146 425 0 0", 1237.92},
		{"a per-core line is not the total", "cpu0 1 2 3 4 5 6 7 8", 0},
		{"short", "cpu 1 2 3", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := statBusySeconds(tc.line); got < tc.want-1e-9 || got > tc.want+1e-9 {
				t.Errorf("statBusySeconds(%q) = %v, want %v", tc.line, got, tc.want)
			}
		})
	}
}
