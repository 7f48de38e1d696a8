package qemu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/procnice"
)

// poolShape is req()'s size: a node of it claims a pool VM.
var poolShape = PoolShape{CPUs: 1, MemoryMiB: 256}

// poolProvider is a recovered Provider keeping a warm pool of size VMs of poolShape.
// before, if set, runs between New and Recover (the pool starts at the end of Recover).
func (e *fakeEnv) poolProvider(t *testing.T, size int, before func(*Provider)) *Provider {
	t.Helper()
	e.cfg.PoolSize, e.cfg.PoolShape = size, poolShape
	p, err := New(e.cfg, e.deps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if before != nil {
		before(p)
	}
	if _, err := p.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	return p
}

// poolNames makes a pool name the given ones first, then random ones; it counts calls.
type poolNames struct {
	mu    sync.Mutex
	names []string
	calls int
}

func (n *poolNames) next() (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls++
	if len(n.names) > 0 {
		name := n.names[0]
		n.names = n.names[1:]
		return name, nil
	}
	return newPoolName()
}

func (n *poolNames) count() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.calls
}

// poolVMs returns the unclaimed pool VMs by name: true once ready.
func poolVMs(p *Provider) map[string]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]bool{}
	for _, in := range p.insts {
		if in.unclaimedLocked() {
			out[in.rec.Request.Name] = in.poolReady
		}
	}
	return out
}

