package provider

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/clientcmd"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/controlplane"
	"github.com/socialweb-computer/socialweb/internal/lease"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodeservice"
	"github.com/socialweb-computer/socialweb/internal/pki"
	"github.com/socialweb-computer/socialweb/internal/sleep"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
	"github.com/socialweb-computer/socialweb/internal/tenantuid"
)

// What observe reports of sleep, from the Cluster and the daemon's default: a
// cluster whose status says Asleep stays asleep after a daemon restart, and a
// cluster that may not sleep gets no sleep state at all (nothing changes).
func TestObserveSleep(t *testing.T) {
	d := func(x time.Duration) *metav1.Duration { return &metav1.Duration{Duration: x} }
	tests := []struct {
		name       string
		spec       *metav1.Duration
		def        time.Duration
		phase      v1.Phase
		wantAsleep bool
		wantState  bool
	}{
		{"sleep off, awake", nil, 0, v1.PhaseReady, false, false},
		{"spec 0 overrides a default", d(0), time.Minute, v1.PhaseReady, false, false},
		{"the default turns it on", nil, time.Minute, v1.PhaseReady, false, true},
		{"spec on, awake", d(time.Minute), 0, v1.PhaseReady, false, true},
		{"asleep before the restart stays asleep", d(time.Minute), 0, v1.PhaseAsleep, true, true},
		{"asleep with sleep since turned off: asleep until the loop wakes it", d(0), 0, v1.PhaseAsleep, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &Provider{cfg: Config{Defaults: Defaults{SleepAfter: tc.def}}, sleepers: map[string]*sleeper{}}
			c := &v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "ci"}, Spec: v1.ClusterSpec{SleepAfter: tc.spec}, Status: v1.ClusterStatus{Phase: tc.phase}}
			var o Observed
			p.observeSleep(c, &o)
			if o.Asleep != tc.wantAsleep || (p.sleepers["ci"] != nil) != tc.wantState {
				t.Errorf("Asleep %v, sleep state %v; want %v, %v", o.Asleep, p.sleepers["ci"] != nil, tc.wantAsleep, tc.wantState)
			}
			// A second look does not read the status again: the daemon's word counts.
			c.Status.Phase = v1.PhaseReady
			p.observeSleep(c, &o)
			if o.Asleep != tc.wantAsleep {
				t.Errorf("second observation: Asleep %v, want %v", o.Asleep, tc.wantAsleep)
			}
		})
	}
}

// recordingNetworks records the node networks made and removed.
type recordingNetworks struct {
	ensured, removed []int
	served           []nodenet.Served
	narrowed         []nodenet.Narrowing
	walls            []nodenet.ControlPlaneReach
	wallNarrowed     []nodenet.Narrowing
	unwalled         []int // ports
}

func (r *recordingNetworks) WallControlPlane(_ context.Context, _ string, reach nodenet.ControlPlaneReach, narrow nodenet.Narrowing) error {
	r.walls = append(r.walls, reach)
	r.wallNarrowed = append(r.wallNarrowed, narrow)
	return nil
}

func (r *recordingNetworks) UnwallControlPlane(_ context.Context, port int) error {
	r.unwalled = append(r.unwalled, port)
	return nil
}

func (r *recordingNetworks) Ensure(_ context.Context, _ string, plan nodenet.Plan, served nodenet.Served, narrow nodenet.Narrowing) error {
	r.ensured = append(r.ensured, plan.Index)
	r.served = append(r.served, served)
	r.narrowed = append(r.narrowed, narrow)
	return nil
}

