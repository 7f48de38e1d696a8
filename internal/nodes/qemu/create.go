package qemu

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/socialweb-computer/socialweb/internal/cgroup"
	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/nodeimage"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
)

// instance is one node as this provider sees it. Fields other than rec.Process, proc,
// done, exitErr and exitedAt are guarded by Provider.mu.
type instance struct {
	dir      string
	rec      record
	creating bool          // Create has not returned yet
	deleting chan struct{} // non-nil while a Delete runs; closed when it ends
	adopted  bool          // found running by Recover: not our child

	proc     *os.Process   // our child (nil when adopted)
	done     chan struct{} // closed once our child has been reaped (nil when adopted)
	exitErr  error         // cmd.Wait's result; read only after done is closed
	started  time.Time     // when our child was started
	exitedAt time.Time

	vproc *os.Process   // our virtiofsd child (nil when adopted or without shared layers)
	vdone chan struct{} // closed once it has been reaped

	progressed bool   // its console showed kernel progress (see EarlyBootStall)
	stalled    string // why it is stuck in early boot; "" if it is not (known to be)

	// Warm pool (pool.go); rec.Pool says the VM is one.
	claiming  bool // a Create is handing it to a node
	poolReady bool // its guest waits for its identity (console: poolReadyMarker)
	poolNiced bool // its threads are at PoolNice since it was ready (see priority.go)
}

// alive reports whether the VM's qemu runs (or, during Create, may still come to run).
func (in *instance) alive() bool {
	if in.done != nil {
		select {
		case <-in.done:
			return false
		default:
			return true
		}
	}
	if in.rec.Process != nil {
		return in.rec.Process.Alive()
	}
	return false
}

func (p *Provider) nodeDir(name string) string { return filepath.Join(p.cfg.StateDir, name) }

// ready fails until Recover has run, and after Close.
func (p *Provider) ready() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return errors.New("qemu provider is closed")
	case !p.recovered:
		return errors.New("qemu provider: Recover has not run: call Recover(ctx) once at start, before Create, Delete or List")
	}
	return nil
}

// Create boots a node: it allocates the lowest free address of the cluster's node
// subnet, clones the image's root disk, writes the identity disk, adds the tap and starts
// qemu, returning once qemu reports the guest running (not booted, not joined). On error
// everything it made is undone; if undoing fails, the node stays in List (Terminated) so
// Delete can finish the job. With a warm pool, a node of the pool's size takes a pool VM
// instead (claim, pool.go), and a node the host has no room for destroys one first.
func (p *Provider) Create(ctx context.Context, req nodes.NodeRequest) (nodes.Instance, error) {
	t0 := time.Now()
	if err := p.ready(); err != nil {
		return nodes.Instance{}, err
	}
	if err := ctx.Err(); err != nil {
		return nodes.Instance{}, err
	}
	if err := p.Validate(req); err != nil {
		return nodes.Instance{}, err
	}
	plan, err := p.deps.Plan(req.Cluster)
	if err != nil {
		return nodes.Instance{}, fmt.Errorf("node %s: network plan of cluster %s: %w", req.Name, req.Cluster, err)
	}
	if plan.NodeCIDR == nil || plan.Gateway == nil {
		return nodes.Instance{}, fmt.Errorf("node %s: network plan of cluster %s is incomplete: build it with nodenet.ForIndex", req.Name, req.Cluster)
	}
	inst, warm := p.claim(ctx, req, plan, t0)
	if warm.Claimed {
		req.TellAdmitted(true)
		return inst, nil
	}
	cold, addr, err := p.reserve(req, plan)
	if nodes.IsCapacity(err) && p.evictPoolVM(req.Name) {
		// The warm pool never keeps a node out: one of its VMs made room.
		cold, addr, err = p.reserve(req, plan)
	}
	if err != nil {
		return nodes.Instance{}, err
	}
	req.TellAdmitted(false) // before the clone, the data disk and qemu: seconds under load
	log := p.log.With("cluster", req.Cluster, "node", req.Name)

	var tapAdded bool
	ok := false
	defer func() {
		if !ok {
			p.undoCreate(cold, tapAdded)
		}
	}()

	if err := writeRecord(cold.dir, cold.rec); err != nil {
		return nodes.Instance{}, err
	}
	id, err := p.identity(ctx, req, plan, addr, cold.rec.MAC)
	if err != nil {
		return nodes.Instance{}, err
	}
	var disk bytes.Buffer
	if err := identity.Encode(&disk, id); err != nil {
		return nodes.Instance{}, fmt.Errorf("node %s: identity disk: %w", req.Name, err)
	}
	addTap := func(ctx context.Context) (nodenet.Tap, error) {
		return p.deps.Networks.AddTap(ctx, req.Cluster, plan, req.Name)
	}
	b, err := p.boot(ctx, cold, disk.Bytes(), addTap, &tapAdded)
	if err != nil {
		return nodes.Instance{}, err
	}
	ok = true
	p.mu.Lock()
	cold.creating = false
	p.mu.Unlock()
	log.Info("node VM started", "address", cold.rec.Address, "tap", cold.rec.Tap, "pid", cold.rec.Process.PID,
		"accel", cold.rec.Accel, "rootfs", string(b.method), "clone", b.clone.Round(time.Millisecond),
		"qemuUp", b.qemuUp.Round(time.Millisecond), "took", time.Since(t0).Round(time.Millisecond))
	view := p.instanceView(cold, nodes.StateRunning)
	view.Warm = warm // a failed claim says why it booted cold
	return view, nil
}

