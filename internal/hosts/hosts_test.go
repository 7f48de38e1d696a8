package hosts

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/placement"
)

const lease = 30 * time.Second

// clock is a host's clock, moved by hand.
type clock struct{ t time.Time }

func (c *clock) Now() time.Time          { return c.t }
func (c *clock) Advance(d time.Duration) { c.t = c.t.Add(d) }

func newClock() *clock { return &clock{t: time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)} }

// service is one management API that several hosts share.
type service struct {
	kube *fake.Clientset
	dyn  *dynamicfake.FakeDynamicClient
}

func newService(objs ...runtime.Object) service {
	return service{
		kube: fake.NewClientset(objs...),
		dyn: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
			map[schema.GroupVersionResource]string{v1.HostGVR: v1.HostKind + "List"}),
	}
}

// host is a Membership of s named name, on clock c.
func (s service) host(name string, c *clock, shared bool) *Membership {
	return New(Config{Name: name, Shared: shared, LeaseDuration: lease, Now: c.Now}, s.kube, s.dyn, slog.New(slog.DiscardHandler))
}

func (s service) lease(t *testing.T, name string) *coordinationv1.Lease {
	t.Helper()
	l, err := s.kube.CoordinationV1().Leases(v1.SystemNamespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading Lease %s: %v", name, err)
	}
	return l
}

func (s service) hostObject(t *testing.T, name string) *v1.Host {
	t.Helper()
	u, err := s.dyn.Resource(v1.HostGVR).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading Host %s: %v", name, err)
	}
	h, err := v1.HostFromUnstructured(u)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// hostLease is a Lease a host of this name left behind, renewed at renew.
func hostLease(name string, renew *time.Time, transitions int32) *coordinationv1.Lease {
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: v1.HostLeaseName(name), Namespace: v1.SystemNamespace, Labels: map[string]string{LeaseLabel: "host"}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseTransitions: ptr.To(transitions)},
	}
	if renew != nil {
		l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(*renew))
	}
	return l
}

func TestJoin(t *testing.T) {
	ctx := context.Background()
	start := newClock().Now()
	ago := func(d time.Duration) *time.Time { return ptr.To(start.Add(-d)) }
	for _, tc := range []struct {
		name            string
		before          *coordinationv1.Lease // the host's Lease before Join; nil: none
		wantWait        time.Duration
		wantTransitions int32
	}{
		{name: "a new host", wantWait: 0},
		{name: "a Lease renewed within its duration", before: hostLease("a", ago(lease-time.Second), 2), wantWait: 0, wantTransitions: 2},
		// Others may have taken its tenants: it waits out any decision in flight.
		{name: "a Lease that lapsed", before: hostLease("a", ago(lease+time.Second), 2), wantWait: lease, wantTransitions: 3},
		{name: "a Lease exactly one duration old has lapsed", before: hostLease("a", ago(lease), 0), wantWait: lease, wantTransitions: 1},
		{name: "a Lease never renewed has lapsed", before: hostLease("a", nil, 0), wantWait: lease, wantTransitions: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s service
			if tc.before != nil {
				s = newService(tc.before)
			} else {
				s = newService()
			}
			c := newClock()
			m := New(Config{Name: "a", Address: "10.0.0.1:7443", FrontDoor: "10.0.0.1:443", Version: "v1.2.3", MaxTenants: 20,
				Shared: true, LeaseDuration: lease, Now: c.Now,
				Resources: func() (Resources, error) { return Resources{CPUs: 8, Memory: 16 << 30, FreeMemory: 12 << 30}, nil },
				Tenants:   func() (int, int) { return 3, 2 }},
				s.kube, s.dyn, slog.New(slog.DiscardHandler))
			wait, err := m.Join(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if wait != tc.wantWait {
				t.Errorf("Join waits %v, want %v", wait, tc.wantWait)
			}
			l := s.lease(t, "host-a")
			if l.Labels[LeaseLabel] != "host" || ptr.Deref(l.Spec.HolderIdentity, "") != "a" {
				t.Errorf("host Lease labels %v, holder %q; want %s=host, holder a", l.Labels, ptr.Deref(l.Spec.HolderIdentity, ""), LeaseLabel)
			}
			if l.Spec.RenewTime == nil || !l.Spec.RenewTime.Time.Equal(c.Now()) || ptr.Deref(l.Spec.LeaseDurationSeconds, 0) != 30 {
				t.Errorf("host Lease renewed %v for %ds; want now for 30s", l.Spec.RenewTime, ptr.Deref(l.Spec.LeaseDurationSeconds, 0))
			}
			if got := ptr.Deref(l.Spec.LeaseTransitions, 0); got != tc.wantTransitions {
				t.Errorf("LeaseTransitions %d, want %d", got, tc.wantTransitions)
			}
			// A lapsed Lease is acquired anew; a fresh one keeps its acquireTime.
			if lapsed := tc.wantWait > 0; lapsed && (l.Spec.AcquireTime == nil || !l.Spec.AcquireTime.Time.Equal(c.Now())) {
				t.Errorf("a lapsed Lease was not acquired again: acquireTime %v", l.Spec.AcquireTime)
			}
			if m.Fenced() {
				t.Error("fenced right after Join")
			}

			st := s.hostObject(t, "a").Status
			want := v1.HostStatus{Address: "10.0.0.1:7443", FrontDoor: "10.0.0.1:443", Version: "v1.2.3", CPUs: 8,
				Memory: resource.MustParse("16Gi"), FreeMemory: resource.MustParse("12Gi"), MaxTenants: 20, Tenants: 3, Awake: 2}
			if st.Address != want.Address || st.FrontDoor != want.FrontDoor || st.Version != want.Version || st.CPUs != want.CPUs ||
				st.Memory.Cmp(want.Memory) != 0 || st.FreeMemory.Cmp(want.FreeMemory) != 0 ||
				st.MaxTenants != want.MaxTenants || st.Tenants != want.Tenants || st.Awake != want.Awake || !st.Reported.Time.Equal(c.Now()) {
				t.Errorf("Host status %+v, want %+v reported now", st, want)
			}
		})
	}
}

