package provider

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/hosts"
	"github.com/socialweb-computer/socialweb/internal/pki"
	"github.com/socialweb-computer/socialweb/internal/placement"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
)

// Ownership is the part of hosts.Membership the provider uses: which clusters
// this host runs. Its errors wrap the management API's.
type Ownership interface {
	// Name is this host's.
	Name() string
	// Fenced: this host went a Lease duration without renewing; it runs nothing.
	Fenced() bool
	// Holder is the host holding a cluster's Lease, "" for none.
	Holder(ctx context.Context, cluster string) (string, error)
	// Claim takes a cluster's Lease; hosts.ErrHeldElsewhere when another has it.
	Claim(ctx context.Context, cluster string) error
	// Release gives a deleted cluster's Lease back.
	Release(ctx context.Context, cluster string) error
	// Observe is the service as this host sees it, for placement.
	Observe(ctx context.Context) (hosts.View, error)
	// HostLive is a host's liveness at the last poll of the Leases; known is
	// false before the poll has seen it.
	HostLive(host string) (live, known bool)
	// Takeover moves a cluster's Lease from a host whose Lease lapsed to this
	// one; hosts.ErrHeldElsewhere when another host was first or from is back.
	Takeover(ctx context.Context, cluster, from string) error
	// DoorOf is another host's front door (host:port), for connections to the
	// clusters it runs.
	DoorOf(host string) (string, bool)
}

// Reasons of the Placed condition.
const (
	ReasonPlaced      = "Placed"
	ReasonAdopted     = "Adopted"
	ReasonUnplaceable = "Unplaceable"
	// ReasonFailedOver: the host that ran it stopped renewing its Lease, and
	// this one took it over.
	ReasonFailedOver = "FailedOver"
	// ReasonHostLost: its host stopped renewing and nothing else can run it.
	ReasonHostLost = "HostLost"
)

// unplacedRetry is how soon a cluster this host did not take is looked at
// again: the host placement chose claims it at once; if it does not (it died
// in between), placement runs again over the hosts left.
const unplacedRetry = 5 * time.Second

// claimedRequeue is how soon a cluster just claimed is reconciled: once the
// informer has its placement.
const claimedRequeue = 100 * time.Millisecond

// owns says whether this host runs c now, claiming it when it is unowned and
// placement picks this host. wait is when to look again (0: an event will
// tell); a cluster claimed now is owned with a short wait, so that it is acted
// on as it is after its placement was written.
func (p *Provider) owns(ctx context.Context, c *v1.Cluster) (owned bool, wait time.Duration, err error) {
	o := p.cfg.Ownership
	if o == nil {
		return true, 0, nil
	}
	if o.Fenced() || p.isMoving(c.Name) {
		return false, unplacedRetry, nil
	}
	holder, err := o.Holder(ctx, c.Name)
	if err != nil {
		return false, 0, err
	}
	switch {
	case holder == o.Name():
		return true, 0, nil
	case holder != "":
		return p.takeOver(ctx, c, holder)
	}
	// Unowned. Files of it here (a cluster made before hosts were, or restored
	// here) keep it here; a deleted one is taken by whoever sees it first, so no
	// cluster waits on a placement to be deleted.
	reason, why := ReasonPlaced, ""
	switch {
	case p.hasLocalData(c.Name):
		reason, why = ReasonAdopted, "adopted by "+o.Name()+": its files are on this host"
	case c.DeletionTimestamp != nil:
		reason, why = ReasonAdopted, "taken by "+o.Name()+" to be deleted"
	default:
		view, err := o.Observe(ctx)
		if err != nil {
			return false, 0, err
		}
		d, err := placement.Decide(view.Candidates())
		if errors.Is(err, placement.ErrNoHost) {
			p.log.Warn("cluster cannot be placed", "cluster", c.Name, "err", err)
			return false, 10 * time.Second, p.recordPlaced(ctx, c.Name, "", metav1.ConditionFalse, ReasonUnplaceable, err.Error())
		}
		if err != nil {
			return false, 0, err
		}
		if d.Host != o.Name() {
			return false, unplacedRetry, nil
		}
		why = d.Reason
	}
	if err := o.Claim(ctx, c.Name); errors.Is(err, hosts.ErrHeldElsewhere) {
		p.log.Info("another host took the cluster first", "cluster", c.Name, "err", err)
		return false, 0, nil
	} else if err != nil {
		return false, 0, err
	}
	p.log.Info("cluster placed here", "cluster", c.Name, "reason", why)
	return true, claimedRequeue, p.recordPlaced(ctx, c.Name, o.Name(), metav1.ConditionTrue, reason, why)
}

