package agent

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder runs the chains with steps that only record their names.
type recorder struct {
	mu    sync.Mutex
	order []string
}

func (r *recorder) step(name string, err error) Step {
	return Step{name, func(context.Context, *Agent) error {
		r.mu.Lock()
		r.order = append(r.order, name)
		r.mu.Unlock()
		return err
	}}
}

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.order...)
}

func testAgent(t *testing.T, rec *recorder, boot Steps) (*Agent, *bytes.Buffer, chan string) {
	var log bytes.Buffer
	final := make(chan string, 1)
	a := New(Config{
		Steps:         boot,
		ShutdownSteps: Steps{rec.step("stop-a", nil), rec.step("stop-b", errors.New("ignored"))},
		Final:         func(a *Agent, reason string) { final <- reason },
		Log:           slog.New(slog.NewTextHandler(&log, nil)),
	})
	return a, &log, final
}

func TestRunLifecycle(t *testing.T) {
	tests := []struct {
		name       string
		boot       func(r *recorder) Steps
		stop       string // sent after boot, when non-empty
		wantOrder  []string
		wantReason string
		wantErr    string
	}{
		{
			name:       "boot, stop, shutdown chain, final",
			boot:       func(r *recorder) Steps { return Steps{r.step("one", nil), r.step("two", nil)} },
			stop:       "signal terminated",
			wantOrder:  []string{"one", "two", "stop-a", "stop-b"},
			wantReason: "signal terminated",
		},
		{
			name:       "a failing step skips the rest and shuts down",
			boot:       func(r *recorder) Steps { return Steps{r.step("one", errors.New("boom")), r.step("two", nil)} },
			wantOrder:  []string{"one", "stop-a", "stop-b"},
			wantReason: "step one failed",
			wantErr:    "step one: boom",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{}
			a, log, final := testAgent(t, rec, tt.boot(rec))
			errc := make(chan error, 1)
			go func() { errc <- a.Run(context.Background()) }()
			if tt.stop != "" {
				deadline := time.Now().Add(5 * time.Second)
				for !strings.Contains(log.String(), "step=up") && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				a.Stop(tt.stop)
			}
			select {
			case reason := <-final:
				if reason != tt.wantReason {
					t.Errorf("final reason %q, want %q", reason, tt.wantReason)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("Final was not called; log:\n%s", log)
			}
			err := <-errc
			if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("Run = %v, want %q", err, tt.wantErr)
			}
			if got := rec.got(); !reflect.DeepEqual(got, tt.wantOrder) {
				t.Errorf("steps ran %v, want %v", got, tt.wantOrder)
			}
			for _, s := range tt.wantOrder[:len(tt.wantOrder)-1] {
				if s == "one" && tt.wantErr != "" {
					continue
				}
				if !strings.Contains(log.String(), "msg=agent step="+s+" uptime=") {
					t.Errorf("no timeline line for %s:\n%s", s, log)
				}
			}
		})
	}
}

func TestRunContextCancelled(t *testing.T) {
	rec := &recorder{}
	a, _, final := testAgent(t, rec, Steps{rec.step("one", nil)})
	ctx, cancel := context.WithCancel(context.Background())
	go a.Run(ctx)
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case reason := <-final:
		if !strings.Contains(reason, "context done") {
			t.Errorf("reason %q", reason)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no shutdown after the context ended")
	}
}

func TestStepsEditing(t *testing.T) {
	s := DefaultSteps()
	if got, want := s.Names(), []string{"mounts", "limits", "modules", "sysctls", "data-disk", "layer-share", "snapshotter", "containerd-config", "containerd", "proxy-prestart",
		"identity", "hostname", "network", "registry", "kubelet-config", "containerd-ready", "kubelet", "register-node", "proxy", "dns", "health", "cpu-report", "boot-timeline"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("DefaultSteps = %v, want %v", got, want)
	}
	noop := func(context.Context, *Agent) error { return nil }
	s2, err := s.InsertAfter(StepNetwork, Step{"images", noop})
	if err != nil || s2.Index("images") != s.Index(StepNetwork)+1 {
		t.Errorf("InsertAfter: %v, %v", s2.Names(), err)
	}
	s3, err := s.InsertBefore(StepMounts, Step{"first", noop})
	if err != nil || s3.Index("first") != 0 {
		t.Errorf("InsertBefore: %v, %v", s3.Names(), err)
	}
	if _, err := s.InsertAfter("nope", Step{"x", noop}); err == nil {
		t.Error("InsertAfter an unknown step succeeded")
	}
	if s.Index("images") != -1 {
		t.Error("InsertAfter changed the original")
	}
	if r := s.Remove(StepModules); r.Index(StepModules) != -1 || len(r) != len(s)-1 {
		t.Errorf("Remove: %v", r.Names())
	}
	if _, err := s.Replace(StepKubelet, noop); err != nil {
		t.Error(err)
	}
	dup := append(Steps{}, s...)
	dup = append(dup, Step{StepKubelet, noop})
	if err := dup.validate(); err == nil {
		t.Error("a duplicate step name validated")
	}
}

