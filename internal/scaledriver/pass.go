package scaledriver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/nodehealth"
	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/scale"
)

// RunPass observes the cluster, decides, carries the decision out and records it. It
// returns the decision even when carrying it out failed (with the error); the idle
// state advances only on success. Before the caches sync it returns ErrNotSynced and
// decides nothing.
func (d *Driver) RunPass(ctx context.Context) (scale.Decision, error) {
	d.passMu.Lock()
	defer d.passMu.Unlock()

	o, failed, joined, err := d.observe(ctx)
	if err != nil {
		return scale.Decision{}, err
	}
	for _, f := range failed {
		d.fail(ctx, f)
	}
	for _, j := range joined {
		d.joined(ctx, j)
	}
	d.recordStarts(ctx)
	d.reportPodStarts(ctx)
	d.reportNetwork(ctx, o.Nodes)
	d.reportAccelerator(ctx)
	dec, err := scale.Decide(o)
	if err != nil {
		return scale.Decision{}, fmt.Errorf("scaledriver: cluster %s: %w", d.cfg.Cluster, err)
	}
	d.metrics.decided(d.cfg.Cluster, dec)
	d.wereIdle = dec.Idle // observed, not done: kept whether the action succeeds or not
	d.seal(ctx, dec.Seal)

	waits, err := d.perform(ctx, dec, d.now())
	// Waiting is known from passes that tried to boot, and over once nothing is unplaced;
	// a pass between (idle nodes going first) keeps it.
	if dec.Action == scale.Provision || dec.Unplaced == 0 {
		d.waiting = waits
	}
	d.reportPods(ctx, dec)
	d.tellWaiting(ctx, dec, o.BootingSizes)
	d.reportIdle(ctx, dec)
	d.reportSchedule(ctx)
	if err != nil {
		d.metrics.failed(d.cfg.Cluster, dec, dec.Current)
		err = fmt.Errorf("scaledriver: cluster %s: %s: %w", d.cfg.Cluster, dec.Action, err)
		d.event(ctx, dec, corev1.EventTypeWarning, string(dec.Action)+"Failed", dec.Reason+"; failed: "+err.Error())
		return dec, err
	}

	next := maps.Clone(dec.IdleSince)
	for _, name := range dec.Remove {
		delete(next, name)
	}
	d.idleSince = next
	// A node that waits for host capacity was not booted: it is no node yet.
	count := dec.Target - len(waits)
	d.metrics.succeeded(d.cfg.Cluster, dec, count, d.now())

	if dec.Action == scale.None || dec.Action == scale.Hold || count == dec.Current {
		return dec, nil
	}
	reason := dec.Reason
	if len(waits) > 0 {
		reason += fmt.Sprintf("; %s waiting for host capacity", plural(len(waits), "node"))
	}
	d.event(ctx, dec, corev1.EventTypeNormal, string(dec.Action), reason)
	if d.status != nil {
		if err := d.status.RecordDecision(ctx, d.cfg.Cluster, dec, count); err != nil {
			// The nodes did change; only the report failed, so the state stays advanced.
			return dec, fmt.Errorf("scaledriver: cluster %s: record status: %w", d.cfg.Cluster, err)
		}
	}
	return dec, nil
}

// failedMachine is a machine to report and delete: its VM died, or its Node never
// registered within BootTimeout.
type failedMachine struct {
	name, reason, message string
}

// joinedMachine is a machine seen booting in an earlier pass whose Node has registered.
type joinedMachine struct {
	name string
	took time.Duration
}