// metric reads one sample of the pool's collector, e.g. `socialweb_warm_pool_vms{state="ready"}`.
func metric(t *testing.T, p *Provider, name string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := reg.Register(p.PoolCollector()); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			id := mf.GetName()
			if l := m.GetLabel(); len(l) > 0 {
				id += fmt.Sprintf("{%s=%q}", l[0].GetName(), l[0].GetValue())
			}
			if id != name {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func waitPoolReady(t *testing.T, p *Provider, n int) {
	t.Helper()
	waitFor(t, 15*time.Second, fmt.Sprintf("%d ready warm-pool VMs", n), func() bool {
		ready := 0
		for _, r := range poolVMs(p) {
			if r {
				ready++
			}
		}
		return ready == n && len(poolVMs(p)) == n
	})
}

func onlyPoolVM(t *testing.T, p *Provider) string {
	t.Helper()
	vms := poolVMs(p)
	if len(vms) != 1 {
		t.Fatalf("pool VMs %v, want one", vms)
	}
	for n := range vms {
		return n
	}
	return ""
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestPoolClaim: a Create of the pool's size takes the ready pool VM: its directory is
// renamed to the node's, its identity written into the same file (the guest, which holds
// it open, reads it), its tap given to the cluster and its record rewritten; List shows
// it only once claimed; the pool refills; Delete and Close leave nothing.
func TestPoolClaim(t *testing.T) {
	e := newFakeEnv(t)
	p := e.poolProvider(t, 1, nil)
	ctx := t.Context()
	waitPoolReady(t, p, 1)
	if got := metric(t, p, `socialweb_warm_pool_vms{state="ready"}`); got != 1 {
		t.Errorf("ready pool VMs metric %v, want 1", got)
	}
	if got, want := metric(t, p, "socialweb_warm_pool_memory_bytes"), float64((256+512)<<20); got != want {
		t.Errorf("pool memory %v, want %v (guest and the TCG VMM's overhead)", got, want)
	}
	vm := onlyPoolVM(t, p)
	if got := listed(t, p); len(got) != 0 {
		t.Fatalf("List reports the pool: %v", got)
	}
	if err := p.Delete(ctx, vm); !nodes.IsNotFound(err) {
		t.Errorf("Delete of a pool VM: %v, want not found", err)
	}
	pool, _ := p.Info(vm)
	poolDir := pool.Dir
	idFile := filepath.Join(poolDir, fileIdentity)
	ino, dirIno := inode(t, idFile), inode(t, poolDir)
	if pool.Tap != nodenet.PoolTapName(nodenet.PoolTapOwner(e.cfg.StateDir), vm) || pool.MAC != nodenet.PoolMAC(vm).String() {
		t.Errorf("pool VM tap %s MAC %s, want nodenet's pool names", pool.Tap, pool.MAC)
	}

	// Unclaimed, it waits at a pool VM's CPU priority; claimed, it has a node's.
	nicesAre := func(want int) func() bool {
		return func() bool {
			n, err := procnice.Threads(pool.PID)
			if err != nil || len(n) == 0 {
				return false
			}
			for _, v := range n {
				if v != want {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, 5*time.Second, "the pool VM's threads at nice 10", nicesAre(PoolNice))
	// It waits with its NIC's carrier down; the claim brings it up (what wakes its agent).
	if b, _ := os.ReadFile(filepath.Join(poolDir, fileConsole)); !strings.Contains(string(b), "fake qemu: link up=false\n") ||
		strings.Contains(string(b), "link up=true") {
		t.Errorf("the pool VM's link before the claim, by its console:\n%s", b)
	}

	t0 := time.Now()
	inst, err := p.Create(ctx, req("a", "a-warm"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("claim took %s", time.Since(t0))
	if !nicesAre(0)() {
		n, _ := procnice.Threads(pool.PID)
		t.Errorf("the claimed node's threads have nice values %v, want 0 (a node's priority)", n)
	}
	if inst.State != nodes.StateRunning || inst.Cluster != "a" || inst.Name != "a-warm" || inst.ProviderID != "socialweb://a/a-warm" {
		t.Errorf("Create returned %+v", inst)
	}
	info, err := p.Info("a-warm")
	if err != nil {
		t.Fatal(err)
	}
	if info.PID != pool.PID {
		t.Errorf("node runs as pid %d, the pool VM was %d: booted instead of claimed", info.PID, pool.PID)
	}
	if _, err := os.Stat(poolDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pool dir after the claim: %v", err)
	}
	newID := filepath.Join(e.cfg.StateDir, "a-warm", fileIdentity)
	if info.Dir != filepath.Join(e.cfg.StateDir, "a-warm") || inode(t, info.Dir) != dirIno {
		t.Errorf("node dir %s: want the pool VM's directory renamed", info.Dir)
	}
	if inode(t, newID) != ino {
		t.Error("the identity disk is a new file: qemu still has the old one open")
	}
	if st, _ := os.Stat(newID); st.Size() != identity.PoolDiskSize {
		t.Errorf("identity disk is %d bytes, want %d", st.Size(), identity.PoolDiskSize)
	}
	f, _ := os.Open(newID)
	id, err := identity.Decode(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if id.NodeName != "a-warm" || id.Cluster != "a" || id.Address != "10.250.5.2/24" || id.MAC != nodenet.PoolMAC(vm).String() ||
		id.ProviderID != "socialweb://a/a-warm" || id.MaxPods != 16 || id.Gateway != "10.250.5.1" {
		t.Errorf("identity after the claim: %+v", id)
	}
	waitFor(t, 5*time.Second, "the guest to read its identity", func() bool {
		con, _ := p.ConsoleTail("a-warm", 5)
		return strings.Contains(con, "SWQT NAME a-warm\n")
	})
	if b, _ := os.ReadFile(filepath.Join(info.Dir, fileConsole)); !strings.Contains(string(b), "fake qemu: link up=true\n") {
		t.Errorf("the claim did not bring the NIC's link up, by the console:\n%s", b)
	}
	wantTap := nodenet.TapName(5, "a", "a-warm")
	if info.Tap != wantTap || !slices.Equal(e.net.claimLog, []string{nodenet.PoolTapName(nodenet.PoolTapOwner(e.cfg.StateDir), vm) + " -> " + wantTap}) {
		t.Errorf("tap %s, claims %v; want %s claimed from the pool tap", info.Tap, e.net.claimLog, wantTap)
	}
	rec, err := readRecord(info.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Pool || rec.PoolTap != "" || rec.Claimed == nil || rec.Request.Name != "a-warm" || rec.Request.Cluster != "a" ||
		rec.Address != "10.250.5.2/24" || rec.Tap != wantTap || rec.Bridge != "swb5" || rec.MAC != nodenet.PoolMAC(vm).String() ||
		rec.Process == nil || rec.Process.PID != pool.PID {
		t.Errorf("record after the claim: %+v", rec)
	}
	if got := listed(t, p); len(got) != 1 || got["a-warm"] != nodes.StateRunning {
		t.Errorf("List after the claim: %v", got)
	}
	if got := metric(t, p, `socialweb_warm_pool_claims_total{result="hit"}`); got != 1 {
		t.Errorf("hits %v, want 1", got)
	}

	// The pool refills with another VM; the next node of the size takes that one.
	waitPoolReady(t, p, 1)
	if again := onlyPoolVM(t, p); again == vm {
		t.Fatalf("the pool still lists %s", vm)
	}
	if _, err := p.Create(ctx, req("a", "a-warm2")); err != nil {
		t.Fatal(err)
	}
	if got := metric(t, p, `socialweb_warm_pool_claims_total{result="hit"}`); got != 2 {
		t.Errorf("hits %v, want 2", got)
	}
	if n, _ := p.Info("a-warm2"); n.Address != "10.250.5.3/24" {
		t.Errorf("second claimed node at %s, want the next address", n.Address)
	}

	// A claimed node is deleted like any other.
	for _, n := range []string{"a-warm", "a-warm2"} {
		if err := p.Delete(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(info.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("node dir after Delete: %v", err)
	}
	waitPoolReady(t, p, 1)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if d := dirEntries(t, e.cfg.StateDir); len(d) != 0 || e.net.count() != 0 || len(qemusUsing(e.cfg.StateDir)) != 0 {
		t.Errorf("left after Close: dirs %v, taps %v, qemus %d", d, e.net.tapNames(), len(qemusUsing(e.cfg.StateDir)))
	}
}

// TestPoolMisses: a node of another size boots cold and leaves the pool alone; with no
// pool VM free a node of the pool's size boots cold too.
func TestPoolMisses(t *testing.T) {
	e := newFakeEnv(t)
	p := e.poolProvider(t, 1, nil)
	ctx := t.Context()
	waitPoolReady(t, p, 1)
	vm := onlyPoolVM(t, p)
	other := req("a", "a-big")
	other.MemoryMiB = 512
	if inst, err := p.Create(ctx, other); err != nil || inst.Warm != (nodes.WarmStart{}) {
		t.Fatalf("Create of another size: %+v, %v; want a cold boot with no warm start tried", inst.Warm, err)
	}
	if info, _ := p.Info("a-big"); info.MAC != nodenet.NodeMAC("a", "a-big").String() {
		t.Errorf("node of another size has MAC %s: not booted cold", info.MAC)
	}
	if onlyPoolVM(t, p) != vm || metric(t, p, `socialweb_warm_pool_claims_total{result="miss_shape"}`) != 1 {
		t.Errorf("after a node of another size: pool %v, miss_shape %v", poolVMs(p), metric(t, p, `socialweb_warm_pool_claims_total{result="miss_shape"}`))
	}

	e2 := newFakeEnv(t)
	held := e2.poolProvider(t, 1, func(p *Provider) { p.pool.holdUntil = time.Now().Add(time.Hour) })
	if _, err := held.Create(ctx, req("a", "a-cold")); err != nil {
		t.Fatal(err)
	}
	if got := metric(t, held, `socialweb_warm_pool_claims_total{result="miss_empty"}`); got != 1 {
		t.Errorf("miss_empty %v, want 1", got)
	}
	if len(poolVMs(held)) != 0 {
		t.Errorf("a held pool booted %v", poolVMs(held))
	}
	for _, c := range []struct {
		p *Provider
		n string
	}{{p, "a-big"}, {held, "a-cold"}} {
		if err := c.p.Delete(ctx, c.n); err != nil {
			t.Error(err)
		}
	}
}

// TestPoolClaimFailure: a claim that fails once it changed the pool VM destroys that VM
// and boots the node cold; one that fails before (the joiner) leaves the VM in the pool.
func TestPoolClaimFailure(t *testing.T) {
	e := newFakeEnv(t)
	p := e.poolProvider(t, 1, nil)
	ctx := t.Context()
	waitPoolReady(t, p, 1)
	vm := onlyPoolVM(t, p)
	pool, _ := p.Info(vm)

	e.net.mu.Lock()
	e.net.failClaim = errors.New("bridge swb5 is gone")
	e.net.mu.Unlock()
	fallback, err := p.Create(ctx, req("a", "a-fallback"))
	if err != nil {
		t.Fatalf("Create after a failed claim: %v; want the node booted cold", err)
	}
	if w := fallback.Warm; w.Claimed || !strings.Contains(w.Failed, "bridge swb5 is gone") || !strings.Contains(w.Failed, "booted cold") {
		t.Errorf("Create after a failed claim reports %+v; want why it booted cold", w)
	}
	info, _ := p.Info("a-fallback")
	if info.PID == pool.PID || info.MAC != nodenet.NodeMAC("a", "a-fallback").String() || info.State != nodes.StateRunning {
		t.Errorf("node after a failed claim: %+v; want a cold boot", info)
	}
	waitFor(t, 5*time.Second, "the pool VM's qemu to end", func() bool { return !runningPID(pool.PID) })
	if slices.Contains(e.net.tapNames(), nodenet.PoolTapName(nodenet.PoolTapOwner(e.cfg.StateDir), vm)) {
		t.Errorf("the failed pool VM's tap is left: %v", e.net.tapNames())
	}
	if _, err := os.Stat(pool.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pool dir after the failed claim: %v", err)
	}
	if got := metric(t, p, `socialweb_warm_pool_claims_total{result="failed"}`); got != 1 {
		t.Errorf("failed claims %v, want 1", got)
	}
	e.net.mu.Lock()
	e.net.failClaim = nil
	e.net.mu.Unlock()

	// Refilled; a joiner that fails costs no pool VM.
	waitPoolReady(t, p, 1)
	vm2 := onlyPoolVM(t, p)
	e.join.mu.Lock()
	e.join.err = errors.New("tenant API unreachable")
	e.join.mu.Unlock()
	if _, err := p.Create(ctx, req("a", "a-nojoin")); err == nil || !strings.Contains(err.Error(), "tenant API unreachable") {
		t.Errorf("Create with a failing joiner: %v", err)
	}
	if got := poolVMs(p); len(got) != 1 || !got[vm2] {
		t.Errorf("pool after a claim the joiner failed: %v, want %s kept", got, vm2)
	}
	if _, err := os.Stat(filepath.Join(e.cfg.StateDir, vm2)); err != nil {
		t.Errorf("pool dir after the joiner failed: %v", err)
	}
	e.join.mu.Lock()
	e.join.err = nil
	e.join.mu.Unlock()
	late, err := p.Create(ctx, req("a", "a-late"))
	if err != nil {
		t.Fatal(err)
	}
	if late.Warm != (nodes.WarmStart{Claimed: true}) {
		t.Errorf("a claimed node reports %+v, want Claimed", late.Warm)
	}
	if n, _ := p.Info("a-late"); n.MAC != nodenet.PoolMAC(vm2).String() {
		t.Errorf("the kept pool VM was not claimed later: %+v", n)
	}
	for _, n := range []string{"a-fallback", "a-late"} {
		if err := p.Delete(ctx, n); err != nil {
			t.Error(err)
		}
	}
}

// crash drops a provider as a killed daemon would: its VMs run on, its lock is gone.
func crash(p *Provider) {
	p.mu.Lock()
	p.closed = true
	cancel, done := p.pool.cancel, p.pool.done
	p.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	syscall.Flock(int(p.lock.Fd()), syscall.LOCK_UN)
	p.lock.Close()
}

// TestPoolRecover: a restarted provider destroys the pool VMs it finds (one whose claim
// stopped halfway too) and leftover pool taps, adopts the claimed node, and refills to
// the pool's size, not more.
func TestPoolRecover(t *testing.T) {
	e := newFakeEnv(t)
	ctx := t.Context()
	p1 := e.poolProvider(t, 3, nil)
	waitPoolReady(t, p1, 3)
	if _, err := p1.Create(ctx, req("a", "a-kept")); err != nil {
		t.Fatal(err)
	}
	waitPoolReady(t, p1, 3)
	kept, _ := p1.Info("a-kept")
	var poolPIDs []int
	var half string
	for vm := range poolVMs(p1) {
		info, _ := p1.Info(vm)
		poolPIDs = append(poolPIDs, info.PID)
		half = vm
	}
	crash(p1)
	// A claim that renamed the directory and stopped there.
	if err := os.Rename(filepath.Join(e.cfg.StateDir, half), filepath.Join(e.cfg.StateDir, "a-halfway")); err != nil {
		t.Fatal(err)
	}
	owner := nodenet.PoolTapOwner(e.cfg.StateDir)
	stray := nodenet.PoolTapName(owner, "pool-gone")
	// Another daemon's waiting pool VM: its tap is not this provider's to remove.
	foreign := nodenet.PoolTapName(nodenet.PoolTapOwner(e.cfg.StateDir+"-other"), "pool-other")
	e.net.mu.Lock()
	e.net.taps[stray] = "nobody" // a pool tap of no VM
	e.net.taps[foreign] = "pool-other"
	e.net.mu.Unlock()

	p2, err := New(e.cfg, e.deps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p2.Close() })
	res, err := p2.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recover: %+v", res)
	if len(res.Pool) != 3 || !slices.Contains(res.Pool, half) || !slices.Equal(res.Adopted, []string{"a-kept"}) ||
		!slices.Equal(res.PoolTaps, []string{stray}) || len(res.Removed)+len(res.Killed) != 0 {
		t.Errorf("Recover = %+v; want 3 pool VMs destroyed (%s halfway), a-kept adopted, the stray pool tap %s removed", res, half, stray)
	}
	if !slices.Contains(e.net.tapNames(), foreign) {
		t.Errorf("Recover removed %s, another daemon's pool tap", foreign)
	}
	for _, pid := range poolPIDs {
		waitFor(t, 5*time.Second, fmt.Sprintf("pool qemu %d to end", pid), func() bool { return !runningPID(pid) })
	}
	if _, err := os.Stat(filepath.Join(e.cfg.StateDir, "a-halfway")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("half-claimed dir: %v", err)
	}
	if info, _ := p2.Info("a-kept"); !info.Adopted || info.PID != kept.PID {
		t.Errorf("claimed node after Recover: %+v", info)
	}
	waitPoolReady(t, p2, 3)
	time.Sleep(3 * poolTick)
	if got := poolVMs(p2); len(got) != 3 || len(qemusUsing(e.cfg.StateDir)) != 4 {
		t.Errorf("after the restart: pool %v and %d qemus; want 3 pool VMs and the node", got, len(qemusUsing(e.cfg.StateDir)))
	}
	if err := p2.Delete(ctx, "a-kept"); err != nil {
		t.Fatal(err)
	}
}

// TestPoolClose: Close destroys the unclaimed pool VMs and leaves claimed nodes running;
// StopAll (socialweb down) then stops the node and leaves nothing.
func TestPoolClose(t *testing.T) {
	e := newFakeEnv(t)
	ctx := t.Context()
	p := e.poolProvider(t, 2, nil)
	waitPoolReady(t, p, 2)
	if _, err := p.Create(ctx, req("a", "a-stays")); err != nil {
		t.Fatal(err)
	}
	node, _ := p.Info("a-stays")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if q := qemusUsing(e.cfg.StateDir); len(q) != 1 || q[0].PID != node.PID {
		t.Errorf("qemus after Close: %v; want only the node's (pid %d)", q, node.PID)
	}
	if d := dirEntries(t, e.cfg.StateDir); !slices.Equal(d, []string{"a-stays"}) {
		t.Errorf("dirs after Close: %v", d)
	}
	if taps := e.net.tapNames(); !slices.Equal(taps, []string{node.Tap}) {
		t.Errorf("taps after Close: %v; want the node's %s", taps, node.Tap)
	}
	stopped, err := StopAll(ctx, e.cfg.StateDir, e.net, testLogger(t))
	if err != nil || !slices.Equal(stopped, []string{"a-stays"}) {
		t.Errorf("StopAll: %v, %v", stopped, err)
	}
	waitFor(t, 5*time.Second, "the node's qemu to end", func() bool { return !runningPID(node.PID) })
	if d := dirEntries(t, e.cfg.StateDir); len(d) != 0 || e.net.count() != 0 {
		t.Errorf("left after StopAll: dirs %v, taps %v", d, e.net.tapNames())
	}
}

// TestStopAllDestroysPool: after a daemon died with a pool, down stops the pool VMs too.
func TestStopAllDestroysPool(t *testing.T) {
	e := newFakeEnv(t)
	p := e.poolProvider(t, 1, nil)
	waitPoolReady(t, p, 1)
	vm := onlyPoolVM(t, p)
	crash(p)
	stopped, err := StopAll(t.Context(), e.cfg.StateDir, e.net, testLogger(t))
	if err != nil || !slices.Equal(stopped, []string{"warm-pool VM " + vm}) {
		t.Errorf("StopAll: %v, %v", stopped, err)
	}
	waitFor(t, 5*time.Second, "the pool VM's qemu to end", func() bool { return len(qemusUsing(e.cfg.StateDir)) == 0 })
	if d := dirEntries(t, e.cfg.StateDir); len(d) != 0 || e.net.count() != 0 {
		t.Errorf("left after StopAll: dirs %v, taps %v", d, e.net.tapNames())
	}
}

// TestPoolEviction: pool VMs count against the host's memory; a node that does not fit
// destroys one (of another size here) and boots; the pool then does not take the room.
func TestPoolEviction(t *testing.T) {
	e := newFakeEnv(t)
	e.deps.MemAvailable = func() (int64, error) { return 1024 + (256 + 512) + 100, nil } // the reserve and one VM
	p := e.poolProvider(t, 2, nil)
	waitPoolReady(t, p, 1)
	time.Sleep(2 * poolTick)
	if n := len(poolVMs(p)); n != 1 {
		t.Fatalf("pool of 2 on a host with room for one VM has %d", n)
	}
	vm := onlyPoolVM(t, p)
	big := req("a", "a-needs-room")
	big.MemoryMiB = 300
	if _, err := p.Create(t.Context(), big); err != nil {
		t.Fatalf("a node that fits once the pool VM is gone: %v", err)
	}
	if info, _ := p.Info(vm); info.Name != "" {
		t.Errorf("pool VM %s still known: %+v", vm, info)
	}
	time.Sleep(2 * poolTick)
	if got := poolVMs(p); len(got) != 0 {
		t.Errorf("the pool took the room back: %v", got)
	}
	if _, err := p.Create(t.Context(), req("a", "a-nope")); !nodes.IsCapacity(err) {
		t.Errorf("another node with no pool VM left to evict: %v, want a CapacityError", err)
	}
	if err := p.Delete(t.Context(), "a-needs-room"); err != nil {
		t.Fatal(err)
	}
}

// TestPoolFailuresPause: three pool VMs in a row that fail (qemu exits at start; a guest
// that never reaches its identity step) stop the refill.
func TestPoolFailuresPause(t *testing.T) {
	e := newFakeEnv(t)
	e.cfg.JoinTimeout = 500 * time.Millisecond
	names := &poolNames{names: []string{"pool-crash00001", "pool-mute000001", "pool-crash00002"}}
	p := e.poolProvider(t, 1, func(p *Provider) { p.pool.newName = names.next })
	waitFor(t, 15*time.Second, "three pool failures", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.pool.failures == 3
	})
	time.Sleep(3 * poolTick)
	p.mu.Lock()
	paused := time.Until(p.pool.pausedUntil)
	p.mu.Unlock()
	if names.count() != 3 || paused < poolPause-time.Minute {
		t.Errorf("after three failures: %d boots, paused for %s; want 3 and about %s", names.count(), paused, poolPause)
	}
	if len(poolVMs(p)) != 0 || len(dirEntries(t, e.cfg.StateDir)) != 0 {
		t.Errorf("left: pool %v, dirs %v", poolVMs(p), dirEntries(t, e.cfg.StateDir))
	}
	if _, err := os.Stat(filepath.Join(e.cfg.StateDir, dirConsoles, "pool-mute000001.log")); err != nil {
		t.Errorf("the console of the pool VM that never got ready: %v", err)
	}
}

// TestPoolAcceleratorChange: pool VMs of an accelerator new VMs no longer get are
// replaced.
func TestPoolAcceleratorChange(t *testing.T) {
	e := newFakeEnv(t)
	p := e.poolProvider(t, 1, nil)
	waitPoolReady(t, p, 1)
	old := onlyPoolVM(t, p)
	p.mu.Lock()
	p.accel = AccelKVM
	p.mu.Unlock()
	waitFor(t, 15*time.Second, "a pool VM under kvm", func() bool {
		vms := poolVMs(p)
		if len(vms) != 1 || vms[old] {
			return false
		}
		info, err := p.Info(onlyPoolVM(t, p))
		return err == nil && info.Accel == AccelKVM
	})
}

// TestPoolLostLayerShare: a ready pool VM whose virtiofsd exits is never claimed; the
// pool destroys it and boots another.
func TestPoolLostLayerShare(t *testing.T) {
	e := newFakeEnv(t)
	p := e.poolProvider(t, 1, nil)
	waitPoolReady(t, p, 1)
	old := onlyPoolVM(t, p)
	gone := make(chan struct{})
	close(gone)
	p.mu.Lock()
	in := p.insts[old]
	in.vdone = gone // as if its virtiofsd had been started and had exited
	claimable := p.claimableLocked(in)
	p.mu.Unlock()
	if claimable {
		t.Error("a pool VM without its virtiofsd is claimable")
	}
	waitFor(t, 15*time.Second, "the pool VM replaced", func() bool {
		vms := poolVMs(p)
		return len(vms) == 1 && !vms[old] && vms[onlyPoolVM(t, p)]
	})
	if _, err := os.Stat(filepath.Join(e.cfg.StateDir, old)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the lost pool VM's directory: %v", err)
	}
}

func TestValidatePoolSize(t *testing.T) {
	for _, tc := range []struct {
		n  int
		ok bool
	}{{0, true}, {1, true}, {MaxPoolSize, true}, {-1, false}, {MaxPoolSize + 1, false}} {
		if err := ValidatePoolSize(tc.n); (err == nil) != tc.ok {
			t.Errorf("ValidatePoolSize(%d) = %v", tc.n, err)
		}
	}
	e := newFakeEnv(t)
	e.cfg.PoolSize, e.cfg.PoolShape = 1, PoolShape{CPUs: 1, MemoryMiB: 1}
	if _, err := New(e.cfg, e.deps); err == nil || !strings.Contains(err.Error(), "warm pool") {
		t.Errorf("a pool of VMs below the image's memory: %v", err)
	}
}

// TestPoolRefillDelay: after a claim the pool boots no replacement for PoolRefillDelay
// (the claimed node's start needs the host's cores), then refills.
func TestPoolRefillDelay(t *testing.T) {
	const delay = 3 * time.Second
	e := newFakeEnv(t)
	e.cfg.PoolRefillDelay = delay
	p := e.poolProvider(t, 1, nil)
	waitPoolReady(t, p, 1)
	claimed := time.Now()
	if _, err := p.Create(t.Context(), req("a", "a-warm")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(delay / 2)
	if vms := poolVMs(p); len(vms) != 0 {
		t.Fatalf("pool VMs %v %s after the claim, want none before %s", vms, time.Since(claimed).Round(time.Millisecond), delay)
	}
	waitPoolReady(t, p, 1)
	if took := time.Since(claimed); took < delay {
		t.Errorf("the pool refilled %s after the claim, want %s or more", took, delay)
	}
	if err := p.Delete(t.Context(), "a-warm"); err != nil {
		t.Fatal(err)
	}
}

// TestPoolGuestASLR: under TCG pool VMs boot with norandmaps unless TCGGuestASLR keeps
// randomization, and their record says which; a pool VM booted the other way is not
// claimed (a daemon restarted with the other setting).
func TestPoolGuestASLR(t *testing.T) {
	for _, tc := range []struct {
		name          string
		aslr          bool
		wantFixedMaps bool
	}{
		{"by default: fixed maps", false, true},
		{"TCGGuestASLR: randomized", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEnv(t)
			e.cfg.TCGGuestASLR = tc.aslr
			p := e.poolProvider(t, 1, nil)
			waitPoolReady(t, p, 1)
			name := onlyPoolVM(t, p)
			p.mu.Lock()
			defer p.mu.Unlock()
			in := p.insts[name]
			if in.rec.Process == nil {
				t.Fatal("the pool VM's record has no qemu process")
			}
			cmdline := strings.Join(in.rec.Process.Cmdline, " ")
			if got := strings.Contains(cmdline, "norandmaps"); got != tc.wantFixedMaps {
				t.Errorf("norandmaps on the command line: %v, want %v (%s)", got, tc.wantFixedMaps, cmdline)
			}
			if in.rec.TCGFixedMaps != tc.wantFixedMaps {
				t.Errorf("record TCGFixedMaps = %v, want %v", in.rec.TCGFixedMaps, tc.wantFixedMaps)
			}
			if !p.claimableLocked(in) {
				t.Error("the pool VM is not claimable under the setting it was booted with")
			}
			p.cfg.TCGGuestASLR = !tc.aslr
			if p.claimableLocked(in) {
				t.Error("the pool VM is claimable under the other setting")
			}
		})
	}
}