// A host that rejoins keeps its Host's spec (an operator's drain) and reports
// its status again; one this process renewed over a duration ago had lapsed,
// by its own clock whatever the Lease says.
func TestRejoin(t *testing.T) {
	ctx := context.Background()
	s := newService()
	c := newClock()
	tenants := 1
	m := New(Config{Name: "a", Shared: true, LeaseDuration: lease, Now: c.Now, Tenants: func() (int, int) { return tenants, 0 }},
		s.kube, s.dyn, slog.New(slog.DiscardHandler))
	if _, err := m.Join(ctx); err != nil {
		t.Fatal(err)
	}
	h := s.hostObject(t, "a")
	h.Spec.Draining = true
	u, err := h.ToUnstructured()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.dyn.Resource(v1.HostGVR).Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name            string
		advance         time.Duration
		wantWait        time.Duration
		wantTransitions int32
	}{
		{"renewed in time", lease - time.Second, 0, 0},
		{"renewed a duration late", lease, lease, 1},
		{"in time again", time.Second, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.Advance(tc.advance)
			tenants++
			wait, err := m.Join(ctx)
			if err != nil || wait != tc.wantWait {
				t.Errorf("Join = %v, %v; want %v", wait, err, tc.wantWait)
			}
			if got := ptr.Deref(s.lease(t, "host-a").Spec.LeaseTransitions, 0); got != tc.wantTransitions {
				t.Errorf("LeaseTransitions %d, want %d", got, tc.wantTransitions)
			}
			h := s.hostObject(t, "a")
			if !h.Spec.Draining || h.Status.Tenants != int32(tenants) {
				t.Errorf("Host draining %v, tenants %d; want the drain kept and %d tenants", h.Spec.Draining, h.Status.Tenants, tenants)
			}
		})
	}
}

// A Host's resources that cannot be read fail the report, not silently zero it.
func TestJoinResourcesError(t *testing.T) {
	s := newService()
	m := New(Config{Name: "a", Now: newClock().Now, Resources: func() (Resources, error) { return Resources{}, errors.New("no /proc") }},
		s.kube, s.dyn, slog.New(slog.DiscardHandler))
	if _, err := m.Join(context.Background()); err == nil || !strings.Contains(err.Error(), "no /proc") {
		t.Errorf("Join = %v, want the resources' error", err)
	}
}