// observe builds one Observed from the informer caches and the provider, and says which
// machines failed (to report and delete: they are not in Observed) and which joined since
// the last pass. Any gap is an error: an empty list from a cache that has not synced must
// never read as "idle".
func (d *Driver) observe(ctx context.Context) (scale.Observed, []failedMachine, []joinedMachine, error) {
	for _, synced := range d.synced {
		if !synced() {
			return scale.Observed{}, nil, nil, fmt.Errorf("scaledriver: cluster %s: %w", d.cfg.Cluster, ErrNotSynced)
		}
	}
	o := scale.Observed{
		Synced:          true,
		NodeSize:        d.cfg.NodeSize,
		MaxNodeSize:     d.cfg.MaxNodeSize,
		Reserve:         d.cfg.Reserve,
		HostFull:        len(d.waiting) > 0,
		MaxNodes:        d.cfg.MaxNodes,
		Hold:            d.cfg.Hold,
		FreshNodePerJob: d.cfg.FreshNodePerJob,
		IdleNodes:       d.idleNodes(),
		NotReadyGrace:   d.cfg.NotReadyGrace,
		RepairAfter:     d.cfg.BootTimeout,
		IdleSince:       d.idleSince,
		WereIdle:        d.wereIdle,
		Now:             d.now(),
	}
	var err error
	everything := labels.Everything()
	list := func(what string, f func() error) {
		if err == nil {
			if e := f(); e != nil {
				err = fmt.Errorf("scaledriver: cluster %s: list %s: %w", d.cfg.Cluster, what, e)
			}
		}
	}
	list("pods", func() (e error) { o.Pods, e = d.pods.List(everything); return })
	list("nodes", func() (e error) { o.Nodes, e = d.nodeLister.List(everything); return })
	list("jobs", func() (e error) { o.Jobs, e = d.jobs.List(everything); return })
	list("deployments", func() (e error) { o.Deployments, e = d.deployments.List(everything); return })
	list("statefulsets", func() (e error) { o.StatefulSets, e = d.statefulSets.List(everything); return })
	list("daemonsets", func() (e error) { o.DaemonSets, e = d.daemonSets.List(everything); return })
	if err != nil {
		return scale.Observed{}, nil, nil, err
	}

	instances, err := d.provider.List(ctx)
	if err != nil {
		return scale.Observed{}, nil, nil, fmt.Errorf("scaledriver: cluster %s: list machines: %w", d.cfg.Cluster, err)
	}
	registered := make(map[string]bool, len(o.Nodes))
	for _, n := range o.Nodes {
		registered[n.Name] = true
	}
	var (
		failed  []failedMachine
		joined  []joinedMachine
		booting = map[string]time.Time{}
	)
	for _, in := range instances {
		if in.Cluster != d.cfg.Cluster || in.State == nodes.StateStopping {
			continue
		}
		switch {
		case in.State == nodes.StateTerminated:
			// The VM is gone without a Delete (it crashed, or the guest powered off), or
			// the provider found it unable to work on. Its Node (if any) goes when the
			// cloud controller sees the instance gone.
			failed = append(failed, failedMachine{name: in.Name, reason: "VMExited",
				message: fmt.Sprintf("node %s: its VM stopped working %s after it was created", in.Name, fmtAge(o.Now.Sub(in.Created)))})
		case registered[in.Name]:
			if created, ok := d.booting[in.Name]; ok {
				joined = append(joined, joinedMachine{name: in.Name, took: o.Now.Sub(created)})
			}
		case o.Now.Sub(in.Created) < d.cfg.BootTimeout:
			if why := d.earlyBootStall(in.Name); why != "" {
				// Its kernel never started: waiting out BootTimeout would only delay the
				// Pods that wait for it.
				failed = append(failed, failedMachine{name: in.Name, reason: "EarlyBootStall", message: why})
				continue
			}
			o.Booting = append(o.Booting, in.Name)
			booting[in.Name] = in.Created
			if in.CPUs > 0 && in.MemoryMiB > 0 {
				if o.BootingSizes == nil {
					o.BootingSizes = map[string]scale.NodeSize{}
				}
				o.BootingSizes[in.Name] = scale.NodeSize{CPUs: in.CPUs, MemoryMiB: in.MemoryMiB, DiskMiB: in.DiskMiB, MaxPods: d.cfg.NodeSize.MaxPods}
			}
		default:
			// Past the deadline by the cache. The cache may lag a Node that registered just
			// now (and may already have a Pod bound), so the apiserver has the last word.
			n, err := d.tenant.CoreV1().Nodes().Get(ctx, in.Name, metav1.GetOptions{})
			switch {
			case err == nil:
				o.Nodes = append(o.Nodes, n)
				joined = append(joined, joinedMachine{name: in.Name, took: o.Now.Sub(in.Created)})
			case apierrors.IsNotFound(err):
				// A machine that never joined holds host resources and is counted nowhere.
				failed = append(failed, failedMachine{name: in.Name, reason: "JoinTimeout",
					message: fmt.Sprintf("node %s did not register within %s of its creation", in.Name, d.cfg.BootTimeout)})
			default:
				return scale.Observed{}, nil, nil, fmt.Errorf("scaledriver: cluster %s: checking whether node %s registered: %w", d.cfg.Cluster, in.Name, err)
			}
		}
	}
	d.booting = booting
	if len(failed) > 0 {
		// A failed machine's Node (if it registered) is no capacity, whatever it last said.
		dead := map[string]bool{}
		for _, f := range failed {
			dead[f.name] = true
		}
		o.Nodes = slices.DeleteFunc(slices.Clone(o.Nodes), func(n *corev1.Node) bool { return dead[n.Name] })
	}
	return o, failed, joined, nil
}

