package qemu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
)

// state is where inst is in its life; call with p.mu held.
func (in *instance) state() nodes.State {
	switch {
	case in.creating:
		return nodes.StatePending
	case in.deleting != nil:
		return nodes.StateStopping
	case in.alive() && !in.shareLost():
		return nodes.StateRunning
	}
	return nodes.StateTerminated
}

// shareLost reports whether the VM was served a layer share by a virtiofsd that is gone.
// Its guest's reads of image layers then block for good (qemu 7.2's vhost-user-fs does
// not reconnect), so a running qemu without it is a failed node. Call with p.mu held.
func (in *instance) shareLost() bool {
	return (in.vdone != nil || in.rec.Virtiofsd != nil) && !in.virtiofsdAlive()
}

// List reports every node the provider knows: Pending while Create runs, Running while
// its qemu process (checked by identity) runs, Stopping during Delete, Terminated once
// qemu is gone, or its layer share's virtiofsd is (until Delete removes it).
func (p *Provider) List(ctx context.Context) ([]nodes.Instance, error) {
	if err := p.ready(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]nodes.Instance, 0, len(p.insts))
	for _, in := range p.insts {
		if in.rec.Pool {
			continue // a warm-pool VM, or one still being claimed: no cluster's node (yet)
		}
		out = append(out, p.instanceView(in, in.state()))
	}
	slices.SortFunc(out, func(a, b nodes.Instance) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Delete stops the node's VM (QMP system_powerdown, then after Config.StopGrace SIGTERM,
// then SIGKILL) and removes its tap and directory. It returns an error satisfying
// nodes.IsNotFound for an unknown node. A node still being created cannot be deleted
// until its Create returns. If removing the tap fails the node stays listed
// (Terminated) and Delete can be retried.
func (p *Provider) Delete(ctx context.Context, name string) error {
	if err := p.ready(); err != nil {
		return err
	}
	var inst *instance
	for inst == nil {
		p.mu.Lock()
		in := p.insts[name]
		switch {
		case in == nil, in.rec.Pool && !in.claiming:
			// A warm-pool VM is no cluster's node: the pool destroys it.
			p.mu.Unlock()
			return nodes.NewNotFound(name)
		case in.creating:
			p.mu.Unlock()
			return fmt.Errorf("node %s is still being created: delete it once Create has returned", name)
		case in.deleting != nil:
			// Another Delete runs: wait for it, then look again (gone: not found).
			ch := in.deleting
			p.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return ctx.Err()
			}
		default:
			in.deleting = make(chan struct{})
			inst = in
			p.mu.Unlock()
		}
	}
	t0 := time.Now()
	err := p.destroy(ctx, inst)
	p.mu.Lock()
	if err == nil {
		delete(p.insts, name)
	}
	close(inst.deleting)
	inst.deleting = nil
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("deleting node %s: %w", name, err)
	}
	p.log.Info("node VM deleted", "node", name, "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// destroy stops the VM and removes its tap, record and directory, in that order: a crash
// in between leaves either a record Recover acts on or a directory without one, which
// Recover removes.
func (p *Provider) destroy(ctx context.Context, inst *instance) error {
	if err := p.stop(ctx, inst); err != nil {
		return err
	}
	p.unjail(inst)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, tap := range []string{inst.rec.Tap, inst.rec.PoolTap} {
		if tap != "" {
			if err := p.deps.Networks.RemoveTap(rctx, tap); err != nil {
				return err
			}
		}
	}
	p.keepConsole(inst)
	if err := os.Remove(filepath.Join(inst.dir, fileRecord)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.RemoveAll(inst.dir)
}

// keepConsole moves a deleted node's console log to <StateDir>/consoles/<node>.log, so
// an operator can read why a node failed after it is gone, and prunes the oldest beyond
// ConsolesKept. Best effort: a lost console log is no reason to keep a node.
func (p *Provider) keepConsole(inst *instance) {
	if p.cfg.ConsolesKept < 0 {
		return
	}
	dir := filepath.Join(p.cfg.StateDir, dirConsoles)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		p.log.Warn("keeping the console log", "node", inst.rec.Request.Name, "err", err)
		return
	}
	dst := filepath.Join(dir, inst.rec.Request.Name+".log")
	if err := os.Rename(filepath.Join(inst.dir, fileConsole), dst); err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			p.log.Warn("keeping the console log", "node", inst.rec.Request.Name, "err", err)
		}
		return
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) <= p.cfg.ConsolesKept {
		return
	}
	type kept struct {
		name string
		mod  time.Time
	}
	var logs []kept
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() {
			logs = append(logs, kept{e.Name(), info.ModTime()})
		}
	}
	slices.SortFunc(logs, func(a, b kept) int { return a.mod.Compare(b.mod) })
	for _, l := range logs[:max(0, len(logs)-p.cfg.ConsolesKept)] {
		_ = os.Remove(filepath.Join(dir, l.name))
	}
}

