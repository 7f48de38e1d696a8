package provider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/hosts"
)

// fakeOwnership is an Ownership whose answers are set by the test and whose
// calls are recorded, in order, as "Method cluster".
type fakeOwnership struct {
	name       string
	fenced     bool
	holder     string
	holderErr  error
	claimErr   error
	view       hosts.View
	observeErr error
	// hostLive is each host's liveness (absent: unknown); takeoverErr Takeover's.
	hostLive    map[string]bool
	takeoverErr error
	doors       map[string]string // DoorOf's answers
	mu          sync.Mutex        // calls, for doors' connections at once
	calls       []string
}

func (f *fakeOwnership) record(call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
}

// count is how often call was made.
func (f *fakeOwnership) count(call string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c == call {
			n++
		}
	}
	return n
}

var _ Ownership = (*fakeOwnership)(nil)

func (f *fakeOwnership) Name() string { return f.name }
func (f *fakeOwnership) Fenced() bool { return f.fenced }

func (f *fakeOwnership) Holder(_ context.Context, cluster string) (string, error) {
	f.record("Holder " + cluster)
	return f.holder, f.holderErr
}

func (f *fakeOwnership) Claim(_ context.Context, cluster string) error {
	f.record("Claim " + cluster)
	return f.claimErr
}

func (f *fakeOwnership) Release(_ context.Context, cluster string) error {
	f.record("Release " + cluster)
	return nil
}

func (f *fakeOwnership) Observe(context.Context) (hosts.View, error) {
	f.record("Observe")
	return f.view, f.observeErr
}

func (f *fakeOwnership) HostLive(host string) (bool, bool) {
	f.record("HostLive " + host)
	live, known := f.hostLive[host]
	return live, known
}

func (f *fakeOwnership) Takeover(_ context.Context, cluster, from string) error {
	f.record("Takeover " + cluster + " from " + from)
	return f.takeoverErr
}

func (f *fakeOwnership) DoorOf(host string) (string, bool) {
	f.record("DoorOf " + host)
	d, ok := f.doors[host]
	return d, ok
}

// hostsView is a view of live hosts, each with free memory in GiB, none holding anything.
func hostsView(free map[string]int64) hosts.View {
	v := hosts.View{Live: map[string]bool{}, Holders: map[string]string{}}
	for name, gib := range free {
		v.Hosts = append(v.Hosts, v1.Host{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: v1.HostStatus{FreeMemory: *resource.NewQuantity(gib<<30, resource.BinarySI)}})
		v.Live[name] = true
	}
	return v
}

// clusterClient is a management API holding c.
func clusterClient(t *testing.T, c *v1.Cluster) *dynamicfake.FakeDynamicClient {
	t.Helper()
	u, err := c.DeepCopy().ToUnstructured()
	if err != nil {
		t.Fatal(err)
	}
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{v1.ClusterResource: "ClusterList"}, u)
}