// booted is how a VM's boot went, for its log line.
type booted struct {
	method        cloneMethod
	clone, qemuUp time.Duration
}

// boot makes what inst's VM boots from in its directory (the identity disk idDisk, the
// root disk's clone, the data disk), adds its tap with addTap and starts qemu, returning
// once qemu runs the guest. It serves both a node's Create and a warm-pool VM's boot, so
// the two boot alike. *tapAdded is set once the tap may exist, for the caller's undo.
func (p *Provider) boot(ctx context.Context, inst *instance, idDisk []byte, addTap func(context.Context) (nodenet.Tap, error), tapAdded *bool) (booted, error) {
	var b booted
	name := inst.rec.Request.Name
	if err := os.WriteFile(filepath.Join(inst.dir, fileIdentity), idDisk, 0o600); err != nil {
		return b, fmt.Errorf("node %s: writing identity disk: %w", name, err)
	}
	tc := time.Now()
	method, err := cloneFile(filepath.Join(p.imageDir, nodeimage.FileRootfs), filepath.Join(inst.dir, fileRootfs))
	if err != nil {
		return b, fmt.Errorf("node %s: cloning the root disk into %s: %w", name, inst.dir, err)
	}
	b.method, b.clone = method, time.Since(tc)
	if d := inst.rec.Request.DiskMiB; d > 0 {
		if err := makeDataDisk(ctx, filepath.Join(inst.dir, fileData), d); err != nil {
			return b, fmt.Errorf("node %s: making its %d MiB data disk: %w", name, d, err)
		}
	}

	*tapAdded = true // a failed AddTap may have made the tap; RemoveTap of a missing one is fine
	tap, err := addTap(ctx)
	if err != nil {
		return b, fmt.Errorf("node %s: adding its tap: %w", name, err)
	}
	if tap.Name != inst.rec.Tap || (tap.MAC != nil && !strings.EqualFold(tap.MAC.String(), inst.rec.MAC)) {
		// The record (and the identity disk) were written with nodenet's naming before
		// the tap existed; a tap made differently would make them lie.
		_ = p.deps.Networks.RemoveTap(context.WithoutCancel(ctx), tap.Name)
		return b, fmt.Errorf("node %s: the network made tap %s (MAC %s), want %s (MAC %s) as nodenet's names say",
			name, tap.Name, tap.MAC, inst.rec.Tap, inst.rec.MAC)
	}

	l := p.launchFor(inst)
	ts := time.Now()
	if err := p.start(inst, l); err != nil {
		return b, fmt.Errorf("node %s: starting qemu: %w", name, err)
	}
	if err := p.waitRunning(ctx, inst); err != nil {
		return b, fmt.Errorf("node %s: %w", name, err)
	}
	b.qemuUp = time.Since(ts)
	return b, nil
}

func (p *Provider) instanceView(inst *instance, st nodes.State) nodes.Instance {
	return nodes.Instance{
		Cluster:    inst.rec.Request.Cluster,
		Name:       inst.rec.Request.Name,
		ProviderID: nodes.ProviderID(inst.rec.Request.Cluster, inst.rec.Request.Name),
		Created:    inst.rec.since(),
		State:      st,
		CPUs:       inst.rec.Request.CPUs,
		MemoryMiB:  inst.rec.Request.MemoryMiB,
		DiskMiB:    inst.rec.Request.DiskMiB,
	}
}