// stop stops the VM's qemu (stopQemu), then its virtiofsd, if it has one.
func (p *Provider) stop(ctx context.Context, inst *instance) error {
	if err := p.stopQemu(ctx, inst); err != nil {
		return err
	}
	return p.stopVirtiofsd(inst)
}

// stopQemu asks the guest to power off, waits up to StopGrace (less if ctx ends sooner),
// then terminates and finally kills qemu. Signals go only to the recorded process: to our
// child through its os.Process, to an adopted one after checking its identity.
func (p *Provider) stopQemu(ctx context.Context, inst *instance) error {
	if !p.aliveLocked(inst) {
		return nil
	}
	grace := p.cfg.StopGrace
	if dl, ok := ctx.Deadline(); ok {
		grace = min(grace, time.Until(dl)/2)
	}
	qctx, cancel := context.WithTimeout(ctx, min(2*time.Second, max(grace, 100*time.Millisecond)))
	err := qmpPowerdown(qctx, inst.dir)
	cancel()
	if err == nil && ctx.Err() == nil && p.waitGone(inst, grace) {
		return nil
	}
	if err != nil {
		p.log.Debug("system_powerdown failed; terminating qemu", "node", inst.rec.Request.Name, "err", err)
	}
	p.signal(inst, syscall.SIGTERM)
	if p.waitGone(inst, 5*time.Second) {
		return nil
	}
	p.signal(inst, syscall.SIGKILL)
	if p.waitGone(inst, 5*time.Second) {
		return nil
	}
	pid := 0
	if inst.rec.Process != nil {
		pid = inst.rec.Process.PID
	}
	return fmt.Errorf("qemu (pid %d) survived SIGKILL", pid)
}

// shareLostLocked is shareLost under p.mu.
func (p *Provider) shareLostLocked(inst *instance) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return inst.shareLost()
}

func (p *Provider) aliveLocked(inst *instance) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return inst.alive()
}

func (p *Provider) signal(inst *instance, sig syscall.Signal) {
	if inst.proc != nil {
		_ = inst.proc.Signal(sig)
		return
	}
	if id := inst.rec.Process; id != nil && id.Alive() {
		_ = syscall.Kill(id.PID, sig)
	}
}

