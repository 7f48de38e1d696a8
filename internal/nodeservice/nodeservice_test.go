package nodeservice

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/join"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/nodes/fake"
	"github.com/socialweb-computer/socialweb/internal/scale"
)

func TestHostRunsAClustersNodeServices(t *testing.T) {
	tenant := kubefake.NewSimpleClientset()
	prov := fake.New(fake.WithTenant(tenant))
	joiners := &Joiners{}
	h := New(prov, joiners, nil, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	plan, _ := nodenet.ForIndex(7)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := Cluster{
		Name: "ci", Tenant: tenant, NodeSize: scale.NodeSize{CPUs: 1, MemoryMiB: 1024, MaxPods: 110}, MaxNodes: 2, Hold: time.Second,
		Minter: join.Minter{Tenant: tenant, APIServer: "https://10.250.7.1:7500", CACert: []byte("PEM"), ClientCA: []byte("CLIENT PEM"), Plan: plan},
	}
	if err := h.Start(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := h.Start(ctx, c); err != nil {
		t.Fatalf("second Start: %v", err)
	}
	_, err := tenant.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "job"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	livetest.Eventually(t, 10*time.Second, 50*time.Millisecond, "a node for the pending pod", func() bool {
		return prov.Count(fake.OpCreate) == 1
	})
	name := prov.Instances()[0].Name
	m, ok, err := h.Machine(ctx, "ci", name)
	if err != nil || !ok || !m.Running {
		t.Errorf("Machine(%s) = %+v, %v, %v", name, m, ok, err)
	}
	if _, ok, _ := h.Machine(ctx, "other", name); ok {
		t.Error("a machine is visible under another cluster")
	}
	id, err := joiners.Identity(ctx, nodes.NodeRequest{Cluster: "ci", Name: name, MaxPods: 110}, net.ParseIP("10.250.7.2"), "02:00:00:00:00:07")
	if err != nil || id.NodeName != name || id.Gateway != "10.250.7.1" {
		t.Errorf("Identity = %+v, %v", id, err)
	}
	h.Stop("ci")
	if _, ok := joiners.Minter("ci"); ok {
		t.Error("a stopped cluster's minter still mints identities")
	}
	if err := h.DeleteAll(ctx, "ci"); err != nil {
		t.Fatal(err)
	}
	if n := len(prov.Instances()); n != 0 {
		t.Errorf("%d machines left after DeleteAll", n)
	}
}

func TestHostWithoutProviderSaysWhatToDo(t *testing.T) {
	h := New(nil, nil, nil, nil, nil, slog.New(slog.DiscardHandler))
	err := h.Start(context.Background(), Cluster{Name: "ci"})
	if err == nil || !strings.Contains(err.Error(), "socialweb image build") {
		t.Errorf("Start without a provider: %v", err)
	}
}

// watchingProvider is a fake with the optional sides the qemu provider has.
type watchingProvider struct{ *fake.Provider }

func (watchingProvider) EarlyBootStall(name string) string { return "stuck: " + name }
func (watchingProvider) Accelerator() (string, string)     { return "tcg", "no KVM here" }

// The driver sees a provider's optional sides through the per-cluster view: a wrapper
// that hid them once kept the NodeAccelerator condition and EarlyBootStall from working.
func TestClusterScopedForwardsOptionalSides(t *testing.T) {
	fp := fake.New()
	if _, err := fp.Create(context.Background(), nodes.NodeRequest{Cluster: "a", Name: "a-1", CPUs: 1, MemoryMiB: 512, MaxPods: 110}); err != nil {
		t.Fatal(err)
	}
	var p nodes.NodeProvider = clusterScoped{watchingProvider{fp}, "a"}
	w, ok := p.(nodes.EarlyBootWatcher)
	if !ok || w.EarlyBootStall("a-1") != "stuck: a-1" {
		t.Errorf("EarlyBootStall not forwarded")
	}
	r, ok := p.(nodes.AcceleratorReporter)
	if a, why := r.Accelerator(); !ok || a != "tcg" || why != "no KVM here" {
		t.Errorf("Accelerator not forwarded: %q %q", a, why)
	}
	var plain nodes.NodeProvider = clusterScoped{fake.New(), "a"}
	if a, _ := plain.(nodes.AcceleratorReporter).Accelerator(); a != "" {
		t.Errorf("a provider without an accelerator reports %q", a)
	}
}

// A tenant names machines through its Node objects, which its admin may write:
// a name of another cluster's machine must reach nothing of it.
func TestClusterScopedReachesOnlyItsOwnMachines(t *testing.T) {
	ctx := context.Background()
	fp := fake.New()
	for _, r := range []nodes.NodeRequest{
		{Cluster: "a", Name: "a-1", CPUs: 1, MemoryMiB: 512, MaxPods: 110},
		{Cluster: "b", Name: "b-1", CPUs: 1, MemoryMiB: 512, MaxPods: 110},
	} {
		if _, err := fp.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	a := clusterScoped{watchingProvider{fp}, "a"}
	for _, tc := range []struct {
		name     string
		call     func() error
		wantErr  string // "" succeeds
		notFound bool
	}{
		{"delete another cluster's machine", func() error { return a.Delete(ctx, "b-1") }, "not found", true},
		{"delete a machine nobody has", func() error { return a.Delete(ctx, "c-9") }, "not found", true},
		{"create for another cluster", func() error {
			_, err := a.Create(ctx, nodes.NodeRequest{Cluster: "b", Name: "b-2", CPUs: 1, MemoryMiB: 512, MaxPods: 110})
			return err
		}, `for cluster "b" through cluster "a"`, false},
		{"diagnose another cluster's machine", func() error {
			if got := a.Diagnose("b-1"); got != "" {
				return fmt.Errorf("Diagnose(b-1) = %q", got)
			}
			return nil
		}, "", false},
		{"early boot of another cluster's machine", func() error {
			if got := a.EarlyBootStall("b-1"); got != "" {
				return fmt.Errorf("EarlyBootStall(b-1) = %q", got)
			}
			return nil
		}, "", false},
		{"forget the join of another cluster's machine", func() error { return a.ForgetJoin(ctx, "b-1") }, "", false},
		{"forget its own machine's join", func() error { return a.ForgetJoin(ctx, "a-1") }, "", false},
		{"delete its own machine", func() error { return a.Delete(ctx, "a-1") }, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("err = %v, want none", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("err = %v, want one saying %q", err, tc.wantErr)
			case tc.notFound && !nodes.IsNotFound(err):
				t.Fatalf("err = %v, want IsNotFound (the driver then treats it as gone)", err)
			}
		})
	}
	left := map[string]bool{}
	for _, in := range fp.Instances() {
		left[in.Name] = true
	}
	if !left["b-1"] || left["a-1"] || left["b-2"] {
		t.Errorf("machines left %v, want b-1 only (a-1 deleted by its own cluster, b-2 never made)", left)
	}
	forgot := 0
	for _, c := range fp.Calls() {
		if c.Op == fake.OpDelete && c.Name != "a-1" {
			t.Errorf("the provider was asked to delete %s", c.Name)
		}
		if c.Op == fake.OpForgetJoin {
			if c.Name != "a-1" {
				t.Errorf("the provider was asked to forget the join of %s", c.Name)
			}
			forgot++
		}
	}
	if forgot != 1 {
		t.Errorf("ForgetJoin reached the provider %d times, want once (for a-1)", forgot)
	}
}

// scheduleStatus records RecordIdleSchedule and ignores the rest.
type scheduleStatus struct {
	mu   sync.Mutex
	told []string // "ok reason: message"
}

func (*scheduleStatus) RecordDecision(context.Context, string, scale.Decision, int) error { return nil }
func (*scheduleStatus) RecordNodeBoot(context.Context, string, bool, string, string) error {
	return nil
}
func (*scheduleStatus) RecordNodeNetwork(context.Context, string, bool, string, string) error {
	return nil
}
func (*scheduleStatus) RecordNodeAccelerator(context.Context, string, string, string) error {
	return nil
}
func (*scheduleStatus) RecordPodsProvisionable(context.Context, string, bool, string, string) error {
	return nil
}
func (*scheduleStatus) RecordWarmStart(context.Context, string, bool, string, string) error {
	return nil
}
func (*scheduleStatus) RecordIdleNodes(context.Context, string, v1.IdleNodesStatus) error { return nil }
func (*scheduleStatus) RecordPodStarts(context.Context, string, []v1.PodStartPercentiles) error {
	return nil
}
func (s *scheduleStatus) RecordIdleSchedule(_ context.Context, _ string, ok bool, reason, message string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.told = append(s.told, fmt.Sprintf("%t %s: %s", ok, reason, message))
	return nil
}

func (s *scheduleStatus) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.told)
}