func TestOwns(t *testing.T) {
	ctx := context.Background()
	heldElsewhere := fmt.Errorf("%w: b holds ci", hosts.ErrHeldElsewhere)
	apiDown := errors.New("the management API is away")
	for _, tc := range []struct {
		name      string
		own       *fakeOwnership // nil: no Ownership
		localData bool           // StateDir/clusters/ci exists
		deleting  bool
		datastore string // spec.datastore
		wantOwned bool
		wantWait  time.Duration
		wantErr   error
		wantCalls []string
		// The Placed condition written, "" none; and status.host after.
		wantReason string
		wantStatus metav1.ConditionStatus
		wantHost   string
		wantMsg    string // in the Placed message
	}{
		{name: "no Ownership: every cluster is this host's", wantOwned: true},
		// A fenced host runs nothing and asks no one.
		{name: "fenced", own: &fakeOwnership{name: "a", fenced: true}, wantWait: unplacedRetry},
		{name: "held by this host", own: &fakeOwnership{name: "a", holder: "a"}, wantOwned: true, wantCalls: []string{"Holder ci"}},
		{name: "held by another host", own: &fakeOwnership{name: "a", holder: "b", hostLive: map[string]bool{"b": true}}, wantCalls: []string{"Holder ci", "HostLive b"}},
		{name: "held by another host, files here too", own: &fakeOwnership{name: "a", holder: "b", hostLive: map[string]bool{"b": true}}, localData: true,
			wantCalls: []string{"Holder ci", "HostLive b"}},
		// Not seen by a poll yet: its loss, if it comes, enqueues the cluster.
		{name: "held by a host not polled yet", own: &fakeOwnership{name: "a", holder: "b"}, wantCalls: []string{"Holder ci", "HostLive b"}},
		// A sqlite tenant's data is on its host's disk: nothing else can run it.
		{
			name: "held by a lost host, sqlite", own: &fakeOwnership{name: "a", holder: "b", hostLive: map[string]bool{"b": false}}, datastore: "sqlite",
			wantCalls: []string{"Holder ci", "HostLive b"}, wantReason: ReasonHostLost, wantStatus: metav1.ConditionFalse, wantMsg: "runs again only when b is back",
		},
		// This host under another name ran it: its files say so.
		{
			name: "held by a lost host, its files here", datastore: "sqlite", localData: true,
			own:       &fakeOwnership{name: "a", holder: "old-name", hostLive: map[string]bool{"old-name": false}},
			wantOwned: true, wantWait: claimedRequeue, wantCalls: []string{"Holder ci", "HostLive old-name", "Takeover ci from old-name"},
			wantReason: ReasonAdopted, wantStatus: metav1.ConditionTrue, wantHost: "a", wantMsg: "adopted by a from old-name",
		},
		{
			name: "held by a lost host, taken over here", datastore: "postgres",
			own:       &fakeOwnership{name: "a", holder: "b", hostLive: map[string]bool{"b": false}, view: hostsView(map[string]int64{"a": 8, "c": 4})},
			wantOwned: true, wantWait: claimedRequeue, wantCalls: []string{"Holder ci", "HostLive b", "Observe", "Takeover ci from b"},
			wantReason: ReasonFailedOver, wantStatus: metav1.ConditionTrue, wantHost: "a", wantMsg: "taken over from b, whose Lease lapsed; placed on a",
		},
		{
			name: "held by a lost host, placed on another", datastore: "postgres",
			own:      &fakeOwnership{name: "a", holder: "b", hostLive: map[string]bool{"b": false}, view: hostsView(map[string]int64{"a": 4, "c": 8})},
			wantWait: unplacedRetry, wantCalls: []string{"Holder ci", "HostLive b", "Observe"},
		},
		{
			name: "held by a lost host, another host took it first", datastore: "postgres",
			own: &fakeOwnership{name: "a", holder: "b", hostLive: map[string]bool{"b": false}, view: hostsView(map[string]int64{"a": 8}),
				takeoverErr: fmt.Errorf("%w: c holds ci now", hosts.ErrHeldElsewhere)},
			wantCalls: []string{"Holder ci", "HostLive b", "Observe", "Takeover ci from b"},
		},
		{name: "the holder cannot be read", own: &fakeOwnership{name: "a", holderErr: apiDown}, wantErr: apiDown, wantCalls: []string{"Holder ci"}},
		{
			name: "unheld, placed here", own: &fakeOwnership{name: "a", view: hostsView(map[string]int64{"a": 8, "b": 4})},
			wantOwned: true, wantWait: claimedRequeue, wantCalls: []string{"Holder ci", "Observe", "Claim ci"},
			wantReason: ReasonPlaced, wantStatus: metav1.ConditionTrue, wantHost: "a", wantMsg: "placed on a",
		},
		// The host placement chose claims it; this one looks again in case it does not.
		{
			name: "unheld, placed on another host", own: &fakeOwnership{name: "a", view: hostsView(map[string]int64{"a": 4, "b": 8})},
			wantWait: unplacedRetry, wantCalls: []string{"Holder ci", "Observe"},
		},
		{
			name: "unheld, no host can take it", own: &fakeOwnership{name: "a", view: hosts.View{}},
			wantWait: 10 * time.Second, wantCalls: []string{"Holder ci", "Observe"},
			wantReason: ReasonUnplaceable, wantStatus: metav1.ConditionFalse, wantMsg: "no host has registered",
		},
		{
			name: "unheld, the view cannot be read", own: &fakeOwnership{name: "a", observeErr: apiDown},
			wantErr: apiDown, wantCalls: []string{"Holder ci", "Observe"},
		},
		// Its files keep it here, whatever placement would say.
		{
			name: "unheld, its files are here", own: &fakeOwnership{name: "a", view: hostsView(map[string]int64{"a": 1, "b": 8})}, localData: true,
			wantOwned: true, wantWait: claimedRequeue, wantCalls: []string{"Holder ci", "Claim ci"},
			wantReason: ReasonAdopted, wantStatus: metav1.ConditionTrue, wantHost: "a", wantMsg: "its files are on this host",
		},
		// No cluster waits on a placement to be deleted.
		{
			name: "unheld, being deleted", own: &fakeOwnership{name: "a", view: hosts.View{}}, deleting: true,
			wantOwned: true, wantWait: claimedRequeue, wantCalls: []string{"Holder ci", "Claim ci"},
			wantReason: ReasonAdopted, wantStatus: metav1.ConditionTrue, wantHost: "a", wantMsg: "to be deleted",
		},
		// Another host's view placed it too, and its create won.
		{
			name: "another host claims it first", own: &fakeOwnership{name: "a", view: hostsView(map[string]int64{"a": 8}), claimErr: heldElsewhere},
			wantCalls: []string{"Holder ci", "Observe", "Claim ci"},
		},
		{
			name: "the claim fails", own: &fakeOwnership{name: "a", view: hostsView(map[string]int64{"a": 8}), claimErr: apiDown},
			wantErr: apiDown, wantCalls: []string{"Holder ci", "Observe", "Claim ci"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			if tc.localData {
				if err := os.MkdirAll(ClusterDir(state, "ci"), 0o700); err != nil {
					t.Fatal(err)
				}
			}
			c := &v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "ci", Generation: 4}, Spec: v1.ClusterSpec{Datastore: tc.datastore}}
			if tc.deleting {
				c.DeletionTimestamp = &metav1.Time{Time: time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)}
				c.Finalizers = []string{v1.Finalizer}
			}
			dyn := clusterClient(t, c)
			cfg := Config{StateDir: state}
			if tc.own != nil {
				cfg.Ownership = tc.own
			}
			p := &Provider{cfg: cfg, dyn: dyn, log: slog.New(slog.DiscardHandler), prepared: map[string]bool{}, takenOver: map[string]bool{}}

			owned, wait, err := p.owns(ctx, c)
			if owned != tc.wantOwned || wait != tc.wantWait || !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Errorf("owns = %v, %v, %v; want %v, %v, %v", owned, wait, err, tc.wantOwned, tc.wantWait, tc.wantErr)
			}
			if tc.own != nil && !slices.Equal(tc.own.calls, tc.wantCalls) {
				t.Errorf("calls %q, want %q", tc.own.calls, tc.wantCalls)
			}

			u, err := dyn.Resource(v1.ClusterResource).Get(ctx, "ci", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got, err := v1.FromUnstructured(u)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status.Host != tc.wantHost {
				t.Errorf("status.host %q, want %q", got.Status.Host, tc.wantHost)
			}
			cond := meta.FindStatusCondition(got.Status.Conditions, v1.ConditionPlaced)
			switch {
			case tc.wantReason == "" && cond != nil:
				t.Errorf("Placed written: %+v", cond)
			case tc.wantReason != "" && (cond == nil || cond.Reason != tc.wantReason || cond.Status != tc.wantStatus ||
				!strings.Contains(cond.Message, tc.wantMsg) || cond.ObservedGeneration != 4):
				t.Errorf("Placed %+v; want %s with reason %s, a message with %q and generation 4", cond, tc.wantStatus, tc.wantReason, tc.wantMsg)
			}
		})
	}
}

