// Package provider reconciles Cluster objects into running tenant control
// planes. The decision is a pure function (Plan) of what was observed; the
// actuator carries out its operations, and the next pass observes again.
package provider

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/lease"
)

// Op is one step the actuator performs. Every Op is idempotent.
type Op string

const (
	OpAddFinalizer Op = "AddFinalizer"
	OpLease        Op = "Lease"
	OpProvision    Op = "Provision" // datastore, PKI, config, admin kubeconfig
	OpStart        Op = "Start"
	OpStop         Op = "Stop"
	// OpSleep stops the node services and the control-plane process, keeping data
	// and port, gives back the node network, and makes the daemon accept on the
	// port so the first connection wakes the cluster.
	OpSleep Op = "Sleep"
	// OpEnsureNetwork applies the node network's rules again: the Cluster's egress
	// narrowing changed while it runs.
	OpEnsureNetwork   Op = "EnsureNetwork"
	OpRemoveData      Op = "RemoveData"
	OpReleaseLease    Op = "ReleaseLease"
	OpRemoveFinalizer Op = "RemoveFinalizer"
)

// Observed is everything Plan looks at.
type Observed struct {
	Deleting     bool
	HasFinalizer bool
	Lease        *lease.Lease
	LeaseErr     error // the last Lease op failed
	Provisioned  bool  // config and PKI are on disk for the current lease (its port, and its network when it holds one)
	ProvisionErr error // the last Provision op failed
	DataPresent  bool  // anything on disk or in the datastore to remove
	Process      ProcessState
	Probe        ProbeState
	// WasReady: the cluster answered before, so a failing probe is an
	// outage (Unavailable), not a start (Initializing).
	WasReady bool
	// Asleep: the cluster went to sleep and nothing has woken it since; its
	// control plane stays stopped.
	Asleep bool
	// NetworkStale: the node network's rules were made for another egress narrowing
	// than the Cluster's spec says now.
	NetworkStale bool
	// Gated: the daemon accepts on the cluster's port for it, or holds a
	// connection that woke it.
	Gated bool
	// Woke: the last wake ended with the apiserver answering (WakeMsg says how
	// fast); WakeErr: it did not come up in time, and why.
	Woke    bool
	WakeMsg string
	WakeErr string
	Now     time.Time
}

// ProcessState is the supervisor's view of the control-plane process.
type ProcessState struct {
	Supervised bool
	Running    bool
	PID        int
	Restarts   int
	LastExit   string
	Since      time.Time
}

// ProbeState is the last /readyz result.
type ProbeState struct {
	OK    bool
	Err   string
	Since time.Time // when OK last changed
}

// Plan is what should be true and what to do about it.
type Plan struct {
	Phase      v1.Phase
	Conditions []metav1.Condition
	Ops        []Op
}

