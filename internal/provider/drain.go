package provider

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/placement"
)

// Drainer is the part of hosts.Membership a drain needs.
type Drainer interface {
	// Draining: `host drain` asked this host to give its tenants away.
	Draining() bool
	// Handover gives a cluster's Lease, held here, to host to.
	Handover(ctx context.Context, cluster, to string) error
}

// Reasons of the Placed condition while a cluster moves.
const (
	ReasonMoving = "Moving"
	ReasonMoved  = "Moved"
)

const (
	// drainCheck is how often a host looks whether it is drained and, while it
	// is, moves its next tenant.
	drainCheck = 2 * time.Second
	// moveSettle is how long a host waits after saying a cluster moves before it
	// stops it there: every door's informer has seen status.movingTo by then
	// (each host's apiserver polls the shared database about once a second), and
	// holds the cluster's new connections instead of dialling the old host. A
	// door that had not, and passed one on to the old host, is held there.
	moveSettle = 2 * time.Second
	// backendHold bounds how long a door holds a connection for a moving
	// cluster before it refuses it.
	backendHold = 60 * time.Second
)

// drainLoop moves this host's tenants away, one at a time, while its Host is
// drained.
func (p *Provider) drainLoop(ctx context.Context) {
	d, ok := p.cfg.Ownership.(Drainer)
	if !ok {
		return
	}
	t := time.NewTicker(drainCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !d.Draining() {
			continue
		}
		name, ok := p.nextToMove()
		if !ok {
			continue
		}
		start := time.Now()
		if err := p.move(ctx, d, name); err != nil {
			p.log.Error("moving a cluster off this drained host", "cluster", name, "err", err)
			continue
		}
		p.log.Info("cluster handed over", "cluster", name, "took", time.Since(start).Round(time.Millisecond))
	}
}

// nextToMove is the first cluster, by name, this host runs and is not moving.
func (p *Provider) nextToMove() (string, bool) {
	var names []string
	for _, u := range p.cachedClusters() {
		if !p.runsHere(u) || u.GetDeletionTimestamp() != nil {
			continue
		}
		if to, _, _ := unstructured.NestedString(u.Object, "status", "movingTo"); to != "" {
			continue
		}
		names = append(names, u.GetName())
	}
	sort.Strings(names)
	if len(names) == 0 {
		return "", false
	}
	return names[0], true
}

// move hands cluster to the host placement picks: it says so on the Cluster
// (doors hold its new connections from then on), stops it here (its
// apiserver ends its requests in flight; its nodes go, its Pods are scheduled
// again there), and gives its Lease to that host, which starts it from the
// shared datastore and CAs and then clears movingTo.
func (p *Provider) move(ctx context.Context, d Drainer, cluster string) error {
	o := p.cfg.Ownership
	view, err := o.Observe(ctx)
	if err != nil {
		return err
	}
	c, err := p.cached(cluster)
	if err != nil {
		return err
	}
	if c.Spec.Datastore != "postgres" {
		return fmt.Errorf("its datastore is sqlite, on this host's disk: it cannot move; delete it, or back it up and restore it elsewhere")
	}
	dec, err := placement.Decide(view.Candidates())
	if errors.Is(err, placement.ErrNoHost) {
		return fmt.Errorf("no host can take it: %w", err)
	}
	if err != nil {
		return err
	}
	p.failMu.Lock()
	p.moving[cluster] = true
	p.failMu.Unlock()
	defer func() {
		p.failMu.Lock()
		delete(p.moving, cluster)
		p.failMu.Unlock()
	}()
	if err := p.recordMove(ctx, cluster, dec.Host, "moving to "+dec.Host+" ("+o.Name()+" is drained): "+dec.Reason); err != nil {
		return err
	}
	time.Sleep(moveSettle)
	p.letGo(ctx, cluster)
	if err := d.Handover(ctx, cluster, dec.Host); err != nil {
		// Still ours: run it here again.
		_ = p.recordMove(ctx, cluster, "", "")
		return err
	}
	// A write the new host sees (a Lease is not what it watches): it takes it now.
	return p.recordMove(ctx, cluster, dec.Host, "handed over to "+dec.Host+" by "+o.Name()+", which is drained")
}

// recordMove sets status.movingTo and says why; to "" takes it back.
func (p *Provider) recordMove(ctx context.Context, cluster, to, msg string) error {
	return ScaleStatus{Client: p.dyn}.updateIf(ctx, cluster, func(c *v1.Cluster) bool {
		c.Status.MovingTo = to
		if to != "" {
			meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: v1.ConditionPlaced, Status: metav1.ConditionTrue,
				Reason: ReasonMoving, Message: truncate(msg), ObservedGeneration: c.Generation})
		}
		return true
	})
}

// arrived ends a move to this host once the cluster answers here, or holds
// its port here asleep: movingTo cleared, status.host this host, so doors
// carry it here. It reads the Cluster afresh: a cached one may be a move that
// already ended.
func (p *Provider) arrived(ctx context.Context, c *v1.Cluster, asleep bool) error {
	o := p.cfg.Ownership
	if o == nil || c.Status.MovingTo != o.Name() {
		return nil
	}
	return ScaleStatus{Client: p.dyn}.updateIf(ctx, c.Name, func(c *v1.Cluster) bool {
		if c.Status.MovingTo != o.Name() {
			return false
		}
		why := "moved here" // the move's condition says from where (status.host is this host's since its first pass here)
		if cur := meta.FindStatusCondition(c.Status.Conditions, v1.ConditionPlaced); cur != nil && cur.Reason == ReasonMoving {
			why += ": " + cur.Message
		}
		if asleep {
			why += "; asleep, and its next client wakes it here"
		}
		c.Status.Host, c.Status.MovingTo = o.Name(), ""
		meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: v1.ConditionPlaced, Status: metav1.ConditionTrue,
			Reason: ReasonMoved, Message: truncate(why), ObservedGeneration: c.Generation})
		return true
	})
}

// isMoving: this host is handing the cluster over; it must not start it again.
func (p *Provider) isMoving(cluster string) bool {
	p.failMu.Lock()
	defer p.failMu.Unlock()
	return p.moving[cluster]
}

// holdWhileMoving waits, for a door's connection, until a moving cluster has
// arrived (or backendHold passed); it returns the cluster's object then, and
// whether it waited. The informer's object of resourceVersion staleRV is older
// than a move this door wrote, and is not believed.
func (p *Provider) holdWhileMoving(cluster string, u *unstructured.Unstructured, staleRV string) (_ *unstructured.Unstructured, held bool) {
	deadline := time.Now().Add(backendHold)
	for ; ; held = true {
		if to, _, _ := unstructured.NestedString(u.Object, "status", "movingTo"); to == "" || time.Now().After(deadline) {
			return u, held
		}
		time.Sleep(50 * time.Millisecond)
		obj, err := p.lister.Get(cluster)
		if err != nil {
			return u, held
		}
		if next, ok := obj.(*unstructured.Unstructured); ok && (staleRV == "" || next.GetResourceVersion() != staleRV) {
			u = next
		}
	}
}