// A placement written once is not written again by the next pass that
// reaches the same decision (an unplaceable cluster is looked at every 10s).
func TestRecordPlacedWritesOnce(t *testing.T) {
	ctx := context.Background()
	c := &v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "ci"}}
	dyn := clusterClient(t, c)
	p := &Provider{dyn: dyn, log: slog.New(slog.DiscardHandler)}
	for _, tc := range []struct {
		name      string
		host      string
		status    metav1.ConditionStatus
		reason    string
		wantWrite bool
	}{
		{"first", "", metav1.ConditionFalse, ReasonUnplaceable, true},
		{"the same again", "", metav1.ConditionFalse, ReasonUnplaceable, false},
		{"placed", "a", metav1.ConditionTrue, ReasonPlaced, true},
		{"placed again", "a", metav1.ConditionTrue, ReasonPlaced, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dyn.ClearActions()
			if err := p.recordPlaced(ctx, "ci", tc.host, tc.status, tc.reason, "why"); err != nil {
				t.Fatal(err)
			}
			wrote := slices.ContainsFunc(dyn.Actions(), func(a clienttesting.Action) bool { return a.GetVerb() == "update" })
			if wrote != tc.wantWrite {
				t.Errorf("wrote the status: %v, want %v", wrote, tc.wantWrite)
			}
		})
	}
}