// A cluster whose idleSchedule does not parse (a zone the CRD's pattern passes but no tz
// database knows) gets its node services all the same: no idle node, the Cluster told
// why, and a node for a Pod that asks.
func TestHostStartsAClusterWithABadIdleSchedule(t *testing.T) {
	tenant := kubefake.NewSimpleClientset()
	prov := fake.New(fake.WithTenant(tenant))
	status := &scheduleStatus{}
	h := New(prov, &Joiners{}, nil, status, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	plan, _ := nodenet.ForIndex(7)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := Cluster{
		Name: "ci", Tenant: tenant, NodeSize: scale.NodeSize{CPUs: 1, MemoryMiB: 1024, MaxPods: 110}, MaxNodes: 2, Hold: time.Second,
		IdleNodes: 1, IdleSchedule: "Mon-Sun 00:00-24:00 Mars/Olympus",
		Minter: join.Minter{Tenant: tenant, APIServer: "https://10.250.7.1:7500", CACert: []byte("PEM"), ClientCA: []byte("CLIENT PEM"), Plan: plan},
	}
	if err := h.Start(ctx, c); err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer h.Stop("ci")
	livetest.Eventually(t, 10*time.Second, 20*time.Millisecond, "the Cluster told its schedule is bad", func() bool {
		return len(status.get()) > 0
	})
	// The report comes after the first pass has carried out its decision: with the
	// schedule read as "always", that pass would have booted an idle node.
	if told := status.get(); len(told) != 1 || !strings.HasPrefix(told[0], "false "+v1.ReasonBadIdleSchedule+": ") || !strings.Contains(told[0], `zone "Mars/Olympus"`) {
		t.Errorf("idle schedule reports %q, want one BadIdleSchedule naming the zone", told)
	}
	if n := prov.Count(fake.OpCreate); n != 0 {
		t.Errorf("%d machines booted with no Pod, want no idle node", n)
	}
	if _, err := tenant.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "job"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	livetest.Eventually(t, 10*time.Second, 50*time.Millisecond, "a node for the pending pod", func() bool {
		return prov.Count(fake.OpCreate) == 1
	})
}

// An edit of a running cluster's scaling (here maxNodes 1 to 2) replaces its scale
// driver: the next Start with the new values, as the provider makes on every pass,
// lets the second Pod have its node; the same values again change nothing.
func TestStartAppliesAScalingEdit(t *testing.T) {
	tenant := kubefake.NewSimpleClientset()
	prov := fake.New(fake.WithTenant(tenant))
	h := New(prov, &Joiners{}, nil, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	plan, _ := nodenet.ForIndex(7)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := Cluster{
		Name: "ci", Tenant: tenant, NodeSize: scale.NodeSize{CPUs: 1, MemoryMiB: 1024, MaxPods: 110}, MaxNodes: 1, Hold: time.Minute,
		Minter: join.Minter{Tenant: tenant, APIServer: "https://10.250.7.1:7500", CACert: []byte("PEM"), ClientCA: []byte("CLIENT PEM"), Plan: plan},
	}
	if err := h.Start(ctx, c); err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer h.Stop("ci")
	for _, name := range []string{"job-a", "job-b"} { // 600m each: one per 1-vCPU node
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "c", Image: "busybox", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("600m")}}}}}}
		if _, err := tenant.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	livetest.Eventually(t, 10*time.Second, 20*time.Millisecond, "one node, as maxNodes 1 allows", func() bool {
		return prov.Count(fake.OpCreate) == 1
	})
	time.Sleep(300 * time.Millisecond) // passes go on; still one
	if n := prov.Count(fake.OpCreate); n != 1 {
		t.Fatalf("%d nodes under maxNodes 1", n)
	}
	if err := h.Start(ctx, c); err != nil { // the same values: nothing to do
		t.Fatalf("Start again: %v", err)
	}
	c.MaxNodes = 2
	if err := h.Start(ctx, c); err != nil {
		t.Fatalf("Start with maxNodes 2: %v", err)
	}
	livetest.Eventually(t, 10*time.Second, 20*time.Millisecond, "a second node once maxNodes is 2", func() bool {
		return prov.Count(fake.OpCreate) == 2
	})
	if n := prov.Count(fake.OpDelete); n != 0 {
		t.Errorf("replacing the driver deleted %d machines, want none", n)
	}
}
