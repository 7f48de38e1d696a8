package scale

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// IdleNodes keeps that many empty nodes of the smallest size up, past the hold, and boots
// the shortfall; a node a Pod takes is replaced; 0 (outside the window) lets them go.
func TestIdleNodes(t *testing.T) {
	keep := func(n int) func(*Observed) { return func(o *Observed) { o.IdleNodes = n } }
	tests := []struct {
		name     string
		o        Observed
		action   Action
		target   int
		newNodes int
		remove   []string
		contains string
	}{
		{name: "none yet: one boots with nothing on it",
			o: obs(keep(1)), action: Provision, target: 1, newNodes: 1, contains: "keeping 1 node idle for the next Pods (idleNodes 1, 0 spare)"},
		{name: "two wanted, one booting: one more",
			o: obs(keep(2), func(o *Observed) { o.Booting = []string{"b1"} }), action: Provision, target: 2, newNodes: 1},
		{name: "one up and idle past the hold: kept",
			o: obs(keep(1), nodes(node("n1")), idle("n1", time.Hour)), action: None, target: 1, contains: "1 node kept idle (idleNodes 1): n1"},
		{name: "two idle past the hold, one wanted: the other goes",
			o: obs(keep(1), nodes(node("n1"), node("n2")), idle("n1", time.Hour), idle("n2", time.Hour)), action: ScaleDown, target: 1, remove: []string{"n2"}},
		{name: "a Pod takes the idle node: another boots for the next",
			o: obs(keep(1), nodes(node("n1")), pods(pod("a"))), action: Provision, target: 2, newNodes: 1, contains: "keeping 1 node idle"},
		{name: "a Pod runs on the only node: another boots",
			o: obs(keep(1), nodes(node("n1")), pods(pod("a", on("n1"), phase(corev1.PodRunning)))), action: Provision, target: 2, newNodes: 1},
		{name: "the cap bounds them",
			o: obs(keep(3), func(o *Observed) { o.MaxNodes = 2 }), action: Provision, target: 2, newNodes: 2},
		{name: "outside the window (0): the idle node goes after the hold",
			o: obs(keep(0), nodes(node("n1")), idle("n1", time.Hour)), action: Teardown, target: 0, remove: []string{"n1"}},
		{name: "a cordoned node is not kept, and one boots instead",
			o: obs(keep(1), nodes(node("n1", cordoned)), idle("n1", time.Hour)), action: Provision, target: 2, newNodes: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Decide(tt.o)
			if err != nil {
				t.Fatal(err)
			}
			if d.Action != tt.action || d.Target != tt.target || len(d.New) != tt.newNodes || !slices.Equal(d.Remove, tt.remove) {
				t.Fatalf("%s (new %d, remove %v); want %s nodes=%d, new %d, remove %v", d, len(d.New), d.Remove, tt.action, tt.target, tt.newNodes, tt.remove)
			}
			for _, n := range d.New {
				if n.Size != size && len(n.For) == 0 {
					t.Errorf("an idle node of %s, want the smallest %s", n.Size, size)
				}
			}
			if !strings.Contains(d.Reason, tt.contains) {
				t.Errorf("reason %q, want it to say %q", d.Reason, tt.contains)
			}
		})
	}
	if _, err := Decide(obs(keep(-1))); err == nil {
		t.Error("negative idle nodes accepted")
	}
}

// Claimed counts the nodes that were spare (the previous Decision's Idle) and that a Pod
// has taken since, bound or put there by the simulation; Idle carries them and the spare
// ones to the next pass.
func TestClaimedIdleNodes(t *testing.T) {
	wereIdle := func(names ...string) func(*Observed) { return func(o *Observed) { o.WereIdle = names } }
	keep := func(o *Observed) { o.IdleNodes = 1 }
	tests := []struct {
		name                    string
		o                       Observed
		spare, booting, claimed int
		idle                    []string
	}{
		{name: "a spare node, no Pod",
			o: obs(keep, nodes(node("n1"))), spare: 1, idle: []string{"n1"}},
		{name: "a Pod runs on a node that was spare: claimed",
			o: obs(keep, nodes(node("n1")), wereIdle("n1"), pods(pod("a", on("n1")))), claimed: 1, idle: []string{"n1"}},
		{name: "a Pod on a node that was never spare (booted for it): not claimed",
			o: obs(keep, nodes(node("n1")), pods(pod("a", on("n1"))))},
		{name: "a pending Pod the simulation puts on the spare node: claimed",
			o: obs(keep, nodes(node("n1")), wereIdle("n1"), pods(pod("a"))), claimed: 1, idle: []string{"n1"}},
		{name: "the claimed node's Pod is done: spare again",
			o: obs(keep, nodes(node("n1")), wereIdle("n1"), pods(pod("a", on("n1"), phase(corev1.PodSucceeded)))), spare: 1, idle: []string{"n1"}},
		{name: "a claimed node that is gone counts for nothing",
			o: obs(keep, wereIdle("n1"), func(o *Observed) { o.Booting = []string{"b1"} }), spare: 1, booting: 1, idle: []string{"b1"}},
		{name: "one claimed, its refill booting",
			o:     obs(keep, nodes(node("n1")), wereIdle("n1", "b1"), pods(pod("a", on("n1"))), func(o *Observed) { o.Booting = []string{"b1"} }),
			spare: 1, booting: 1, claimed: 1, idle: []string{"b1", "n1"}},
		{name: "a DaemonSet Pod does not claim a node",
			o:     obs(keep, nodes(node("n1"), node("n2")), wereIdle("n1", "n2"), pods(pod("a", on("n1")), pod("ds", on("n2"), ownedBy("DaemonSet", "agent")))),
			spare: 1, claimed: 1, idle: []string{"n1", "n2"}},
		{name: "a job's node, sealed (fresh node per job) while the job runs: still claimed",
			o:       obs(keep, nodes(node("n1", cordoned)), wereIdle("n1"), pods(pod("job", on("n1"), lbl(LabelCIJob, "1"))), func(o *Observed) { o.FreshNodePerJob = true }),
			claimed: 1, idle: []string{"n1"}},
		{name: "a booting refill a waiting Pod is put on: claimed before it joins",
			o: obs(keep, wereIdle("b1"), pods(pod("a")), func(o *Observed) { o.Booting = []string{"b1"} }), claimed: 1, idle: []string{"b1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Decide(tt.o)
			if err != nil {
				t.Fatal(err)
			}
			idle := slices.Sorted(slices.Values(d.Idle))
			if d.Spare != tt.spare || d.SpareBooting != tt.booting || d.Claimed != tt.claimed || !slices.Equal(idle, tt.idle) {
				t.Errorf("spare %d (%d booting), claimed %d, idle %v; want spare %d (%d booting), claimed %d, idle %v (%s)",
					d.Spare, d.SpareBooting, d.Claimed, idle, tt.spare, tt.booting, tt.claimed, tt.idle, d)
			}
		})
	}
}
