// Package sleep decides when an idle tenant control plane sleeps, and wakes it
// on the first connection: Decide is the pure decision from what the daemon
// observed, Gate holds the cluster's port while it sleeps and passes the
// waking connection on once its apiserver answers again.
package sleep

import (
	"fmt"
	"time"
)

// WakeLead is how long before a CronJob is due a sleeping cluster wakes, and so
// how soon a due CronJob keeps a cluster awake: a wake takes seconds, and the
// margin covers a busy host.
const WakeLead = 2 * time.Minute

// Observed is what the daemon sees of an awake cluster.
type Observed struct {
	Now        time.Time
	SleepAfter time.Duration // 0: never
	// AwakeSince is when the control plane last started answering: a cluster
	// just woken or created is not idle yet.
	AwakeSince time.Time
	// LastRequest is the last API request from outside socialweb (zero: none seen).
	LastRequest time.Time
	Nodes       int // Node objects
	// WantsNodes counts what asks for a node (scale.Wanting): the scale decision's intent.
	WantsNodes int
	// NextCron is when the next CronJob is due (zero: none is scheduled).
	NextCron time.Time
	// IdleNodesWanted: the cluster keeps idle nodes and its window is open now.
	IdleNodesWanted bool
	// NextIdleWindow is when its idle-node window opens next (zero: none).
	NextIdleWindow time.Time
}

// Verdict is what Decide says.
type Verdict struct {
	Sleep bool
	// Why says what keeps the cluster awake, or why it sleeps.
	Why string
	// NextWake is when the sleeping cluster must wake by itself, ahead of its
	// next CronJob (zero: only a connection wakes it).
	NextWake time.Time
}

// Decide says whether a cluster sleeps now. Every condition must hold for a
// whole SleepAfter: no request, no node, none wanted, no CronJob due within
// WakeLead.
func Decide(o Observed) Verdict {
	if o.SleepAfter <= 0 {
		return Verdict{Why: "sleepAfter is 0 (never)"}
	}
	idleSince := o.AwakeSince
	if o.LastRequest.After(idleSince) {
		idleSince = o.LastRequest
	}
	switch {
	case o.Nodes > 0:
		return Verdict{Why: fmt.Sprintf("%d nodes", o.Nodes)}
	case o.WantsNodes > 0:
		return Verdict{Why: fmt.Sprintf("%d pods wait for a node", o.WantsNodes)}
	case o.IdleNodesWanted:
		return Verdict{Why: "idle nodes are wanted now (idleNodes, inside idleSchedule)"}
	case !o.NextCron.IsZero() && o.NextCron.Sub(o.Now) <= WakeLead:
		return Verdict{Why: fmt.Sprintf("a CronJob is due at %s", o.NextCron.UTC().Format(time.RFC3339))}
	}
	if idle := o.Now.Sub(idleSince); idle < o.SleepAfter {
		return Verdict{Why: fmt.Sprintf("idle for %s of %s", idle.Round(time.Second), o.SleepAfter)}
	}
	v := Verdict{Sleep: true, Why: fmt.Sprintf("no request, node or due CronJob for %s", o.SleepAfter)}
	// It wakes ahead of its next CronJob, and ahead of its idle-node window so that
	// the idle nodes are up when the window opens.
	for _, at := range []time.Time{o.NextCron, o.NextIdleWindow} {
		if !at.IsZero() && (v.NextWake.IsZero() || at.Add(-WakeLead).Before(v.NextWake)) {
			v.NextWake = at.Add(-WakeLead)
		}
	}
	return v
}