// reserve claims the name (in memory and as a directory) and the lowest free address
// of the cluster's node subnet, over every node this provider has.
func (p *Provider) reserve(req nodes.NodeRequest, plan nodenet.Plan) (*instance, net.IP, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.admitLocked(req); err != nil {
		return nil, nil, err
	}
	addr, err := p.nextAddressLocked(plan)
	if err != nil {
		return nil, nil, fmt.Errorf("node %s: %w", req.Name, err)
	}
	rec, err := p.newRecord(req)
	if err != nil {
		return nil, nil, err
	}
	dir, err := p.makeDir(req.Name)
	if err != nil {
		return nil, nil, err
	}
	ones, _ := plan.NodeCIDR.Mask.Size()
	rec.Address = fmt.Sprintf("%s/%d", addr, ones)
	rec.Tap = nodenet.TapName(plan.Index, req.Cluster, req.Name)
	rec.Bridge = nodenet.BridgeName(plan.Index)
	rec.MAC = nodenet.NodeMAC(req.Cluster, req.Name).String()
	inst := &instance{dir: dir, creating: true, rec: rec}
	p.insts[req.Name] = inst
	return inst, addr, nil
}

// admitLocked refuses a name in use and a VM the host has no room for. Called with p.mu
// held, so that parallel boots see each other's claims.
func (p *Provider) admitLocked(req nodes.NodeRequest) error {
	if _, ok := p.insts[req.Name]; ok {
		return fmt.Errorf("node %s already exists: node names are never reused (make a new one with nodes.NewNodeName)", req.Name)
	}
	return p.checkCapacity(req)
}

// nextAddressLocked is the lowest free address of the plan's node subnet over every VM
// this provider has. Called with p.mu held.
func (p *Provider) nextAddressLocked(plan nodenet.Plan) (net.IP, error) {
	var inUse []net.IP
	for _, in := range p.insts {
		if ip := addressOf(in.rec.Address); ip != nil {
			inUse = append(inUse, ip)
		}
	}
	return nodenet.NodeIPAM{Plan: plan}.Next(inUse)
}

// makeDir makes the VM's directory; one that exists is refused, never reused.
func (p *Provider) makeDir(name string) (string, error) {
	dir := p.nodeDir(name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("node %s: its directory %s already exists although no such node is known: node names are never reused; if it is a leftover, Recover removes it at start", name, dir)
		}
		return "", fmt.Errorf("node %s: %w", name, err)
	}
	return dir, nil
}

// identity asks the Joiner for the node's identity and fills in, or checks, what the
// provider knows.
func (p *Provider) identity(ctx context.Context, req nodes.NodeRequest, plan nodenet.Plan, addr net.IP, mac string) (identity.Identity, error) {
	id, err := p.deps.Joiner.Identity(ctx, req, addr, mac)
	if err != nil {
		return id, fmt.Errorf("node %s: making its identity: %w", req.Name, err)
	}
	ones, _ := plan.NodeCIDR.Mask.Size()
	var errs []error
	must := func(field *string, want, name string) {
		switch {
		case *field == "":
			*field = want
		case *field != want:
			errs = append(errs, fmt.Errorf("%s is %q, want %q", name, *field, want))
		}
	}
	if id.MAC != "" {
		if hw, err := net.ParseMAC(id.MAC); err == nil {
			id.MAC = hw.String()
		}
	}
	must(&id.Cluster, req.Cluster, "cluster")
	must(&id.NodeName, req.Name, "nodeName")
	must(&id.ProviderID, nodes.ProviderID(req.Cluster, req.Name), "providerID")
	must(&id.Address, fmt.Sprintf("%s/%d", addr, ones), "address")
	must(&id.MAC, mac, "mac")
	if id.Gateway == "" {
		id.Gateway = plan.Gateway.String()
	}
	if id.DNS == "" {
		id.DNS = plan.Gateway.String()
	}
	if id.ClusterDNS == "" && plan.DNSService != nil {
		id.ClusterDNS = plan.DNSService.String()
	}
	if id.MaxPods == 0 {
		id.MaxPods = req.MaxPods
	}
	if id.Labels == nil {
		id.Labels = req.Labels
	}
	if err := errors.Join(errs...); err != nil {
		return id, fmt.Errorf("node %s: the joiner's identity disagrees with the provider: %w", req.Name, err)
	}
	if err := id.Validate(); err != nil {
		return id, fmt.Errorf("node %s: %w", req.Name, err)
	}
	return id, nil
}

