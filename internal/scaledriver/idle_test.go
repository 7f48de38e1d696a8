package scaledriver

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // Europe/Berlin whatever this host has installed, as in the daemon

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/scale"
)

// A cluster with idle nodes boots them with no Pod, inside its window only, and says on
// the Cluster how many it wants and has.
func TestIdleNodesInTheirWindow(t *testing.T) {
	tests := []struct {
		name     string
		schedule string // t0 is a Tuesday, 12:00 UTC
		booting  bool   // the node booted for the idle count has not registered yet
		action   scale.Action
		reports  [][4]int // wanted, spare, of which booting, claimed
	}{
		{"always", "", false, scale.Provision, [][4]int{{1, 0, 0, 0}, {1, 1, 0, 0}}},
		{"inside the window", "Mon-Fri 08:00-18:00", false, scale.Provision, [][4]int{{1, 0, 0, 0}, {1, 1, 0, 0}}},
		{"still booting", "", true, scale.Provision, [][4]int{{1, 0, 0, 0}, {1, 1, 1, 0}}},
		{"outside the window", "Sat,Sun 08:00-18:00", false, scale.None, [][4]int{{0, 0, 0, 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, Config{IdleNodes: 1, IdleSchedule: tt.schedule}, false, nil)
			ctx := context.Background()
			r.start(ctx)
			dec, err := r.d.RunPass(ctx)
			if err != nil || dec.Action != tt.action {
				t.Fatalf("first pass: %s, %v; want %s", dec, err, tt.action)
			}
			if tt.booting {
				// The fake registers the Node at once; without it the machine is booting.
				if err := r.client.CoreV1().Nodes().Delete(ctx, r.prov.Instances()[0].Name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			r.settle()
			r.clock.advance(time.Second)
			if dec, err = r.d.RunPass(ctx); err != nil || (dec.Action != scale.None && dec.Action != scale.Hold) {
				t.Fatalf("second pass: %s, %v; want nothing more", dec, err)
			}
			r.status.mu.Lock()
			got := slices.Clone(r.status.idle)
			r.status.mu.Unlock()
			if !slices.Equal(got, tt.reports) {
				t.Errorf("idle node reports (wanted, spare, booting, claimed) %v, want %v", got, tt.reports)
			}
		})
	}
}

// A Pod that lands on the idle node claims it: the Cluster says 1 claimed while a refill
// boots, and 0 again once the Pod is done and the node is spare.
func TestIdleNodeClaimed(t *testing.T) {
	r := newRig(t, Config{IdleNodes: 1}, false, nil)
	ctx := context.Background()
	r.start(ctx)
	pass := func(want scale.Action) {
		t.Helper()
		r.settle()
		r.clock.advance(time.Second)
		if dec, err := r.d.RunPass(ctx); err != nil || dec.Action != want {
			t.Fatalf("pass: %s, %v; want %s", dec, err, want)
		}
	}
	pass(scale.Provision) // the idle node
	pass(scale.None)
	idle := r.prov.Instances()[0].Name
	if _, err := r.client.CoreV1().Pods("default").Create(ctx, testPod("job", boundTo(idle)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pass(scale.Provision) // its refill
	pass(scale.None)
	p, err := r.client.CoreV1().Pods("default").Get(ctx, "job", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = corev1.PodSucceeded
	if _, err := r.client.CoreV1().Pods("default").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pass(scale.Hold) // two spare, one wanted: the other waits out the hold

	r.status.mu.Lock()
	got := slices.Clone(r.status.idle)
	r.status.mu.Unlock()
	// The fake registers a Node within Create, so the refill is never seen booting.
	want := [][4]int{{1, 0, 0, 0}, {1, 1, 0, 0}, {1, 0, 0, 1}, {1, 1, 0, 1}, {1, 2, 0, 0}}
	if !slices.Equal(got, want) {
		t.Errorf("idle node reports (wanted, spare, booting, claimed) %v, want %v", got, want)
	}
}

// A schedule that does not parse turns idle nodes off, not the driver: it still boots for
// Pods, and the Cluster says once what was wrong and what would be right.
func TestBadIdleScheduleKeepsScaling(t *testing.T) {
	tests := []struct {
		name     string
		schedule string
		want     bootCall // the one RecordIdleSchedule call; message: a part of it
		idle     bool     // an idle node boots on the first pass
	}{
		{"unknown zone", "Mon-Sun 00:00-24:00 Mars/Olympus", bootCall{false, v1.ReasonBadIdleSchedule, `zone "Mars/Olympus" is not an IANA time zone name`}, false},
		{"from before the CRD checked it", "weekdays 08:00-18:00", bootCall{false, v1.ReasonBadIdleSchedule, `day "weekdays"`}, false},
		{"good", "Mon-Sun 00:00-24:00 Europe/Berlin", bootCall{true, "IdleScheduleParsed", `"Mon-Sun 00:00-24:00 Europe/Berlin" parses`}, true},
		{"none", "", bootCall{true, "IdleScheduleParsed", "empty: idle nodes are kept at all times"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, Config{IdleNodes: 1, IdleSchedule: tt.schedule}, false, nil)
			ctx := context.Background()
			r.start(ctx)
			first := scale.None
			if tt.idle {
				first = scale.Provision
			}
			dec, err := r.d.RunPass(ctx)
			if err != nil || dec.Action != first {
				t.Fatalf("first pass: %s, %v; want %s", dec, err, first)
			}
			if _, err := r.client.CoreV1().Pods("default").Create(ctx, testPod("job"), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			r.settle()
			r.clock.advance(time.Second)
			if dec, err = r.d.RunPass(ctx); err != nil || dec.Action != scale.Provision {
				t.Fatalf("a pending Pod: %s, %v; want a node booted for it", dec, err)
			}

			r.status.mu.Lock()
			told, idle := slices.Clone(r.status.schedule), slices.Clone(r.status.idle)
			r.status.mu.Unlock()
			if len(told) != 1 || told[0].ok != tt.want.ok || told[0].reason != tt.want.reason || !strings.Contains(told[0].message, tt.want.message) {
				t.Fatalf("idle schedule reports %+v, want one %+v", told, tt.want)
			}
			if !tt.want.ok {
				for _, part := range []string{"no idle nodes are kept", `e.g. "Mon-Fri 08:00-18:00 Europe/Berlin"`, "Fix spec.idleSchedule"} {
					if !strings.Contains(told[0].message, part) {
						t.Errorf("message %q does not say %q", told[0].message, part)
					}
				}
				if len(idle) == 0 || idle[0][0] != 0 {
					t.Errorf("idle node reports %v, want none wanted", idle)
				}
			}
		})
	}
}
