package scale

import (
	"fmt"
	"strings"
	"time"
)

// maxReasonNotes bounds how many not-provisionable Pods a reason names.
const maxReasonNotes = 3

// Decide reads one observation and says what to do with the cluster's nodes.
//
// Order matters: provisioning comes first, because a Pod that waits is the cost users
// see; removal only considers nodes the simulation left empty, so a node that a pending
// Pod could use is never torn down under it. A node is removed only when no workload Pod
// is on it and nothing forbids it (do-not-disrupt), and either none has been for the whole
// hold or it has not been Ready for RepairAfter (a stalled node).
func Decide(o Observed) (Decision, error) {
	if err := o.validate(); err != nil {
		return Decision{}, err
	}
	s := newSim(&o)

	// What wants a node: live workload Pods (bound or not) and synthetic Pods for
	// workloads whose Pods are not there yet. Only unbound Pending ones need placing.
	intent := s.orphans
	var demands []*demand
	for _, p := range o.Pods {
		if !isWorkload(p) {
			continue
		}
		if p.Spec.NodeName != "" {
			if s.byName[p.Spec.NodeName] != nil {
				intent++
			}
			continue
		}
		if !placeable(p) {
			continue
		}
		intent++
		demands = append(demands, newDemand(Ref{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID}, p.Labels, &p.Spec, p.CreationTimestamp, false))
	}
	synthetic := workloadDemands(&o)
	intent += len(synthetic)
	demands = append(demands, synthetic...)

	// Simulate beyond the cap so the reason can say how far the cap binds, but boundedly.
	res := s.place(demands, o.MaxNodes+100)
	intent -= len(res.notProvisionable)

	var seal []string
	if o.FreshNodePerJob {
		for _, n := range s.nodes[:s.known] {
			if n.existing && n.jobBound && !n.ranJob {
				seal = append(seal, n.name)
			}
		}
	}
	// Spare: placeable nodes with nothing on them and nothing placed; with IdleNodes,
	// boot the shortfall (the smallest size), and keep that many from the hold. Claimed:
	// nodes that were spare and have work now.
	spare, spareBooting, claimed := 0, 0, 0
	var idleNames []string
	wereIdle := make(map[string]bool, len(o.WereIdle))
	for _, name := range o.WereIdle {
		wereIdle[name] = true
	}
	for _, n := range s.nodes[:s.known] {
		switch {
		case n.placeable && !n.busy && n.placed == 0:
			spare++
			if !n.existing {
				spareBooting++
			}
		case (n.busy || n.placed > 0) && wereIdle[n.name]:
			claimed++
		default:
			continue
		}
		idleNames = append(idleNames, n.name)
	}
	extra := max(o.IdleNodes-spare, 0)
	d := Decision{
		Seal:             seal,
		Spare:            spare,
		SpareBooting:     spareBooting,
		Claimed:          claimed,
		Idle:             idleNames,
		Current:          s.known,
		Target:           s.known,
		Intent:           intent,
		Unplaced:         res.unplaced,
		Need:             s.known + s.newCount + extra,
		NotProvisionable: res.notProvisionable,
		Unfit:            res.unfit,
		WaitFor:          res.waitFor,
		PendingSince:     res.pendingSince.Time,
		IdleSince:        map[string]time.Time{},
	}

	// Idle clocks: a registered node with no workload Pod and nothing the simulation
	// put there. A node keeps its clock across passes; any workload resets it.
	var idle, removable []*simNode
	var kept []string
	for _, n := range s.nodes[:s.known] {
		if !n.existing || n.busy || n.placed > 0 {
			continue
		}
		since, ok := o.IdleSince[n.name]
		if !ok || since.After(o.Now) {
			since = o.Now
		}
		d.IdleSince[n.name] = since
		// Kept for IdleNodes: its clock runs, so that it goes once it is no longer
		// wanted (outside the window) and has idled for the hold.
		if len(kept) < o.IdleNodes && n.placeable && n.notReadyFor == 0 {
			kept = append(kept, n.name)
			continue
		}
		idle = append(idle, n)
		// A node not Ready for RepairAfter goes without waiting out the hold: it is not
		// capacity worth keeping, and at the cap it stands in the way of one that works.
		// Nor does a node that ran a job, with FreshNodePerJob: it is never reused.
		spent := o.FreshNodePerJob && (n.ranJob || n.jobBound)
		if n.blocked == "" && (o.Now.Sub(since) >= o.Hold || n.notReadyFor > 0 || spent) {
			removable = append(removable, n)
		}
	}
	registered := 0
	for _, n := range s.nodes[:s.known] {
		if n.existing {
			registered++
		}
	}

	var notes []string
	if s.newCount > 0 || res.overflow > 0 || extra > 0 {
		need := fmt.Sprintf("need %d nodes", d.Need)
		if res.overflow > 0 {
			need = fmt.Sprintf("need more than %d nodes", d.Need)
		}
		target := d.Need
		if res.overflow > 0 || target > o.MaxNodes {
			d.Capped = true
			target = max(o.MaxNodes, d.Current)
		}
		switch {
		case target > d.Current && o.HostFull && len(removable) > 0:
			notes = append(notes, fmt.Sprintf("%s %s for host capacity: idle nodes go first", plural(res.unplaced, "pod"), verb(res.unplaced, "waits", "wait")))
		case target > d.Current:
			d.Action, d.Target = Provision, target
			d.New = s.newNodes(target - d.Current)
			for len(d.New) < target-d.Current {
				d.New = append(d.New, NewNode{Size: s.min, Why: fmt.Sprintf("an idle node kept for the next Pod (idleNodes %d): a %s node (the smallest)", o.IdleNodes, s.min)})
			}
			switch {
			case s.newCount == 0 && res.overflow == 0:
				d.Reason = fmt.Sprintf("keeping %s idle for the next Pods (idleNodes %d, %d spare)", plural(o.IdleNodes, "node"), o.IdleNodes, spare)
			case d.Current == 0:
				d.Reason = "intent and no node"
			default:
				d.Reason = fmt.Sprintf("%s unschedulable on %s", plural(res.unplaced, "pod"), plural(d.Current, "node"))
			}
			if d.Capped {
				d.Reason = joinReason(d.Reason, fmt.Sprintf("%s, capped at max %d", need, o.MaxNodes), d.Current == 0)
			} else if d.Current > 0 {
				d.Reason += fmt.Sprintf(": need %d", d.Need)
			}
			if s.min != s.max {
				// The size was chosen, so the reason says which and why.
				d.Reason = withNotes(d.Reason, sizeNotes(d.New))
			}
			d.Reason = withNotes(d.Reason, notProvisionable(res.notProvisionable))
			return d, nil
		default:
			notes = append(notes, fmt.Sprintf("%s unplaced: %s, capped at max %d", plural(res.unplaced, "pod"), need, o.MaxNodes))
		}
	}
	notes = append(notes, notProvisionable(res.notProvisionable)...)
	if len(kept) > 0 {
		notes = append(notes, fmt.Sprintf("%s kept idle (idleNodes %d): %s", plural(len(kept), "node"), o.IdleNodes, strings.Join(kept, ", ")))
	}
	for _, n := range idle {
		switch {
		case n.blocked != "" && n.notReadyFor > 0:
			notes = append(notes, fmt.Sprintf("node %s not Ready for %s but kept: %s", n.name, fmtDur(n.notReadyFor), n.blocked))
		case n.blocked != "" && o.Now.Sub(d.IdleSince[n.name]) >= o.Hold:
			notes = append(notes, fmt.Sprintf("node %s idle past the hold but kept: %s", n.name, n.blocked))
		}
	}

	switch {
	case len(removable) > 0:
		d.Action, d.Target = ScaleDown, d.Current-len(removable)
		if d.Target == 0 && intent == 0 {
			// Every node goes and nothing wants one: back to zero.
			d.Action = Teardown
		}
		var held, notReady, spent []string
		for _, n := range removable {
			switch {
			case n.notReadyFor > 0:
				notReady = append(notReady, fmt.Sprintf("%s (%s)", n.name, fmtDur(n.notReadyFor)))
			case o.FreshNodePerJob && (n.ranJob || n.jobBound) && o.Now.Sub(d.IdleSince[n.name]) < o.Hold:
				spent = append(spent, n.name)
			default:
				held = append(held, n.name)
			}
		}
		if d.Action == Teardown && len(notReady) == 0 && len(spent) == 0 {
			d.Reason = fmt.Sprintf("nothing running for %s, past the %s hold", fmtDur(o.Now.Sub(latest(removable, d.IdleSince))), o.Hold)
			break
		}
		var parts []string
		if len(notReady) > 0 {
			parts = append(parts, fmt.Sprintf("%s not Ready for over %s, removed: %s", plural(len(notReady), "node"), o.RepairAfter, strings.Join(notReady, ", ")))
		}
		if len(spent) > 0 {
			parts = append(parts, fmt.Sprintf("%s ran a job (a fresh node per job), removed without the hold: %s", plural(len(spent), "node"), strings.Join(spent, ", ")))
		}
		if len(held) > 0 {
			parts = append(parts, fmt.Sprintf("%s idle past the %s hold: %s", plural(len(held), "node"), o.Hold, strings.Join(held, ", ")))
		}
		d.Reason = strings.Join(parts, "; ")
	case len(idle) > 0 && hasUnblocked(idle):
		d.Action = Hold
		first := earliestUnblocked(idle, d.IdleSince)
		left := o.Hold - o.Now.Sub(first)
		if len(idle) == registered && d.Current == registered && intent == 0 {
			d.Reason = fmt.Sprintf("nothing running for %s, %s left of the %s hold", fmtDur(o.Now.Sub(latest(idle, d.IdleSince))), fmtDur(left), o.Hold)
		} else {
			d.Reason = fmt.Sprintf("%s idle, the first past the %s hold in %s", plural(len(idle), "node"), o.Hold, fmtDur(left))
		}
	default:
		d.Action = None
		switch {
		case d.Current == 0 && intent == 0:
			d.Reason = "no intent and no node"
		case d.Current == 0:
			d.Reason = fmt.Sprintf("%s and no node", plural(intent, "pod"))
		default:
			d.Reason = fmt.Sprintf("%s on %s", plural(intent, "pod"), plural(d.Current, "node"))
		}
	}
	for _, n := range removable {
		d.Cordon = append(d.Cordon, n.name)
		d.Remove = append(d.Remove, n.name)
	}
	d.Reason = withNotes(d.Reason, notes)
	return d, nil
}