func fmtAge(d time.Duration) string { return d.Round(time.Second).String() }

// fail reports a failed machine (a Warning Event and the Cluster's NodeBoot condition,
// with what the provider can tell of it) and deletes it. Errors are logged: the next pass
// sees the machine again if it is still there.
func (d *Driver) fail(ctx context.Context, f failedMachine) {
	msg := f.message
	if dg, ok := d.provider.(nodes.Diagnoser); ok {
		if s := dg.Diagnose(f.name); s != "" {
			msg += "\n" + s
		}
	}
	d.log.Warn("node failed; deleting its machine", "node", f.name, "reason", f.reason, "detail", msg)
	d.event(ctx, scale.Decision{}, corev1.EventTypeWarning, "Node"+f.reason, msg)
	d.tellFailed(ctx, f)
	if d.status != nil {
		if err := d.status.RecordNodeBoot(ctx, d.cfg.Cluster, false, f.reason, msg); err != nil {
			d.log.Error("record node failure in the cluster status", "node", f.name, "err", err)
		}
	}
	if err := d.provider.Delete(ctx, f.name); err != nil && !nodes.IsNotFound(err) {
		d.log.Error("delete failed machine", "node", f.name, "err", err)
		return
	}
	d.starts.forget(f.name)
	d.forgetBootedFor(f.name)
	d.metrics.nodeFailed(d.cfg.Cluster, f.reason)
}

// reportNetwork records the nodes' network health on the Cluster when it changed, and a
// Warning Event for each new problem. A failed report is tried again next pass.
func (d *Driver) reportNetwork(ctx context.Context, ns []*corev1.Node) {
	problems := nodehealth.Problems(ns)
	ok, reason, msg := true, "NodesHealthy", "no node reports a network problem"
	if len(problems) > 0 {
		ok, reason, msg = false, "NodeNetworkProblem", strings.Join(problems, "\n")
	}
	report := reason + "\n" + msg
	if d.status == nil || report == d.network {
		return
	}
	for _, p := range problems {
		if !strings.Contains(d.network, p) {
			d.log.Warn("node network problem", "problem", p)
			d.event(ctx, scale.Decision{}, corev1.EventTypeWarning, "NodeNetworkProblem", p)
		}
	}
	if err := d.status.RecordNodeNetwork(ctx, d.cfg.Cluster, ok, reason, msg); err != nil {
		d.log.Error("record node network health in the cluster status", "err", err)
		return
	}
	d.network = report
}

// earlyBootStall asks the provider, if it can tell, whether a machine is stuck before its
// kernel started.
func (d *Driver) earlyBootStall(name string) string {
	if w, ok := d.provider.(nodes.EarlyBootWatcher); ok {
		return w.EarlyBootStall(name)
	}
	return ""
}

// reportAccelerator records the provider's accelerator on the Cluster when it changed (at
// the first pass, and when the provider turns KVM off). A failed report is tried again
// next pass.
func (d *Driver) reportAccelerator(ctx context.Context) {
	r, ok := d.provider.(nodes.AcceleratorReporter)
	if !ok || d.status == nil {
		return
	}
	accel, why := r.Accelerator()
	report := accel + "\n" + why
	if accel == "" || report == d.accel {
		return
	}
	if d.accel != "" {
		d.log.Warn("node accelerator changed", "accel", accel, "reason", why)
		d.event(ctx, scale.Decision{}, corev1.EventTypeWarning, "NodeAcceleratorChanged", why)
	}
	if err := d.status.RecordNodeAccelerator(ctx, d.cfg.Cluster, accel, why); err != nil {
		d.log.Error("record the node accelerator in the cluster status", "err", err)
		return
	}
	d.accel = report
}

// joined records that a node registered.
func (d *Driver) joined(ctx context.Context, j joinedMachine) {
	d.log.Info("node joined", "node", j.name, "afterCreate", j.took)
	d.forgetBootedFor(j.name)
	if d.status != nil {
		msg := fmt.Sprintf("node %s registered %s after its machine was created", j.name, fmtAge(j.took))
		if err := d.status.RecordNodeBoot(ctx, d.cfg.Cluster, true, "NodeJoined", msg); err != nil {
			d.log.Error("record node join in the cluster status", "node", j.name, "err", err)
		}
	}
}

