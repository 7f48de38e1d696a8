package scaledriver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/nodehealth"
	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/nodes/fake"
	"github.com/socialweb-computer/socialweb/internal/scale"
)

var t0 = time.Date(2026, 10, 6, 12, 0, 0, 0, time.UTC)

const cluster = "liveweb"

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

type statusCall struct {
	action scale.Action
	nodes  int
	reason string
}

type recStatus struct {
	mu       sync.Mutex
	calls    []statusCall
	boots    []bootCall
	network  []bootCall
	accels   []string
	pods     []bootCall
	warm     []bootCall
	starts   [][]v1.PodStartPercentiles
	idle     [][4]int
	schedule []bootCall
}

type bootCall struct {
	ok              bool
	reason, message string
}

func (s *recStatus) RecordDecision(_ context.Context, c string, d scale.Decision, n int) error {
	if c != cluster {
		return fmt.Errorf("cluster %q", c)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, statusCall{d.Action, n, d.Reason})
	return nil
}

// record appends call to *to, for the cluster under test only.
func (s *recStatus) record(c string, to *[]bootCall, call bootCall) error {
	if c != cluster {
		return fmt.Errorf("cluster %q", c)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	*to = append(*to, call)
	return nil
}

func (s *recStatus) RecordNodeBoot(_ context.Context, c string, ok bool, reason, message string) error {
	return s.record(c, &s.boots, bootCall{ok, reason, message})
}

func (s *recStatus) RecordNodeNetwork(_ context.Context, c string, ok bool, reason, message string) error {
	return s.record(c, &s.network, bootCall{ok, reason, message})
}

func (s *recStatus) RecordNodeAccelerator(_ context.Context, c, accel, reason string) error {
	if c != cluster {
		return fmt.Errorf("cluster %q", c)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.accels = append(s.accels, accel+": "+reason)
	return nil
}

func (s *recStatus) RecordPodsProvisionable(_ context.Context, c string, ok bool, reason, message string) error {
	return s.record(c, &s.pods, bootCall{ok, reason, message})
}

func (s *recStatus) RecordWarmStart(_ context.Context, c string, ok bool, reason, message string) error {
	return s.record(c, &s.warm, bootCall{ok, reason, message})
}

func (s *recStatus) RecordIdleSchedule(_ context.Context, c string, ok bool, reason, message string) error {
	return s.record(c, &s.schedule, bootCall{ok, reason, message})
}

func (s *recStatus) getWarm() []bootCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.warm)
}

func (s *recStatus) getPods() []bootCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.pods)
}

func (s *recStatus) getAccels() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.accels)
}

func (s *recStatus) getNetwork() []bootCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.network)
}

func (s *recStatus) getBoots() []bootCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.boots)
}

func (s *recStatus) get() []statusCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

type rig struct {
	t      testing.TB
	client *k8sfake.Clientset
	prov   *fake.Provider
	reg    *prometheus.Registry
	status *recStatus
	clock  *clock
	d      *Driver
}

var testSize = scale.NodeSize{CPUs: 2, MemoryMiB: 2048, MaxPods: 20}

