package agent

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/boottimeline"
	"github.com/socialweb-computer/socialweb/internal/identity"
)

// disks are identity disk images as a pool VM sees them.
type disks struct{ pool, claimed, torn, invalid []byte }

func testDisks(t *testing.T) disks {
	t.Helper()
	var pool, claimed bytes.Buffer
	if err := identity.EncodePool(&pool, identity.Pool{}); err != nil {
		t.Fatal(err)
	}
	if err := identity.EncodeSized(&claimed, sampleIdentity(), identity.PoolDiskSize); err != nil {
		t.Fatal(err)
	}
	// The host's rewrite seen halfway: the new document's first part, then the pool
	// disk's zeros.
	torn := make([]byte, identity.PoolDiskSize)
	copy(torn, claimed.Bytes()[:bytes.IndexByte(claimed.Bytes(), 0)/2])
	invalid := make([]byte, identity.PoolDiskSize)
	copy(invalid, `{"cluster":"ci","nodeName":"n1"}`) // JSON, but no identity
	return disks{pool.Bytes(), claimed.Bytes(), torn, invalid}
}

// script is a claimPoller's read: each call gives the next result, the last one again
// once the script is done.
type script struct {
	mu    sync.Mutex
	steps []func() ([]byte, error)
	n     int
}

func (s *script) read() ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := min(s.n, len(s.steps)-1)
	s.n++
	return s.steps[i]()
}

func (s *script) reads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func TestClaimPollerWait(t *testing.T) {
	d := testDisks(t)
	tests := []struct {
		name string
		// reads are what the disk gives, in order, the last one again and again:
		// pool, claimed, torn, invalid, garbage, eio (a read error), or cancel (the wait's
		// context is cancelled during a pool read).
		reads     []string
		wantNode  string
		wantReads int // 0: not checked
		wantErr   string
		wantIs    error
	}{
		{name: "unclaimed, then claimed", reads: []string{"pool", "pool", "claimed"}, wantNode: "ci-abc123", wantReads: 3},
		{name: "a torn read, then the whole identity", reads: []string{"pool", "torn", "claimed"}, wantNode: "ci-abc123", wantReads: 3},
		{name: "a read error, then the identity", reads: []string{"pool", "eio", "claimed"}, wantNode: "ci-abc123", wantReads: 3},
		{name: "bad reads between pool reads do not add up",
			reads:    []string{"torn", "torn", "pool", "torn", "torn", "pool", "torn", "torn", "pool", "claimed"},
			wantNode: "ci-abc123", wantReads: 10},
		{name: "context cancelled while unclaimed", reads: []string{"pool", "pool", "cancel"}, wantIs: context.Canceled, wantReads: 3},
		{name: "garbage forever", reads: []string{"pool", "garbage"}, wantErr: "held neither the pool document nor a valid identity"},
		{name: "an invalid identity forever", reads: []string{"pool", "invalid"}, wantErr: "apiServer is empty"},
		{name: "read errors forever", reads: []string{"pool", "eio"}, wantErr: "input/output error", wantIs: syscall.EIO},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s := &script{}
			for _, r := range tt.reads {
				disk := map[string][]byte{"pool": d.pool, "claimed": d.claimed, "torn": d.torn, "invalid": d.invalid,
					"garbage": []byte("\x00garbage"), "cancel": d.pool}[r]
				s.steps = append(s.steps, func() ([]byte, error) {
					switch r {
					case "eio":
						return nil, syscall.EIO
					case "cancel":
						cancel()
					}
					return disk, nil
				})
			}
			t0 := time.Now()
			id, err := claimPoller{read: s.read, every: time.Millisecond, settle: 100 * time.Millisecond}.wait(ctx)
			if tt.wantErr != "" || tt.wantIs != nil {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || (tt.wantIs != nil && !errors.Is(err, tt.wantIs)) {
					t.Fatalf("wait = %+v, %v; want an error containing %q (is %v)", id, err, tt.wantErr, tt.wantIs)
				}
				if !errors.Is(err, context.Canceled) && time.Since(t0) < 100*time.Millisecond {
					t.Errorf("gave up after %s, before settle", time.Since(t0))
				}
			} else if err != nil || id.NodeName != tt.wantNode {
				t.Fatalf("wait = %+v, %v; want node %s", id, err, tt.wantNode)
			}
			if tt.wantReads != 0 && s.reads() != tt.wantReads {
				t.Errorf("%d reads, want %d", s.reads(), tt.wantReads)
			}
		})
	}
}

