package provider

import (
	"errors"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/controlplane"
	"github.com/socialweb-computer/socialweb/internal/lease"
)

func TestDecide(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	l := &lease.Lease{Port: 7500, Network: 1}
	portOnly := &lease.Lease{Port: 7500} // asleep: the node network given back
	running := ProcessState{Supervised: true, Running: true, PID: 42}
	exited := ProcessState{Supervised: true, Running: false, LastExit: "exited: signal: killed", Restarts: 1}
	tests := []struct {
		name      string
		obs       Observed
		wantPhase v1.Phase
		wantOps   []Op
		wantCond  map[string]string // type -> reason
	}{
		{
			name:      "a new cluster gets a finalizer and a lease first",
			obs:       Observed{Now: now},
			wantPhase: v1.PhaseInitializing,
			wantOps:   []Op{OpAddFinalizer, OpLease},
			wantCond:  map[string]string{v1.ConditionLeased: "Pending"},
		},
		{
			name:      "an exhausted range is a condition, not a retry loop",
			obs:       Observed{Now: now, HasFinalizer: true, LeaseErr: errors.New("lease range exhausted: widen --port-range")},
			wantPhase: v1.PhaseInitializing,
			wantOps:   nil,
			wantCond:  map[string]string{v1.ConditionLeased: "LeaseFailed"},
		},
		{
			name:      "leased but not provisioned",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: l},
			wantPhase: v1.PhaseInitializing,
			wantOps:   []Op{OpProvision},
			wantCond:  map[string]string{v1.ConditionLeased: "Leased", v1.ConditionProvisioned: "Pending"},
		},
		{
			name:      "a failed provision is reported and not retried in the same pass",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: l, ProvisionErr: errors.New("postgres down")},
			wantPhase: v1.PhaseInitializing,
			wantCond:  map[string]string{v1.ConditionProvisioned: "ProvisionFailed"},
		},
		{
			name:      "a changed egress narrowing re-applies the running cluster's network rules",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: l, Provisioned: true, Process: running, NetworkStale: true, Probe: ProbeState{OK: true}},
			wantPhase: v1.PhaseReady,
			wantOps:   []Op{OpEnsureNetwork},
			wantCond:  map[string]string{v1.ConditionRunning: "Running", v1.ConditionReady: "ReadyzOK"},
		},
		{
			name:      "a stale network of an asleep cluster waits for the wake",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: portOnly, Provisioned: true, Asleep: true, Gated: true, NetworkStale: true},
			wantPhase: v1.PhaseAsleep,
		},
		{
			name:      "going to sleep stops node services and the process and gates the port",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: l, Provisioned: true, Process: running, Asleep: true},
			wantPhase: v1.PhaseAsleep,
			wantOps:   []Op{OpSleep},
			wantCond:  map[string]string{v1.ConditionRunning: "Asleep", v1.ConditionReady: "Asleep"},
		},
		{
			name:      "asleep after a daemon restart: nothing started, the port gated",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: l, Provisioned: true, Asleep: true, WasReady: true},
			wantPhase: v1.PhaseAsleep,
			wantOps:   []Op{OpSleep},
			wantCond:  map[string]string{v1.ConditionReady: "Asleep"},
		},
		{
			name:      "moved here asleep: its port gated, provisioned only at its wake",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: portOnly, Asleep: true},
			wantPhase: v1.PhaseAsleep,
			wantOps:   []Op{OpSleep},
			wantCond:  map[string]string{v1.ConditionProvisioned: "AtWake", v1.ConditionReady: "Asleep"},
		},
		{
			name:      "woken where it moved asleep: provisioned now",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: l, Gated: true},
			wantPhase: v1.PhaseInitializing,
			wantOps:   []Op{OpProvision},
		},
		{
			name:      "asleep and gated: nothing to do",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: l, Provisioned: true, Asleep: true, Gated: true},
			wantPhase: v1.PhaseAsleep,
			wantCond:  map[string]string{v1.ConditionRunning: "Asleep"},
		},
		{
			name:      "woken: started again, starting is not an outage",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: l, Provisioned: true, Gated: true},
			wantPhase: v1.PhaseInitializing,
			wantOps:   []Op{OpStart},
			wantCond:  map[string]string{v1.ConditionRunning: "NotStarted", v1.ConditionReady: "Starting"},
		},
		{
			name:      "woken and answering",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: l, Provisioned: true, Process: running, Probe: ProbeState{OK: true}, Woke: true, WakeMsg: "answered 1.8s after the first connection"},
			wantPhase: v1.PhaseReady,
			wantCond:  map[string]string{v1.ConditionWake: "Woke", v1.ConditionReady: "ReadyzOK"},
		},
		{
			name:      "a wake that did not come up says why and goes back to sleep",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: l, Provisioned: true, Process: exited, Asleep: true, WakeErr: "the control plane exited while waking: exited: signal: killed"},
			wantPhase: v1.PhaseAsleep,
			wantOps:   []Op{OpSleep},
			wantCond:  map[string]string{v1.ConditionWake: "WakeFailed", v1.ConditionRunning: "Asleep"},
		},
		{
			name:      "asleep without a node network: leased, nothing to do",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: portOnly, Provisioned: true, Asleep: true, Gated: true},
			wantPhase: v1.PhaseAsleep,
			wantCond:  map[string]string{v1.ConditionLeased: "Leased", v1.ConditionRunning: "Asleep"},
		},
		{
			name:      "woken without a node network: one is leased before anything starts",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: portOnly, Provisioned: true, Gated: true},
			wantPhase: v1.PhaseInitializing,
			wantOps:   []Op{OpLease},
			wantCond:  map[string]string{v1.ConditionLeased: "Pending"},
		},
		{
			name:      "a wake that found no free node network sleeps on",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: portOnly, Provisioned: true, Asleep: true, Gated: true, LeaseErr: errors.New("lease range exhausted: no free node network"), WakeErr: "no node network is free for the wake"},
			wantPhase: v1.PhaseAsleep,
			wantCond:  map[string]string{v1.ConditionLeased: "Leased", v1.ConditionWake: "WakeFailed", v1.ConditionReady: "Asleep"},
		},
		{
			name:      "a sleeping cluster without a network is deleted: no network to remove, the port released",
			obs:       Observed{Now: now, Deleting: true, HasFinalizer: true, Lease: portOnly, Provisioned: true, DataPresent: true, Asleep: true, Gated: true},
			wantPhase: v1.PhaseDraining,
			wantOps:   []Op{OpRemoveData, OpReleaseLease, OpRemoveFinalizer},
		},
		{
			name:      "a sleeping cluster is deleted: no process to stop",
			obs:       Observed{Now: now, Deleting: true, HasFinalizer: true, Lease: l, Provisioned: true, DataPresent: true, Asleep: true, Gated: true},
			wantPhase: v1.PhaseDraining,
			wantOps:   []Op{OpRemoveData, OpReleaseLease, OpRemoveFinalizer},
		},
		{
			name:      "provisioned and not started",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: l, Provisioned: true},
			wantPhase: v1.PhaseInitializing,
			wantOps:   []Op{OpStart},
			wantCond:  map[string]string{v1.ConditionRunning: "NotStarted", v1.ConditionReady: "Starting"},
		},
		{
			name:      "running, not yet answering",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: l, Provisioned: true, Process: running, Probe: ProbeState{Err: "connection refused"}},
			wantPhase: v1.PhaseInitializing,
			wantCond:  map[string]string{v1.ConditionRunning: "Running", v1.ConditionReady: "Starting"},
		},
		{
			name:      "answering readyz is Ready",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: l, Provisioned: true, Process: running, Probe: ProbeState{OK: true}},
			wantPhase: v1.PhaseReady,
			wantCond:  map[string]string{v1.ConditionReady: "ReadyzOK"},
		},
		{
			name:      "it stopped answering after being Ready",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: l, Provisioned: true, Process: running, Probe: ProbeState{Err: "/readyz answered 500"}, WasReady: true},
			wantPhase: v1.PhaseUnavailable,
			wantCond:  map[string]string{v1.ConditionReady: "ReadyzFailed"},
		},
		{
			name:      "the process crashed after being Ready",
			obs:       Observed{Now: now, HasFinalizer: true, Lease: l, Provisioned: true, Process: exited, WasReady: true},
			wantPhase: v1.PhaseUnavailable,
			wantCond:  map[string]string{v1.ConditionReady: "ProcessExited", v1.ConditionRunning: "Exited"},
		},
		{
			name:      "delete drains in order",
			obs:       Observed{Now: now, Deleting: true, HasFinalizer: true, Lease: l, DataPresent: true, Process: running},
			wantPhase: v1.PhaseDraining,
			wantOps:   []Op{OpStop, OpRemoveData, OpReleaseLease, OpRemoveFinalizer},
			wantCond:  map[string]string{v1.ConditionReady: "Deleting"},
		},
		{
			name:      "a half-drained cluster finishes the rest",
			obs:       Observed{Now: now, Deleting: true, HasFinalizer: true, Lease: l},
			wantPhase: v1.PhaseDraining,
			wantOps:   []Op{OpReleaseLease, OpRemoveFinalizer},
		},
		{
			name:      "delete before anything was made only drops the finalizer",
			obs:       Observed{Now: now, Deleting: true, HasFinalizer: true},
			wantPhase: v1.PhaseDraining,
			wantOps:   []Op{OpRemoveFinalizer},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Decide(tt.obs)
			if p.Phase != tt.wantPhase {
				t.Errorf("phase = %s, want %s", p.Phase, tt.wantPhase)
			}
			if !slices.Equal(p.Ops, tt.wantOps) {
				t.Errorf("ops = %v, want %v", p.Ops, tt.wantOps)
			}
			for typ, reason := range tt.wantCond {
				c := findCondition(p.Conditions, typ)
				if c == nil {
					t.Errorf("no %s condition", typ)
					continue
				}
				if c.Reason != reason {
					t.Errorf("%s reason = %s (%s), want %s", typ, c.Reason, c.Message, reason)
				}
				if c.Message == "" {
					t.Errorf("%s has no message", typ)
				}
			}
		})
	}
}