// newRig builds a driver on a fake tenant and a fake provider that registers Nodes.
// machines are booted through the provider first (so they have Node objects).
func newRig(t testing.TB, cfg Config, realClock bool, objs []runtime.Object, machines ...string) *rig {
	t.Helper()
	r := &rig{t: t, client: k8sfake.NewClientset(objs...), reg: prometheus.NewRegistry(), status: &recStatus{}, clock: &clock{t: t0}}
	now := r.clock.now
	if realClock {
		now = time.Now
	}
	r.prov = fake.New(fake.WithTenant(r.client), fake.WithClock(now))
	for _, m := range machines {
		if _, err := r.prov.Create(context.Background(), nodes.NodeRequest{Cluster: cluster, Name: m, CPUs: testSize.CPUs, MemoryMiB: testSize.MemoryMiB, MaxPods: testSize.MaxPods, Labels: scale.NodeLabels(m, testSize)}); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Cluster = cluster
	if cfg.NodeSize == (scale.NodeSize{}) {
		cfg.NodeSize = testSize
	}
	if cfg.MaxNodes == 0 {
		cfg.MaxNodes = 5
	}
	d, err := New(cfg, Deps{
		Tenant: r.client, Provider: r.prov, Status: r.status, Metrics: r.reg, Clock: now,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	r.d = d
	return r
}

func (r *rig) start(ctx context.Context) {
	r.t.Helper()
	if err := r.d.Start(ctx); err != nil {
		r.t.Fatal(err)
	}
	r.settle()
}

// settle waits until the driver's caches show what the fake apiserver holds.
func (r *rig) settle() {
	r.t.Helper()
	ctx := context.Background()
	view := func(ns []*corev1.Node, ps []*corev1.Pod) string {
		var out []string
		for _, n := range ns {
			out = append(out, fmt.Sprintf("node %s %t", n.Name, n.Spec.Unschedulable))
		}
		for _, p := range ps {
			out = append(out, fmt.Sprintf("pod %s/%s %s %s", p.Namespace, p.Name, p.Spec.NodeName, p.Status.Phase))
		}
		sort.Strings(out)
		return strings.Join(out, "\n")
	}
	var want, got string
	for range 400 {
		nl, err := r.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			r.t.Fatal(err)
		}
		pl, err := r.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			r.t.Fatal(err)
		}
		var ns []*corev1.Node
		for i := range nl.Items {
			ns = append(ns, &nl.Items[i])
		}
		var ps []*corev1.Pod
		for i := range pl.Items {
			ps = append(ps, &pl.Items[i])
		}
		want = view(ns, ps)
		cn, _ := r.d.nodeLister.List(labels.Everything())
		cp, _ := r.d.pods.List(labels.Everything())
		if got = view(cn, cp); got == want {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.t.Fatalf("caches did not settle:\nwant\n%s\ngot\n%s", want, got)
}

func (r *rig) nodeNames() []string {
	r.t.Helper()
	nl, err := r.client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	var out []string
	for _, n := range nl.Items {
		out = append(out, n.Name)
	}
	sort.Strings(out)
	return out
}

func (r *rig) events() []string {
	r.t.Helper()
	el, err := r.client.EventsV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	var out []string
	for _, e := range el.Items {
		out = append(out, e.Type+" "+e.Reason+": "+e.Note)
	}
	sort.Strings(out)
	return out
}

func testPod(name string, mods ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", CreationTimestamp: metav1.NewTime(t0)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
		}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

func boundTo(node string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.NodeName = node; p.Status.Phase = corev1.PodRunning }
}

// fullDaemon fills its node with a DaemonSet pod: the node is idle, but has no room.
func fullDaemon(p *corev1.Pod) {
	p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "hog", UID: "hog"}}
	p.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("2")
}

func TestPendingPodLeadsToCreate(t *testing.T) {
	r := newRig(t, Config{Resync: time.Hour}, true, nil)
	created := make(chan time.Time, 10)
	r.prov = fake.New(fake.WithTenant(r.client), fake.WithOnCall(func(c fake.Call) {
		if c.Op == fake.OpCreate {
			created <- c.At
		}
	}))
	r.d.provider = r.prov

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.d.Run(ctx) }()
	// Wait for the first (empty) pass so the Pod is news, not initial state.
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(r.d.metrics.decisions.WithLabelValues(cluster, string(scale.None))) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no first pass")
		}
		time.Sleep(5 * time.Millisecond)
	}

	p := testPod("job-1")
	p.CreationTimestamp = metav1.Now()
	start := time.Now()
	if _, err := r.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-created:
		if lat := at.Sub(start); lat > time.Second {
			t.Errorf("pending pod to Create took %s, want under 1s", lat)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no Create within 5s of a pending pod")
	}
	// The node registered; later passes place the pod on it and create nothing more.
	time.Sleep(3 * r.d.cfg.Batch)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v on cancel, want nil", err)
	}
	if err := r.d.Run(context.Background()); err == nil {
		t.Error("second Run succeeded, want an error")
	}

	calls := r.prov.Calls()
	var creates []fake.Call
	for _, c := range calls {
		if c.Op == fake.OpCreate {
			creates = append(creates, c)
		}
	}
	if len(creates) != 1 {
		t.Fatalf("%d creates, want 1: %+v", len(creates), creates)
	}
	req := creates[0].Request
	if req.Cluster != cluster || !strings.HasPrefix(req.Name, cluster+"-") || req.CPUs != 2 || req.MemoryMiB != 2048 || req.MaxPods != 20 {
		t.Errorf("request %+v", req)
	}
	if req.Labels[corev1.LabelInstanceTypeStable] != "socialweb-2c-2048Mi" || req.Labels[scale.LabelManaged] != "true" || req.Labels[corev1.LabelHostname] != req.Name {
		t.Errorf("labels %v", req.Labels)
	}
	if got := r.nodeNames(); !slices.Equal(got, []string{req.Name}) {
		t.Errorf("nodes %v, want [%s]", got, req.Name)
	}
	if ev := r.events(); len(ev) != 2 || ev[1] != "Normal Provision: intent and no node" ||
		!strings.HasPrefix(ev[0], "Normal NodeBooting: booting node "+req.Name+" (2 vCPU / 2048 MiB) for this Pod") {
		t.Errorf("events %q, want the Pod's NodeBooting and the Provision", ev)
	}
	if st := r.status.get(); len(st) != 1 || st[0] != (statusCall{scale.Provision, 1, "intent and no node"}) {
		t.Errorf("status %+v", st)
	}
	// Metrics were recorded; Run's exit then dropped this cluster's series.
	if n := testutil.CollectAndCount(r.d.metrics.decisions); n != 0 {
		t.Errorf("%d decision series after Run ended, want 0", n)
	}
}