// reportWarmStart puts how a node tried warm started on the Cluster, and a failed warm
// start in a Warning Event too: the node still came, but slower, and an operator
// should know why the pool did not serve it. A failed report is only logged.
func (d *Driver) reportWarmStart(ctx context.Context, name string, w nodes.WarmStart) {
	var ok bool
	var reason, msg string
	switch {
	case w.Failed != "":
		reason, msg = "WarmStartFailed", w.Failed
		d.log.Warn("warm start failed; the node booted cold", "node", name, "why", w.Failed)
		d.event(ctx, scale.Decision{}, corev1.EventTypeWarning, reason, msg)
	case w.Claimed:
		ok, reason, msg = true, "WarmPoolClaimed", fmt.Sprintf("node %s started from a pre-booted warm-pool VM", name)
	default:
		return
	}
	if d.status == nil {
		return
	}
	if err := d.status.RecordWarmStart(ctx, d.cfg.Cluster, ok, reason, msg); err != nil {
		d.log.Error("record the warm start in the cluster status", "node", name, "err", err)
	}
}

// capacityWait is a node the host had no room for.
type capacityWait struct {
	node scale.NewNode
	why  string // the provider's CapacityError reason
}

// perform carries dec out, decided at decided. Provider calls run concurrently,
// CreateParallelism at a time. A node the host has no room for now is no failure: it is
// returned, to be reported and tried again next pass.
func (d *Driver) perform(ctx context.Context, dec scale.Decision, decided time.Time) ([]capacityWait, error) {
	switch dec.Action {
	case scale.Provision:
		var (
			mu    sync.Mutex
			waits []capacityWait
		)
		err := d.parallel(dec.Target-dec.Current, func(i int) error {
			n := scale.NewNode{Size: d.cfg.NodeSize}
			if i < len(dec.New) {
				n = dec.New[i]
			}
			err := d.create(ctx, n, decided)
			var ce *nodes.CapacityError
			if errors.As(err, &ce) {
				d.log.Debug("node waits for host capacity", "size", n.Size.String(), "reason", ce.Reason)
				d.metrics.capacityWait(d.cfg.Cluster)
				mu.Lock()
				waits = append(waits, capacityWait{node: n, why: ce.Reason})
				mu.Unlock()
				return nil
			}
			return err
		})
		return waits, err
	case scale.ScaleDown, scale.Teardown:
		if !equal(dec.Cordon, dec.Remove) {
			return nil, fmt.Errorf("decision removes %v but cordons %v", dec.Remove, dec.Cordon)
		}
		return nil, d.parallel(len(dec.Remove), func(i int) error { return d.remove(ctx, dec.Remove[i]) })
	}
	return nil, nil
}

func (d *Driver) parallel(n int, f func(i int) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, d.cfg.CreateParallelism)
	)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := f(i); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (d *Driver) create(ctx context.Context, node scale.NewNode, decided time.Time) error {
	size := node.Size
	// A fresh name per attempt: a failed boot's name is never reused.
	name, err := nodes.NewNodeName(d.cfg.Cluster)
	if err != nil {
		return err
	}
	// The Pods hear of their node as soon as the provider takes it on, not after the
	// clone and the VMM start that Create waits for (seconds on a busy host).
	var told sync.Once
	tell := func(warm bool) { told.Do(func() { d.tellBooting(ctx, name, node, warm) }) }
	inst, err := d.provider.Create(ctx, nodes.NodeRequest{
		Cluster: d.cfg.Cluster, Name: name,
		CPUs: size.CPUs, MemoryMiB: size.MemoryMiB, DiskMiB: size.DiskMiB, MaxPods: size.MaxPods,
		Labels:   scale.NodeLabels(name, size),
		Admitted: tell,
	})
	if err != nil {
		err = fmt.Errorf("create node %s: %w", name, err)
		d.tellFailed(ctx, failedMachine{name: name, reason: "CreateFailed", message: err.Error()})
		d.forgetBootedFor(name)
		return err
	}
	d.reportWarmStart(ctx, name, inst.Warm)
	n, _ := d.nodeLister.Get(name) // a provider may register the Node within Create
	d.starts.booted(name, decided, d.now(), n)
	tell(inst.Warm.Claimed) // a provider that does not call Admitted
	return nil
}

// idleNodes is how many idle nodes the cluster wants now: IdleNodes inside its window,
// else none; none with a schedule that does not parse (no window is not "always").
func (d *Driver) idleNodes() int {
	if d.cfg.IdleNodes > 0 && d.badSchedule == nil && d.idleWindow.Open(d.now()) {
		return d.cfg.IdleNodes
	}
	return 0
}