func findCondition(cs []metav1.Condition, typ string) *metav1.Condition {
	for i := range cs {
		if cs[i].Type == typ {
			return &cs[i]
		}
	}
	return nil
}

// A config on disk is current for a lease when it has the lease's port and,
// when the lease holds a node network, that network's gateway: a woken
// cluster may get another network than it slept with.
func TestProvisionedFor(t *testing.T) {
	cfg := controlplane.Config{Port: 7500, AdvertiseAddress: "10.250.3.1", NodeCIDR: "10.250.3.0/24"}
	old := cfg
	old.NodeCIDR = ""
	tests := []struct {
		name  string
		cfg   *controlplane.Config
		lease lease.Lease
		want  bool
	}{
		{"same port and network", nil, lease.Lease{Port: 7500, Network: 3}, true},
		{"written before the egress wall (no node CIDR)", &old, lease.Lease{Port: 7500, Network: 3}, false},
		{"asleep: the port is enough", nil, lease.Lease{Port: 7500}, true},
		{"woken on another network", nil, lease.Lease{Port: 7500, Network: 4}, false},
		{"another port", nil, lease.Lease{Port: 7501, Network: 3}, false},
		{"a network outside the plan", nil, lease.Lease{Port: 7500, Network: 999}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := cfg
			if tt.cfg != nil {
				c = *tt.cfg
			}
			if got := provisionedFor(c, tt.lease); got != tt.want {
				t.Errorf("provisionedFor(%+v) = %v, want %v", tt.lease, got, tt.want)
			}
		})
	}
}