func TestMetrics(t *testing.T) {
	r := newRig(t, Config{}, false, []runtime.Object{testPod("a")})
	ctx := context.Background()
	r.start(ctx)
	if _, err := r.d.RunPass(ctx); err != nil {
		t.Fatal(err)
	}
	r.settle()
	r.clock.advance(time.Second)
	if _, err := r.d.RunPass(ctx); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP socialweb_scale_decisions_total Scale decisions made, by cluster and action (every pass, including None and Hold).
# TYPE socialweb_scale_decisions_total counter
socialweb_scale_decisions_total{action="None",cluster="liveweb"} 1
socialweb_scale_decisions_total{action="Provision",cluster="liveweb"} 1
# HELP socialweb_nodes Nodes of the cluster (registered and booting) after the last scale pass.
# TYPE socialweb_nodes gauge
socialweb_nodes{cluster="liveweb"} 1
`
	if err := testutil.GatherAndCompare(r.reg, strings.NewReader(want), "socialweb_scale_decisions_total", "socialweb_nodes"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(r.d.metrics.pending, "socialweb_scale_pending_to_provision_seconds"); n != 1 {
		t.Errorf("%d pending-to-provision series, want 1", n)
	}
	// The pod was created at t0 and provisioned at t0: one observation of 0s.
	out, err := testutil.CollectAndFormat(r.d.metrics.pending, expfmt.TypeTextPlain, "socialweb_scale_pending_to_provision_seconds")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `socialweb_scale_pending_to_provision_seconds_count{cluster="liveweb"} 1`) {
		t.Errorf("histogram:\n%s", out)
	}

	// A second cluster's driver shares the registry's collectors.
	d2, err := New(Config{Cluster: "other", NodeSize: testSize, MaxNodes: 1}, Deps{Tenant: k8sfake.NewClientset(), Provider: fake.New(), Metrics: r.reg})
	if err != nil {
		t.Fatalf("second driver on one registry: %v", err)
	}
	if d2.metrics.decisions != r.d.metrics.decisions {
		t.Error("second driver did not share the decisions counter")
	}
}

// step is one pass at clock+advance.
type step struct {
	advance time.Duration
	fail    fake.Op // fail the next call of this op before the pass
	action  scale.Action
	wantErr bool
	idle    map[string]time.Duration // node -> idle since t0+this; nil: don't check
}

func TestPasses(t *testing.T) {
	tests := []struct {
		name     string
		objs     []runtime.Object
		machines []string
		steps    []step
		creates  int
		deletes  []string
		nodes    []string // nil: don't check
		events   []string // substrings, in order of time is not guaranteed: checked as a set
	}{
		{
			name: "pending pod leads to Create",
			objs: []runtime.Object{testPod("a")},
			steps: []step{
				{action: scale.Provision},
				{advance: time.Second, action: scale.None},
			},
			creates: 1,
			events:  []string{"Normal Provision: intent and no node"},
		},
		{
			name:     "idle node past the hold leads to Delete",
			machines: []string{"n1"},
			steps: []step{
				{action: scale.Hold, idle: map[string]time.Duration{"n1": 0}},
				{advance: 30 * time.Second, action: scale.Hold, idle: map[string]time.Duration{"n1": -30 * time.Second}},
				{advance: 31 * time.Second, action: scale.Teardown, idle: map[string]time.Duration{}},
				{advance: time.Second, action: scale.None},
			},
			deletes: []string{"n1"},
			nodes:   []string{},
			events:  []string{"Normal Teardown: nothing running for 1m1s, past the 1m0s hold"},
		},
		{
			name:     "only the idle node goes",
			objs:     []runtime.Object{testPod("a", boundTo("busy"))},
			machines: []string{"busy", "idle"},
			steps: []step{
				{action: scale.Hold},
				{advance: 2 * time.Minute, action: scale.ScaleDown},
				{advance: time.Hour, action: scale.None},
			},
			deletes: []string{"idle"},
			nodes:   []string{"busy"},
		},
		{
			name:     "a node with a running pod is never removed",
			objs:     []runtime.Object{testPod("a", boundTo("n1"))},
			machines: []string{"n1"},
			steps: []step{
				{action: scale.None, idle: map[string]time.Duration{}},
				{advance: time.Hour, action: scale.None},
			},
			nodes: []string{"n1"},
		},
		{
			name:     "delete failure does not advance idle state, and is retried",
			machines: []string{"n1"},
			steps: []step{
				{action: scale.Hold, idle: map[string]time.Duration{"n1": 0}},
				{advance: 2 * time.Minute, fail: fake.OpDelete, action: scale.Teardown, wantErr: true, idle: map[string]time.Duration{"n1": -2 * time.Minute}},
				{advance: time.Second, action: scale.Teardown, idle: map[string]time.Duration{}},
			},
			deletes: []string{"n1", "n1"}, // the failed call, then the retry
			nodes:   []string{},
			events:  []string{"Warning TeardownFailed", "Normal Teardown"},
		},
		{
			name:     "create failure does not advance idle state",
			objs:     []runtime.Object{testPod("a"), testPod("hog", boundTo("full"), fullDaemon)},
			machines: []string{"full"},
			steps: []step{
				{fail: fake.OpCreate, action: scale.Provision, wantErr: true, idle: map[string]time.Duration{}},
				{advance: 5 * time.Second, action: scale.Provision, idle: map[string]time.Duration{"full": 0}},
			},
			creates: 2,
			events:  []string{"Warning ProvisionFailed", "Normal Provision: 1 pod unschedulable on 1 node: need 2"},
		},
		{
			name:     "failed machine list is an error, never idle",
			machines: []string{"n1"},
			steps: []step{
				{action: scale.Hold},
				{advance: 2 * time.Minute, fail: fake.OpList, wantErr: true, idle: map[string]time.Duration{"n1": -2 * time.Minute}},
			},
			nodes: []string{"n1"},
		},
		{
			name:     "do-not-disrupt keeps an idle node",
			objs:     []runtime.Object{testPod("agent", boundTo("n1"), fullDaemon, func(p *corev1.Pod) { p.Annotations = map[string]string{scale.AnnotationDoNotDisrupt: "true"} })},
			machines: []string{"n1"},
			steps: []step{
				{action: scale.None},
				{advance: time.Hour, action: scale.None},
			},
			nodes: []string{"n1"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Config{}, false, tc.objs, tc.machines...)
			ctx := context.Background()
			r.start(ctx)
			baseCreates := r.prov.Count(fake.OpCreate)
			for i, s := range tc.steps {
				r.clock.advance(s.advance)
				if s.fail != "" {
					r.prov.FailNext(s.fail, errors.New("injected"))
				}
				dec, err := r.d.RunPass(ctx)
				if (err != nil) != s.wantErr {
					t.Fatalf("step %d: err = %v, want error %t (%s)", i, err, s.wantErr, dec)
				}
				if s.action != "" && dec.Action != s.action {
					t.Fatalf("step %d: %s, want %s", i, dec, s.action)
				}
				if s.idle != nil {
					want := map[string]time.Time{}
					for n, off := range s.idle {
						want[n] = r.clock.now().Add(off)
					}
					if got := r.d.IdleSince(); fmt.Sprint(got) != fmt.Sprint(want) {
						t.Errorf("step %d: idle state %v, want %v", i, got, want)
					}
				}
				r.settle()
			}
			if got := r.prov.Count(fake.OpCreate) - baseCreates; got != tc.creates {
				t.Errorf("%d creates, want %d", got, tc.creates)
			}
			var deletes []string
			for _, c := range r.prov.Calls() {
				if c.Op == fake.OpDelete {
					deletes = append(deletes, c.Name)
				}
			}
			if !slices.Equal(deletes, tc.deletes) {
				t.Errorf("deletes %v, want %v", deletes, tc.deletes)
			}
			if tc.nodes != nil {
				if got := r.nodeNames(); !slices.Equal(got, tc.nodes) && !(len(got) == 0 && len(tc.nodes) == 0) {
					t.Errorf("nodes %v, want %v", got, tc.nodes)
				}
			}
			evs := r.events()
			for _, want := range tc.events {
				if !slices.ContainsFunc(evs, func(e string) bool { return strings.Contains(e, want) }) {
					t.Errorf("no event containing %q in %q", want, evs)
				}
			}
			if tc.events == nil && len(tc.deletes) == 0 && tc.creates == 0 && len(evs) > 0 {
				t.Errorf("events %q for a run that changed nothing", evs)
			}
		})
	}
}

// Removal cordons first: a Node is patched unschedulable before it is deleted, and a
// Pod bound in the meantime keeps it (and it is uncordoned again).
func TestRemovalCordonsAndRechecks(t *testing.T) {
	for _, race := range []bool{false, true} {
		t.Run(fmt.Sprint("pod bound during removal=", race), func(t *testing.T) {
			r := newRig(t, Config{}, false, nil, "n1")
			if race {
				// Simulate the scheduler binding a Pod just before the cordon lands.
				r.client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
					if _, err := r.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), "default", "late"); err == nil {
						return false, nil, nil
					}
					if err := r.client.Tracker().Add(testPod("late", boundTo("n1"))); err != nil {
						t.Error(err)
					}
					return false, nil, nil
				})
			}
			ctx := context.Background()
			r.start(ctx)
			if _, err := r.d.RunPass(ctx); err != nil {
				t.Fatal(err)
			}
			r.clock.advance(2 * time.Minute)
			dec, err := r.d.RunPass(ctx)
			if dec.Action != scale.Teardown {
				t.Fatalf("%s, want Teardown", dec)
			}
			var verbs []string
			for _, a := range r.client.Actions() {
				if a.GetResource().Resource == "nodes" && (a.GetVerb() == "patch" || a.GetVerb() == "delete") {
					verbs = append(verbs, a.GetVerb())
				}
			}
			if race {
				if !errors.Is(err, errNodeBusy) {
					t.Fatalf("err = %v, want errNodeBusy", err)
				}
				if r.prov.Count(fake.OpDelete) != 0 {
					t.Error("machine deleted under a pod")
				}
				n, err := r.client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
				if err != nil || n.Spec.Unschedulable {
					t.Errorf("node after kept removal: %v, unschedulable %v", err, n != nil && n.Spec.Unschedulable)
				}
				if !slices.Equal(verbs, []string{"patch", "patch"}) {
					t.Errorf("node actions %v, want cordon and uncordon", verbs)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// The fake provider deletes the Node too; the driver's own delete then
			// finds it gone, which is fine.
			if !slices.Equal(verbs[:2], []string{"patch", "delete"}) {
				t.Errorf("node actions %v, want cordon before delete", verbs)
			}
		})
	}
}

func TestNoDecisionBeforeSync(t *testing.T) {
	r := newRig(t, Config{}, false, []runtime.Object{testPod("a")}, "n1")
	_, err := r.d.RunPass(context.Background())
	if !errors.Is(err, ErrNotSynced) {
		t.Fatalf("err = %v, want ErrNotSynced", err)
	}
	if n := len(r.prov.Calls()); n != 1 { // the rig's own Create of n1
		t.Errorf("%d provider calls before sync, want none by the driver", n-1)
	}
	if err := r.d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := r.d.Start(context.Background()); err == nil {
		t.Error("second Start succeeded")
	}
}

// A machine whose Node has not registered counts as a node, until BootTimeout.
func TestBootingMachines(t *testing.T) {
	client := k8sfake.NewClientset(testPod("a"))
	c := &clock{t: t0}
	prov := fake.New(fake.WithClock(c.now)) // no tenant: machines never register
	status := &recStatus{}
	d, err := New(Config{Cluster: cluster, NodeSize: testSize, MaxNodes: 3, BootTimeout: 5 * time.Minute},
		Deps{Tenant: client, Provider: prov, Status: status, Clock: c.now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		advance time.Duration
		action  scale.Action
		creates int
		deletes int
	}{
		{0, scale.Provision, 1, 0},
		{10 * time.Second, scale.None, 1, 0},     // booting absorbs the pod
		{4 * time.Minute, scale.None, 1, 0},      // still within BootTimeout
		{2 * time.Minute, scale.Provision, 2, 1}, // timed out: deleted and replaced
		{10 * time.Second, scale.None, 2, 1},
	} {
		c.advance(want.advance)
		dec, err := d.RunPass(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if dec.Action != want.action || prov.Count(fake.OpCreate) != want.creates || prov.Count(fake.OpDelete) != want.deletes {
			t.Fatalf("step %d: %s, %d creates, %d deletes; want %s, %d, %d", i, dec, prov.Count(fake.OpCreate), prov.Count(fake.OpDelete), want.action, want.creates, want.deletes)
		}
	}
	// The timeout was reported once, with the provider's diagnostics.
	boots := status.getBoots()
	if len(boots) != 1 || boots[0].ok || boots[0].reason != "JoinTimeout" || !strings.Contains(boots[0].message, "kernel panic") {
		t.Errorf("NodeBoot reports %+v, want one JoinTimeout with the console line", boots)
	}
	assertEvent(t, client, "NodeJoinTimeout", "did not register within 5m0s")
}

// A Node that registered just before the boot deadline but is not in the informer cache
// yet (it lags) must not be deleted as a JoinTimeout: it may already run a Pod. The
// apiserver is asked before deleting.
func TestLateRegistrationIsNotDeleted(t *testing.T) {
	client := k8sfake.NewClientset(testPod("a"))
	c := &clock{t: t0}
	prov := fake.New(fake.WithClock(c.now)) // no tenant: the cache never sees a Node
	d, err := New(Config{Cluster: cluster, NodeSize: testSize, MaxNodes: 3, BootTimeout: 5 * time.Minute},
		Deps{Tenant: client, Provider: prov, Clock: c.now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if dec, err := d.RunPass(ctx); err != nil || dec.Action != scale.Provision {
		t.Fatalf("first pass: %s, %v; want Provision", dec, err)
	}
	name := prov.Instances()[0].Name
	// Only a live GET finds the Node: list and watch (the cache) do not.
	client.PrependReactor("get", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.GetAction).GetName() != name {
			return false, nil, nil
		}
		res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"),
			corev1.ResourceMemory: resource.MustParse("2Gi"), corev1.ResourcePods: resource.MustParse("20")}
		return true, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{
			Capacity: res, Allocatable: res,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}, nil
	})
	c.advance(6 * time.Minute)
	dec, err := d.RunPass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if prov.Count(fake.OpDelete) != 0 || prov.Count(fake.OpCreate) != 1 || dec.Action == scale.Provision {
		t.Errorf("past the deadline with the Node registered: %s, %d creates, %d deletes; want no delete, no new machine",
			dec, prov.Count(fake.OpCreate), prov.Count(fake.OpDelete))
	}
	if got := testutil.ToFloat64(d.metrics.nodeFails.WithLabelValues(cluster, "JoinTimeout")); got != 0 {
		t.Errorf("socialweb_node_failures_total{reason=JoinTimeout} = %v, want 0", got)
	}

	// When the apiserver cannot say, nothing is deleted and the pass is an error.
	client.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("apiserver unavailable")
	})
	c.advance(time.Minute)
	if _, err := d.RunPass(ctx); err == nil || !strings.Contains(err.Error(), "checking whether node "+name+" registered") {
		t.Errorf("pass with the Node's GET failing: %v, want an error naming the node", err)
	}
	if prov.Count(fake.OpDelete) != 0 {
		t.Errorf("%d deletes while the apiserver could not say whether the Node registered", prov.Count(fake.OpDelete))
	}
}

// assertEvent fails unless the tenant has a Warning Event with reason whose note
// contains text.
func assertEvent(t *testing.T, client *k8sfake.Clientset, reason, text string) {
	t.Helper()
	evs, err := client.EventsV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if e.Reason == reason && e.Type == corev1.EventTypeWarning && strings.Contains(e.Note, text) {
			return
		}
	}
	t.Errorf("no Warning Event %s containing %q among %d events", reason, text, len(evs.Items))
}

// A machine whose VM dies is reported (Event, NodeBoot condition with diagnostics) and
// deleted, and replaced if its Pods still want a node; a machine seen booting that
// registers is reported as joined.
func TestFailedMachinesAreReportedAndDeleted(t *testing.T) {
	r := newRig(t, Config{}, false, []runtime.Object{testPod("a")})
	ctx := context.Background()
	r.start(ctx)
	dec, err := r.d.RunPass(ctx)
	if err != nil || dec.Action != scale.Provision {
		t.Fatalf("first pass: %s, %v; want Provision", dec, err)
	}
	booted := r.prov.Instances()
	if len(booted) != 1 {
		t.Fatalf("instances %v", booted)
	}
	name := booted[0].Name
	// The fake registered the Node at Create; the driver saw it booting only if a pass ran
	// before registration, so none reports a join here. Crash it.
	if !r.prov.Crash(name) {
		t.Fatal("crash: no such machine")
	}
	r.clock.advance(time.Second)
	dec, err = r.d.RunPass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.prov.Count(fake.OpDelete) != 1 {
		t.Errorf("deletes %d, want the crashed machine deleted", r.prov.Count(fake.OpDelete))
	}
	for _, in := range r.prov.Instances() {
		if in.Name == name {
			t.Errorf("crashed machine %s still listed", name)
		}
	}
	if dec.Action != scale.Provision {
		t.Errorf("after the crash: %s, want Provision (the pod still wants a node)", dec)
	}
	boots := r.status.getBoots()
	if len(boots) != 1 || boots[0].ok || boots[0].reason != "VMExited" || !strings.Contains(boots[0].message, "fake console of "+name) {
		t.Errorf("NodeBoot reports %+v, want one VMExited with diagnostics", boots)
	}
	assertEvent(t, r.client, "NodeVMExited", "its VM stopped")
	if got := testutil.ToFloat64(r.d.metrics.nodeFails.WithLabelValues(cluster, "VMExited")); got != 1 {
		t.Errorf("socialweb_node_failures_total{reason=VMExited} = %v, want 1", got)
	}
}

func TestNewValidates(t *testing.T) {
	good := Deps{Tenant: k8sfake.NewClientset(), Provider: fake.New()}
	for name, tc := range map[string]struct {
		cfg  Config
		deps Deps
	}{
		"no cluster":   {Config{NodeSize: testSize}, good},
		"no size":      {Config{Cluster: "c"}, good},
		"negative max": {Config{Cluster: "c", NodeSize: testSize, MaxNodes: -1}, good},
		"no provider":  {Config{Cluster: "c", NodeSize: testSize}, Deps{Tenant: k8sfake.NewClientset()}},
	} {
		if _, err := New(tc.cfg, tc.deps); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}

// TestNodeNetworkProblemsReachTheCluster: a node's own network conditions (nodehealth)
// are summed up on the Cluster, once per change, with a Warning Event per new problem.
func TestNodeNetworkProblemsReachTheCluster(t *testing.T) {
	r := newRig(t, Config{}, false, []runtime.Object{testPod("a", boundTo("n1"))}, "n1")
	ctx := context.Background()
	r.start(ctx)
	setDNS := func(status corev1.ConditionStatus, msg string) {
		t.Helper()
		n, err := r.client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Conditions = []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue},
			{Type: nodehealth.ClusterDNSUnavailable, Status: status, Message: msg},
		}
		if _, err := r.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		livetest.Eventually(t, 5*time.Second, 10*time.Millisecond, "the driver's cache to see the node's conditions", func() bool {
			n, err := r.d.nodeLister.Get("n1")
			return err == nil && len(n.Status.Conditions) == 2 && n.Status.Conditions[1].Status == status
		})
	}
	steps := []struct {
		name   string
		status corev1.ConditionStatus
		want   []bootCall
	}{
		{"healthy: reported once", corev1.ConditionFalse, []bootCall{{true, "NodesHealthy", "no node reports a network problem"}}},
		{"still healthy: nothing new", corev1.ConditionFalse, nil},
		{"DNS down", corev1.ConditionTrue, []bootCall{{false, "NodeNetworkProblem", "node n1: ClusterDNSUnavailable: no answer"}}},
		{"DNS back", corev1.ConditionFalse, []bootCall{{true, "NodesHealthy", "no node reports a network problem"}}},
	}
	seen := 0
	for _, st := range steps {
		setDNS(st.status, "no answer")
		if _, err := r.d.RunPass(ctx); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		got := r.status.getNetwork()[seen:]
		seen += len(got)
		if !slices.Equal(got, st.want) {
			t.Errorf("%s: recorded %+v, want %+v", st.name, got, st.want)
		}
	}
	assertEvent(t, r.client, "NodeNetworkProblem", "node n1: ClusterDNSUnavailable: no answer")
}

// stallingProvider is a fake whose machines named in stalled are stuck in early boot, and
// which reports an accelerator the test can change.
type stallingProvider struct {
	*fake.Provider
	mu          sync.Mutex
	stalled     map[string]bool
	accel, why  string
	stallChecks int
}

func (p *stallingProvider) EarlyBootStall(name string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stallChecks++
	if p.stalled[name] {
		return "node " + name + ": no kernel progress 30s after qemu started under kvm"
	}
	return ""
}

func (p *stallingProvider) Accelerator() (string, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accel, p.why
}

// A machine stuck in early boot is reported as EarlyBootStall and replaced long before
// BootTimeout; the Cluster is told the accelerator once, and again when it changes.
func TestEarlyBootStallAndAccelerator(t *testing.T) {
	client := k8sfake.NewClientset(testPod("a"))
	c := &clock{t: t0}
	prov := &stallingProvider{Provider: fake.New(fake.WithClock(c.now)), stalled: map[string]bool{},
		accel: "kvm", why: "KVM: a guest booted"}
	status := &recStatus{}
	d, err := New(Config{Cluster: cluster, NodeSize: testSize, MaxNodes: 3, BootTimeout: 5 * time.Minute},
		Deps{Tenant: client, Provider: prov, Status: status, Clock: c.now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if dec, err := d.RunPass(ctx); err != nil || dec.Action != scale.Provision {
		t.Fatalf("first pass: %s, %v", dec, err)
	}
	ins, _ := prov.List(ctx)
	if len(ins) != 1 {
		t.Fatalf("%d machines, want 1", len(ins))
	}
	prov.mu.Lock()
	prov.stalled[ins[0].Name] = true
	prov.accel, prov.why = "tcg", "TCG, because 2 node boots in a row stalled in early boot under KVM"
	prov.mu.Unlock()

	c.advance(40 * time.Second) // far inside the 5m BootTimeout
	dec, err := d.RunPass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if dec.Action != scale.Provision || prov.Count(fake.OpDelete) != 1 || prov.Count(fake.OpCreate) != 2 {
		t.Fatalf("after the stall: %s, %d deletes, %d creates; want the stuck machine deleted and replaced",
			dec, prov.Count(fake.OpDelete), prov.Count(fake.OpCreate))
	}
	boots := status.getBoots()
	if len(boots) != 1 || boots[0].ok || boots[0].reason != "EarlyBootStall" || !strings.Contains(boots[0].message, "no kernel progress") {
		t.Errorf("NodeBoot reports %+v, want one EarlyBootStall (not JoinTimeout)", boots)
	}
	assertEvent(t, client, "NodeEarlyBootStall", "no kernel progress")
	if got := testutil.ToFloat64(d.metrics.nodeFails.WithLabelValues(cluster, "EarlyBootStall")); got != 1 {
		t.Errorf("socialweb_node_failures_total{reason=EarlyBootStall} = %v, want 1", got)
	}
	accels := status.getAccels()
	if len(accels) != 2 || !strings.HasPrefix(accels[0], "kvm: ") || !strings.HasPrefix(accels[1], "tcg: ") {
		t.Errorf("accelerator reports %q; want kvm at the first pass, then tcg", accels)
	}
	assertEvent(t, client, "NodeAcceleratorChanged", "stalled in early boot")
	c.advance(10 * time.Second)
	if _, err := d.RunPass(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(status.getAccels()); n != 2 {
		t.Errorf("%d accelerator reports after an unchanged pass, want 2", n)
	}
}

// A node the provider started warm, or tried to and booted cold, is put on the Cluster;
// the failure also as a Warning Event. A node no warm start was tried for says nothing.
func TestWarmStartReachesTheCluster(t *testing.T) {
	tests := []struct {
		name   string
		warm   *nodes.WarmStart
		want   []bootCall // ok, reason, message substring
		events string     // a Warning Event's reason, if one is wanted
	}{
		{"no warm start tried", nil, nil, ""},
		{"claimed", &nodes.WarmStart{Claimed: true},
			[]bootCall{{true, "WarmPoolClaimed", "started from a pre-booted warm-pool VM"}}, ""},
		{"claim failed", &nodes.WarmStart{Failed: "claiming warm-pool VM pool-1 failed at its tap step (bridge gone); it was destroyed, and node a-1 booted cold"},
			[]bootCall{{false, "WarmStartFailed", "failed at its tap step (bridge gone)"}}, "WarmStartFailed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, Config{}, false, []runtime.Object{testPod("a")})
			if tt.warm != nil {
				r.prov.WarmNext(*tt.warm)
			}
			ctx := context.Background()
			r.start(ctx)
			if dec, err := r.d.RunPass(ctx); err != nil || dec.Action != scale.Provision {
				t.Fatalf("first pass: %s, %v; want Provision", dec, err)
			}
			got := r.status.getWarm()
			if len(got) != len(tt.want) {
				t.Fatalf("WarmStart reports %+v, want %d", got, len(tt.want))
			}
			for i, w := range tt.want {
				if got[i].ok != w.ok || got[i].reason != w.reason || !strings.Contains(got[i].message, w.message) {
					t.Errorf("WarmStart report %+v, want %+v", got[i], w)
				}
			}
			if tt.events != "" {
				assertEvent(t, r.client, tt.events, "booted cold")
			}
		})
	}
}

// A node that registered and then stalled (not Ready, here since it registered) holds
// the cluster's only slot until BootTimeout has passed again; then it is removed without
// waiting out the hold, and the next pass boots a node for the waiting Pod.
func TestStalledNodeIsReplaced(t *testing.T) {
	r := newRig(t, Config{MaxNodes: 1, Hold: time.Hour, BootTimeout: 5 * time.Minute}, false, []runtime.Object{testPod("a")}, "stalled")
	ctx := context.Background()
	n, err := r.client.CoreV1().Nodes().Get(ctx, "stalled", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown,
		Reason: "NodeStatusNeverUpdated", LastTransitionTime: metav1.NewTime(r.clock.now())}}
	if _, err := r.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.start(ctx)
	for i, s := range []struct {
		advance time.Duration
		action  scale.Action
	}{
		{0, scale.None},                              // within the grace: coming capacity
		{4 * time.Minute, scale.Hold},                // past the grace: idle, at the cap, not yet broken
		{time.Minute + time.Second, scale.ScaleDown}, // not Ready for over 5 min
		{time.Second, scale.Provision},               // the slot is free again
	} {
		r.clock.advance(s.advance)
		dec, err := r.d.RunPass(ctx)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if dec.Action != s.action {
			t.Fatalf("step %d: %s, want %s", i, dec, s.action)
		}
		r.settle()
	}
	var deletes []string
	for _, c := range r.prov.Calls() {
		if c.Op == fake.OpDelete {
			deletes = append(deletes, c.Name)
		}
	}
	if !slices.Equal(deletes, []string{"stalled"}) {
		t.Errorf("deletes %v, want [stalled]", deletes)
	}
	if got := r.prov.Count(fake.OpCreate); got != 2 {
		t.Errorf("%d creates, want 2 (the stalled node, then its replacement)", got)
	}
	want := "Normal ScaleDown: 1 node not Ready for over 5m0s, removed: stalled (5m1s)"
	if evs := r.events(); !slices.ContainsFunc(evs, func(e string) bool { return strings.HasPrefix(e, want) }) {
		t.Errorf("no event %q in %q", want, evs)
	}
}
