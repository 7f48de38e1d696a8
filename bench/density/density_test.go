package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

const smapsSample = `55d0c6a3a000-7ffd9a5f2000 ---p 00000000 00:00 0                          [rollup]
Rss:              215044 kB
Pss:              198311 kB
Pss_Dirty:        180222 kB
Pss_Anon:         176400 kB
Pss_File:          21911 kB
Pss_Shmem:             0 kB
Shared_Clean:      30480 kB
Private_Dirty:    180220 kB
Swap:                  0 kB
SwapPss:               0 kB
`

func TestParsePssKiB(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    int64
		wantErr bool
	}{
		{"rollup", smapsSample, 198311, false}, // Pss, not Pss_Dirty or SwapPss
		{"zero", "Rss: 0 kB\nPss: 0 kB\n", 0, false},
		{"no pss", "Rss: 12 kB\nPss_Anon: 3 kB\n", 0, true},
		{"bad number", "Pss: x kB\n", 0, true},
		{"empty", "", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parsePssKiB([]byte(tc.in))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parsePssKiB = %d, %v; want %d, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestParseStatPPID(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    int
		wantErr bool
	}{
		{"plain", "1234 (socialweb) S 1000 1234 1000 0 -1", 1000, false},
		{"comm with spaces and parens", "77 (a (b) c) R 42 77 42 0", 42, false},
		{"no comm", "77 socialweb S 42", 0, true},
		{"short", "77 (x) S", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatPPID(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseStatPPID = %d, %v; want %d, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestParseMemAvailableKiB(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    int64
		wantErr bool
	}{
		{"meminfo", "MemTotal:       8000000 kB\nMemFree:         100000 kB\nMemAvailable:    2500000 kB\n", 2500000, false},
		{"missing", "MemTotal: 1 kB\n", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMemAvailableKiB([]byte(tc.in))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseMemAvailableKiB = %d, %v; want %d, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var d []time.Duration
		for _, x := range v {
			d = append(d, time.Duration(x)*time.Millisecond)
		}
		return d
	}
	one20 := ms(20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1)
	for _, tc := range []struct {
		name string
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty", nil, 50, 0},
		{"single p50", ms(7), 50, 7 * time.Millisecond},
		{"single p99", ms(7), 99, 7 * time.Millisecond},
		{"20 p50", one20, 50, 10 * time.Millisecond}, // nearest rank 10 of 20
		{"20 p99", one20, 99, 20 * time.Millisecond}, // rank 20: the slowest
		{"20 p100", one20, 100, 20 * time.Millisecond},
		{"4 p50", ms(4, 1, 3, 2), 50, 2 * time.Millisecond},
		{"200 p99", ms(seq(200)...), 99, 198 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := percentile(tc.in, tc.p); got != tc.want {
				t.Errorf("percentile(%v) = %v, want %v", tc.p, got, tc.want)
			}
		})
	}
	// The input is not reordered.
	in := ms(3, 1, 2)
	_ = percentile(in, 50)
	if in[0] != 3*time.Millisecond {
		t.Errorf("percentile sorted its input: %v", in)
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i + 1
	}
	return s
}

func TestParseClusterList(t *testing.T) {
	out := "NAME    PHASE   URL                       NODES   AGE\n" +
		"t0000   Ready   https://127.0.0.1:20001   0       5m\n" +
		"t0001   Asleep  https://127.0.0.1:20002   0       5m\n" +
		"t0002   Creating                           0       1s\n\n"
	got := parseClusterList(out)
	want := map[string]string{"t0000": "Ready", "t0001": "Asleep", "t0002": "Creating"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %q, want %q", k, got[k], v)
		}
	}
}

func TestDescendantsIncludesSelf(t *testing.T) {
	// A real /proc scan: this process has no children here, so the tree is itself.
	tree, err := descendants(1 << 30)
	if err != nil {
		t.Fatal(err)
	}
	if len(tree) != 1 {
		t.Errorf("a PID with no process: tree %v, want just the root", tree)
	}
}

func TestTreePssCountsChildren(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep binary:", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	tree, err := descendants(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(tree, cmd.Process.Pid) {
		t.Fatalf("tree %v lacks the child %d", tree, cmd.Process.Pid)
	}
	self, err := treePssMiB(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	all, err := treePssMiB(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if self <= 0 || all <= self {
		t.Errorf("PSS: child %.2f MiB, tree %.2f MiB; want 0 < child < tree", self, all)
	}
}

func TestNamesDir(t *testing.T) {
	const dir = "/tmp/socialweb-density-12"
	for _, tc := range []struct {
		name    string
		cmdline string
		want    bool
	}{
		{"flag value", "socialweb\x00serve\x00--state-dir\x00/tmp/socialweb-density-12\x00--api-port\x0020000\x00", true},
		{"path below", "socialweb\x00controlplane\x00--dir=/tmp/socialweb-density-12/clusters/t0001\x00", true},
		{"longer sibling", "socialweb\x00serve\x00--state-dir\x00/tmp/socialweb-density-123\x00", false},
		{"sibling then match", "x\x00/tmp/socialweb-density-123:/tmp/socialweb-density-12\x00", true},
		{"unrelated", "bash\x00-c\x00sleep 5\x00", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := namesDir([]byte(tc.cmdline), dir); got != tc.want {
				t.Errorf("namesDir = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPrintTable(t *testing.T) {
	o := options{tenants: 100, awake: 10, sleepAfter: 30 * time.Second, concurrency: 4}
	awake := report{mode: "awake", held: 40, stopReason: "MemAvailable 2000 MiB < reserve 2048 MiB", awake: 40,
		baseline: 300, total: 8300, perTenant: 200, latencies: []time.Duration{20 * time.Millisecond},
		creates: []time.Duration{5 * time.Second}, next: 5 * time.Second, nextName: "t0039"}
	sleep := report{mode: "sleep", held: 100, awake: 10, asleep: 90, baseline: 300, total: 2750, awakeEach: 200, awakeSum: 2000,
		alone: parts{daemon: 100, mgmt: 200}, with: parts{daemon: 120, mgmt: 230},
		perSleeping: (2750 - 300 - 2000) / 90.0, perTenant: 24.5, latencies: []time.Duration{2 * time.Second, 3 * time.Second},
		creates: []time.Duration{6 * time.Second}, next: 7 * time.Second, nextName: "t0100"}
	var b strings.Builder
	printTable(&b, o, []report{awake, sleep}, "go run ./bench/density -tenants 100")
	out := b.String()
	for _, want := range []string{
		"| figure | awake | sleep | awake / sleep |",
		"| tenants held (N) | 40 | 100 | 0.40 |",
		"= (total − alone − PSS of every awake tenant's processes) / asleep | n/a | 5.00 | |",
		"| of which the daemon process, alone → with N (MiB) | 0 → 0 | 100 → 120 | |",
		"| processes of sleeping tenants (their PSS) | n/a | 0 (0 MiB) | |",
		"| memory per tenant, simple (MiB) = (total − alone) / N | 200.00 | 24.50 | 8.16 |",
		"7.00s (t0100)",
		"command: go run ./bench/density -tenants 100",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestClusterOf(t *testing.T) {
	const state = "/tmp/socialweb-density-12"
	for _, tc := range []struct {
		name, cmdline, cluster string
		mgmt                   bool
	}{
		{"a tenant's control plane", "socialweb\x00controlplane\x00--config\x00/tmp/socialweb-density-12/clusters/t0007/controlplane.json\x00--listen-fd\x003\x00", "t0007", false},
		{"the management API", "socialweb\x00controlplane\x00--config\x00/tmp/socialweb-density-12/mgmt/controlplane.json\x00", "", true},
		{"another state dir's tenant", "socialweb\x00controlplane\x00--config\x00/tmp/socialweb-density-123/clusters/t0007/controlplane.json\x00", "", false},
		{"something else", "qemu-system-x86_64\x00-name\x00x\x00", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cluster, mgmt := clusterOf([]byte(tc.cmdline), state)
			if cluster != tc.cluster || mgmt != tc.mgmt {
				t.Errorf("clusterOf = %q, %v; want %q, %v", cluster, mgmt, tc.cluster, tc.mgmt)
			}
		})
	}
}

func TestBreakdownOfThisProcess(t *testing.T) {
	// sh names the tenant's dir (its $0) and stays, as the parent of sleep, which names nothing.
	cmd := exec.Command("sh", "-c", "sleep 30; :", "/tmp/socialweb-density-test/clusters/t0001/x")
	if err := cmd.Start(); err != nil {
		t.Skip("no sh:", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	time.Sleep(100 * time.Millisecond) // exec'd, so the cmdline is the child's
	p, err := breakdown(os.Getpid(), "/tmp/socialweb-density-test")
	if err != nil {
		t.Fatal(err)
	}
	if p.daemon <= 0 || p.procs["t0001"] != 1 || p.tenants["t0001"] <= 0 || p.other <= 0 {
		t.Errorf("breakdown %+v; want this process as the daemon, sh as tenant t0001's, sleep as other", p)
	}
}
