package qemu

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/procnice"
)

// The warm pool (issue 12, item 2): Config.PoolSize VMs booted ahead of demand exactly as
// nodes are (image, kernel command line, accelerator, TCG cache, shared layers, root
// clone, data disk), but for no cluster. Each has the pool marker on its identity disk
// (identity.EncodePool), a tap on no bridge (nodenet.AddPoolTap) and a guest agent parked
// at its identity step, reading the disk again and again. A Create of the pool's size
// claims one instead of booting: its directory is renamed to the node's, its tap given to
// the cluster (nodenet.ClaimTap), its identity written into the disk qemu holds open, and
// its record rewritten; the guest then joins as that node. A loop keeps the pool full.
//
// Pool VMs are the provider's own business: List does not report them, Delete does not
// find them, Recover destroys them (so a daemon restart never doubles the pool), Close
// destroys the unclaimed ones, and a node that does not fit the host destroys one to make
// room.

const (
	// MaxPoolSize bounds Config.PoolSize: each pool VM holds its guest memory all the time.
	MaxPoolSize = 16
	// poolPrefix starts every pool VM's name: pool-<10 random lower-case alphanumerics>.
	poolPrefix = "pool-"
	// poolReadyMarker is what the guest agent prints on its console once it waits for its
	// identity: the pool VM is then ready to be claimed.
	poolReadyMarker = "step=identity-wait"
	// poolTick is how often the pool loop looks at its VMs and refills.
	poolTick = time.Second
	// After poolFailuresBeforePause pool VMs in a row failed to boot or died before they
	// were ready, the pool stops refilling for poolPause (or until the next claim): a
	// broken image or host would otherwise boot and destroy VMs forever.
	poolFailuresBeforePause = 3
	poolPause               = 5 * time.Minute
	// poolEvictHold: after a pool VM was destroyed to make room for a node, the pool does
	// not refill for this long, so it does not take back the room the node is waiting for.
	poolEvictHold = 2 * time.Minute
	// DefaultPoolRefillDelay is the daemon's Config.PoolRefillDelay: long enough for a
	// claimed node to get its kubelet going before a replacement boots beside it.
	DefaultPoolRefillDelay = 30 * time.Second
)

// Results of a claim, the label of socialweb_warm_pool_claims_total.
const (
	claimHit       = "hit"        // a pool VM became the node
	claimMissEmpty = "miss_empty" // the node has the pool's size, but no pool VM was free
	claimMissShape = "miss_shape" // the node has another size: booted cold
	claimFailed    = "failed"     // a claim began and failed: booted cold
)

// PoolShape is the size of the warm pool's VMs.
type PoolShape struct {
	CPUs, MemoryMiB, DiskMiB int64
}

func (s PoolShape) fits(r nodes.NodeRequest) bool {
	return r.CPUs == s.CPUs && r.MemoryMiB == s.MemoryMiB && r.DiskMiB == s.DiskMiB
}

// ValidatePoolSize checks a warm pool's size (Config.PoolSize).
func ValidatePoolSize(n int) error {
	if n < 0 || n > MaxPoolSize {
		return fmt.Errorf("warm pool of %d VMs: want 0 (no pool) to %d", n, MaxPoolSize)
	}
	return nil
}

// checkPoolShape reports whether VMs of shape s can boot on this host at all.
func checkPoolShape(s PoolShape, h host, reserveMiB int64) error {
	if s.CPUs <= 0 || s.MemoryMiB <= 0 || s.DiskMiB < 0 {
		return fmt.Errorf("warm pool VMs of %d vCPUs, %d MiB of memory and a %d MiB disk: want vCPUs and memory above 0 and a disk of 0 or more (the default node size)",
			s.CPUs, s.MemoryMiB, s.DiskMiB)
	}
	if err := checkSize(nodes.NodeRequest{Name: "of the warm pool", CPUs: s.CPUs, MemoryMiB: s.MemoryMiB}, h, reserveMiB); err != nil {
		return fmt.Errorf("warm pool (VMs of the default node size): %w", err)
	}
	return nil
}