func (p *Provider) launchFor(inst *instance) launch {
	r := inst.rec
	dataDisk := ""
	if r.Request.DiskMiB > 0 {
		dataDisk = filepath.Join(inst.dir, fileData)
	}
	return launch{
		Name:         r.Request.Name,
		Accel:        r.Accel,
		TCGCacheMiB:  r.TCGCacheMiB,
		CPUs:         r.Request.CPUs,
		MemoryMiB:    r.Request.MemoryMiB,
		Kernel:       filepath.Join(p.imageDir, nodeimage.FileKernel),
		Initrd:       filepath.Join(p.imageDir, nodeimage.FileInitramfs),
		Cmdline:      kernelCmdline(p.image, r.Accel, p.host.TSCkHz, r.TCGFixedMaps),
		Rootfs:       filepath.Join(inst.dir, fileRootfs),
		IdentityDisk: filepath.Join(inst.dir, fileIdentity),
		DataDisk:     dataDisk,
		Tap:          r.Tap,
		MAC:          r.MAC,
		Console:      filepath.Join(inst.dir, fileConsole),
		QMP:          sockName, // relative to qemu's working directory, the node dir
		LayersSocket: layersSocket(r),
		UID:          r.UID,
	}
}

// layersSocket is the virtiofsd socket a VM's qemu connects to, relative to the node dir;
// "" when the VM has no shared layers.
func layersSocket(r record) string {
	if r.LayersDir == "" {
		return ""
	}
	return sockVirtiofs
}

// newRecord is the record of a VM about to boot for req: what p boots new VMs with (the
// image, accelerator, TCG settings and layer share; claimableLocked compares a pool VM's
// with these) and its user, without its network. Called with p.mu held, so that two
// boots never take one user.
func (p *Provider) newRecord(req nodes.NodeRequest) (record, error) {
	uid, err := p.nextUIDLocked()
	if err != nil {
		return record{}, fmt.Errorf("node %s: %w", req.Name, err)
	}
	return record{
		UID:          uid,
		Version:      recordVersion,
		Request:      req,
		ImageDir:     p.imageDir,
		Accel:        p.accel,
		TCGCacheMiB:  p.cfg.TCGCacheMiB,
		TCGFixedMaps: p.tcgFixedMaps(),
		LayersDir:    p.layersDir(),
		Created:      p.now(),
	}, nil
}

// nextUIDLocked is the lowest user from Config.VMUIDBase that no VM of p holds (0 when
// VMs run as root). Called with p.mu held.
func (p *Provider) nextUIDLocked() (int, error) {
	if p.cfg.VMUIDBase == 0 {
		return 0, nil
	}
	inUse := map[int]bool{}
	for _, in := range p.insts {
		inUse[in.rec.UID] = true
	}
	for uid := p.cfg.VMUIDBase; uid < p.cfg.VMUIDBase+VMUIDSlots; uid++ {
		if !inUse[uid] {
			return uid, nil
		}
	}
	return 0, fmt.Errorf("all %d VM users from %d are taken: delete VMs, or move --vm-uid-base", VMUIDSlots, p.cfg.VMUIDBase)
}

// tcgFixedMaps reports whether new VMs boot with norandmaps: under TCG, unless
// Config.TCGGuestASLR keeps randomization.
func (p *Provider) tcgFixedMaps() bool {
	return p.accel == AccelTCG && !p.cfg.TCGGuestASLR
}

func (p *Provider) layersDir() string {
	if p.cfg.Layers == nil {
		return ""
	}
	return p.cfg.Layers.Dir
}