// Decide computes the plan for one cluster. It is pure: the same
// observation always gives the same plan.
func Decide(o Observed) Plan {
	if o.Deleting {
		return drain(o)
	}
	p := Plan{Phase: v1.PhaseInitializing}
	if !o.HasFinalizer {
		p.Ops = append(p.Ops, OpAddFinalizer)
	}
	switch {
	case o.Lease != nil && o.Lease.HasNetwork():
		p.cond(v1.ConditionLeased, true, "Leased", fmt.Sprintf("apiserver port %d, node network %d", o.Lease.Port, o.Lease.Network), o.Now)
	case o.Lease != nil && o.Asleep:
		// A sleeping cluster has no node, so it needs no node network: it is
		// given back at sleep and leased again at the wake.
		p.cond(v1.ConditionLeased, true, "Leased", fmt.Sprintf("apiserver port %d; the node network is leased again at the wake", o.Lease.Port), o.Now)
	case o.LeaseErr != nil:
		p.cond(v1.ConditionLeased, false, "LeaseFailed", o.LeaseErr.Error(), o.Now)
		return p
	case o.Lease != nil:
		p.cond(v1.ConditionLeased, false, "Pending", fmt.Sprintf("apiserver port %d; waiting for a node network", o.Lease.Port), o.Now)
		p.Ops = append(p.Ops, OpLease)
		return p
	default:
		p.cond(v1.ConditionLeased, false, "Pending", "waiting for a port and network lease", o.Now)
		p.Ops = append(p.Ops, OpLease)
		return p
	}
	switch {
	case o.ProvisionErr != nil:
		p.cond(v1.ConditionProvisioned, false, "ProvisionFailed", o.ProvisionErr.Error(), o.Now)
		return p
	case o.Provisioned:
		p.cond(v1.ConditionProvisioned, true, "Provisioned", "datastore, PKI and config are in place", o.Now)
	case o.Asleep:
		// Moved here asleep: nothing runs until the wake, which provisions it
		// with the node network it leases then.
		p.cond(v1.ConditionProvisioned, false, "AtWake", "it moved here asleep; its config and PKI are written on this host at its wake", o.Now)
	default:
		p.cond(v1.ConditionProvisioned, false, "Pending", "creating datastore, PKI and config", o.Now)
		p.Ops = append(p.Ops, OpProvision)
		return p
	}
	switch {
	case o.WakeErr != "":
		p.cond(v1.ConditionWake, false, "WakeFailed", o.WakeErr, o.Now)
	case o.Woke:
		p.cond(v1.ConditionWake, true, "Woke", o.WakeMsg, o.Now)
	}
	if o.Asleep {
		return asleep(o, p)
	}
	switch {
	case !o.Process.Supervised:
		p.cond(v1.ConditionRunning, false, "NotStarted", "starting the control-plane process", o.Now)
		p.Ops = append(p.Ops, OpStart)
	case o.Process.Running:
		msg := fmt.Sprintf("pid %d, %d restarts", o.Process.PID, o.Process.Restarts)
		if o.Process.Restarts > 0 && o.Process.LastExit != "" {
			// Why it restarted stays in view (an OOM kill at its limit, say).
			msg += "; the last run " + o.Process.LastExit
		}
		p.cond(v1.ConditionRunning, true, "Running", msg, o.Now)
		if o.NetworkStale {
			p.Ops = append(p.Ops, OpEnsureNetwork)
		}
	default:
		p.cond(v1.ConditionRunning, false, "Exited", fmt.Sprintf("%s; restarting with backoff (%d restarts); see controlplane.log in the cluster's run dir (STATE/clusters/NAME/run)", o.Process.LastExit, o.Process.Restarts), o.Now)
	}
	switch {
	case o.Probe.OK:
		p.Phase = v1.PhaseReady
		p.cond(v1.ConditionReady, true, "ReadyzOK", "the apiserver answers /readyz", o.Now)
	case o.WasReady:
		p.Phase = v1.PhaseUnavailable
		reason, msg := "ReadyzFailed", o.Probe.Err
		if o.Process.Supervised && !o.Process.Running {
			reason, msg = "ProcessExited", o.Process.LastExit
		}
		if msg == "" {
			msg = "the apiserver stopped answering /readyz"
		}
		p.cond(v1.ConditionReady, false, reason, msg, o.Now)
	default:
		msg := "waiting for the apiserver to answer /readyz"
		if o.Probe.Err != "" {
			msg += ": " + o.Probe.Err
		}
		p.cond(v1.ConditionReady, false, "Starting", msg, o.Now)
	}
	return p
}

// asleep keeps a sleeping cluster's control plane stopped and its port
// accepting: after it went to sleep, and after a daemon restart, which starts
// no sleeping control plane.
func asleep(o Observed, p Plan) Plan {
	p.Phase = v1.PhaseAsleep
	const msg = "the control plane sleeps; the first client that names it (TLS server name NAME.DOMAIN, as its kubeconfig does), on its port or through the front door, wakes it"
	p.cond(v1.ConditionRunning, false, "Asleep", msg, o.Now)
	p.cond(v1.ConditionReady, false, "Asleep", msg, o.Now)
	if o.Process.Supervised || !o.Gated {
		p.Ops = append(p.Ops, OpSleep)
	}
	return p
}

// drain tears down in the order that leaves nothing behind: the process
// first (it holds the port and the data), then the data, then the lease,
// and the finalizer last so the object outlives everything it owns.
func drain(o Observed) Plan {
	p := Plan{Phase: v1.PhaseDraining}
	p.cond(v1.ConditionReady, false, "Deleting", "the cluster is being torn down", o.Now)
	if o.Process.Supervised {
		p.Ops = append(p.Ops, OpStop)
	}
	if o.DataPresent {
		p.Ops = append(p.Ops, OpRemoveData)
	}
	if o.Lease != nil {
		p.Ops = append(p.Ops, OpReleaseLease)
	}
	if o.HasFinalizer {
		p.Ops = append(p.Ops, OpRemoveFinalizer)
	}
	return p
}

func (p *Plan) cond(t string, ok bool, reason, msg string, now time.Time) {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	p.Conditions = append(p.Conditions, metav1.Condition{
		Type: t, Status: status, Reason: reason, Message: msg, LastTransitionTime: metav1.NewTime(now),
	})
}
