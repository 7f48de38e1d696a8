package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
)

func listed(t *testing.T, p *Provider) map[string]nodes.State {
	t.Helper()
	l, err := p.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]nodes.State{}
	for _, i := range l {
		out[i.Name] = i.State
	}
	return out
}

// TestCreateListDelete boots fake qemus in parallel and checks what Create leaves
// (addresses, files, identity disk, taps, records), List, and that Delete undoes it all.
func TestCreateListDelete(t *testing.T) {
	e := newFakeEnv(t)
	p := e.provider(t)
	ctx := t.Context()

	names := []string{"a-node0", "a-node1", "a-node2", "a-node3"}
	var wg sync.WaitGroup
	errs := make([]error, len(names))
	for i, n := range names {
		wg.Go(func() { _, errs[i] = p.Create(ctx, req("a", n)) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Create(ctx, req("b", "b-node0")); err != nil {
		t.Fatal(err)
	}

	addrs := map[string]bool{}
	for _, n := range names {
		info, err := p.Info(n)
		if err != nil {
			t.Fatal(err)
		}
		if addrs[info.Address] {
			t.Errorf("address %s handed out twice", info.Address)
		}
		addrs[info.Address] = true
		if info.State != nodes.StateRunning || info.PID == 0 || info.ProviderID != "socialweb://a/"+n {
			t.Errorf("info %+v", info)
		}
		for _, f := range []string{fileRecord, fileRootfs, fileIdentity, fileConsole, fileQemuLog} {
			if _, err := os.Stat(filepath.Join(info.Dir, f)); err != nil {
				t.Errorf("node %s: %v", n, err)
			}
		}
		f, _ := os.Open(filepath.Join(info.Dir, fileIdentity))
		id, err := identity.Decode(f)
		f.Close()
		if err != nil {
			t.Fatalf("identity disk of %s: %v", n, err)
		}
		if id.NodeName != n || id.Cluster != "a" || id.Address != info.Address || id.Gateway != "10.250.5.1" ||
			id.DNS != "10.250.5.1" || id.ClusterDNS != "10.251.0.10" || id.MAC != info.MAC || id.MaxPods != 16 ||
			id.Labels["socialweb.computer/pool"] != "default" || id.ProviderID != "socialweb://a/"+n {
			t.Errorf("identity of %s: %+v (info %+v)", n, id, info)
		}
		if st, _ := os.Stat(filepath.Join(info.Dir, fileIdentity)); st.Size()%512 != 0 {
			t.Errorf("identity disk is %d bytes, not whole sectors", st.Size())
		}
		con, _ := p.ConsoleTail(n, 50)
		if !strings.Contains(con, "SWQT NAME "+n+"\n") || !strings.Contains(con, "tsc_early_khz=") && p.host.TSCkHz > 0 {
			t.Errorf("console of %s:\n%s", n, con)
		}
		rec, err := readRecord(info.Dir)
		if err != nil || rec.Process == nil || !rec.Process.Alive() || rec.Tap != info.Tap || rec.Address != info.Address {
			t.Errorf("record of %s: %+v, %v", n, rec, err)
		}
		if ex, why := p.Exited(n); ex {
			t.Errorf("%s exited: %s", n, why)
		}
	}
	for _, a := range []string{"10.250.5.2/24", "10.250.5.3/24", "10.250.5.4/24", "10.250.5.5/24"} {
		if !addrs[a] {
			t.Errorf("addresses %v: want the four lowest, .2-.5", addrs)
		}
	}
	if b, _ := p.Info("b-node0"); b.Address != "10.250.6.2/24" {
		t.Errorf("cluster b's first node got %s, want 10.250.6.2/24 (its own subnet)", b.Address)
	}
	if got := listed(t, p); len(got) != 5 || got["a-node2"] != nodes.StateRunning {
		t.Errorf("List: %v", got)
	}
	if e.net.count() != 5 || len(qemusUsing(e.cfg.StateDir)) != 5 {
		t.Errorf("taps %d, qemus %d; want 5 each", e.net.count(), len(qemusUsing(e.cfg.StateDir)))
	}
	if _, err := p.Create(ctx, req("a", "a-node1")); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("Create of a name in use: %v", err)
	}

	// The lowest free address is reused; the graceful path (system_powerdown) is quick.
	freed, _ := p.Info("a-node1")
	t0 := time.Now()
	if err := p.Delete(ctx, "a-node1"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > e.cfg.StopGrace {
		t.Errorf("Delete of a guest that powers off took %s, longer than the stop grace", d)
	}
	if _, err := os.Stat(freed.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("node dir after Delete: %v", err)
	}
	if _, err := p.Create(ctx, req("a", "a-node4")); err != nil {
		t.Fatal(err)
	}
	if got, _ := p.Info("a-node4"); got.Address != freed.Address {
		t.Errorf("new node got %s, want the freed lowest address %s", got.Address, freed.Address)
	}

	// Concurrent Deletes of everything, one name twice.
	all := append(slices.DeleteFunc(slices.Clone(names), func(s string) bool { return s == "a-node1" }), "a-node4", "b-node0", "a-node0")
	errs = make([]error, len(all))
	for i, n := range all {
		wg.Go(func() { errs[i] = p.Delete(ctx, n) })
	}
	wg.Wait()
	notFound := 0
	for i, err := range errs {
		switch {
		case nodes.IsNotFound(err):
			notFound++
		case err != nil:
			t.Errorf("Delete %s: %v", all[i], err)
		}
	}
	if notFound != 1 {
		t.Errorf("deleting a-node0 twice at once: %d not-found errors, want 1 (%v)", notFound, errs)
	}
	if err := p.Delete(ctx, "a-node0"); !nodes.IsNotFound(err) {
		t.Errorf("Delete again: %v, want not found", err)
	}
	if got := listed(t, p); len(got) != 0 {
		t.Errorf("List after deleting all: %v", got)
	}
	if d := dirEntries(t, e.cfg.StateDir); len(d) != 0 || e.net.count() != 0 || len(qemusUsing(e.cfg.StateDir)) != 0 {
		t.Errorf("left behind: dirs %v, taps %d, qemus %d", d, e.net.count(), len(qemusUsing(e.cfg.StateDir)))
	}
}

// TestCreateFailureUndoes makes each step of Create fail and checks nothing is left.
func TestCreateFailureUndoes(t *testing.T) {
	e := newFakeEnv(t)
	p := e.provider(t)
	ctx := t.Context()
	for _, tc := range []struct {
		name string
		node string
		set  func()
		want []string
	}{
		{"joiner fails", "a-joiner", func() { e.join.err = errors.New("no bootstrap token today") }, []string{"making its identity", "no bootstrap token today"}},
		{"joiner disagrees", "a-disagree", func() { e.join.override = func(id *identity.Identity) { id.NodeName = "someone-else" } },
			[]string{"disagrees", `nodeName is "someone-else"`}},
		{"tap fails", "a-tapfail", func() { e.net.failAdd = errors.New("bridge swb5 missing: run Ensure") }, []string{"adding its tap", "run Ensure"}},
		{"qemu exits at start", "a-crash", nil, []string{"could not configure /dev/net/tun"}},
		{"qemu never answers QMP", "a-hang", func() { p.cfg.StartTimeout = 500 * time.Millisecond }, []string{"did not report the VM running within 500ms"}},
		{"context cancelled", "a-cancelled", func() { p.cfg.StartTimeout = 10 * time.Second }, []string{"context canceled"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.join.err, e.join.override, e.net.failAdd = nil, nil, nil
			if tc.set != nil {
				tc.set()
			}
			cctx := ctx
			if tc.name == "context cancelled" {
				c, cancel := context.WithCancel(ctx)
				cancel()
				cctx = c
				e.join.err = nil
			}
			_, err := p.Create(cctx, req("a", tc.node))
			if err == nil {
				t.Fatal("Create succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if d := dirEntries(t, e.cfg.StateDir); len(d) != 0 || e.net.count() != 0 || len(qemusUsing(e.cfg.StateDir)) != 0 || len(listed(t, p)) != 0 {
				t.Errorf("left behind: dirs %v, taps %d, qemus %d, listed %v", d, e.net.count(), len(qemusUsing(e.cfg.StateDir)), listed(t, p))
			}
		})
	}
	e.join.err, e.join.override, e.net.failAdd = nil, nil, nil

	t.Run("undo that cannot remove the tap keeps the node listed", func(t *testing.T) {
		e.net.failRem = errors.New("ip: permission denied")
		if _, err := p.Create(ctx, req("a", "a-crash2")); err == nil {
			t.Fatal("Create succeeded")
		}
		if got := listed(t, p); got["a-crash2"] != nodes.StateTerminated {
			t.Fatalf("List after a failed undo: %v, want a-crash2 Terminated", got)
		}
		if ex, why := p.Exited("a-crash2"); !ex || !strings.Contains(why, "could not configure") {
			t.Errorf("Exited: %v %q", ex, why)
		}
		if err := p.Delete(ctx, "a-crash2"); err == nil {
			t.Fatal("Delete succeeded while RemoveTap fails")
		}
		e.net.failRem = nil
		if err := p.Delete(ctx, "a-crash2"); err != nil {
			t.Fatalf("Delete retry: %v", err)
		}
		if d := dirEntries(t, e.cfg.StateDir); len(d) != 0 || e.net.count() != 0 {
			t.Errorf("left behind: dirs %v, taps %d", d, e.net.count())
		}
	})
}

func TestNotReadyAndClosed(t *testing.T) {
	e := newFakeEnv(t)
	p, err := New(e.cfg, e.deps)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Create(t.Context(), req("a", "a-x")); err == nil || !strings.Contains(err.Error(), "Recover") {
		t.Errorf("Create before Recover: %v", err)
	}
	if _, err := p.List(t.Context()); err == nil {
		t.Error("List before Recover: no error")
	}
	if _, err := p.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Recover(t.Context()); err == nil {
		t.Error("second Recover: no error")
	}
	p.Close()
	if _, err := p.List(t.Context()); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("List after Close: %v", err)
	}
}

// TestDeleteEscalates: a guest that ignores the power button and a qemu that ignores
// SIGTERM are still gone after Delete.
func TestDeleteEscalates(t *testing.T) {
	e := newFakeEnv(t)
	e.cfg.StopGrace = 300 * time.Millisecond
	p := e.provider(t)
	if _, err := p.Create(t.Context(), req("a", "a-stubborn")); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := p.Delete(t.Context(), "a-stubborn"); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	con, _ := os.ReadFile(filepath.Join(e.cfg.StateDir, "a-stubborn", fileConsole)) // gone
	if con != nil {
		t.Error("console survived Delete")
	}
	if took < e.cfg.StopGrace+5*time.Second-time.Second || took > 15*time.Second {
		t.Errorf("Delete took %s: want stop grace + SIGTERM wait, then SIGKILL", took)
	}
	if len(qemusUsing(e.cfg.StateDir)) != 0 || e.net.count() != 0 {
		t.Error("left behind after escalation")
	}
}

func TestExited(t *testing.T) {
	e := newFakeEnv(t)
	p := e.provider(t)
	if _, err := p.Create(t.Context(), req("a", "a-dies")); err != nil {
		t.Fatal(err)
	}
	if ex, why := p.Exited("a-dies"); ex {
		t.Fatalf("exited right after Create: %s", why)
	}
	waitFor(t, 5*time.Second, "the VM to exit", func() bool { ex, _ := p.Exited("a-dies"); return ex })
	ex, why := p.Exited("a-dies")
	for _, w := range []string{"exit status 3", "guest panicked", "Kernel panic - not syncing: fake", "boot line 29"} {
		if !strings.Contains(why, w) {
			t.Errorf("Exited reason does not mention %q:\n%s", w, why)
		}
	}
	if !ex || listed(t, p)["a-dies"] != nodes.StateTerminated {
		t.Errorf("List: %v", listed(t, p))
	}
	tail, err := p.ConsoleTail("a-dies", 2)
	if err != nil || tail != "boot line 29\nKernel panic - not syncing: fake" {
		t.Errorf("ConsoleTail = %q, %v", tail, err)
	}
	if _, err := p.ConsoleTail("nope", 2); !nodes.IsNotFound(err) {
		t.Errorf("ConsoleTail of an unknown node: %v", err)
	}
	if ex, _ := p.Exited("nope"); ex {
		t.Error("an unknown node has exited")
	}
	if err := p.Delete(t.Context(), "a-dies"); err != nil {
		t.Fatal(err)
	}
}

// TestLostLayerShare: a VM whose layer share's virtiofsd exits while qemu runs is a failed
// node (its guest's reads of image files would hang): List says Terminated, Exited says
// why with virtiofsd's last words, and Delete stops its qemu.
func TestLostLayerShare(t *testing.T) {
	e := newFakeEnv(t)
	p := e.provider(t)
	if _, err := p.Create(t.Context(), req("a", "a-share")); err != nil {
		t.Fatal(err)
	}
	// A stand-in virtiofsd, attached as startVirtiofsd attaches the real one.
	v := exec.Command("sleep", "60")
	if err := v.Start(); err != nil {
		t.Fatal(err)
	}
	vdone := make(chan struct{})
	go func() { v.Wait(); close(vdone) }()
	p.mu.Lock()
	inst := p.insts["a-share"]
	inst.vproc, inst.vdone = v.Process, vdone
	p.mu.Unlock()
	if err := os.WriteFile(filepath.Join(inst.dir, fileVirtiofsLog), []byte("virtiofsd: fake: bad descriptor\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	if st := listed(t, p)["a-share"]; st != nodes.StateRunning {
		t.Fatalf("with its virtiofsd running: %s, want Running", st)
	}
	if ex, why := p.Exited("a-share"); ex {
		t.Fatalf("exited with its virtiofsd running: %s", why)
	}
	v.Process.Kill()
	<-vdone
	if st := listed(t, p)["a-share"]; st != nodes.StateTerminated {
		t.Errorf("after its virtiofsd exited: %s, want Terminated", st)
	}
	ex, why := p.Exited("a-share")
	for _, w := range []string{"virtiofsd serving its shared image layers", "exited while qemu ran", "virtiofsd: fake: bad descriptor"} {
		if !strings.Contains(why, w) {
			t.Errorf("Exited reason does not mention %q:\n%s", w, why)
		}
	}
	if !ex {
		t.Error("Exited = false after its virtiofsd exited")
	}
	pid := inst.rec.Process.PID
	if err := p.Delete(t.Context(), "a-share"); err != nil {
		t.Fatal(err)
	}
	if (supervisor.Identity{PID: pid, StartTime: inst.rec.Process.StartTime, Cmdline: inst.rec.Process.Cmdline}).Alive() {
		t.Errorf("qemu (pid %d) runs after Delete", pid)
	}
}

// TestRecover: a provider restarted on the same state dir adopts the VM that still
// runs, cleans up after the one that died, removes a directory without a record, and
// kills a qemu no record names.
func TestRecover(t *testing.T) {
	e := newFakeEnv(t)
	ctx := t.Context()
	p1 := e.provider(t)
	for _, n := range []string{"a-survivor", "a-victim", "a-halfway"} {
		if _, err := p1.Create(ctx, req("a", n)); err != nil {
			t.Fatal(err)
		}
	}
	survivor, _ := p1.Info("a-survivor")
	victim, _ := p1.Info("a-victim")
	halfway, _ := p1.Info("a-halfway")
	// The victim's VM dies while no daemon runs.
	syscall.Kill(victim.PID, syscall.SIGKILL)
	waitFor(t, 5*time.Second, "the victim to exit", func() bool { ex, _ := p1.Exited("a-victim"); return ex })
	// A Create that crashed after starting qemu but before recording it.
	rec, _ := readRecord(halfway.Dir)
	rec.Process = nil
	if err := writeRecord(halfway.Dir, rec); err != nil {
		t.Fatal(err)
	}
	// A directory a crash left without a record.
	os.MkdirAll(filepath.Join(e.cfg.StateDir, "a-norecord"), 0o700)
	os.WriteFile(filepath.Join(e.cfg.StateDir, "a-norecord", fileRootfs), []byte("x"), 0o600)
	if err := p1.Close(); err != nil {
		t.Fatal(err)
	}

	p2, err := New(e.cfg, e.deps)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	res, err := p2.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recover: %+v", res)
	if !slices.Equal(res.Adopted, []string{"a-survivor"}) || !slices.Equal(res.Cleaned, []string{"a-halfway", "a-victim"}) ||
		!slices.Equal(res.Removed, []string{"a-norecord"}) || !slices.Equal(res.Killed, []int{halfway.PID}) {
		t.Errorf("Recover = %+v; want adopted survivor, cleaned halfway+victim, removed norecord, killed pid %d", res, halfway.PID)
	}
	if got := listed(t, p2); len(got) != 1 || got["a-survivor"] != nodes.StateRunning {
		t.Errorf("List after Recover: %v", got)
	}
	if d := dirEntries(t, e.cfg.StateDir); !slices.Equal(d, []string{"a-survivor"}) {
		t.Errorf("state dir after Recover: %v", d)
	}
	if e.net.count() != 1 || len(qemusUsing(e.cfg.StateDir)) != 1 {
		t.Errorf("taps %d, qemus %d after Recover; want 1 each", e.net.count(), len(qemusUsing(e.cfg.StateDir)))
	}
	info, _ := p2.Info("a-survivor")
	if !info.Adopted || info.PID != survivor.PID || info.Address != survivor.Address {
		t.Errorf("adopted info %+v, was %+v", info, survivor)
	}
	// The adopted node's address stays taken.
	if _, err := p2.Create(ctx, req("a", "a-new")); err != nil {
		t.Fatal(err)
	}
	if n, _ := p2.Info("a-new"); n.Address == survivor.Address {
		t.Errorf("new node got the adopted node's address %s", n.Address)
	}
	// Deleting the adopted node works through QMP and identity-checked signals.
	if err := p2.Delete(ctx, "a-survivor"); err != nil {
		t.Fatal(err)
	}
	if err := p2.Delete(ctx, "a-new"); err != nil {
		t.Fatal(err)
	}
	if d := dirEntries(t, e.cfg.StateDir); len(d) != 0 || e.net.count() != 0 || len(qemusUsing(e.cfg.StateDir)) != 0 {
		t.Errorf("left behind: dirs %v, taps %d, qemus %d", d, e.net.count(), len(qemusUsing(e.cfg.StateDir)))
	}
}

// TestRecoverAdoptedExit: an adopted VM that dies is reported as exited.
func TestRecoverAdoptedExit(t *testing.T) {
	e := newFakeEnv(t)
	p1 := e.provider(t)
	if _, err := p1.Create(t.Context(), req("a", "a-adoptee")); err != nil {
		t.Fatal(err)
	}
	p1.Close()
	p2 := e.provider(t)
	info, _ := p2.Info("a-adoptee")
	syscall.Kill(info.PID, syscall.SIGKILL)
	waitFor(t, 5*time.Second, "the adopted VM to be reported exited", func() bool { ex, _ := p2.Exited("a-adoptee"); return ex })
	_, why := p2.Exited("a-adoptee")
	if !strings.Contains(why, "adopted") || !strings.Contains(why, "SWQT NAME a-adoptee") {
		t.Errorf("reason: %s", why)
	}
	if err := p2.Delete(t.Context(), "a-adoptee"); err != nil {
		t.Fatal(err)
	}
}

// TestRecoverIgnoresRecycledPID: a record whose pid now belongs to another process (a
// different start time or command line) is not adopted, and that process is not killed.
func TestRecoverIgnoresRecycledPID(t *testing.T) {
	e := newFakeEnv(t)
	p1 := e.provider(t)
	if _, err := p1.Create(t.Context(), req("a", "a-recycled")); err != nil {
		t.Fatal(err)
	}
	info, _ := p1.Info("a-recycled")
	if err := p1.Delete(t.Context(), "a-recycled"); err != nil {
		t.Fatal(err)
	}
	p1.Close()
	// Put back a record naming a live bystander with a different identity.
	bystander := exec.Command("sleep", "60")
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { bystander.Process.Kill(); bystander.Wait() }()
	id, err := supervisor.Observe(bystander.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	id.StartTime++ // same pid, another process
	os.MkdirAll(info.Dir, 0o700)
	rec := record{Version: recordVersion, Request: req("a", "a-recycled"), Address: info.Address, Tap: info.Tap, MAC: info.MAC, Process: &id}
	if err := writeRecord(info.Dir, rec); err != nil {
		t.Fatal(err)
	}
	p2 := e.provider(t)
	if got := listed(t, p2); len(got) != 0 {
		t.Errorf("List: %v; a record whose process identity does not match must not be adopted", got)
	}
	if bystander.ProcessState != nil || syscall.Kill(bystander.Process.Pid, 0) != nil {
		t.Error("the bystander was killed")
	}
	if !slices.Contains(e.net.removeLog, info.Tap) {
		t.Errorf("the dead record's tap %s was not removed (%v)", info.Tap, e.net.removeLog)
	}
}

// TestLongStateDir: the QMP socket is reached even when its absolute path is longer
// than a unix socket address can be.
func TestLongStateDir(t *testing.T) {
	e := newFakeEnv(t)
	e.cfg.StateDir = filepath.Join(t.TempDir(), strings.Repeat("long-", 20), "state")
	p := e.provider(t)
	t.Cleanup(func() { killLeftovers(t, e.cfg.StateDir) })
	name := "a-" + strings.Repeat("x", 40)
	if _, err := p.Create(t.Context(), req("a", name)); err != nil {
		t.Fatal(err)
	}
	info, _ := p.Info(name)
	if n := len(filepath.Join(info.Dir, sockName)); n <= maxSockPath {
		t.Fatalf("socket path is only %d bytes; the test needs a longer one", n)
	}
	t0 := time.Now()
	if err := p.Delete(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 3*time.Second { // the stop grace is 5s; -race adds 1s at a fake's exit
		t.Errorf("Delete took %s: system_powerdown did not reach the guest through the long path", took)
	}
}

// Delete keeps the node's console log under consoles/, pruning beyond ConsolesKept, and
// Recover does not take that directory for a node.
func TestConsoleKeptAfterDelete(t *testing.T) {
	e := newFakeEnv(t)
	e.cfg.ConsolesKept = 2
	p := e.provider(t)
	ctx := t.Context()
	names := []string{"a-keep0", "a-keep1", "a-keep2"}
	for _, n := range names {
		if _, err := p.Create(ctx, req("a", n)); err != nil {
			t.Fatal(err)
		}
		if err := p.Delete(ctx, n); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // distinct modification times for pruning
	}
	dir := filepath.Join(e.cfg.StateDir, dirConsoles)
	var kept []string
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range entries {
		kept = append(kept, en.Name())
	}
	if want := []string{"a-keep1.log", "a-keep2.log"}; !slices.Equal(kept, want) {
		t.Errorf("consoles kept %v, want %v (the oldest pruned)", kept, want)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "a-keep2.log")); err != nil || !strings.Contains(string(b), "a-keep2") {
		t.Errorf("kept console of a-keep2: %q, %v", b, err)
	}
	p.Close()
	p2, err := New(e.cfg, e.deps)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	res, err := p2.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Removed)+len(res.Cleaned)+len(res.Adopted) != 0 {
		t.Errorf("Recover touched something: %+v", res)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("consoles dir after Recover: %v", err)
	}
}

// With a user base, every VM's qemu is told to drop to a user no other VM holds (the
// lowest free one, so a deleted VM's comes back), and its disks and console belong to
// that user while the record and the directory stay root's.
func TestVMsRunAsUsersOfTheirOwn(t *testing.T) {
	const base = 3000000000
	e := newFakeEnv(t)
	e.cfg.VMUIDBase = base
	p := e.provider(t)
	ctx := t.Context()
	names := []string{"a-u0", "a-u1", "b-u2"}
	var wg sync.WaitGroup
	errs := make([]error, len(names))
	for i, n := range names {
		wg.Go(func() { _, errs[i] = p.Create(ctx, req(n[:1], n)) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	uidOf := func(n string) int {
		t.Helper()
		info, err := p.Info(n)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := readRecord(info.Dir)
		if err != nil {
			t.Fatal(err)
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", info.PID))
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("\x00-runas\x00%d:%d\x00", rec.UID, rec.UID)
		if !strings.Contains(string(cmd), want) || !strings.Contains(string(cmd), SandboxRunAs) {
			t.Errorf("node %s: qemu's command line %q lacks -runas %d:%d or the sandbox for it", n, cmd, rec.UID, rec.UID)
		}
		owner := func(f string) (int, int) {
			var st syscall.Stat_t
			if err := syscall.Lstat(filepath.Join(info.Dir, f), &st); err != nil {
				t.Fatalf("node %s: %v", n, err)
			}
			return int(st.Uid), int(st.Gid)
		}
		for _, f := range []string{fileRootfs, fileIdentity, fileConsole, fileQemuLog} {
			if u, g := owner(f); u != rec.UID || g != rec.UID {
				t.Errorf("node %s: %s belongs to %d:%d, want the VM's user %d", n, f, u, g, rec.UID)
			}
		}
		for _, f := range []string{fileRecord, "."} {
			if u, _ := owner(f); u != 0 {
				t.Errorf("node %s: %s belongs to %d, want root: the VM's user must not replace the daemon's files", n, f, u)
			}
		}
		return rec.UID
	}
	seen := map[int]string{}
	for _, n := range names {
		u := uidOf(n)
		if u < base || u >= base+len(names) || seen[u] != "" {
			t.Errorf("node %s runs as %d (node %q has it too); want a user of its own from %d to %d", n, u, seen[u], base, base+len(names)-1)
		}
		seen[u] = n
	}
	freed := uidOf("a-u1")
	if err := p.Delete(ctx, "a-u1"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Create(ctx, req("a", "a-u3")); err != nil {
		t.Fatal(err)
	}
	if u := uidOf("a-u3"); u != freed {
		t.Errorf("a VM made after a delete runs as %d, want the freed %d (the lowest free)", u, freed)
	}
	for _, n := range []string{"a-u0", "b-u2", "a-u3"} {
		if err := p.Delete(ctx, n); err != nil {
			t.Error(err)
		}
	}
}

func TestValidateUIDBase(t *testing.T) {
	for _, tc := range []struct {
		base int
		ok   bool
	}{{0, true}, {DefaultVMUIDBase, true}, {1000, true}, {999, false}, {-5, false}, {1<<32 - 2, false}, {1<<32 - 2 - VMUIDSlots, true}} {
		if err := ValidateUIDBase(tc.base); (err == nil) != tc.ok {
			t.Errorf("ValidateUIDBase(%d) = %v, want ok %t", tc.base, err, tc.ok)
		}
	}
}

// ForgetJoin rewrites the identity disk in place (the VMM holds it open) without the
// bootstrap token; a second call, an unknown node and a later delete are all fine.
func TestForgetJoinRewritesTheDisk(t *testing.T) {
	e := newFakeEnv(t)
	p := e.provider(t)
	ctx := t.Context()
	if _, err := p.Create(ctx, req("a", "a-j0")); err != nil {
		t.Fatal(err)
	}
	info, err := p.Info("a-j0")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(info.Dir, fileIdentity)
	before, _ := os.ReadFile(path)
	var st0 syscall.Stat_t
	if err := syscall.Stat(path, &st0); err != nil {
		t.Fatal(err)
	}
	if !identity.HoldsJoinSecret(before) {
		t.Fatalf("the new node's disk holds no token to forget: %q", before)
	}
	for range 2 {
		if err := p.ForgetJoin(ctx, "a-j0"); err != nil {
			t.Fatal(err)
		}
	}
	after, _ := os.ReadFile(path)
	var st1 syscall.Stat_t
	if err := syscall.Stat(path, &st1); err != nil {
		t.Fatal(err)
	}
	if identity.HoldsJoinSecret(after) || len(after) != len(before) || st1.Ino != st0.Ino {
		t.Errorf("after ForgetJoin: token kept %t, %d bytes (was %d), inode %d (was %d); want no token, the same file rewritten in place",
			identity.HoldsJoinSecret(after), len(after), len(before), st1.Ino, st0.Ino)
	}
	if err := p.ForgetJoin(ctx, "nobody"); err != nil {
		t.Errorf("ForgetJoin of an unknown node: %v", err)
	}
	if err := p.Delete(ctx, "a-j0"); err != nil {
		t.Fatal(err)
	}
}
