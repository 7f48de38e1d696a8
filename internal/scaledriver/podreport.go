package scaledriver

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/scale"
)

// Reasons of the Pod Events and of the PodsProvisionable condition.
const (
	reasonNotProvisionable = "NotProvisionable"
	reasonWaitingForHost   = "WaitingForHostCapacity"
	reasonExceedsNodeSize  = "PodsExceedNodeSize"
	reasonProvisionable    = "PodsProvisionable"
	reasonNodeBooting      = "NodeBooting"
	reasonNodeBootFailed   = "NodeBootFailed"
)

// podProblemKey is one thing told to one Pod (or workload, before its Pods exist).
type podProblemKey struct {
	ref    scale.Ref
	reason string
}

// reportPods tells the Pods of dec that no node size fits, and those whose node waits for
// host capacity (d.waiting): a Warning Event on each, once per Pod and reason while it
// lasts, and the PodsProvisionable condition on the Cluster when it changed.
func (d *Driver) reportPods(ctx context.Context, dec scale.Decision) {
	type problem struct {
		podProblemKey
		note string
	}
	var problems []problem
	seen := map[podProblemKey]bool{}
	add := func(ref scale.Ref, reason, note string) {
		k := podProblemKey{ref, reason}
		if !seen[k] {
			seen[k] = true
			problems = append(problems, problem{k, note})
		}
	}
	for _, u := range dec.Unfit {
		add(u.Ref, reasonNotProvisionable, u.Why+": no node is booted for it")
	}
	for _, w := range d.waiting {
		for _, ref := range w.node.For {
			add(ref, reasonWaitingForHost, fmt.Sprintf("waits for host capacity: its %s node does not fit the host now (%s); it boots when capacity frees up", w.node.Size, w.why))
		}
	}

	for _, p := range problems {
		if !d.told[p.podProblemKey] {
			d.log.Warn("pod gets no node", "pod", p.ref.String(), "reason", p.reason, "detail", p.note)
			d.podEvent(ctx, p.ref, corev1.EventTypeWarning, p.reason, p.note)
		}
	}
	d.told = seen
	d.metrics.unprovisionable(d.cfg.Cluster, len(dec.Unfit))

	ok, reason, lines := true, reasonProvisionable, []string{"every Pod that wants a node fits a node this cluster may boot"}
	if len(problems) > 0 {
		ok, reason, lines = false, reasonWaitingForHost, nil
		if len(dec.Unfit) > 0 {
			reason = reasonExceedsNodeSize
		}
		for _, p := range problems {
			lines = append(lines, p.ref.String()+": "+p.note)
		}
		slices.Sort(lines)
	}
	msg := strings.Join(lines, "\n")
	report := reason + "\n" + msg
	if d.status == nil || report == d.provisionable {
		return
	}
	if err := d.status.RecordPodsProvisionable(ctx, d.cfg.Cluster, ok, reason, msg); err != nil {
		d.log.Error("record pods provisionable in the cluster status", "err", err)
		return
	}
	d.provisionable = report
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// apiVersion of the kinds a scale.Ref names.
func apiVersion(kind string) string {
	switch kind {
	case "Job":
		return "batch/v1"
	case "Deployment", "StatefulSet":
		return "apps/v1"
	}
	return "v1"
}

// podEvent writes an Event about ref, in its namespace, where `kubectl describe` of it
// shows it and a job runner that reads its Pod's events (a Role on that namespace alone)
// prints it.
func (d *Driver) podEvent(ctx context.Context, ref scale.Ref, typ, reason, note string) {
	d.writeEvent(ctx, ref.Namespace, corev1.ObjectReference{
		APIVersion: apiVersion(ref.Kind), Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name, UID: ref.UID,
	}, typ, reason, note)
}

// tellBooting tells each Pod (or workload) a new node was created for that it is coming,
// its size, and about how long its Pods take to start that way; and keeps whom it was
// for, so a failure is told to them too.
func (d *Driver) tellBooting(ctx context.Context, name string, node scale.NewNode, warm bool) {
	refs := slices.Compact(slices.SortedFunc(slices.Values(node.For), compareRefs))
	if len(refs) == 0 {
		return
	}
	d.forMu.Lock()
	d.bootedFor[name] = refs
	d.forMu.Unlock()
	path, how := v1.PodStartCold, "booting node %s (%s) for this Pod"
	if warm {
		path, how = v1.PodStartWarm, "starting node %s (%s) for this Pod from a pre-booted warm-pool VM"
	}
	took, measured := d.startEstimate(path)
	note := fmt.Sprintf(how+"; it starts in %s", name, node.Size, aboutWords(took, measured))
	for _, ref := range refs {
		d.podEvent(ctx, ref, corev1.EventTypeNormal, reasonNodeBooting, note)
	}
}

// startEstimate is about how long a Pod takes to start on path, under the provider's
// accelerator (podStarts.estimate).
func (d *Driver) startEstimate(path string) (time.Duration, bool) {
	accel := ""
	if r, ok := d.provider.(nodes.AcceleratorReporter); ok {
		accel, _ = r.Accelerator()
	}
	return d.podStarts.estimate(d.now(), path, accel)
}

// tellWaiting tells each Pod the decision put on a machine already booting (booted for
// other Pods first) that it waits for that machine, and about how long; once per Pod and
// machine. sizes are the booting machines' sizes.
func (d *Driver) tellWaiting(ctx context.Context, dec scale.Decision, sizes map[string]scale.NodeSize) {
	told := map[scale.Ref]string{}
	for ref, name := range dec.WaitFor {
		told[ref] = name
		if d.waitTold[ref] == name {
			continue
		}
		d.forMu.Lock()
		bootedForIt := slices.Contains(d.bootedFor[name], ref)
		d.forMu.Unlock()
		if bootedForIt {
			continue // its NodeBooting said so
		}
		size := d.cfg.NodeSize
		if s, ok := sizes[name]; ok {
			size = s
		}
		took, measured := d.startEstimate(v1.PodStartCold)
		left := aboutWords(took, measured)
		if at, ok := d.starts.decidedAt(name); ok {
			left = aboutWords(max(took-d.now().Sub(at), 5*time.Second), false) + " (it began " + d.now().Sub(at).Round(time.Second).String() + " ago)"
		}
		d.podEvent(ctx, ref, corev1.EventTypeNormal, reasonNodeBooting,
			fmt.Sprintf("node %s (%s), already booting, takes this Pod; it starts in %s", name, size, left))
	}
	d.waitTold = told
}

// tellFailed tells the Pods a failed machine was booted for that it failed and why (the
// first line), and that the next pass boots another.
func (d *Driver) tellFailed(ctx context.Context, f failedMachine) {
	d.forMu.Lock()
	refs := d.bootedFor[f.name]
	d.forMu.Unlock()
	why, _, _ := strings.Cut(f.message, "\n")
	for _, ref := range refs {
		d.podEvent(ctx, ref, corev1.EventTypeWarning, reasonNodeBootFailed,
			fmt.Sprintf("node %s failed to start (%s): %s; another is booted for this Pod", f.name, f.reason, why))
	}
}

func (d *Driver) forgetBootedFor(name string) {
	d.forMu.Lock()
	delete(d.bootedFor, name)
	d.forMu.Unlock()
}

func compareRefs(a, b scale.Ref) int {
	return strings.Compare(a.Namespace+"/"+a.Kind+"/"+a.Name+"/"+string(a.UID), b.Namespace+"/"+b.Kind+"/"+b.Name+"/"+string(b.UID))
}

// reportPodStarts records the last hour's Pod start percentiles on the Cluster: when a
// count changed, or when they changed otherwise (starts ageing out) and a minute passed.
func (d *Driver) reportPodStarts(ctx context.Context) {
	if d.status == nil {
		return
	}
	now := d.now()
	sum := d.podStarts.summary(now)
	if slices.Equal(sum, d.podStartsReport) {
		return
	}
	counts := func(ps []v1.PodStartPercentiles) []int32 {
		var out []int32
		for _, p := range ps {
			out = append(out, p.Count)
		}
		return out
	}
	if slices.Equal(counts(sum), counts(d.podStartsReport)) && now.Sub(d.podStartsAt) < time.Minute {
		return
	}
	if err := d.status.RecordPodStarts(ctx, d.cfg.Cluster, sum); err != nil {
		d.log.Error("record pod start percentiles in the cluster status", "err", err)
		return
	}
	d.podStartsReport, d.podStartsAt = sum, now
}