// start launches qemu in its own session (a terminal's signals to the daemon do not
// reach it, and it outlives a daemon restart: see Recover), records its identity, and
// reaps it in the background.
func (p *Provider) start(inst *instance, l launch) error {
	if l.LayersSocket != "" {
		// First: qemu connects to its socket as it starts, and fails without it.
		if err := p.startVirtiofsd(inst); err != nil {
			return fmt.Errorf("starting virtiofsd for the shared layers: %w", err)
		}
	}
	logf, err := os.OpenFile(filepath.Join(inst.dir, fileQemuLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	if err := giveFiles(inst.dir, l.UID); err != nil {
		logf.Close()
		return err
	}
	cmd := exec.Command(p.qemu, l.args()...)
	cmd.Dir = inst.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return err
	}
	done := make(chan struct{})
	p.mu.Lock()
	inst.proc, inst.done, inst.started = cmd.Process, done, time.Now()
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		inst.exitErr, inst.exitedAt = err, time.Now()
		close(done)
		p.mu.Lock()
		name := inst.rec.Request.Name // a warm-pool VM may have become a node since
		p.mu.Unlock()
		p.log.Info("node VM exited", "node", name, "pid", cmd.Process.Pid, "status", exitText(err))
	}()
	id, err := supervisor.ObserveStarted(cmd.Process.Pid)
	if err != nil {
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("qemu exited at once (%s)%s", exitText(inst.exitErr), p.qemuSaid(inst))
	}
	group, dirs, err := p.jail(inst, l, cmd.Process.Pid)
	if err != nil {
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("putting qemu in its cgroup: %w", err)
	}
	return p.update(inst, func(r *record) { r.Process, r.Cgroup, r.CgroupDirs = &id, group, dirs })
}

// vmOverheadMiB is what a qemu takes beyond its guest's memory and TCG cache (its
// own code, I/O buffers, virtio queues); its memory cap leaves that much room.
const vmOverheadMiB = 384

// VMGroup is the cgroup of the VM in directory dir of the daemon with stateDir.
func VMGroup(stateDir, dir string) string {
	sum := sha256.Sum256([]byte(stateDir))
	return "vm-" + hex.EncodeToString(sum[:4]) + "-" + filepath.Base(dir)
}

// jail moves qemu (pid) and the VM's virtiofsd, if it has one, into a group of its own
// and returns the group's name and directories ("" when the provider has no cgroups). virtiofsd serves
// that VM alone and reads what its guest asks for, so it is held by the VM's limits
// too, not the daemon's.
func (p *Provider) jail(inst *instance, l launch, pid int) (string, []string, error) {
	if p.cfg.Cgroups == nil {
		return "", nil, nil
	}
	name := VMGroup(p.cfg.StateDir, inst.dir)
	g, err := p.cfg.Cgroups.Ensure(name, vmLimits(l))
	if err != nil {
		return "", nil, err
	}
	pids := []int{pid}
	p.mu.Lock()
	if inst.vproc != nil {
		pids = append(pids, inst.vproc.Pid)
	}
	p.mu.Unlock()
	for _, pid := range pids {
		if err := g.Add(pid); err != nil {
			g.Remove()
			return "", nil, err
		}
	}
	return name, g.Dirs(), nil
}

// vmLimits caps a VM's qemu and virtiofsd: its guest's memory, its TCG cache and
// vmOverheadMiB; 512 threads (vCPUs, I/O workers, virtiofsd's pool).
func vmLimits(l launch) cgroup.Limits {
	mem := l.MemoryMiB + vmOverheadMiB
	if l.Accel == AccelTCG {
		cache := l.TCGCacheMiB
		if cache == 0 {
			cache = 1024 // qemu's default tb-size
		}
		mem += cache
	}
	// The guest's vCPUs, and half a core for qemu's main loop (device I/O, and under
	// TCG the translation of code), however idle the host.
	return cgroup.Limits{MemoryMax: mem << 20, PIDsMax: 512, CPUWeight: 100, CPUMaxMilli: l.CPUs*1000 + 500}
}

// vmFiles are the files of a VM's directory that belong to its qemu's user: its disks,
// its console and qemu's output. The record, the sockets and virtiofsd's log stay the
// daemon's (root's), and so does the directory (0700): the user can neither list it,
// nor add, rename or replace a file in it, so the daemon's own reads and writes there
// (the record, a warm-pool VM's identity) cannot be turned against it.
func vmFiles() []string {
	return []string{fileRootfs, fileIdentity, fileData, fileConsole, fileQemuLog}
}

// giveFiles makes the VM's files in dir belong to uid (user and group), creating the
// console file for it (qemu would make it as root before dropping); 0 changes nothing.
func giveFiles(dir string, uid int) error {
	if uid == 0 {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(dir, fileConsole), os.O_CREATE|os.O_WRONLY|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("making the console file: %w", err)
	}
	f.Close()
	for _, name := range vmFiles() {
		if err := os.Lchown(filepath.Join(dir, name), uid, uid); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("giving %s to the VM's user %d: %w", name, uid, err)
		}
	}
	return nil
}