func TestTenants(t *testing.T) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, c := range []struct {
		name, host string
		phase      v1.Phase
	}{
		{"a-ready", "a", v1.PhaseReady},
		{"a-asleep", "a", v1.PhaseAsleep},
		{"a-new", "a", v1.PhaseInitializing},
		{"b-ready", "b", v1.PhaseReady},
		{"unplaced", "", ""},
	} {
		u, err := (&v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: c.name}, Status: v1.ClusterStatus{Host: c.host, Phase: c.phase}}).ToUnstructured()
		if err != nil {
			t.Fatal(err)
		}
		if err := indexer.Add(u); err != nil {
			t.Fatal(err)
		}
	}
	lister := cache.NewGenericLister(indexer, v1.ClusterResource.GroupResource())
	for _, tc := range []struct {
		name                 string
		own                  Ownership
		wantOwned, wantAwake int
	}{
		{"without Ownership, every cluster", nil, 5, 2},
		{"host a", &fakeOwnership{name: "a"}, 3, 1},
		{"host b", &fakeOwnership{name: "b"}, 1, 1},
		{"a host with none", &fakeOwnership{name: "c"}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Provider{cfg: Config{Ownership: tc.own}, lister: lister}
			if owned, awake := p.Tenants(); owned != tc.wantOwned || awake != tc.wantAwake {
				t.Errorf("Tenants = %d, %d; want %d, %d", owned, awake, tc.wantOwned, tc.wantAwake)
			}
		})
	}
}