// TestClaimPollerWake: with link notifications the disk is read when one comes, not at
// the (here hour-long) poll interval; without a claim a wake-up just reads again.
func TestClaimPollerWake(t *testing.T) {
	d := testDisks(t)
	var mu sync.Mutex
	claimed := false
	reads := 0
	read := func() ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		reads++
		if claimed {
			return d.claimed, nil
		}
		return d.pool, nil
	}
	wake := make(chan struct{}, 1)
	type result struct {
		node string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		id, err := claimPoller{read: read, every: time.Hour, settle: time.Second, wake: wake}.wait(context.Background())
		done <- result{id.NodeName, err}
	}()
	waitReads := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			mu.Lock()
			r := reads
			mu.Unlock()
			if r >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d reads after 5s, want %d", r, n)
			}
		}
	}
	waitReads(1)
	wake <- struct{}{} // a link event that is not the claim
	waitReads(2)
	select {
	case r := <-done:
		t.Fatalf("wait returned %+v while unclaimed", r)
	case <-time.After(50 * time.Millisecond):
	}
	mu.Lock()
	claimed = true
	mu.Unlock()
	wake <- struct{}{}
	select {
	case r := <-done:
		if r.err != nil || r.node != "ci-abc123" {
			t.Fatalf("wait = %+v, want node ci-abc123", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the wake-up did not end the wait within 5s")
	}
}

// TestWatchLinks: a link named that does not exist is an error; a real one (a dummy
// bridge made for the test) is set up, and a change to it reaches C.
func TestWatchLinks(t *testing.T) {
	if _, err := watchLinks([]string{"swtest-missing"}); err == nil || !strings.Contains(err.Error(), "swtest-missing") {
		t.Errorf("watchLinks(a missing link) = %v, want an error naming it", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a link")
	}
	const link = "swtest-lw0"
	_ = exec.Command("ip", "link", "del", link).Run()
	if out, err := exec.Command("ip", "link", "add", link, "type", "bridge").CombinedOutput(); err != nil {
		t.Fatalf("ip link add %s type bridge: %v: %s", link, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", link).Run() })
	w, err := watchLinks([]string{"lo", link})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	b, err := os.ReadFile("/sys/class/net/" + link + "/flags")
	if err != nil {
		t.Fatal(err)
	}
	if flags, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 0, 32); flags&1 == 0 {
		t.Errorf("%s flags %s: not up", link, strings.TrimSpace(string(b)))
	}
	drain := func() {
		for {
			select {
			case <-w.C:
			case <-time.After(200 * time.Millisecond):
				return
			}
		}
	}
	drain() // its own setting up
	if out, err := exec.Command("ip", "link", "set", link, "mtu", "1400").CombinedOutput(); err != nil {
		t.Fatalf("changing %s: %v: %s", link, err, out)
	}
	select {
	case <-w.C:
	case <-time.After(5 * time.Second):
		t.Fatal("no link notification within 5s of a change")
	}
	if err := w.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// TestWaitClaim: the wait is logged once and marked on the boot timeline, and Stop ends
// it (the host destroying an unclaimed VM).
func TestWaitClaim(t *testing.T) {
	d := testDisks(t)
	tests := []struct {
		name     string
		claimed  bool // the disk turns into the identity on the third read
		stop     bool
		wantNode string
		wantErr  error
	}{
		{name: "claimed", claimed: true, wantNode: "ci-abc123"},
		{name: "stopped while unclaimed", stop: true, wantErr: errStopped},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var log bytes.Buffer
			a := New(Config{Log: slog.New(slog.NewTextHandler(&log, nil))})
			s := &script{steps: []func() ([]byte, error){func() ([]byte, error) { return d.pool, nil }}}
			if tt.claimed {
				s.steps = append(s.steps, s.steps[0], func() ([]byte, error) { return d.claimed, nil })
			}
			if tt.stop {
				go func() {
					time.Sleep(30 * time.Millisecond)
					a.Stop("power button")
				}()
			}
			id, err := a.waitClaim(context.Background(), "/dev/vdb", claimPoller{read: s.read, every: time.Millisecond, settle: time.Second})
			if !errors.Is(err, tt.wantErr) || id.NodeName != tt.wantNode {
				t.Fatalf("waitClaim = %+v, %v; want node %q, error %v", id, err, tt.wantNode, tt.wantErr)
			}
			if c := strings.Count(log.String(), "waiting to be claimed"); c != 1 {
				t.Errorf("%d 'waiting to be claimed' lines, want 1:\n%s", c, &log)
			}
			if !strings.Contains(log.String(), "msg=agent step=identity-wait uptime=") {
				t.Errorf("no identity-wait timeline line:\n%s", &log)
			}
			if _, ok := a.boot[boottimeline.StepIdentityWait]; !ok {
				t.Errorf("boot timeline %v lacks %s", a.boot, boottimeline.StepIdentityWait)
			}
		})
	}
}

// TestRunMarksAndStops: a step's mark lands in the published boot timeline between the
// steps around it, and a step that gives way to Stop shuts the agent down for Stop's
// reason, not as a failure.
func TestRunMarksAndStops(t *testing.T) {
	tests := []struct {
		name       string
		step       func(context.Context, *Agent) error
		wantReason string
	}{
		{name: "mark", step: func(_ context.Context, a *Agent) error { a.mark(boottimeline.StepIdentityWait); return nil }},
		{name: "stopped", step: func(_ context.Context, a *Agent) error {
			a.Stop("power button")
			<-a.stopAsked
			return errStopped
		}, wantReason: "power button during boot"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{}
			a, log, final := testAgent(t, rec, Steps{rec.step("one", nil), {"waits", tt.step}, rec.step("two", nil)})
			errc := make(chan error, 1)
			go func() { errc <- a.Run(context.Background()) }()
			if tt.wantReason == "" {
				var tl boottimeline.Timeline
				select {
				case tl = <-a.booted:
				case <-time.After(5 * time.Second):
					t.Fatalf("no boot timeline; log:\n%s", log)
				}
				if w, one, two := tl[boottimeline.StepIdentityWait], tl["one"], tl["two"]; w == 0 || w < one || w > two || tl[boottimeline.StepUp] == 0 {
					t.Errorf("boot timeline %v: want identity-wait between one and two", tl)
				}
				a.Stop("signal terminated")
			}
			select {
			case reason := <-final:
				if want := tt.wantReason; want != "" && reason != want {
					t.Errorf("final reason %q, want %q", reason, want)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("Final was not called; log:\n%s", log)
			}
			if err := <-errc; err != nil {
				t.Errorf("Run = %v", err)
			}
			if tt.wantReason != "" && (strings.Contains(log.String(), "agent step failed") || slices.Contains(rec.got(), "two")) {
				t.Errorf("a stopped step counted as failed, or the chain went on: %v\n%s", rec.got(), log)
			}
		})
	}
}

// TestReadDirect reads a pool disk, then the same file rewritten in place, as the host
// claims a VM.
func TestReadDirect(t *testing.T) {
	d := testDisks(t)
	path := filepath.Join(t.TempDir(), "identity.img")
	for _, tc := range []struct {
		name     string
		disk     []byte
		wantNode string
		wantErr  error
	}{
		{name: "pool", disk: d.pool, wantErr: identity.ErrUnclaimed},
		{name: "claimed in place", disk: d.claimed, wantNode: "ci-abc123"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(tc.disk, 0); err != nil {
				t.Fatal(err)
			}
			f.Close()
			b, err := readDirect(path, identity.PoolDiskSize)
			if errors.Is(err, syscall.EINVAL) {
				t.Skipf("no O_DIRECT on this filesystem: %v", err)
			}
			if err != nil || len(b) != identity.PoolDiskSize {
				t.Fatalf("readDirect = %d bytes, %v", len(b), err)
			}
			id, err := identity.Decode(bytes.NewReader(b))
			if !errors.Is(err, tc.wantErr) || id.NodeName != tc.wantNode {
				t.Errorf("Decode = %+v, %v; want node %q, error %v", id, err, tc.wantNode, tc.wantErr)
			}
		})
	}
}

// The host's breakdown finds the identity step by boottimeline's name for it.
func TestIdentityStepName(t *testing.T) {
	if StepIdentity != boottimeline.StepIdentity {
		t.Errorf("StepIdentity %q, boottimeline.StepIdentity %q", StepIdentity, boottimeline.StepIdentity)
	}
}