// reportIdle records on the Cluster how many idle nodes are wanted and spare, when that
// changed, for a cluster that keeps them. A failed report is tried again next pass.
func (d *Driver) reportIdle(ctx context.Context, dec scale.Decision) {
	if d.status == nil || d.cfg.IdleNodes == 0 {
		return
	}
	idle := v1.IdleNodesStatus{Wanted: int32(d.idleNodes()), Spare: int32(dec.Spare), Booting: int32(dec.SpareBooting), Claimed: int32(dec.Claimed)}
	report := fmt.Sprint(idle)
	if report == d.idleReport {
		return
	}
	if err := d.status.RecordIdleNodes(ctx, d.cfg.Cluster, idle); err != nil {
		d.log.Error("record idle nodes in the cluster status", "err", err)
		return
	}
	d.idleReport = report
}

// reportSchedule records once how the driver read spec.idleSchedule: why no idle nodes
// are kept when it does not parse, else that it does (which clears a report from an
// earlier start). A failed report is tried again next pass.
func (d *Driver) reportSchedule(ctx context.Context) {
	if d.status == nil || d.scheduleTold {
		return
	}
	ok, reason, msg := true, "IdleScheduleParsed", "spec.idleSchedule is empty: idle nodes are kept at all times"
	switch {
	case d.badSchedule != nil:
		ok, reason = false, v1.ReasonBadIdleSchedule
		msg = fmt.Sprintf("no idle nodes are kept: spec.idleSchedule does not parse: %v. Fix spec.idleSchedule (or empty it for "+
			"always): an edit of the Cluster's scaling fields replaces its scale driver within seconds", d.badSchedule)
	case d.cfg.IdleSchedule != "":
		msg = fmt.Sprintf("spec.idleSchedule %q parses: idleNodes (%d) are kept inside it", d.cfg.IdleSchedule, d.cfg.IdleNodes)
	}
	if err := d.status.RecordIdleSchedule(ctx, d.cfg.Cluster, ok, reason, msg); err != nil {
		d.log.Error("record the idle schedule in the cluster status", "err", err)
		return
	}
	d.scheduleTold = true
}

// seal cordons each node a job ran on and marks it, so that it takes no other Pod and the
// next decisions remove it once the job is over. A failure is logged; the next pass,
// seeing the node unmarked, tries again.
func (d *Driver) seal(ctx context.Context, names []string) {
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"true"}},"spec":{"unschedulable":true}}`, scale.AnnotationRanJob)
	for _, name := range names {
		if _, err := d.tenant.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
			d.log.Error("seal the node a job ran on", "node", name, "err", err)
			continue
		}
		d.log.Info("node sealed: a job ran on it, it takes no other Pod (fresh node per job)", "node", name)
	}
}

// errNodeBusy: a Pod was bound to the node between the decision and the cordon.
var errNodeBusy = errors.New("a pod that keeps the node was bound after the decision")

// remove cordons name, makes sure nothing that keeps it arrived meanwhile, then deletes
// the machine and the Node object. Already-gone is success at every step.
func (d *Driver) remove(ctx context.Context, name string) error {
	wasCordoned := false
	if n, err := d.nodeLister.Get(name); err == nil {
		wasCordoned = n.Spec.Unschedulable
	}
	cordon := func(on bool) error {
		patch := fmt.Appendf(nil, `{"spec":{"unschedulable":%t}}`, on)
		_, err := d.tenant.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		return err
	}
	uncordon := func() {
		if !wasCordoned {
			if err := cordon(false); err != nil && !apierrors.IsNotFound(err) {
				d.log.Error("uncordon after failed removal", "node", name, "err", err)
			}
		}
	}

	nodeGone := false
	if err := cordon(true); err != nil {
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("cordon %s: %w", name, err)
		}
		nodeGone = true
	}
	if !nodeGone {
		// Ask the apiserver, not the cache: the cache may not have the Pod the scheduler
		// bound a moment before the cordon. (Field selectors narrow a real apiserver's
		// answer; filter again for clients that ignore them.)
		pods, err := d.tenant.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + name})
		if err != nil {
			uncordon()
			return fmt.Errorf("re-check pods on %s: %w", name, err)
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.Spec.NodeName == name && scale.BlocksRemoval(p) {
				uncordon()
				return fmt.Errorf("keep %s: pod %s/%s: %w", name, p.Namespace, p.Name, errNodeBusy)
			}
		}
	}
	if err := d.provider.Delete(ctx, name); err != nil && !nodes.IsNotFound(err) {
		uncordon()
		return fmt.Errorf("delete machine %s: %w", name, err)
	}
	d.starts.forget(name)
	d.forgetBootedFor(name)
	if !nodeGone {
		err := d.tenant.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete node object %s: %w", name, err)
		}
	}
	return nil
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