// pool is the warm pool's state.
type pool struct {
	size  int
	shape PoolShape
	// newName names a new pool VM (newPoolName; tests pick names the fake qemu acts on).
	newName func() (string, error)
	kick    chan struct{} // wakes the loop (a claim, a died VM)
	claims  *prometheus.CounterVec

	// Guarded by Provider.mu.
	cancel      context.CancelFunc // ends the loop; nil until it started
	done        chan struct{}      // closed when the loop has ended
	failures    int                // pool VMs in a row that failed before they were ready
	pausedUntil time.Time          // no refill before this, after failures
	holdUntil   time.Time          // no refill before this, after an eviction for a node or a claim
	refillDelay time.Duration      // Config.PoolRefillDelay
	full        bool               // the last refill did not fit the host (logged once)
}

func newPool(cfg Config) *pool {
	pl := &pool{size: cfg.PoolSize, shape: cfg.PoolShape, refillDelay: cfg.PoolRefillDelay, newName: newPoolName, kick: make(chan struct{}, 1),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "socialweb_warm_pool_claims_total",
			Help: "Node VMs asked of the qemu provider while the warm pool is on, by result: hit (a pool VM became the node), " +
				"miss_empty (the pool's size, but no pool VM free), miss_shape (another size), failed (a claim failed; the node booted cold).",
		}, []string{"result"})}
	for _, r := range []string{claimHit, claimMissEmpty, claimMissShape, claimFailed} {
		pl.claims.WithLabelValues(r)
	}
	return pl
}

