package scaledriver

import (
	"context"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
		reports  [][3]int // wanted, spare, of which booting
	}{
		{"always", "", false, scale.Provision, [][3]int{{1, 0, 0}, {1, 1, 0}}},
		{"inside the window", "Mon-Fri 08:00-18:00", false, scale.Provision, [][3]int{{1, 0, 0}, {1, 1, 0}}},
		{"still booting", "", true, scale.Provision, [][3]int{{1, 0, 0}, {1, 1, 1}}},
		{"outside the window", "Sat,Sun 08:00-18:00", false, scale.None, [][3]int{{0, 0, 0}}},
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
				t.Errorf("idle node reports (wanted, spare, booting) %v, want %v", got, tt.reports)
			}
		})
	}
	if _, err := New(Config{Cluster: cluster, NodeSize: testSize, IdleNodes: 1, IdleSchedule: "weekdays"}, Deps{Tenant: newRig(t, Config{}, false, nil).client, Provider: newRig(t, Config{}, false, nil).prov}); err == nil {
		t.Error("a bad idle schedule was accepted")
	}
}