// Hosts claim, read and release tenants' Leases in turn, all in one
// management API: each step sees what the steps before it wrote.
func TestClaimHolderRelease(t *testing.T) {
	ctx := context.Background()
	s := newService()
	c := newClock()
	hs := map[string]*Membership{"a": s.host("a", c, true), "b": s.host("b", c, true)}
	for _, tc := range []struct {
		name       string
		host       string
		op         string // claim, release, or "" (only read the holder)
		cluster    string
		wantErr    error
		wantMsg    string // in the error
		wantHolder string // after the step, as either host reads it
	}{
		{name: "none holds it", host: "a", cluster: "ci", wantHolder: ""},
		{name: "the first claim takes it", host: "a", op: "claim", cluster: "ci", wantHolder: "a"},
		{name: "another host is refused, told who holds it", host: "b", op: "claim", cluster: "ci",
			wantErr: ErrHeldElsewhere, wantMsg: "a holds ci", wantHolder: "a"},
		{name: "the holder claims again", host: "a", op: "claim", cluster: "ci", wantHolder: "a"},
		{name: "another tenant is free", host: "b", op: "claim", cluster: "web", wantHolder: "b"},
		{name: "a release by another host leaves it", host: "b", op: "release", cluster: "ci", wantHolder: "a"},
		{name: "the holder releases it", host: "a", op: "release", cluster: "ci", wantHolder: ""},
		{name: "releasing what none holds", host: "a", op: "release", cluster: "ci", wantHolder: ""},
		{name: "released, another host takes it", host: "b", op: "claim", cluster: "ci", wantHolder: "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := hs[tc.host]
			var err error
			switch tc.op {
			case "claim":
				err = m.Claim(ctx, tc.cluster)
			case "release":
				err = m.Release(ctx, tc.cluster)
			}
			if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("%s %s by %s = %v, want %v", tc.op, tc.cluster, tc.host, err, tc.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not say %q", err, tc.wantMsg)
			}
			for name, m := range hs {
				if got, err := m.Holder(ctx, tc.cluster); err != nil || got != tc.wantHolder {
					t.Errorf("Holder(%s) read by %s = %q, %v; want %q", tc.cluster, name, got, err, tc.wantHolder)
				}
			}
			if tc.wantHolder != "" {
				if l := s.lease(t, v1.TenantLeaseName(tc.cluster)); l.Labels[LeaseLabel] != "tenant" {
					t.Errorf("tenant Lease labels %v, want %s=tenant", l.Labels, LeaseLabel)
				}
			}
		})
	} // Only the holder's release deleted, and only the Lease it read: a host
	// that took it in between keeps it. (The fake sets no resourceVersions, so
	// only the precondition's presence is checked.)
	var deletes []clienttesting.DeleteActionImpl
	for _, a := range s.kube.Actions() {
		if d, ok := a.(clienttesting.DeleteActionImpl); ok {
			deletes = append(deletes, d)
		}
	}
	if len(deletes) != 1 || deletes[0].Name != "tenant-ci" || deletes[0].DeleteOptions.Preconditions == nil ||
		deletes[0].DeleteOptions.Preconditions.ResourceVersion == nil {
		t.Errorf("deletes %+v; want one of tenant-ci with a resourceVersion precondition", deletes)
	}
}