// latest is the most recent idle start among ns: how long the whole set has been idle.
func latest(ns []*simNode, since map[string]time.Time) time.Time {
	var t time.Time
	for _, n := range ns {
		if s := since[n.name]; s.After(t) {
			t = s
		}
	}
	return t
}

func earliestUnblocked(ns []*simNode, since map[string]time.Time) time.Time {
	var t time.Time
	for _, n := range ns {
		if s := since[n.name]; n.blocked == "" && (t.IsZero() || s.Before(t)) {
			t = s
		}
	}
	return t
}

func hasUnblocked(ns []*simNode) bool {
	for _, n := range ns {
		if n.blocked == "" {
			return true
		}
	}
	return false
}

func notProvisionable(lines []string) []string {
	if len(lines) <= maxReasonNotes {
		return lines
	}
	out := append([]string(nil), lines[:maxReasonNotes]...)
	return append(out, fmt.Sprintf("%d more not provisionable", len(lines)-maxReasonNotes))
}

// sizeNotes names each new node's size and why, nodes of the same description once.
func sizeNotes(ns []NewNode) []string {
	var whys []string
	count := map[string]int{}
	for _, n := range ns {
		if count[n.Why] == 0 {
			whys = append(whys, n.Why)
		}
		count[n.Why]++
	}
	var out []string
	for i, w := range whys {
		if i == maxReasonNotes {
			rest := 0
			for _, w := range whys[i:] {
				rest += count[w]
			}
			out = append(out, fmt.Sprintf("and %s more", plural(rest, "node")))
			break
		}
		if c := count[w]; c > 1 {
			w = fmt.Sprintf("%d× (%s)", c, w)
		}
		out = append(out, w)
	}
	return out
}

func joinReason(base, more string, semicolon bool) string {
	if semicolon {
		return base + "; " + more
	}
	return base + ": " + more
}

func withNotes(reason string, notes []string) string {
	for _, n := range notes {
		if reason == "" {
			reason = n
			continue
		}
		reason += "; " + n
	}
	return reason
}

// fmtDur rounds to a tenth of a second: "1m0.9s", not "1m0.917972328s".
func fmtDur(d time.Duration) string {
	return max(d, 0).Round(100 * time.Millisecond).String()
}

func verb(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
