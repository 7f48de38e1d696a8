package provider

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/placement"
)

// A sleeping tenant runs nothing, so it is not bound to its host: the door
// that gets a connection for it decides where it wakes (placement.Rewake).
// When that is another host, the door asks for a move (status.movingTo) and
// holds the connection as during a drain; the tenant's host hands the
// sleeping tenant over (its Lease, nothing else: its data and CAs are
// shared); the new host holds its port, says it arrived, and the held
// connection, passed on to it, wakes it there.

// wakePlaceEvery bounds how often a door asks where one sleeping cluster wakes.
const wakePlaceEvery = 5 * time.Second

// placeWake decides, for a door's connection to a sleeping cluster, where it
// wakes; if not on its host it writes the move and returns the cluster as
// written, with the resourceVersion before the write: the informer's object
// until then is stale, and the door holds on.
func (p *Provider) placeWake(u *unstructured.Unstructured, fromPeer bool) (_ *unstructured.Unstructured, staleRV string) {
	o := p.cfg.Ownership
	if o == nil || fromPeer {
		return u, ""
	}
	c, err := v1.FromUnstructured(u)
	if err != nil || c.Status.Phase != v1.PhaseAsleep || c.Status.MovingTo != "" || c.Status.Host == "" ||
		c.Spec.Datastore != "postgres" || c.DeletionTimestamp != nil {
		return u, ""
	}
	if live, known := o.HostLive(c.Status.Host); !live || !known {
		return u, "" // its host is lost: a takeover places it
	}
	p.failMu.Lock()
	last, recent := p.wakePlaced[c.Name]
	recent = recent && time.Since(last.at) < wakePlaceEvery
	if !recent {
		if p.wakePlaced == nil {
			p.wakePlaced = map[string]wakePlacement{}
		}
		p.wakePlaced[c.Name] = wakePlacement{at: time.Now()}
	}
	p.failMu.Unlock()
	if recent {
		return last.moving(u)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	view, err := o.Observe(ctx)
	if err != nil {
		p.log.Warn("placing the wake of a sleeping cluster: it wakes on its host", "cluster", c.Name, "err", err)
		return u, ""
	}
	d, moved, err := placement.Rewake(view.Candidates(), c.Status.Host)
	if err != nil || !moved {
		return u, ""
	}
	from := c.Status.Host
	wrote := false
	err = ScaleStatus{Client: p.dyn}.updateIf(ctx, c.Name, func(c *v1.Cluster) bool {
		if c.Status.Phase != v1.PhaseAsleep || c.Status.MovingTo != "" || c.Status.Host != from {
			return false // woken, moving or moved meanwhile
		}
		c.Status.MovingTo = d.Host
		meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: v1.ConditionPlaced, Status: metav1.ConditionTrue,
			Reason: ReasonMoving, Message: truncate("a connection came for it asleep; " + d.Reason), ObservedGeneration: c.Generation})
		wrote = true
		return true
	})
	if err != nil || !wrote {
		if err != nil {
			p.log.Warn("asking for a sleeping cluster to wake on another host: it wakes on its host", "cluster", c.Name, "to", d.Host, "err", err)
		}
		return u, ""
	}
	p.log.Info("a sleeping cluster wakes on another host", "cluster", c.Name, "from", from, "to", d.Host, "reason", d.Reason)
	w := wakePlacement{at: time.Now(), to: d.Host, staleRV: u.GetResourceVersion()}
	p.failMu.Lock()
	p.wakePlaced[c.Name] = w
	p.failMu.Unlock()
	return w.moving(u)
}

// wakePlacement is a door's last answer of where a sleeping cluster wakes.
type wakePlacement struct {
	at      time.Time
	to      string // the host it moves to; "" for its own
	staleRV string // its resourceVersion before the move was written
}

// moving is u as the door wrote it: moving to w.to, with the version the
// informer's copy is stale at; u itself when it does not move (or the
// informer has seen more since).
func (w wakePlacement) moving(u *unstructured.Unstructured) (*unstructured.Unstructured, string) {
	if w.to == "" || u.GetResourceVersion() != w.staleRV {
		return u, ""
	}
	out := u.DeepCopy()
	if err := unstructured.SetNestedField(out.Object, w.to, "status", "movingTo"); err != nil {
		return u, ""
	}
	return out, w.staleRV
}

// moveRequested starts, on the cluster's host, the move a door asked for
// (status.movingTo names another host, and no drain of this host is moving
// it). It reports whether one runs. Only a cluster that sleeps, and that
// nothing is waking, moves; else the move is taken back and it stays.
func (p *Provider) moveRequested(ctx context.Context, c *v1.Cluster) (bool, error) {
	o := p.cfg.Ownership
	d, ok := o.(Drainer)
	if o == nil || !ok || c.Status.MovingTo == "" || c.Status.MovingTo == o.Name() || c.DeletionTimestamp != nil || p.isMoving(c.Name) {
		return false, nil
	}
	to := c.Status.MovingTo
	p.sleepMu.Lock()
	s := p.sleepers[c.Name]
	asleep := s != nil && s.asleep && s.cause == "" && s.gate != nil && s.gate.Listening()
	if asleep {
		// From here a connection on its port waits in the backlog (and is
		// refused with the port): every door holds the cluster's new ones.
		s.gate.Stop()
	}
	p.sleepMu.Unlock()
	if !asleep {
		p.countMove("stayed")
		why := fmt.Sprintf("it was to move to %s, but it is awake or waking on %s: it stays", to, o.Name())
		p.log.Info("a requested move is taken back", "cluster", c.Name, "to", to, "why", why)
		return true, p.recordPlaced(ctx, c.Name, o.Name(), metav1.ConditionTrue, ReasonPlaced, why)
	}
	p.failMu.Lock()
	p.moving[c.Name] = true
	p.failMu.Unlock()
	defer func() {
		p.failMu.Lock()
		delete(p.moving, c.Name)
		p.failMu.Unlock()
	}()
	start := time.Now()
	p.letGo(ctx, c.Name)
	if err := d.Handover(ctx, c.Name, to); err != nil {
		// Still ours: it sleeps here again at the next pass.
		p.countMove("failed")
		_ = p.recordPlaced(ctx, c.Name, o.Name(), metav1.ConditionTrue, ReasonPlaced, fmt.Sprintf("it stays on %s: handing it to %s failed: %v", o.Name(), to, err))
		return true, fmt.Errorf("handing the sleeping cluster to %s: %w", to, err)
	}
	p.countMove("handed_over")
	p.log.Info("sleeping cluster handed over to wake there", "cluster", c.Name, "to", to, "took", time.Since(start).Round(time.Millisecond))
	// A write the new host sees (a Lease is not what it watches): it takes it now.
	return true, p.recordMove(ctx, c.Name, to, "handed over asleep to "+to+" by "+o.Name()+", to wake there")
}

func (p *Provider) countMove(result string) {
	if p.sleepMetrics != nil {
		p.sleepMetrics.Moves.WithLabelValues(result).Inc()
	}
}