// Liveness is by the observer's clock, from when it saw a host's renewTime
// change: a host is live for a Lease duration after each renewal it is seen
// to make, whatever its own clock says.
func TestObserveLiveness(t *testing.T) {
	ctx := context.Background()
	s := newService()
	ca, cb, cc := newClock(), newClock(), newClock()
	// b's and c's clocks are far from a's: only a's measures.
	cb.Advance(-time.Hour)
	cc.Advance(72 * time.Hour)
	a, b, cHost := s.host("a", ca, true), s.host("b", cb, true), s.host("c", cc, true)
	for _, m := range []*Membership{a, b} {
		if _, err := m.Join(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name     string
		advance  time.Duration // a's clock
		renewB   bool          // b renews (its renewTime changes) before a looks
		joinC    bool
		wantLive map[string]bool
	}{
		{name: "a host just seen is live", wantLive: map[string]bool{"a": true, "b": true}},
		{name: "b silent, within a duration", advance: lease - time.Second, wantLive: map[string]bool{"a": true, "b": true}},
		{name: "b silent for a duration", advance: time.Second, wantLive: map[string]bool{"a": true, "b": false}},
		{name: "b renews", advance: time.Second, renewB: true, wantLive: map[string]bool{"a": true, "b": true}},
		{name: "b silent, within a duration of its renewal", advance: lease - time.Second, wantLive: map[string]bool{"a": true, "b": true}},
		{name: "c appears while b is silent", advance: 5 * time.Second, joinC: true, wantLive: map[string]bool{"a": true, "b": false, "c": true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca.Advance(tc.advance)
			// a renews every step: its own liveness is not being fenced.
			if _, err := a.Join(ctx); err != nil {
				t.Fatal(err)
			}
			if tc.renewB {
				cb.Advance(time.Second)
				if _, err := b.Join(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if tc.joinC {
				if _, err := cHost.Join(ctx); err != nil {
					t.Fatal(err)
				}
			}
			v, err := a.Observe(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(v.Live, tc.wantLive) {
				t.Errorf("Live = %v, want %v", v.Live, tc.wantLive)
			}
			if len(v.Hosts) != len(tc.wantLive) {
				t.Errorf("%d Hosts listed, want %d", len(v.Hosts), len(tc.wantLive))
			}
		})
	}
}

// A host that went a duration without renewing sees itself as not live: it
// is fenced.
func TestObserveSelfFenced(t *testing.T) {
	ctx := context.Background()
	s := newService()
	c := newClock()
	a := s.host("a", c, true)
	if _, err := a.Join(ctx); err != nil {
		t.Fatal(err)
	}
	c.Advance(lease)
	v, err := a.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v.Live["a"] {
		t.Error("a fenced host sees itself live")
	}
}

func TestObserveHolders(t *testing.T) {
	ctx := context.Background()
	s := newService()
	c := newClock()
	a, b := s.host("a", c, true), s.host("b", c, true)
	for _, m := range []*Membership{a, b} {
		if _, err := m.Join(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, claim := range []struct {
		m       *Membership
		cluster string
	}{{a, "t1"}, {a, "t2"}, {b, "t3"}} {
		if err := claim.m.Claim(ctx, claim.cluster); err != nil {
			t.Fatal(err)
		}
	}
	v, err := b.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Host Leases are not tenants.
	if want := map[string]string{"t1": "a", "t2": "a", "t3": "b"}; !reflect.DeepEqual(v.Holders, want) {
		t.Errorf("Holders = %v, want %v", v.Holders, want)
	}
	got := map[string]int{}
	for _, h := range v.Candidates() {
		got[h.Name] = h.Tenants
	}
	if want := map[string]int{"a": 2, "b": 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("Candidates' tenants = %v, want %v", got, want)
	}
}

func TestCandidates(t *testing.T) {
	host := func(name string, draining bool, free string, max int32) v1.Host {
		return v1.Host{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.HostSpec{Draining: draining},
			Status: v1.HostStatus{FreeMemory: resource.MustParse(free), MaxTenants: max}}
	}
	for _, tc := range []struct {
		name string
		view View
		want []placement.Host
	}{
		{name: "no hosts", view: View{}, want: []placement.Host{}},
		{
			name: "tenants counted per holder, host fields carried",
			view: View{
				Hosts:   []v1.Host{host("a", false, "8Gi", 10), host("b", true, "1Gi", 0), host("c", false, "0", 1)},
				Live:    map[string]bool{"a": true, "b": true},
				Holders: map[string]string{"t1": "a", "t2": "a", "t3": "b", "t4": "gone"},
			},
			want: []placement.Host{
				{Name: "a", Live: true, FreeMemory: 8 << 30, Tenants: 2, MaxTenants: 10},
				{Name: "b", Live: true, Draining: true, FreeMemory: 1 << 30, Tenants: 1},
				// No Lease seen: not live.
				{Name: "c", MaxTenants: 1},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.view.Candidates(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Candidates = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestFenced(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		shared    bool
		join      bool          // Join first
		advance   time.Duration // then the clock moves
		renew     bool          // then it renews (Join again)
		failRenew bool          // and that renewal fails
		want      bool
	}{
		// Alone, no other host could run its tenants.
		{name: "alone, never joined", want: false},
		{name: "alone, silent for an hour", join: true, advance: time.Hour, want: false},
		{name: "shared, never joined", shared: true, want: true},
		{name: "shared, just joined", shared: true, join: true, want: false},
		{name: "shared, within a duration", shared: true, join: true, advance: lease - time.Nanosecond, want: false},
		{name: "shared, a duration without renewing", shared: true, join: true, advance: lease, want: true},
		{name: "shared, an hour without renewing", shared: true, join: true, advance: time.Hour, want: true},
		{name: "shared, renewed after an hour", shared: true, join: true, advance: time.Hour, renew: true, want: false},
		{name: "shared, a failed renewal does not unfence", shared: true, join: true, advance: time.Hour, renew: true, failRenew: true, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newService()
			c := newClock()
			m := s.host("a", c, tc.shared)
			if tc.join {
				if _, err := m.Join(ctx); err != nil {
					t.Fatal(err)
				}
			}
			c.Advance(tc.advance)
			if tc.failRenew {
				s.kube.PrependReactor("update", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
					return true, nil, errors.New("the management API is away")
				})
			}
			if tc.renew {
				if _, err := m.Join(ctx); (err != nil) != tc.failRenew {
					t.Fatalf("Join = %v, want an error %v", err, tc.failRenew)
				}
			}
			if got := m.Fenced(); got != tc.want {
				t.Errorf("Fenced = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestDoorAddress(t *testing.T) {
	for _, tc := range []struct {
		name   string
		st     v1.HostStatus
		want   string
		wantOK bool
	}{
		{"a door on one address", v1.HostStatus{FrontDoor: "192.0.2.1:8443", Address: "192.0.2.9"}, "192.0.2.1:8443", true},
		{"a door on every interface takes the host's address", v1.HostStatus{FrontDoor: "0.0.0.0:8443", Address: "192.0.2.9"}, "192.0.2.9:8443", true},
		{"no host in the door's address", v1.HostStatus{FrontDoor: ":8443", Address: "192.0.2.9"}, "192.0.2.9:8443", true},
		{"a door on every interface and no host address", v1.HostStatus{FrontDoor: "0.0.0.0:8443"}, "", false},
		{"no door", v1.HostStatus{Address: "192.0.2.9"}, "", false},
		{"a named door", v1.HostStatus{FrontDoor: "door.example:443"}, "door.example:443", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := DoorAddress(tc.st)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("DoorAddress(%+v) = %q, %v; want %q, %v", tc.st, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// A host alone (sqlite) never waits at a rejoin: no one could have taken its tenants.
func TestRejoinAlone(t *testing.T) {
	ctx := context.Background()
	s := newService()
	c := newClock()
	m := New(Config{Name: "a", LeaseDuration: lease, Now: c.Now}, s.kube, s.dyn, slog.New(slog.DiscardHandler))
	if _, err := m.Join(ctx); err != nil {
		t.Fatal(err)
	}
	c.Advance(10 * lease)
	if wait, err := m.Join(ctx); err != nil || wait != 0 {
		t.Errorf("Join of a lapsed host alone = %v, %v; want 0", wait, err)
	}
}

func TestCollector(t *testing.T) {
	s := newService()
	c := newClock()
	m := New(Config{Name: "a", Shared: true, LeaseDuration: lease, Now: c.Now}, s.kube, s.dyn, slog.New(slog.DiscardHandler))
	m.alive = map[string]bool{"a": true, "b": true, "c": false}
	m.metrics.takeovers.Add(2)
	m.metrics.handovers.Add(1)
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collector())
	want := `
# HELP socialweb_host_fenced 1 while this host could not renew its Lease for a Lease duration and runs no tenant.
# TYPE socialweb_host_fenced gauge
socialweb_host_fenced 1
# HELP socialweb_hosts Hosts of the service as this host saw them at its last poll of their Leases, by state (live or lost).
# TYPE socialweb_hosts gauge
socialweb_hosts{state="live"} 2
socialweb_hosts{state="lost"} 1
# HELP socialweb_tenant_handovers_total Tenants this host handed to another while drained.
# TYPE socialweb_tenant_handovers_total counter
socialweb_tenant_handovers_total 1
# HELP socialweb_tenant_takeovers_total Tenants this host took over from a host whose Lease lapsed.
# TYPE socialweb_tenant_takeovers_total counter
socialweb_tenant_takeovers_total 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err) // never renewed: fenced
	}
}