// unjail removes a stopped VM's group: the directories its record names (so a
// provider without cgroups of its own, `socialweb down`'s, removes them too), or, for a
// record from before they were kept, the group as Config.Cgroups names it.
func (p *Provider) unjail(inst *instance) {
	if inst.rec.Cgroup == "" {
		return
	}
	if dirs := groupDirs(inst.rec); len(dirs) > 0 {
		for _, d := range dirs {
			if err := cgroup.RemoveDir(d); err != nil {
				p.log.Warn("removing a VM's cgroup", "dir", d, "err", err)
			}
		}
		return
	}
	if p.cfg.Cgroups == nil {
		return
	}
	if err := p.cfg.Cgroups.Lookup(inst.rec.Cgroup).Remove(); err != nil {
		p.log.Warn("removing a VM's cgroup", "group", inst.rec.Cgroup, "err", err)
	}
}

// groupDirs are the recorded directories of r's group that are one: under the cgroup
// mount and named as the group. A record is the daemon's own file, but an rmdir
// elsewhere is never what it means.
func groupDirs(r record) []string {
	var out []string
	for _, d := range r.CgroupDirs {
		if filepath.IsAbs(d) && filepath.Clean(d) == d && strings.HasPrefix(d, "/sys/fs/cgroup/") && filepath.Base(d) == r.Cgroup {
			out = append(out, d)
		}
	}
	return out
}

// update changes inst's record under the lock and writes it.
func (p *Provider) update(inst *instance, f func(*record)) error {
	p.mu.Lock()
	f(&inst.rec)
	r := inst.rec
	p.mu.Unlock()
	return writeRecord(inst.dir, r)
}

// waitRunning waits until qemu's QMP socket reports the VM running.
func (p *Provider) waitRunning(ctx context.Context, inst *instance) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	var last error
	for {
		qctx, qcancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := qmpStatus(qctx, inst.dir)
		qcancel()
		if err == nil && st == "running" {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("status %q", st)
		}
		last = err
		select {
		case <-inst.done:
			return fmt.Errorf("qemu exited while starting (%s)%s", exitText(inst.exitErr), p.qemuSaid(inst))
		case <-ctx.Done():
			return fmt.Errorf("qemu did not report the VM running within %s (%v; last QMP answer: %v)%s",
				p.cfg.StartTimeout, ctx.Err(), last, p.qemuSaid(inst))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// undoCreate removes everything a failed Create made. If the tap cannot be removed the
// node stays known (Terminated, with its record) so that Delete can retry.
func (p *Provider) undoCreate(inst *instance, tapAdded bool) {
	name := inst.rec.Request.Name
	if inst.proc != nil {
		_ = inst.proc.Kill()
		<-inst.done
	}
	if inst.vproc != nil {
		_ = inst.vproc.Kill()
		<-inst.vdone
	}
	// Its group too, once nothing runs in it (a Create cancelled after qemu started,
	// as at a daemon's stop, had left it).
	p.unjail(inst)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if tapAdded {
		if err := p.deps.Networks.RemoveTap(ctx, inst.rec.Tap); err != nil {
			p.log.Error("undoing a failed Create: removing the tap failed; the node stays listed so Delete can retry",
				"node", name, "tap", inst.rec.Tap, "err", err)
			p.mu.Lock()
			inst.creating = false
			p.mu.Unlock()
			return
		}
	}
	if err := os.RemoveAll(inst.dir); err != nil {
		p.log.Error("undoing a failed Create: removing the node dir failed", "node", name, "dir", inst.dir, "err", err)
	}
	p.mu.Lock()
	delete(p.insts, name)
	p.mu.Unlock()
}

// exitText describes cmd.Wait's result.
func exitText(err error) string {
	if err == nil {
		return "exit status 0 (the guest powered off or rebooted, qemu runs with -no-reboot; or qemu was told to quit)"
	}
	return err.Error()
}

// qemuSaid is the tail of qemu.log, formatted for an error message.
func (p *Provider) qemuSaid(inst *instance) string {
	if t := tailLines(filepath.Join(inst.dir, fileQemuLog), 10); t != "" {
		return "; qemu said: " + strings.ReplaceAll(t, "\n", " | ")
	}
	return ""
}
