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