func (p *Provider) waitGone(inst *instance, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if !p.aliveLocked(inst) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		if inst.done != nil {
			select {
			case <-inst.done:
			case <-time.After(time.Until(deadline)):
			}
			continue
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Exited reports whether the node's qemu is gone, or its layer share's virtiofsd is
// (shareLost), and if so why, with the last lines qemu (or virtiofsd) and the guest
// console printed: the daemon's watchdog reports a VM that died while booting with it.
// An unknown node, or one still being created, has not exited.
func (p *Provider) Exited(name string) (bool, string) {
	p.mu.Lock()
	inst := p.insts[name]
	if inst == nil || inst.creating || (inst.alive() && !inst.shareLost()) {
		p.mu.Unlock()
		return false, ""
	}
	adopted, done, rec, alive := inst.adopted, inst.done, inst.rec, inst.alive()
	vpid := 0
	if inst.vproc != nil {
		vpid = inst.vproc.Pid
	} else if rec.Virtiofsd != nil {
		vpid = rec.Virtiofsd.PID
	}
	p.mu.Unlock()
	var b strings.Builder
	log := fileQemuLog
	switch {
	case alive:
		pid := ""
		if vpid != 0 {
			pid = fmt.Sprintf(" (pid %d)", vpid)
		}
		fmt.Fprintf(&b, "the virtiofsd serving its shared image layers%s exited while qemu ran: the guest's reads of image files would hang, so the VM counts as failed", pid)
		log = fileVirtiofsLog
	case done != nil:
		fmt.Fprintf(&b, "qemu (pid %d) exited %s after it started: %s",
			inst.proc.Pid, inst.exitedAt.Sub(inst.started).Round(time.Millisecond), exitText(inst.exitErr))
	case adopted:
		fmt.Fprintf(&b, "qemu (pid %d, adopted after a daemon restart) is no longer running; its exit status is unknown", rec.Process.PID)
	default:
		b.WriteString("qemu is not running (it never started, or the daemon restarted before recording it)")
	}
	if t := tailLines(filepath.Join(inst.dir, log), 10); t != "" {
		fmt.Fprintf(&b, "\n%s said:\n%s", strings.TrimSuffix(log, ".log"), t)
	}
	if t := tailLines(filepath.Join(inst.dir, fileConsole), 20); t != "" {
		fmt.Fprintf(&b, "\nlast console lines:\n%s", t)
	} else {
		b.WriteString("\nthe console is empty (the kernel printed nothing)")
	}
	return true, b.String()
}

// Diagnose implements nodes.Diagnoser: Exited's explanation for a VM that is gone, the
// last console lines for one that runs.
func (p *Provider) Diagnose(name string) string {
	if gone, why := p.Exited(name); gone {
		return why
	}
	t, err := p.ConsoleTail(name, 20)
	if err != nil || t == "" {
		return "the console is empty (the kernel printed nothing)"
	}
	return "the VM runs; last console lines:\n" + t
}

// ConsoleTail returns the last n lines of the node's serial console.
func (p *Provider) ConsoleTail(name string, n int) (string, error) {
	p.mu.Lock()
	inst := p.insts[name]
	p.mu.Unlock()
	if inst == nil {
		return "", nodes.NewNotFound(name)
	}
	return tailLines(filepath.Join(inst.dir, fileConsole), n), nil
}

// Address is the node's address on its cluster network (the CCM reports it).
func (p *Provider) Address(name string) (net.IP, bool) {
	info, err := p.Info(name)
	if err != nil {
		return nil, false
	}
	return addressOf(info.Address), addressOf(info.Address) != nil
}

// Info is what the provider knows of one node beyond nodes.Instance.
type Info struct {
	nodes.Instance
	Dir     string
	Address string // with prefix
	Tap     string
	MAC     string
	PID     int // 0 before qemu started
	Accel   Accel
	Adopted bool // found running by Recover
	// JoinDeadline is Created (a claimed pool VM's claim) + Config.JoinTimeout: the
	// daemon's watchdog gives up then.
	JoinDeadline time.Time
	Console      string // path of console.log
}

// Info describes one node.
func (p *Provider) Info(name string) (Info, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	inst := p.insts[name]
	if inst == nil {
		return Info{}, nodes.NewNotFound(name)
	}
	r := inst.rec
	i := Info{Instance: p.instanceView(inst, inst.state()), Dir: inst.dir, Address: r.Address, Tap: r.Tap,
		MAC: r.MAC, Accel: r.Accel, Adopted: inst.adopted, JoinDeadline: r.since().Add(p.cfg.JoinTimeout),
		Console: filepath.Join(inst.dir, fileConsole)}
	if r.Process != nil {
		i.PID = r.Process.PID
	}
	return i, nil
}

// RecoverResult says what Recover found.
type RecoverResult struct {
	Adopted []string // nodes whose recorded qemu process still runs: now managed again
	Cleaned []string // nodes whose qemu was gone: tap and directory removed
	Removed []string // node directories without a usable record: removed
	Killed  []int    // pids of qemu processes using the state dir that no record named
	// Pool are the warm-pool VMs destroyed (unclaimed, or claimed halfway), by the names
	// their records give, and PoolTaps the pool taps left by no VM.
	Pool     []string
	PoolTaps []string
}

// Recover must run once, at daemon start, before Create, Delete and List. For each
// node directory under the state dir:
//
//   - if the qemu process its record names (pid, start time and cmdline all equal) still
//     runs, the node is adopted: it is listed, Delete stops it, Exited watches it;
//   - otherwise its tap and directory are removed (Cleaned);
//   - a directory without a readable record (a Create or Delete interrupted by a crash)
//     is removed (Removed);
//   - a warm-pool VM (record Pool, also one whose claim renamed its directory but did not
//     finish) is destroyed, running or not (Pool), and so is every pool tap left (PoolTaps):
//     pool VMs are quick to boot again, and the pool refills once Recover is done, so a
//     restart never doubles the pool.
//
// Any other qemu process whose console file lies in the state dir (started by a Create that
// crashed before recording it) is killed, so no qemu and no tap outlives its record; so is
// any virtiofsd serving a node of the state dir that no adopted record names.
//
// Why adopt rather than kill: nodes are cattle, but a daemon restart (an upgrade, a
// crash) is not a reason to kill the jobs running on a tenant's nodes, and the VM the
// record names is provably the one this provider started — the identity check excludes
// a recycled pid, and the record says which tap, address and disks it holds. The cost is
// that an adopted VM's exit status is unknown (it is not our child), which Exited says.
// The alternative, reaping (as internal/supervisor does for control-plane processes,
// whose state lives elsewhere), would turn every daemon restart into an outage of every
// tenant's workloads.
func (p *Provider) Recover(ctx context.Context) (RecoverResult, error) {
	var res RecoverResult
	p.mu.Lock()
	switch {
	case p.closed:
		p.mu.Unlock()
		return res, errors.New("qemu provider is closed")
	case p.recovered:
		p.mu.Unlock()
		return res, errors.New("qemu provider: Recover already ran")
	}
	p.mu.Unlock()

	entries, err := os.ReadDir(p.cfg.StateDir)
	if err != nil {
		return res, fmt.Errorf("reading qemu state dir: %w", err)
	}
	var (
		errs    []error
		adopt   = map[string]*instance{}
		dead    []*instance
		pool    []*instance
		keepIDs []supervisor.Identity
	)
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || !nodeNameRE.MatchString(name) || name == dirConsoles {
			continue // .lock, and nothing this provider made
		}
		dir := p.nodeDir(name)
		rec, err := readRecord(dir)
		if err != nil {
			if r, rerr := readRecordAnyName(dir); rerr == nil && r.Pool {
				rec, err = r, nil // a claim renamed the directory, then the daemon stopped
			}
		}
		if err == nil && rec.Pool {
			inst := &instance{dir: dir, rec: rec}
			// Its qemu and virtiofsd first, by their recorded identities, so the orphan
			// sweep below does not take them for unrecorded ones.
			if err := p.stopPoolVM(inst); err != nil {
				errs = append(errs, fmt.Errorf("stopping warm-pool VM %s: %w", rec.Request.Name, err))
			}
			pool = append(pool, inst)
			continue
		}
		if err != nil {
			p.log.Warn("removing a node directory without a usable record", "dir", dir, "err", err)
			if err := os.RemoveAll(dir); err != nil {
				errs = append(errs, err)
				continue
			}
			res.Removed = append(res.Removed, name)
			continue
		}
		inst := &instance{dir: dir, rec: rec}
		if rec.Process != nil && rec.Process.Alive() {
			inst.adopted = true
			adopt[name] = inst
			keepIDs = append(keepIDs, *rec.Process)
			if rec.Virtiofsd != nil {
				// It serves the adopted VM's layer share: the VM keeps it.
				keepIDs = append(keepIDs, *rec.Virtiofsd)
			}
			continue
		}
		if rec.Process != nil {
			cur, err := supervisor.Observe(rec.Process.PID)
			p.log.Info("the qemu process a node record names is gone", "node", name, "pid", rec.Process.PID, "running", strings.Join(cur.Cmdline, " "), "err", err)
		}
		dead = append(dead, inst)
	}

	// Orphans first: a qemu must be gone before its tap and disks are removed.
	killed, err := p.killOrphans(keepIDs)
	res.Killed = killed
	if err != nil {
		errs = append(errs, err)
	}

	for _, inst := range dead {
		name := inst.rec.Request.Name
		if err := p.destroy(ctx, inst); err != nil {
			// Keep it listed (Terminated) so Delete can retry.
			errs = append(errs, fmt.Errorf("cleaning up node %s: %w", name, err))
			adopt[name] = inst
			continue
		}
		p.log.Info("cleaned up a node whose VM was gone", "node", name, "tap", inst.rec.Tap)
		res.Cleaned = append(res.Cleaned, name)
	}
	for _, inst := range pool {
		name := inst.rec.Request.Name
		if err := p.destroyPool(inst, false); err != nil {
			errs = append(errs, fmt.Errorf("removing warm-pool VM %s: %w", name, err))
			continue
		}
		p.log.Info("destroyed a warm-pool VM of an earlier run", "vm", name, "dir", inst.dir)
		res.Pool = append(res.Pool, name)
	}
	taps, err := p.removePoolTaps(ctx)
	res.PoolTaps = taps
	if err != nil {
		errs = append(errs, err)
	}
	for name, inst := range adopt {
		if inst.adopted {
			p.log.Info("adopted a running node VM", "node", name, "pid", inst.rec.Process.PID, "address", inst.rec.Address)
			res.Adopted = append(res.Adopted, name)
		}
	}
	slices.Sort(res.Adopted)
	slices.Sort(res.Cleaned)
	slices.Sort(res.Removed)
	slices.Sort(res.Pool)

	p.mu.Lock()
	for name, inst := range adopt {
		p.insts[name] = inst
	}
	p.recovered = true
	p.mu.Unlock()
	p.startPool()
	return res, errors.Join(errs...)
}

// killOrphans kills every qemu process whose serial console file lies in the state dir
// and that is none of keep.
func (p *Provider) killOrphans(keep []supervisor.Identity) ([]int, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	var killed []int
	var errs []error
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		id, err := supervisor.Observe(pid)
		if err != nil || !usesStateDir(id.Cmdline, p.cfg.StateDir) && !ownedVirtiofsd(pid, p.cfg.StateDir) {
			continue
		}
		if slices.ContainsFunc(keep, id.Same) {
			continue
		}
		p.log.Warn("killing a qemu or virtiofsd process no node record names", "pid", pid, "cmdline", strings.Join(id.Cmdline, " "))
		inst := &instance{rec: record{Process: &id}}
		p.signal(inst, syscall.SIGTERM)
		if !p.waitGone(inst, 3*time.Second) {
			p.signal(inst, syscall.SIGKILL)
			if !p.waitGone(inst, 5*time.Second) {
				errs = append(errs, fmt.Errorf("orphan qemu (pid %d) survived SIGKILL", pid))
				continue
			}
		}
		killed = append(killed, pid)
	}
	return killed, errors.Join(errs...)
}

// usesStateDir reports whether a command line has "-serial file:<stateDir>/<node>/console.log",
// i.e. is a qemu this provider (on this state dir) started.
func usesStateDir(cmdline []string, stateDir string) bool {
	prefix := "file:" + stateDir + "/"
	for i := 0; i+1 < len(cmdline); i++ {
		if cmdline[i] != "-serial" {
			continue
		}
		rest, ok := strings.CutPrefix(cmdline[i+1], prefix)
		if !ok {
			continue
		}
		node, file, ok := strings.Cut(rest, "/")
		if ok && file == fileConsole && nodeNameRE.MatchString(node) {
			return true
		}
	}
	return false
}

// addressOf parses a record's address; nil if it is not address/prefix.
func addressOf(s string) net.IP {
	ip, _, err := net.ParseCIDR(s)
	if err != nil {
		return nil
	}
	return ip
}