// newPoolName is pool-<10 random lower-case alphanumerics>.
func newPoolName() (string, error) {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("naming a warm-pool VM: %w", err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return poolPrefix + string(b[:]), nil
}

func (p *Provider) poolOn() bool { return p.pool != nil && p.pool.size > 0 }

// kickPool wakes the pool loop; it never blocks.
func (p *Provider) kickPool() {
	if p.pool == nil {
		return
	}
	select {
	case p.pool.kick <- struct{}{}:
	default:
	}
}

// startPool starts the pool loop (Recover's last step). A provider without a node image
// (StopAll's) keeps no pool.
func (p *Provider) startPool() {
	if !p.poolOn() || p.image == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	p.mu.Lock()
	p.pool.cancel, p.pool.done = cancel, done
	p.mu.Unlock()
	s := p.pool.shape
	p.log.Info("warm pool on", "size", p.pool.size, "cpus", s.CPUs, "memoryMiB", s.MemoryMiB, "diskMiB", s.DiskMiB)
	go func() {
		defer close(done)
		t := time.NewTicker(poolTick)
		defer t.Stop()
		for {
			p.tendPool(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-p.pool.kick:
			}
		}
	}()
}

// stopPool ends the pool loop (a pool VM it was booting is undone) and destroys every
// unclaimed pool VM. Claims under way finish: theirs are nodes now.
func (p *Provider) stopPool() {
	if p.pool == nil {
		return
	}
	p.mu.Lock()
	cancel, done := p.pool.cancel, p.pool.done
	p.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
	for _, inst := range p.takePoolVMs(MaxPoolSize*2, false) {
		_ = p.removePoolVM(inst, "the provider closes", false)
	}
}

// unclaimedLocked reports whether in is a pool VM that no claim or removal holds (a VM
// still booting is one). Called with p.mu held.
func (in *instance) unclaimedLocked() bool {
	return in.rec.Pool && !in.claiming && in.deleting == nil
}

// claimableLocked reports whether in can become a node of p's pool size now: it runs,
// under the accelerator, TCG cache and maps, layers and image new VMs get. Called with
// p.mu held.
func (p *Provider) claimableLocked(in *instance) bool {
	r := in.rec
	return in.unclaimedLocked() && !in.creating && in.stalled == "" && in.alive() && !in.shareLost() &&
		p.pool.shape.fits(r.Request) && r.Accel == p.accel && r.TCGCacheMiB == p.cfg.TCGCacheMiB &&
		r.TCGFixedMaps == p.tcgFixedMaps() && r.LayersDir == p.layersDir() && r.ImageDir == p.imageDir
}

// tendPool looks at each unclaimed pool VM (ready yet? died? stuck? of an old
// accelerator?), destroys those that will never serve, then boots VMs until the pool is
// full, the host has no room, or boots keep failing.
func (p *Provider) tendPool(ctx context.Context) {
	type look struct {
		inst              *instance
		name, dir         string
		started           time.Time
		ready, progressed bool
		accel             Accel
		broken            string
	}
	p.mu.Lock()
	var looks []look
	for _, in := range p.insts {
		if in.unclaimedLocked() && !in.creating {
			p.poolNiceLocked(in)
			looks = append(looks, look{inst: in, name: in.rec.Request.Name, dir: in.dir, started: in.started, ready: in.poolReady,
				progressed: in.progressed, accel: in.rec.Accel, broken: in.stalled})
		}
	}
	accel := p.accel
	p.mu.Unlock()

	for _, l := range looks {
		console := filepath.Join(l.dir, fileConsole)
		age := time.Since(l.started)
		if l.started.IsZero() {
			age = 0
		}
		var why string
		failed := false
		switch {
		case l.broken != "":
			why = l.broken
		case !p.aliveLocked(l.inst):
			_, said := p.Exited(l.name)
			why, failed = "its VM stopped: "+said, !l.ready
		case p.shareLostLocked(l.inst):
			_, said := p.Exited(l.name)
			why, failed = "its layer share is gone: "+said, !l.ready
		case l.accel != accel:
			why = fmt.Sprintf("it runs under %s and new VMs now get %s", l.accel, accel)
		case l.ready:
			continue
		case consoleHas(console, poolReadyMarker):
			p.mu.Lock()
			l.inst.poolReady, l.inst.progressed = true, true
			p.pool.failures = 0
			p.mu.Unlock()
			p.log.Info("warm pool VM ready", "vm", l.name, "took", age.Round(time.Millisecond))
			continue
		case !l.progressed && age > p.cfg.EarlyBootTimeout && !consoleShowsProgress(console):
			why, failed = fmt.Sprintf("its guest kernel showed no progress %s after qemu started under %s", age.Round(time.Second), l.accel), true
		case age > p.cfg.JoinTimeout:
			why, failed = fmt.Sprintf("its guest did not reach its identity step (%q on its console) within %s", poolReadyMarker, p.cfg.JoinTimeout), true
		default:
			continue
		}
		if !p.takePoolVM(l.inst) {
			continue // claimed or removed meanwhile
		}
		if err := p.removePoolVM(l.inst, why, failed); err != nil {
			p.log.Error("removing a warm-pool VM failed; trying again", "vm", l.name, "err", err)
		}
		if failed {
			p.poolFailure(l.name, why)
		}
	}
	p.refill(ctx)
}

// poolNiceLocked lowers the CPU priority of unclaimed pool VM in to PoolNice, again on
// each pass until its guest is ready (qemu may start threads until then). Called with
// p.mu held, so a claim, which raises it, comes before or after, never between.
func (p *Provider) poolNiceLocked(in *instance) {
	if in.poolNiced || in.rec.Process == nil || !in.alive() {
		return
	}
	if err := procnice.Set(in.rec.Process.PID, PoolNice); err != nil {
		p.log.Warn("warm-pool VM: could not lower its CPU priority", "vm", in.rec.Request.Name, "err", err)
		in.poolNiced = true // not again every second
		return
	}
	in.poolNiced = in.poolReady
}

// refill boots pool VMs, one after the other, until the pool is full.
func (p *Provider) refill(ctx context.Context) {
	for ctx.Err() == nil {
		p.mu.Lock()
		n := 0
		for _, in := range p.insts {
			if in.unclaimedLocked() {
				n++
			}
		}
		now := time.Now()
		blocked := p.closed || now.Before(p.pool.pausedUntil) || now.Before(p.pool.holdUntil)
		p.mu.Unlock()
		if blocked || n >= p.pool.size {
			return
		}
		err := p.bootPoolVM(ctx)
		switch {
		case err == nil:
			p.mu.Lock()
			p.pool.full = false
			p.mu.Unlock()
		case nodes.IsCapacity(err):
			// Nodes come first; the pool fills once they leave room.
			p.mu.Lock()
			logIt := !p.pool.full
			p.pool.full = true
			p.mu.Unlock()
			if logIt {
				p.log.Info("warm pool not full: the host has no room for another pool VM now; trying again later", "want", p.pool.size, "have", n, "why", err)
			}
			return
		case ctx.Err() != nil:
			return
		default:
			p.poolFailure("", err.Error())
			return
		}
	}
}

// poolFailure counts a pool VM that failed before it was ready and pauses the refill
// after poolFailuresBeforePause in a row.
func (p *Provider) poolFailure(vm, why string) {
	p.mu.Lock()
	p.pool.failures++
	n := p.pool.failures
	pause := n >= poolFailuresBeforePause && !time.Now().Before(p.pool.pausedUntil)
	if pause {
		p.pool.pausedUntil = time.Now().Add(poolPause)
	}
	p.mu.Unlock()
	if !pause {
		p.log.Warn("warm pool VM failed", "vm", vm, "inARow", n, "why", why)
		return
	}
	p.log.Error(fmt.Sprintf("warm pool: %d pool VMs in a row failed to boot or died before their guest was ready; not refilling for %s (or until a node claims a pool VM). "+
		"Check the node image (rebuild with `socialweb image build`), the accelerator (serve --accel tcg if KVM misbehaves), free host memory, "+
		"and the failed VMs' consoles in %s", n, poolPause, filepath.Join(p.cfg.StateDir, dirConsoles, poolPrefix+"*.log")),
		"vm", vm, "last", why)
}

// bootPoolVM boots one pool VM and returns once qemu runs it; on error nothing of it is
// left (or it stays known, Terminated, for the loop to remove).
func (p *Provider) bootPoolVM(ctx context.Context) error {
	t0 := time.Now()
	name, err := p.pool.newName()
	if err != nil {
		return err
	}
	s := p.pool.shape
	req := nodes.NodeRequest{Name: name, CPUs: s.CPUs, MemoryMiB: s.MemoryMiB, DiskMiB: s.DiskMiB}
	tap := nodenet.PoolTapName(p.poolTapOwner(), name)
	p.mu.Lock()
	if err := p.admitLocked(req); err != nil {
		p.mu.Unlock()
		return err
	}
	// Tap names carry 28 bits of the VM's name: two live pool VMs sharing one would
	// have the second's failed boot remove the first's tap.
	for other, in := range p.insts {
		if in.rec.Tap == tap || in.rec.PoolTap == tap {
			p.mu.Unlock()
			return fmt.Errorf("warm-pool VM %s: its tap name %s is VM %s's; the next refill picks another name", name, tap, other)
		}
	}
	rec, err := p.newRecord(req)
	if err != nil {
		p.mu.Unlock()
		return err
	}
	dir, err := p.makeDir(name)
	if err != nil {
		p.mu.Unlock()
		return err
	}
	rec.Tap = tap
	rec.MAC = nodenet.PoolMAC(name).String()
	rec.Pool = true
	inst := &instance{dir: dir, creating: true, rec: rec}
	p.insts[name] = inst
	p.mu.Unlock()

	var tapAdded bool
	ok := false
	defer func() {
		if !ok {
			p.undoCreate(inst, tapAdded)
		}
	}()
	if err := writeRecord(dir, inst.rec); err != nil {
		return err
	}
	var disk bytes.Buffer
	if err := identity.EncodePool(&disk, identity.Pool{Prewarm: p.cfg.PoolPrewarm}); err != nil {
		return fmt.Errorf("warm-pool VM %s: identity disk: %w", name, err)
	}
	addTap := func(ctx context.Context) (nodenet.Tap, error) {
		return p.deps.Networks.AddPoolTap(ctx, p.poolTapOwner(), name)
	}
	b, err := p.boot(ctx, inst, disk.Bytes(), addTap, &tapAdded)
	if err != nil {
		return err
	}
	// The NIC waits with its carrier down (before the guest's driver looks, a second or
	// more into its boot); the claim brings it up, and that link event is what wakes the
	// guest's agent. Without it the agent still finds its identity, within a second.
	lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
	if err := qmpSetLink(lctx, inst.dir, false); err != nil {
		p.log.Warn("warm-pool VM: could not set its NIC's link down; a claim will reach it by the agent's slower disk poll", "vm", name, "err", err)
	}
	lcancel()
	ok = true
	p.mu.Lock()
	inst.creating = false
	p.poolNiceLocked(inst)
	p.mu.Unlock()
	p.log.Info("warm pool VM started", "vm", name, "pid", inst.rec.Process.PID, "accel", inst.rec.Accel, "rootfs", string(b.method),
		"clone", b.clone.Round(time.Millisecond), "qemuUp", b.qemuUp.Round(time.Millisecond), "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// claim hands an unclaimed pool VM of req's size to req's node instead of booting one
// (see the comment at the top). Not Claimed: the caller boots the node cold; Failed then
// says why, if a claim was tried. A claim that fails once it changed the VM destroys it;
// one that fails before (the joiner, a directory in the way) gives it back to the pool.
func (p *Provider) claim(ctx context.Context, req nodes.NodeRequest, plan nodenet.Plan, t0 time.Time) (nodes.Instance, nodes.WarmStart) {
	if !p.poolOn() {
		return nodes.Instance{}, nodes.WarmStart{}
	}
	if !p.pool.shape.fits(req) {
		p.pool.claims.WithLabelValues(claimMissShape).Inc()
		return nodes.Instance{}, nodes.WarmStart{}
	}
	inst, addr, poolName, wasReady := p.pickPoolVM(req, plan)
	if inst == nil {
		return nodes.Instance{}, nodes.WarmStart{}
	}
	log := p.log.With("cluster", req.Cluster, "node", req.Name, "vm", poolName)
	fail := func(step string, err error, changed bool) (nodes.Instance, nodes.WarmStart) {
		p.pool.claims.WithLabelValues(claimFailed).Inc()
		fate := "it stays in the pool"
		if changed {
			p.discardClaim(inst, req.Name, poolName, err)
			fate = "it was destroyed"
		} else {
			p.releaseClaim(inst, req.Name, poolName)
		}
		log.Warn("claiming a warm-pool VM failed; the node boots cold", "step", step, "err", err, "vm", fate)
		p.kickPool()
		return nodes.Instance{}, nodes.WarmStart{Failed: fmt.Sprintf(
			"claiming warm-pool VM %s failed at its %s step (%v); %s, and node %s booted cold", poolName, step, err, fate, req.Name)}
	}

	// A node's priority from here on, even if the claim fails: the pool loop lowers
	// it again for a VM given back.
	p.mu.Lock()
	inst.poolNiced = false
	proc := inst.rec.Process
	p.mu.Unlock()
	if proc == nil {
		return fail("priority", errors.New("its qemu has not started"), false)
	} else if err := procnice.Set(proc.PID, 0); err != nil {
		log.Warn("warm-pool VM: could not raise its CPU priority to a node's", "err", err)
	}
	id, err := p.identity(ctx, req, plan, addr, inst.rec.MAC)
	if err != nil {
		return fail("identity", err, false)
	}
	var disk bytes.Buffer
	if err := identity.EncodeSized(&disk, id, identity.PoolDiskSize); err != nil {
		return fail("identity", err, false)
	}
	// qemu's working directory, console, QMP and virtiofsd sockets and open disks all
	// follow the directory; its recorded identity (pid, start time, command line) stays.
	oldDir, newDir := inst.dir, p.nodeDir(req.Name)
	if err := renameNoReplace(oldDir, newDir); err != nil {
		return fail("directory", fmt.Errorf("renaming %s to %s: %w", oldDir, newDir, err), false)
	}
	p.mu.Lock()
	inst.dir = newDir
	rec := inst.rec
	p.mu.Unlock()
	// Still Pool: a daemon that stops now leaves a record Recover destroys, naming both
	// taps the VM may have.
	rec.PoolTap = rec.Tap
	rec.Request = req
	rec.Tap = nodenet.TapName(plan.Index, req.Cluster, req.Name)
	rec.Bridge = nodenet.BridgeName(plan.Index)
	if err := p.update(inst, func(r *record) { *r = rec }); err != nil {
		return fail("record", err, true)
	}
	tap, err := p.deps.Networks.ClaimTap(ctx, rec.PoolTap, req.Cluster, plan, req.Name)
	if err != nil {
		return fail("tap", err, true)
	}
	if tap.Name != rec.Tap {
		return fail("tap", fmt.Errorf("the network made tap %s, want %s as nodenet.TapName says", tap.Name, rec.Tap), true)
	}
	if err := rewriteInPlace(filepath.Join(newDir, fileIdentity), disk.Bytes()); err != nil {
		return fail("identity disk", err, true)
	}
	// After the identity is on the disk: the carrier coming up wakes the guest's agent,
	// which reads it. A NIC left down would leave the node without a network.
	lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
	err = qmpSetLink(lctx, newDir, true)
	lcancel()
	if err != nil {
		return fail("link", err, true)
	}
	claimed := p.now()
	rec.Pool, rec.PoolTap, rec.Claimed = false, "", &claimed
	if err := p.update(inst, func(r *record) { *r = rec }); err != nil {
		return fail("record", err, true)
	}
	p.mu.Lock()
	inst.claiming, inst.creating = false, false
	p.pool.failures, p.pool.pausedUntil = 0, time.Time{}
	if until := time.Now().Add(p.pool.refillDelay); until.After(p.pool.holdUntil) {
		p.pool.holdUntil = until
	}
	p.mu.Unlock()
	p.pool.claims.WithLabelValues(claimHit).Inc()
	log.Info("node VM claimed from the warm pool", "address", rec.Address, "tap", rec.Tap, "pid", rec.Process.PID,
		"accel", rec.Accel, "guestReady", wasReady, "took", time.Since(t0).Round(time.Millisecond))
	p.kickPool()
	view := p.instanceView(inst, nodes.StateRunning)
	view.Warm.Claimed = true
	return view, view.Warm
}

// pickPoolVM takes the best claimable pool VM for req (one whose guest waits for its
// identity, else the oldest still booting) with the lowest free address of the plan, and
// files it under req.Name, Pending. nil when there is none (counted as miss_empty) or the
// cold path should report why not (name in use, subnet full, provider closed).
func (p *Provider) pickPoolVM(req nodes.NodeRequest, plan nodenet.Plan) (*instance, net.IP, string, bool) {
	// Readiness of the candidates not yet seen ready, read without the lock.
	p.mu.Lock()
	var unsure []*instance
	dirs := map[*instance]string{}
	for _, in := range p.insts {
		if p.claimableLocked(in) && !in.poolReady {
			unsure = append(unsure, in)
			dirs[in] = in.dir
		}
	}
	p.mu.Unlock()
	for _, in := range unsure {
		if consoleHas(filepath.Join(dirs[in], fileConsole), poolReadyMarker) {
			p.mu.Lock()
			in.poolReady, in.progressed = true, true
			p.mu.Unlock()
		}
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if _, taken := p.insts[req.Name]; taken || p.closed {
		return nil, nil, "", false
	}
	var best *instance
	for _, in := range p.insts {
		if !p.claimableLocked(in) {
			continue
		}
		if best == nil || in.poolReady && !best.poolReady ||
			in.poolReady == best.poolReady && in.rec.Created.Before(best.rec.Created) {
			best = in
		}
	}
	if best == nil {
		p.pool.claims.WithLabelValues(claimMissEmpty).Inc()
		return nil, nil, "", false
	}
	addr, err := p.nextAddressLocked(plan)
	if err != nil {
		return nil, nil, "", false
	}
	if _, err := os.Lstat(p.nodeDir(req.Name)); !errors.Is(err, os.ErrNotExist) {
		return nil, nil, "", false // the cold path says what is in the way
	}
	ones, _ := plan.NodeCIDR.Mask.Size()
	poolName := best.rec.Request.Name
	best.claiming, best.creating = true, true
	best.rec.Address = fmt.Sprintf("%s/%d", addr, ones) // taken from here on
	delete(p.insts, poolName)
	p.insts[req.Name] = best
	return best, addr, poolName, best.poolReady
}

// releaseClaim gives a VM whose claim failed before it was changed back to the pool;
// after Close, which destroyed the pool meanwhile, it destroys it.
func (p *Provider) releaseClaim(inst *instance, node, poolName string) {
	p.mu.Lock()
	delete(p.insts, node)
	inst.rec.Address = ""
	inst.claiming, inst.creating = false, false
	p.insts[poolName] = inst
	closed := p.closed
	if closed {
		inst.deleting = make(chan struct{})
	}
	p.mu.Unlock()
	if closed {
		if err := p.removePoolVM(inst, "the provider closed during a claim", false); err != nil {
			p.log.Error("destroying a warm-pool VM after Close", "vm", poolName, "err", err)
		}
	}
}

// discardClaim destroys a VM whose claim failed halfway (qemu, virtiofsd, both taps,
// directory). If that fails it goes back under its pool name, marked broken, and the
// pool loop tries again; it is never claimed.
func (p *Provider) discardClaim(inst *instance, node, poolName string, cause error) {
	err := p.destroyPool(inst, false)
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.insts, node)
	if err == nil {
		return
	}
	p.log.Error("destroying a warm-pool VM whose claim failed; trying again", "vm", poolName, "node", node, "err", err)
	inst.claiming, inst.creating = false, false
	inst.stalled = fmt.Sprintf("its claim for node %s failed (%v)", node, cause)
	p.insts[poolName] = inst
}

// evictPoolVM destroys an unclaimed pool VM, of any size, to make room for node; false
// if there was none to destroy. The pool then holds off refilling for poolEvictHold.
func (p *Provider) evictPoolVM(node string) bool {
	if !p.poolOn() {
		return false
	}
	victims := p.takePoolVMs(1, true)
	if len(victims) == 0 {
		return false
	}
	p.mu.Lock()
	p.pool.holdUntil = time.Now().Add(poolEvictHold)
	p.mu.Unlock()
	return p.removePoolVM(victims[0], "node "+node+" needs the room", false) == nil
}

// takePoolVMs marks up to n unclaimed pool VMs that are not booting as being removed and
// returns them; with notReadyFirst, those whose guest is not ready yet come first.
func (p *Provider) takePoolVMs(n int, notReadyFirst bool) []*instance {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ready, notReady []*instance
	for _, in := range p.insts {
		if !in.unclaimedLocked() || in.creating {
			continue
		}
		if in.poolReady {
			ready = append(ready, in)
		} else {
			notReady = append(notReady, in)
		}
	}
	all := append(append([]*instance{}, ready...), notReady...)
	if notReadyFirst {
		all = append(append([]*instance{}, notReady...), ready...)
	}
	all = all[:min(n, len(all))]
	for _, in := range all {
		in.deleting = make(chan struct{})
	}
	return all
}

// takePoolVM marks one pool VM as being removed, if nothing else holds it.
func (p *Provider) takePoolVM(in *instance) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !in.unclaimedLocked() || in.creating {
		return false
	}
	in.deleting = make(chan struct{})
	return true
}

// removePoolVM destroys a pool VM taken with takePoolVM(s) and forgets it; if that fails
// it stays known for the loop to try again. failed keeps its console among the deleted
// nodes' (consoles/pool-*.log).
func (p *Provider) removePoolVM(inst *instance, why string, failed bool) error {
	name := inst.rec.Request.Name
	err := p.destroyPool(inst, failed)
	p.mu.Lock()
	if err == nil {
		for k, v := range p.insts {
			if v == inst {
				delete(p.insts, k)
			}
		}
	}
	close(inst.deleting)
	inst.deleting = nil
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("removing warm-pool VM %s: %w", name, err)
	}
	p.log.Info("warm pool VM destroyed", "vm", name, "why", why)
	p.kickPool()
	return nil
}

// destroyPool stops a pool VM (no graceful power-off: its guest holds nothing) and
// removes its taps, record and directory. keepConsole keeps its console log as Delete
// keeps a node's.
func (p *Provider) destroyPool(inst *instance, keepConsole bool) error {
	if err := p.stopPoolVM(inst); err != nil {
		return err
	}
	p.unjail(inst)
	p.mu.Lock()
	dir, rec := inst.dir, inst.rec
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tap := range []string{rec.Tap, rec.PoolTap} {
		if tap != "" {
			if err := p.deps.Networks.RemoveTap(ctx, tap); err != nil {
				return err
			}
		}
	}
	if keepConsole {
		p.keepConsole(inst)
	}
	if err := os.Remove(filepath.Join(dir, fileRecord)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.RemoveAll(dir)
}

// stopPoolVM ends a pool VM's qemu (SIGTERM, then SIGKILL, only to the recorded process)
// and then its virtiofsd.
func (p *Provider) stopPoolVM(inst *instance) error {
	if p.aliveLocked(inst) {
		p.signal(inst, syscall.SIGTERM)
		if !p.waitGone(inst, 5*time.Second) {
			p.signal(inst, syscall.SIGKILL)
			if !p.waitGone(inst, 5*time.Second) {
				return fmt.Errorf("qemu of warm-pool VM %s survived SIGKILL", inst.rec.Request.Name)
			}
		}
	}
	return p.stopVirtiofsd(inst)
}

// poolTapOwner is the owner part of this provider's pool tap names: the state directory
// tells them from another daemon's on the same host.
func (p *Provider) poolTapOwner() string { return nodenet.PoolTapOwner(p.cfg.StateDir) }

// removePoolTaps removes this provider's pool taps on the host (Recover: none of its pool
// VMs runs then); other daemons' are theirs.
func (p *Provider) removePoolTaps(ctx context.Context) ([]string, error) {
	if p.deps.Networks == nil {
		return nil, nil
	}
	taps, err := p.deps.Networks.PoolTaps(ctx, p.poolTapOwner())
	if err != nil {
		return nil, fmt.Errorf("listing leftover warm-pool taps: %w", err)
	}
	var removed []string
	var errs []error
	for _, t := range taps {
		if err := p.deps.Networks.RemoveTap(ctx, t); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, t)
	}
	if len(removed) > 0 {
		p.log.Info("removed warm-pool taps no VM uses", "taps", removed)
	}
	return removed, errors.Join(errs...)
}

// renameNoReplace renames a directory, failing if the new name exists (rename(2) would
// replace an empty directory).
func renameNoReplace(from, to string) error {
	err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) {
		// A filesystem without RENAME_NOREPLACE: check, then rename (one provider per
		// state dir, so nothing else makes the name in between).
		if _, serr := os.Lstat(to); serr == nil {
			return os.ErrExist
		}
		return os.Rename(from, to)
	}
	return err
}