// A cluster's network opens to its nodes its apiserver on the leased port and
// the registry: the ports its nodes are told to dial on the gateway.
func TestEnsureNetworkServesTheLease(t *testing.T) {
	nets := &recordingNetworks{}
	p := &Provider{cfg: Config{NodeNetworks: nets}, egressApplied: map[string]string{}}
	c := &v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "c"}}
	if err := p.ensureNetwork(context.Background(), c, lease.Lease{Port: 7512, Network: 5}); err != nil {
		t.Fatal(err)
	}
	want := nodenet.Served{APIServer: 7512, Registry: nodeservice.RegistryPort}
	if !slices.Equal(nets.ensured, []int{5}) || len(nets.served) != 1 || !reflect.DeepEqual(nets.served[0], want) {
		t.Errorf("ensured %v serving %+v, want network 5 serving %+v", nets.ensured, nets.served, want)
	}
	if !reflect.DeepEqual(nets.narrowed, []nodenet.Narrowing{{}}) || p.egressApplied["c"] != egressKey(c.Spec) {
		t.Errorf("narrowed %+v (applied %q), want nothing narrowed, recorded", nets.narrowed, p.egressApplied["c"])
	}
}

// A control plane under a uid of its own is walled when its network is ensured:
// its uid and port, its nodes, its datastore server, the cluster's narrowing. One
// that runs as root has no wall (the kernel cannot tell it from the daemon).
func TestEnsureNetworkWallsTheControlPlane(t *testing.T) {
	for _, tc := range []struct {
		name      string
		uidBase   int64
		datastore string
		spec      v1.ClusterSpec
		want      []nodenet.ControlPlaneReach
		narrow    []nodenet.Narrowing
	}{
		{"root: no wall", 0, "sqlite:///x/state.db", v1.ClusterSpec{}, nil, nil},
		{"sqlite", tenantuid.DefaultBase, "sqlite:///x/state.db", v1.ClusterSpec{},
			[]nodenet.ControlPlaneReach{{UID: tenantuid.DefaultBase + 7512, Port: 7512}}, []nodenet.Narrowing{{}}},
		{"postgres, egress none", tenantuid.DefaultBase, "postgres://r:p@127.0.0.1:5433/socialweb_t_c", v1.ClusterSpec{Egress: v1.EgressNone},
			[]nodenet.ControlPlaneReach{{UID: tenantuid.DefaultBase + 7512, Port: 7512, Datastore: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:5433")}}},
			[]nodenet.Narrowing{{None: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := controlplane.Config{Name: "c", Dir: ClusterDir(dir, "c"), Port: 7512, Datastore: tc.datastore, Components: []string{controlplane.APIServer}}
			if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := cfg.Write(); err != nil {
				t.Fatal(err)
			}
			nets := &recordingNetworks{}
			p := &Provider{cfg: Config{NodeNetworks: nets, StateDir: dir, UIDBase: tc.uidBase}, egressApplied: map[string]string{}, log: slog.New(slog.DiscardHandler)}
			c := &v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: tc.spec}
			if err := p.ensureNetwork(context.Background(), c, lease.Lease{Port: 7512, Network: 5}); err != nil {
				t.Fatal(err)
			}
			plan, _ := nodenet.ForIndex(5)
			for i := range tc.want {
				tc.want[i].Plan = &plan
			}
			// The resolvers are the host's: not compared.
			for i := range nets.walls {
				nets.walls[i].Resolvers = nil
			}
			if !reflect.DeepEqual(nets.walls, tc.want) || !reflect.DeepEqual(nets.wallNarrowed, tc.narrow) {
				t.Errorf("walled %+v narrowed %+v; want %+v narrowed %+v", nets.walls, nets.wallNarrowed, tc.want, tc.narrow)
			}
		})
	}
}

// The Cluster's egress and egressDeny reach the network's rules as a narrowing; one
// the CRD should have refused walls the cluster off rather than open it.
func TestEgressNarrowing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		spec    v1.ClusterSpec
		want    nodenet.Narrowing
		wantErr bool
	}{
		{"unset", v1.ClusterSpec{}, nodenet.Narrowing{}, false},
		{"host", v1.ClusterSpec{Egress: v1.EgressHost}, nodenet.Narrowing{}, false},
		{"none", v1.ClusterSpec{Egress: v1.EgressNone}, nodenet.Narrowing{None: true}, false},
		{"denies", v1.ClusterSpec{EgressDeny: []string{"203.0.113.0/24"}},
			nodenet.Narrowing{Deny: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}, false},
		{"an invalid deny walls it off", v1.ClusterSpec{EgressDeny: []string{"203.0.113.1/24"}}, nodenet.Narrowing{None: true}, true},
		{"an unknown mode walls it off", v1.ClusterSpec{Egress: "everywhere"}, nodenet.Narrowing{None: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := EgressNarrowing(tc.spec)
			if (err != nil) != tc.wantErr || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("EgressNarrowing = %+v, %v; want %+v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func (r *recordingNetworks) Remove(_ context.Context, _ string, plan nodenet.Plan) error {
	r.removed = append(r.removed, plan.Index)
	return nil
}

// A cluster going to sleep keeps its port (the gate accepts on it), removes
// and gives back its node network, and drops the daemon's client of it. One
// that this daemon did not prepare (asleep across a restart) gets an admin
// kubeconfig that names it, which the gate wakes it for.
func TestGoToSleepKeepsOnlyThePort(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.Ensure(filepath.Join(ClusterDir(dir, "ci"), "pki"), pki.Options{Clients: []pki.Identity{pki.Admin}}); err != nil {
		t.Fatal(err)
	}
	kube := fake.NewClientset()
	nets := &recordingNetworks{}
	p := &Provider{
		cfg:          Config{StateDir: dir, Defaults: Defaults{SleepAfter: time.Minute}, NodeNetworks: nets, Domain: "tenants.test"},
		kube:         kube,
		log:          slog.New(slog.DiscardHandler),
		sup:          supervisor.New(slog.New(slog.DiscardHandler), supervisor.DefaultBackoff(), "", nil),
		leases:       leaseStore{kube: kube, ports: lease.Range{Lo: 1024, Hi: 65535}, networks: lease.Range{Lo: 1, Hi: 190}},
		probes:       map[string]*probe{},
		sleepers:     map[string]*sleeper{},
		sleepMetrics: sleep.NewMetrics(),
	}
	c := &v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "ci"}, Status: v1.ClusterStatus{Phase: v1.PhaseReady}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ctx := context.Background()
	cm, table, err := p.leases.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	table["ci"], table["other"] = lease.Lease{Port: port, Network: 5}, lease.Lease{Port: port + 1, Network: 6}
	if err := p.leases.save(ctx, cm, table); err != nil {
		t.Fatal(err)
	}
	p.sleepers["ci"] = &sleeper{known: true, tenant: fake.NewClientset()}
	p.probes["ci"] = &probe{}
	if err := p.goToSleep(ctx, c, table["ci"]); err != nil {
		t.Fatal(err)
	}
	defer p.forgetSleeper("ci")
	s := p.sleepers["ci"]
	if s.tenant != nil || p.probes["ci"] != nil {
		t.Errorf("asleep with a tenant client (%v) or a probe (%v)", s.tenant != nil, p.probes["ci"] != nil)
	}
	if s.gate == nil || !s.gate.Listening() {
		t.Fatal("asleep without a gate accepting on its port")
	}
	if l, err := net.Listen("tcp", s.gate.Addr()); err == nil {
		l.Close()
		t.Errorf("the port %s is free while the cluster sleeps", s.gate.Addr())
	}
	if !slices.Equal(nets.removed, []int{5}) || len(nets.ensured) != 0 {
		t.Errorf("networks removed %v, made %v; want network 5 removed and none made", nets.removed, nets.ensured)
	}
	if !slices.Equal(nets.unwalled, []int{port}) || len(nets.walls) != 0 {
		t.Errorf("control-plane walls removed %v, written %v; want the one of port %d removed, none written", nets.unwalled, nets.walls, port)
	}
	got, err := p.leases.Get(ctx, "ci")
	if err != nil || got == nil || got.Port != port || got.HasNetwork() {
		t.Errorf("asleep, the lease is %+v (%v); want port %d and no network", got, err, port)
	}
	if other, _ := p.leases.Get(ctx, "other"); other == nil || other.Network != 6 {
		t.Errorf("another cluster's lease changed: %+v", other)
	}
	secret, err := kube.CoreV1().Secrets(v1.SystemNamespace).Get(ctx, AdminSecretName("ci"), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("no admin kubeconfig for the sleeping cluster: %v", err)
	}
	kc, err := clientcmd.Load(secret.Data["kubeconfig"])
	if err != nil {
		t.Fatal(err)
	}
	if cl := kc.Clusters["ci"]; cl == nil || cl.Server != fmt.Sprintf("https://127.0.0.1:%d", port) || cl.TLSServerName != "ci.tenants.test" {
		t.Errorf("the sleeping cluster's admin kubeconfig names %+v; want its port and tls-server-name ci.tenants.test", cl)
	}
	// Asleep again (a daemon restart): nothing more is removed.
	if err := p.goToSleep(ctx, c, *got); err != nil {
		t.Fatal(err)
	}
	if len(nets.removed) != 1 {
		t.Errorf("a second sleep removed networks %v", nets.removed)
	}
	// The wake leases a network again, the lowest free one.
	woke, err := p.leases.Acquire(ctx, "ci")
	if err != nil || woke.Port != port || woke.Network != 1 {
		t.Errorf("the wake leased %+v (%v), want port %d and network 1", woke, err, port)
	}

	// The gate wakes it for its name only: a ClientHello that names nothing
	// is refused and counted under the cluster; one that names it is held.
	hello := func(serverName string) error {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", s.gate.Addr(),
			&tls.Config{ServerName: serverName, InsecureSkipVerify: true})
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := hello(""); err == nil || !strings.Contains(err.Error(), "unrecognized name") || !s.gate.Listening() {
		t.Errorf("a hello naming nothing: %v, gate accepting %v; want refused, still accepting", err, s.gate.Listening())
	}
	if n := testutil.ToFloat64(p.sleepMetrics.WakeRefused.WithLabelValues("ci", "no_name")); n != 1 {
		t.Errorf("socialweb_cluster_wake_refused_total{cluster=ci,reason=no_name} = %v, want 1", n)
	}
	go hello("ci.tenants.test") // held: no apiserver answers here
	livetest.Eventually(t, 5*time.Second, 10*time.Millisecond, "a hello naming ci.tenants.test to wake it", func() bool {
		waking, _ := s.gate.Waking()
		return waking
	})
}

func TestObserveIdleNodes(t *testing.T) {
	// 2026-12-07 is a Monday.
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		spec     v1.ClusterSpec
		wanted   bool
		nextOpen time.Time
	}{
		{"no idle nodes", v1.ClusterSpec{IdleSchedule: "Mon-Fri 08:00-18:00"}, false, time.Time{}},
		{"always", v1.ClusterSpec{IdleNodes: 1}, true, time.Time{}},
		{"inside the window", v1.ClusterSpec{IdleNodes: 1, IdleSchedule: "Mon-Fri 08:00-18:00"}, true, time.Time{}},
		{"outside: when it opens", v1.ClusterSpec{IdleNodes: 1, IdleSchedule: "Tue 08:00-18:00"}, false, time.Date(2026, 12, 8, 8, 0, 0, 0, time.UTC)},
		{"a bad schedule keeps nothing awake", v1.ClusterSpec{IdleNodes: 1, IdleSchedule: "weekdays"}, false, time.Time{}},
		{"nor does an unknown zone", v1.ClusterSpec{IdleNodes: 1, IdleSchedule: "Mon-Sun 00:00-24:00 Mars/Olympus"}, false, time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := sleep.Observed{Now: now}
			observeIdleNodes(&v1.Cluster{Spec: tt.spec}, &o)
			if o.IdleNodesWanted != tt.wanted || !o.NextIdleWindow.Equal(tt.nextOpen) {
				t.Errorf("wanted %t, next window %s; want %t, %s", o.IdleNodesWanted, o.NextIdleWindow, tt.wanted, tt.nextOpen)
			}
		})
	}
}