// The unplaceable message says why, for `kubectl describe`.
func TestOwnsUnplaceableSaysWhy(t *testing.T) {
	c := &v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "ci"}}
	dyn := clusterClient(t, c)
	v := hostsView(map[string]int64{"a": 8})
	v.Live["a"] = false
	p := &Provider{cfg: Config{StateDir: t.TempDir(), Ownership: &fakeOwnership{name: "a", view: v}}, dyn: dyn, log: slog.New(slog.DiscardHandler)}
	if _, _, err := p.owns(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	u, err := dyn.Resource(v1.ClusterResource).Get(context.Background(), "ci", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := v1.FromUnstructured(u)
	if err != nil {
		t.Fatal(err)
	}
	if cond := meta.FindStatusCondition(got.Status.Conditions, v1.ConditionPlaced); cond == nil || !strings.Contains(cond.Message, "a: its Lease lapsed") {
		t.Errorf("Placed %+v; want a message naming a's lapsed Lease", cond)
	}
}

// The door carries a cluster to its own loopback port, to the door of the host
// that runs it, or nowhere: never a second hop for a connection from a peer.
func TestBackend(t *testing.T) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, c := range []v1.Cluster{
		{ObjectMeta: metav1.ObjectMeta{Name: "here"}, Status: v1.ClusterStatus{Host: "a", Port: 7501}},
		{ObjectMeta: metav1.ObjectMeta{Name: "there"}, Status: v1.ClusterStatus{Host: "b", Port: 7502}},
		{ObjectMeta: metav1.ObjectMeta{Name: "lost"}, Status: v1.ClusterStatus{Host: "gone", Port: 7503}},
		{ObjectMeta: metav1.ObjectMeta{Name: "unplaced"}},
	} {
		u, err := c.ToUnstructured()
		if err != nil {
			t.Fatal(err)
		}
		if err := indexer.Add(u); err != nil {
			t.Fatal(err)
		}
	}
	lister := cache.NewGenericLister(indexer, v1.ClusterResource.GroupResource())
	own := &fakeOwnership{name: "a", doors: map[string]string{"b": "192.0.2.2:8443"}}
	for _, tc := range []struct {
		name, cluster string
		fromPeer      bool
		want          string
		wantOK        bool
	}{
		{"run here", "here", false, "127.0.0.1:7501", true},
		{"run here, from a peer", "here", true, "127.0.0.1:7501", true},
		{"run on b", "there", false, "192.0.2.2:8443", true},
		{"run on b, from a peer: no second hop", "there", true, "", false},
		{"its host has no known door", "lost", false, "", false},
		{"placed nowhere yet", "unplaced", false, "", false},
		{"no such cluster", "nope", false, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Provider{cfg: Config{Ownership: own}, lister: lister}
			got, ok := p.Backend(tc.cluster, tc.fromPeer)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("Backend(%s, %v) = %q, %v; want %q, %v", tc.cluster, tc.fromPeer, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// A connection for a moving cluster is held until it arrives; one a peer passed
// on here while it moved away goes on to its new host (one hop more, once).
func TestBackendHoldsAMovingCluster(t *testing.T) {
	for _, fromPeer := range []bool{false, true} {
		t.Run(fmt.Sprintf("fromPeer=%v", fromPeer), func(t *testing.T) {
			lister, put := clusterCache(t)
			put(v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "ci"}, Status: v1.ClusterStatus{Host: "a", MovingTo: "b", Port: 7501}})
			p := &Provider{cfg: Config{Ownership: &fakeOwnership{name: "a", doors: map[string]string{"b": "192.0.2.2:8443"}}},
				lister: lister}
			arrive := time.AfterFunc(300*time.Millisecond, func() {
				put(v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "ci"}, Status: v1.ClusterStatus{Host: "b", Port: 7501}})
			})
			defer arrive.Stop()
			start := time.Now()
			got, ok := p.Backend("ci", fromPeer)
			if waited := time.Since(start); waited < 250*time.Millisecond {
				t.Errorf("Backend returned after %v: it did not hold the connection while the cluster moved", waited)
			}
			if got != "192.0.2.2:8443" || !ok {
				t.Errorf("Backend = %q, %v; want the new host's door", got, ok)
			}
		})
	}
}

// clusterCache is an informer's cache of Clusters, and how a test puts one in it.
func clusterCache(t *testing.T) (cache.GenericLister, func(v1.Cluster)) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	put := func(c v1.Cluster) {
		u, err := c.ToUnstructured()
		if err != nil {
			t.Fatal(err)
		}
		if err := indexer.Update(u); err != nil {
			t.Fatal(err)
		}
	}
	return cache.NewGenericLister(indexer, v1.ClusterResource.GroupResource()), put
}