// rewriteInPlace writes b over a file of exactly len(b) bytes, without truncating or
// replacing it: qemu has it open as a disk, and a new file would not reach the guest.
func rewriteInPlace(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() != int64(len(b)) {
		return fmt.Errorf("%s is %d bytes, want %d: not a warm-pool VM's identity disk", path, st.Size(), len(b))
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", path, err)
	}
	return f.Close()
}

// consoleHas reports whether a console log (its first 16 MiB) contains marker.
func consoleHas(path, marker string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, 16<<20))
	return bytes.Contains(b, []byte(marker))
}

// PoolCollector is the warm pool's metrics: socialweb_warm_pool_vms{state},
// socialweb_warm_pool_memory_bytes and socialweb_warm_pool_claims_total{result}.
func (p *Provider) PoolCollector() prometheus.Collector {
	return &poolCollector{p: p,
		vms: prometheus.NewDesc("socialweb_warm_pool_vms", "Unclaimed warm-pool VMs by state: booting, or ready (the guest waits for its identity).",
			[]string{"state"}, nil),
		memory: prometheus.NewDesc("socialweb_warm_pool_memory_bytes",
			"Host memory the unclaimed warm-pool VMs hold as the capacity check counts it: guest memory and the VMM's (and virtiofsd's) overhead.", nil, nil),
	}
}

type poolCollector struct {
	p           *Provider
	vms, memory *prometheus.Desc
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.vms
	ch <- c.memory
	c.p.pool.claims.Describe(ch)
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.p
	var booting, ready, mib int64
	p.mu.Lock()
	for _, in := range p.insts {
		if !in.unclaimedLocked() {
			continue
		}
		if in.poolReady {
			ready++
		} else {
			booting++
		}
		mib += in.rec.Request.MemoryMiB + vmmOverheadMiB(in.rec.Accel, in.rec.TCGCacheMiB)
		if in.rec.LayersDir != "" {
			mib += virtiofsdOverheadMiB
		}
	}
	p.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.vms, prometheus.GaugeValue, float64(booting), "booting")
	ch <- prometheus.MustNewConstMetric(c.vms, prometheus.GaugeValue, float64(ready), "ready")
	ch <- prometheus.MustNewConstMetric(c.memory, prometheus.GaugeValue, float64(mib<<20))
	p.pool.claims.Collect(ch)
}
