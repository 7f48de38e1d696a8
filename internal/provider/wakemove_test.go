package provider

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/hosts"
)

// A door's connection for a sleeping cluster asks for it to wake on a host
// with a tenant's room more, and is held until it arrives there; otherwise it
// goes to its host at once, and nothing is written.
func TestBackendPlacesTheWakeOfASleeper(t *testing.T) {
	busyA := hostsView(map[string]int64{"a": 4, "b": 4})
	busyA.Holders = map[string]string{"ci": "a", "other": "a"}
	evenly := hostsView(map[string]int64{"a": 4, "b": 4})
	evenly.Holders = map[string]string{"ci": "a", "other": "b"}
	for _, tc := range []struct {
		name      string
		view      hosts.View
		datastore string
		phase     v1.Phase
		fromPeer  bool
		wantMove  bool
	}{
		{"a host a tenant emptier: it wakes there", busyA, "postgres", v1.PhaseAsleep, false, true},
		{"hosts as full: it wakes on its host", evenly, "postgres", v1.PhaseAsleep, false, false},
		{"sqlite stays with its disk", busyA, "sqlite", v1.PhaseAsleep, false, false},
		{"awake: not moved", busyA, "postgres", v1.PhaseReady, false, false},
		{"from a peer: its door decided", busyA, "postgres", v1.PhaseAsleep, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "ci", ResourceVersion: "5"}, Spec: v1.ClusterSpec{Datastore: tc.datastore},
				Status: v1.ClusterStatus{Host: "a", Phase: tc.phase, Port: 7501}}
			dyn := clusterClient(t, &c)
			lister, put := clusterCache(t)
			put(c)
			own := &fakeOwnership{name: "a", hostLive: map[string]bool{"a": true, "b": true}, doors: map[string]string{"b": "192.0.2.2:8443"}}
			own.view = tc.view
			p := &Provider{cfg: Config{Ownership: own}, dyn: dyn, lister: lister,
				log: slog.New(slog.DiscardHandler)}
			// The informer sees the move late, then the cluster arrived on b.
			arrive := time.AfterFunc(400*time.Millisecond, func() {
				moving := c
				moving.ResourceVersion, moving.Status.MovingTo = "6", "b"
				put(moving)
				time.Sleep(200 * time.Millisecond)
				moved := c
				moved.ResourceVersion, moved.Status.Host = "7", "b"
				put(moved)
			})
			defer arrive.Stop()
			start := time.Now()
			got, ok := p.Backend("ci", tc.fromPeer)
			waited := time.Since(start)
			u, err := dyn.Resource(v1.ClusterResource).Get(context.Background(), "ci", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			stored, err := v1.FromUnstructured(u)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.wantMove {
				if stored.Status.MovingTo != "" {
					t.Errorf("movingTo %q written, want none", stored.Status.MovingTo)
				}
				if waited > 300*time.Millisecond {
					t.Errorf("Backend held the connection %v for a cluster that does not move", waited)
				}
				if got != "127.0.0.1:7501" || !ok {
					t.Errorf("Backend = %q, %v; want its port here", got, ok)
				}
				return
			}
			if stored.Status.MovingTo != "b" {
				t.Errorf("movingTo %q, want b", stored.Status.MovingTo)
			}
			if pl := meta.FindStatusCondition(stored.Status.Conditions, v1.ConditionPlaced); pl == nil || pl.Reason != ReasonMoving {
				t.Errorf("Placed condition %+v, want reason Moving", pl)
			}
			if waited < 550*time.Millisecond {
				t.Errorf("Backend returned after %v: it believed the informer's stale object, or did not hold the connection", waited)
			}
			if got != "192.0.2.2:8443" || !ok {
				t.Errorf("Backend = %q, %v; want b's door", got, ok)
			}
			if own.count("Observe") != 1 {
				t.Errorf("calls %v: the wake was placed without a view of the hosts", own.calls)
			}
		})
	}
}

// Connections for a sleeping cluster that come together cost one view of the
// hosts, and each is held while it moves: the later ones too, though the
// informer has not seen the move yet.
func TestBackendPlacesAWakeOnce(t *testing.T) {
	view := hostsView(map[string]int64{"a": 4, "b": 4})
	view.Holders = map[string]string{"ci": "a", "other": "a", "third": "a"}
	c := v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "ci", ResourceVersion: "5"}, Spec: v1.ClusterSpec{Datastore: "postgres"},
		Status: v1.ClusterStatus{Host: "a", Phase: v1.PhaseAsleep, Port: 7501}}
	lister, put := clusterCache(t)
	put(c)
	own := &fakeOwnership{name: "a", view: view, hostLive: map[string]bool{"a": true, "b": true}, doors: map[string]string{"b": "192.0.2.2:8443"}}
	p := &Provider{cfg: Config{Ownership: own}, dyn: clusterClient(t, &c), lister: lister, log: slog.New(slog.DiscardHandler)}
	arrive := time.AfterFunc(500*time.Millisecond, func() {
		moved := c
		moved.ResourceVersion, moved.Status.Host = "7", "b"
		put(moved)
	})
	defer arrive.Stop()
	var wg sync.WaitGroup
	got := make([]string, 5)
	for i := range got {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 50 * time.Millisecond)
			got[i], _ = p.Backend("ci", false)
		})
	}
	wg.Wait()
	for i, g := range got {
		if g != "192.0.2.2:8443" {
			t.Errorf("connection %d went to %q, want b's door: it was not held while the cluster moved", i, g)
		}
	}
	if n := own.count("Observe"); n != 1 {
		t.Errorf("%d views of the hosts for 5 connections at once, want 1", n)
	}
}
