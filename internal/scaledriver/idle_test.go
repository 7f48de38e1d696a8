package scaledriver

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/scale"
)

// A cluster with idle nodes boots them with no Pod, inside its window only, and says on
// the Cluster how many it wants and has.
func TestIdleNodesInTheirWindow(t *testing.T) {
	tests := []struct {
		name     string
		schedule string // t0 is a Tuesday, 12:00 UTC
		action   scale.Action
		reports  [][2]int
	}{
		{"always", "", scale.Provision, [][2]int{{1, 0}, {1, 1}}},
		{"inside the window", "Mon-Fri 08:00-18:00", scale.Provision, [][2]int{{1, 0}, {1, 1}}},
		{"outside the window", "Sat,Sun 08:00-18:00", scale.None, [][2]int{{0, 0}}},
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
			r.settle()
			r.clock.advance(time.Second)
			if dec, err = r.d.RunPass(ctx); err != nil || (dec.Action != scale.None && dec.Action != scale.Hold) {
				t.Fatalf("second pass: %s, %v; want nothing more", dec, err)
			}
			r.status.mu.Lock()
			got := slices.Clone(r.status.idle)
			r.status.mu.Unlock()
			if !slices.Equal(got, tt.reports) {
				t.Errorf("idle node reports (wanted, spare) %v, want %v", got, tt.reports)
			}
		})
	}
	if _, err := New(Config{Cluster: cluster, NodeSize: testSize, IdleNodes: 1, IdleSchedule: "weekdays"}, Deps{Tenant: newRig(t, Config{}, false, nil).client, Provider: newRig(t, Config{}, false, nil).prov}); err == nil {
		t.Error("a bad idle schedule was accepted")
	}
}