// takeOver runs c here if its holder's Lease lapsed, its data is in the shared
// datastore (a sqlite tenant's is on its host's disk: it waits for that host),
// and placement over the live hosts picks this one.
func (p *Provider) takeOver(ctx context.Context, c *v1.Cluster, holder string) (bool, time.Duration, error) {
	o := p.cfg.Ownership
	if live, known := o.HostLive(holder); live || !known {
		return false, 0, nil // its host's loss will enqueue it (HostLost)
	}
	if p.hasLocalData(c.Name) {
		// Its files are here: this host ran it under another name (its hostname
		// changed, or --host-name did), whatever its datastore.
		if err := o.Takeover(ctx, c.Name, holder); errors.Is(err, hosts.ErrHeldElsewhere) {
			return false, 0, nil
		} else if err != nil {
			return false, 0, err
		}
		return true, claimedRequeue, p.recordPlaced(ctx, c.Name, o.Name(), metav1.ConditionTrue, ReasonAdopted,
			fmt.Sprintf("adopted by %s from %s, whose Lease lapsed: its files are on this host", o.Name(), holder))
	}
	if c.Spec.Datastore != "postgres" {
		return false, 0, p.recordPlaced(ctx, c.Name, "", metav1.ConditionFalse, ReasonHostLost,
			fmt.Sprintf("its host %s stopped renewing its Lease; its datastore is sqlite on that host's disk, so it runs again only when %s is back", holder, holder))
	}
	view, err := o.Observe(ctx)
	if err != nil {
		return false, 0, err
	}
	d, err := placement.Decide(view.Candidates())
	if errors.Is(err, placement.ErrNoHost) {
		return false, 10 * time.Second, p.recordPlaced(ctx, c.Name, "", metav1.ConditionFalse, ReasonUnplaceable,
			fmt.Sprintf("its host %s stopped renewing its Lease and %v", holder, err))
	}
	if err != nil {
		return false, 0, err
	}
	if d.Host != o.Name() {
		return false, unplacedRetry, nil
	}
	if err := o.Takeover(ctx, c.Name, holder); errors.Is(err, hosts.ErrHeldElsewhere) {
		p.log.Info("the cluster was not taken over here", "cluster", c.Name, "err", err)
		return false, 0, nil
	} else if err != nil {
		return false, 0, err
	}
	why := fmt.Sprintf("taken over from %s, whose Lease lapsed; %s", holder, d.Reason)
	p.log.Warn("cluster taken over", "cluster", c.Name, "from", holder, "reason", d.Reason)
	p.setPrepared(c.Name, false)
	p.failMu.Lock()
	p.takenOver[c.Name] = true
	p.failMu.Unlock()
	return true, claimedRequeue, p.recordPlaced(ctx, c.Name, o.Name(), metav1.ConditionTrue, ReasonFailedOver, why)
}

// HostLost enqueues the clusters a lapsed host ran, for a takeover.
func (p *Provider) HostLost(host string) {
	for _, u := range p.cachedClusters() {
		if h, _, _ := unstructured.NestedString(u.Object, "status", "host"); h == host {
			p.queue.Add(u.GetName())
		}
	}
}

// EnqueueAll looks at every cluster again: this host was fenced, and stops
// those it runs.
func (p *Provider) EnqueueAll() {
	for _, u := range p.cachedClusters() {
		p.queue.Add(u.GetName())
	}
}

// cachedClusters are the Clusters in the informer's cache (none if it cannot be read).
func (p *Provider) cachedClusters() []*unstructured.Unstructured {
	objs, err := p.lister.List(labels.Everything())
	if err != nil {
		return nil
	}
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		if u, ok := o.(*unstructured.Unstructured); ok {
			out = append(out, u)
		}
	}
	return out
}

// hasLocalData: the cluster has a directory in this host's state dir.
func (p *Provider) hasLocalData(cluster string) bool {
	_, err := os.Lstat(ClusterDir(p.cfg.StateDir, cluster))
	return err == nil
}

