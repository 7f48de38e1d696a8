package scaledriver

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/socialweb-computer/socialweb/internal/scale"
)

// Reasons of the Pod Events and of the PodsProvisionable condition.
const (
	reasonNotProvisionable = "NotProvisionable"
	reasonWaitingForHost   = "WaitingForHostCapacity"
	reasonExceedsNodeSize  = "PodsExceedNodeSize"
	reasonProvisionable    = "PodsProvisionable"
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
			d.podEvent(ctx, p.ref, p.reason, p.note)
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

// podEvent writes a Warning Event about ref, in its namespace, where `kubectl describe`
// of it shows it.
func (d *Driver) podEvent(ctx context.Context, ref scale.Ref, reason, note string) {
	d.writeEvent(ctx, ref.Namespace, corev1.ObjectReference{
		APIVersion: apiVersion(ref.Kind), Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name, UID: ref.UID,
	}, corev1.EventTypeWarning, reason, note)
}