func TestPickLink(t *testing.T) {
	links := map[string]string{"lo": "00:00:00:00:00:00", "eth1": "52:54:00:00:00:02", "eth0": "52:54:00:00:00:01"}
	tests := []struct {
		name    string
		links   map[string]string
		mac     string
		want    string
		wantErr bool
	}{
		{"by MAC", links, "52:54:00:00:00:02", "eth1", false},
		{"by MAC, other case", links, "52:54:00:00:00:0A", "eth0", false},
		{"MAC absent: first link", links, "52:54:00:00:00:09", "eth0", false},
		{"no MAC: first link", links, "", "eth0", false},
		{"upper-case MAC", map[string]string{"lo": "", "ens3": "aa:bb:cc:dd:ee:ff"}, "AA:BB:CC:DD:EE:FF", "ens3", false},
		{"only lo", map[string]string{"lo": ""}, "", "", true},
		{"bad MAC", links, "zz", "", true},
	}
	for _, tt := range tests {
		got, err := PickLink(tt.links, tt.mac)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("%s: PickLink = %q, %v; want %q (err %v)", tt.name, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestNetworkScript(t *testing.T) {
	got := NetworkScript(sampleIdentity(), "eth0")
	want := "link set dev lo up\nlink set dev eth0 up\naddr replace 10.250.3.2/24 dev eth0\nroute replace default via 10.250.3.1 dev eth0\n"
	if got != want {
		t.Errorf("script =\n%s\nwant\n%s", got, want)
	}
}

func TestContainerdMajor(t *testing.T) {
	tests := []struct {
		out     string
		want    int
		wantErr bool
	}{
		{"containerd github.com/containerd/containerd/v2 v2.4.2 \n", 2, false},
		{"containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1\n", 1, false},
		{"containerd github.com/containerd/containerd v1.7.24 88bf19b2\n", 1, false},
		{"garbage", 0, true},
	}
	for _, tt := range tests {
		got, err := ContainerdMajor(tt.out)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ContainerdMajor(%q) = %d, %v; want %d", tt.out, got, err, tt.want)
		}
	}
}

func TestParseStat(t *testing.T) {
	line := "1234 (weird ) name) Z 1 1234 1234 0 -1 4194564 100 0 0 0 1 2 0 0 20 0 1 0 98765 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0"
	st, err := parseStat(line)
	if err != nil || st.state != 'Z' || st.ppid != 1 || st.startTime != 98765 {
		t.Errorf("parseStat = %+v, %v", st, err)
	}
	if _, err := parseStat("1 (x"); err == nil {
		t.Error("malformed stat accepted")
	}
	if self, err := readStat(os.Getpid()); err != nil || self.state == 'Z' || self.ppid != os.Getppid() {
		t.Errorf("own stat = %+v, %v", self, err)
	}
}

func TestHasKeyBit(t *testing.T) {
	tests := []struct {
		caps string
		bit  int
		want bool
	}{
		{"10000000000000 0", keyPower, true}, // ACPI power button: bit 116 in the 2nd word
		{"0 0", keyPower, false},
		{"4", 2, true},
		{"", keyPower, false},
	}
	for _, tt := range tests {
		if got := hasKeyBit(tt.caps, tt.bit); got != tt.want {
			t.Errorf("hasKeyBit(%q, %d) = %v", tt.caps, tt.bit, got)
		}
	}
}