// recordPlaced writes status.host and the Placed condition.
func (p *Provider) recordPlaced(ctx context.Context, cluster, host string, status metav1.ConditionStatus, reason, msg string) error {
	return ScaleStatus{Client: p.dyn}.updateIf(ctx, cluster, func(c *v1.Cluster) bool {
		cur := meta.FindStatusCondition(c.Status.Conditions, v1.ConditionPlaced)
		if c.Status.Host == host && c.Status.MovingTo == "" && cur != nil && cur.Status == status && cur.Reason == reason && cur.Message == msg {
			return false
		}
		if host != "" {
			c.Status.Host = host
			c.Status.MovingTo = "" // whatever move there was ended here
		}
		meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: v1.ConditionPlaced, Status: status, Reason: reason,
			Message: truncate(msg), ObservedGeneration: c.Generation})
		return true
	})
}

// letGo stops what this host runs of a cluster it does not own (any more): its
// nodes, its control plane, its held port. Its data stays: it is the owner's.
func (p *Provider) letGo(ctx context.Context, cluster string) {
	_, supervised := p.sup.State(ProcessName(cluster))
	p.sleepMu.Lock()
	_, sleeping := p.sleepers[cluster]
	p.sleepMu.Unlock()
	_, left, _ := supervisor.Running(filepath.Join(ClusterDir(p.cfg.StateDir, cluster), "instance.json"))
	if !supervised && !sleeping && !left {
		return
	}
	p.log.Warn("stopping a cluster this host does not own", "cluster", cluster)
	if err := p.stopNodeServices(ctx, cluster); err != nil {
		p.log.Warn("stopping the nodes of a cluster this host does not own", "cluster", cluster, "err", err)
	}
	if err := p.stopProcess(cluster); err != nil {
		p.log.Warn("stopping the control plane of a cluster this host does not own", "cluster", cluster, "err", err)
	}
	p.forgetProbe(cluster)
	p.forgetSleeper(cluster)
	p.setPrepared(cluster, false)
}

// Tenants counts, from the informer's cache, the clusters this host runs and
// how many of those are Ready (awake), for its Host object.
func (p *Provider) Tenants() (owned, awake int) {
	for _, u := range p.cachedClusters() {
		if !p.runsHere(u) {
			continue
		}
		owned++
		if phase, _, _ := unstructured.NestedString(u.Object, "status", "phase"); phase == string(v1.PhaseReady) {
			awake++
		}
	}
	return owned, awake
}

// runsHere says whether the cached cluster's status names this host (every
// cluster does without Ownership).
func (p *Provider) runsHere(u *unstructured.Unstructured) bool {
	if p.cfg.Ownership == nil {
		return true
	}
	host, _, _ := unstructured.NestedString(u.Object, "status", "host")
	return host == p.cfg.Ownership.Name()
}

// heldHere says whether this host may keep running cluster: no Ownership, or
// its Lease names this host (or no host: placement decides). An unreadable
// Lease keeps it, for the reconcile to decide.
func (p *Provider) heldHere(cluster string) bool {
	o := p.cfg.Ownership
	if o == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	holder, err := o.Holder(ctx, cluster)
	return err != nil || holder == "" || holder == o.Name()
}

// removeStaleNodes deletes, once a cluster taken over answers here, every Node
// it has: each ran on the host it was taken from, which is gone, and until
// they turn NotReady (a minute) the scheduler would bind new Pods to them.
// The node services then boot nodes here for the Pods left Pending.
func (p *Provider) removeStaleNodes(ctx context.Context, cluster string) error {
	p.failMu.Lock()
	stale := p.takenOver[cluster]
	p.failMu.Unlock()
	if !stale {
		return nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(ClusterDir(p.cfg.StateDir, cluster), pki.Daemon.Name+".kubeconfig"))
	if err != nil {
		return err
	}
	k, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	nodes, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing the Nodes of %s, taken over: %w", cluster, err)
	}
	for _, n := range nodes.Items {
		if err := k.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting Node %s of %s, which ran on the host it was taken from: %w", n.Name, cluster, err)
		}
		p.log.Info("deleted a Node of the host the cluster was taken from", "cluster", cluster, "node", n.Name)
	}
	p.failMu.Lock()
	delete(p.takenOver, cluster)
	p.failMu.Unlock()
	return nil
}
