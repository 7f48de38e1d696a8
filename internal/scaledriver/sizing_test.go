package scaledriver

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/nodes/fake"
	"github.com/socialweb-computer/socialweb/internal/scale"
)

// sizedConfig lets nodes range from 1 vCPU / 1 GiB / 10 GiB to 8 vCPU / 16 GiB / 50 GiB.
func sizedConfig() Config {
	return Config{
		NodeSize:    scale.NodeSize{CPUs: 1, MemoryMiB: 1024, DiskMiB: 10240, MaxPods: 20},
		MaxNodeSize: scale.NodeSize{CPUs: 8, MemoryMiB: 16384, DiskMiB: 51200},
		Reserve:     scale.DefaultReserve(),
	}
}

func requests(cpu, mem, storage string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		r := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}
		if storage != "" {
			r[corev1.ResourceEphemeralStorage] = resource.MustParse(storage)
		}
		p.Spec.Containers[0].Resources.Requests = r
	}
}

// podEvents lists the Events about Pods as "Type Reason pod/name: note".
// podEvents are the Warning Events about Pods in default (the problems; the Normal
// NodeBooting ones are TestPodsHearWhyTheyWait's).
func (r *rig) podEvents() []string {
	r.t.Helper()
	el, err := r.client.EventsV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	var out []string
	for _, e := range el.Items {
		if e.Regarding.Kind == "Pod" && e.Type == corev1.EventTypeWarning {
			out = append(out, e.Type+" "+e.Reason+" "+e.Regarding.Namespace+"/"+e.Regarding.Name+": "+e.Note)
		}
	}
	slices.Sort(out)
	return out
}

func (r *rig) creates() []nodes.NodeRequest {
	var out []nodes.NodeRequest
	for _, c := range r.prov.Calls() {
		if c.Op == fake.OpCreate && c.Err == nil {
			out = append(out, c.Request)
		}
	}
	return out
}

// Each node is created with the size the decision chose for it, and labelled with it.
func TestSizedCreates(t *testing.T) {
	tests := []struct {
		name   string
		pods   []runtime.Object
		sizes  []scale.NodeSize
		event  string
		unfit  []string // Pod events
		reason string   // of the PodsProvisionable condition
	}{
		{name: "one big pod, one big node",
			pods:   []runtime.Object{testPod("big", requests("3", "5Gi", ""))},
			sizes:  []scale.NodeSize{{CPUs: 3, MemoryMiB: 5632, DiskMiB: 10240, MaxPods: 20}},
			event:  "Normal Provision: intent and no node; 1 pod needs 3 CPU, 5Gi memory: a 3 vCPU / 5632 MiB / 10 GiB node",
			reason: "PodsProvisionable"},
		{name: "small pods share a small node",
			pods:   []runtime.Object{testPod("a"), testPod("b"), testPod("c")},
			sizes:  []scale.NodeSize{{CPUs: 2, MemoryMiB: 1024, DiskMiB: 10240, MaxPods: 20}},
			event:  "Normal Provision: intent and no node; 3 pods need 1500m CPU, 768Mi memory: a 2 vCPU / 1024 MiB / 10 GiB node",
			reason: "PodsProvisionable"},
		{name: "storage sizes the disk",
			pods:   []runtime.Object{testPod("build", requests("1", "1Gi", "20Gi"))},
			sizes:  []scale.NodeSize{{CPUs: 1, MemoryMiB: 1536, DiskMiB: 26624, MaxPods: 20}},
			reason: "PodsProvisionable"},
		{name: "a pod no size fits boots nothing and is told",
			pods:   []runtime.Object{testPod("huge", requests("16", "1Gi", ""))},
			unfit:  []string{"Warning NotProvisionable default/huge: needs 16 CPU; the largest node is 8 vCPU: no node is booted for it"},
			reason: "PodsExceedNodeSize"},
		{name: "the others still get their node",
			pods:   []runtime.Object{testPod("huge", requests("16", "1Gi", "")), testPod("a")},
			sizes:  []scale.NodeSize{{CPUs: 1, MemoryMiB: 1024, DiskMiB: 10240, MaxPods: 20}},
			unfit:  []string{"Warning NotProvisionable default/huge: needs 16 CPU; the largest node is 8 vCPU: no node is booted for it"},
			reason: "PodsExceedNodeSize"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, sizedConfig(), false, tc.pods)
			ctx := context.Background()
			r.start(ctx)
			for range 3 { // later passes neither boot more nor tell the Pods again
				if _, err := r.d.RunPass(ctx); err != nil {
					t.Fatal(err)
				}
				r.settle()
				r.clock.advance(time.Second)
			}
			var sizes []scale.NodeSize
			for _, req := range r.creates() {
				sizes = append(sizes, scale.NodeSize{CPUs: req.CPUs, MemoryMiB: req.MemoryMiB, DiskMiB: req.DiskMiB, MaxPods: req.MaxPods})
				want := scale.NodeSize{CPUs: req.CPUs, MemoryMiB: req.MemoryMiB}.InstanceType()
				if got := req.Labels[corev1.LabelInstanceTypeStable]; got != want || req.Labels[corev1.LabelHostname] != req.Name {
					t.Errorf("node %s labelled %v, want instance type %s", req.Name, req.Labels, want)
				}
			}
			if !slices.Equal(sizes, tc.sizes) {
				t.Errorf("created %v, want %v", sizes, tc.sizes)
			}
			if tc.event != "" && !slices.Contains(r.events(), tc.event) {
				t.Errorf("events %q, want %q", r.events(), tc.event)
			}
			if got := r.podEvents(); !slices.Equal(got, tc.unfit) {
				t.Errorf("pod events %q, want %q", got, tc.unfit)
			}
			conds := r.status.getPods()
			if len(conds) != 1 || conds[0].reason != tc.reason || conds[0].ok != (tc.reason == "PodsProvisionable") {
				t.Errorf("PodsProvisionable reports %+v, want one %s", conds, tc.reason)
			}
			if got := testutil.ToFloat64(r.d.metrics.unfit.WithLabelValues(cluster)); got != float64(len(tc.unfit)) {
				t.Errorf("socialweb_scale_unprovisionable_pods = %v, want %d", got, len(tc.unfit))
			}
		})
	}
}

// Once the Pod no size fits is gone, the Cluster says every Pod is provisionable again,
// and a Pod that comes back is told again.
func TestUnfitPodGoesAndComesBack(t *testing.T) {
	huge := testPod("huge", requests("16", "1Gi", ""))
	r := newRig(t, sizedConfig(), false, []runtime.Object{huge})
	ctx := context.Background()
	r.start(ctx)
	pass := func() {
		t.Helper()
		if _, err := r.d.RunPass(ctx); err != nil {
			t.Fatal(err)
		}
		r.clock.advance(time.Second)
	}
	pass()
	if err := r.client.CoreV1().Pods("default").Delete(ctx, "huge", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.settle()
	pass()
	if _, err := r.client.CoreV1().Pods("default").Create(ctx, huge, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.settle()
	pass()
	var reasons []string
	for _, c := range r.status.getPods() {
		reasons = append(reasons, c.reason)
	}
	if want := []string{"PodsExceedNodeSize", "PodsProvisionable", "PodsExceedNodeSize"}; !slices.Equal(reasons, want) {
		t.Errorf("PodsProvisionable reports %q, want %q", reasons, want)
	}
	if n := len(r.podEvents()); n != 2 {
		t.Errorf("%d pod events, want 2 (told again when it came back)", n)
	}
}

// A node the host has no room for is no failure: its Pods are told they wait for host
// capacity, the boot is tried again each pass, and it happens once room frees up.
func TestCapacityWait(t *testing.T) {
	r := newRig(t, sizedConfig(), false, []runtime.Object{testPod("big", requests("3", "5Gi", ""))})
	r.prov.SetHostCapacity(4096, 0)
	ctx := context.Background()
	r.start(ctx)
	waitNote := "Warning WaitingForHostCapacity default/big: waits for host capacity: its 3 vCPU / 5632 MiB / 10 GiB node does not fit the host now (needs 5632 MiB of host memory; 4096 MiB free); it boots when capacity frees up"
	for i, st := range []struct {
		hostMiB  int64 // set before the pass; 0 leaves it
		attempts int   // Create calls so far
		machines int
		cond     []string // PodsProvisionable reasons so far
	}{
		{attempts: 1, machines: 0, cond: []string{"WaitingForHostCapacity"}},
		{attempts: 2, machines: 0, cond: []string{"WaitingForHostCapacity"}},
		{hostMiB: 8192, attempts: 3, machines: 1, cond: []string{"WaitingForHostCapacity", "PodsProvisionable"}},
		{attempts: 3, machines: 1, cond: []string{"WaitingForHostCapacity", "PodsProvisionable"}},
	} {
		if st.hostMiB != 0 {
			r.prov.SetHostCapacity(st.hostMiB, 0)
		}
		dec, err := r.d.RunPass(ctx)
		if err != nil {
			t.Fatalf("pass %d: %v (a capacity wait is no failure)", i, err)
		}
		r.settle()
		r.clock.advance(5 * time.Second)
		if got := r.prov.Count(fake.OpCreate); got != st.attempts || len(r.prov.Instances()) != st.machines {
			t.Errorf("pass %d (%s): %d creates, %d machines; want %d, %d", i, dec, got, len(r.prov.Instances()), st.attempts, st.machines)
		}
		var cond []string
		for _, c := range r.status.getPods() {
			cond = append(cond, c.reason)
		}
		if !slices.Equal(cond, st.cond) {
			t.Errorf("pass %d: PodsProvisionable reports %q, want %q", i, cond, st.cond)
		}
	}
	if got := r.podEvents(); !slices.Equal(got, []string{waitNote}) {
		t.Errorf("pod events %q, want once %q", got, waitNote)
	}
	if got := testutil.ToFloat64(r.d.metrics.waits.WithLabelValues(cluster)); got != 2 {
		t.Errorf("socialweb_scale_host_capacity_waits_total = %v, want 2", got)
	}
	if got := testutil.ToFloat64(r.d.metrics.failures.WithLabelValues(cluster, string(scale.Provision))); got != 0 {
		t.Errorf("socialweb_scale_action_failures_total{action=Provision} = %v, want 0", got)
	}
	// The Provision is recorded once, when the node booted.
	var provisions []string
	for _, e := range r.events() {
		if strings.HasPrefix(e, "Normal Provision") {
			provisions = append(provisions, e)
		}
	}
	if len(provisions) != 1 {
		t.Errorf("Provision events %q, want one", provisions)
	}
	if st := r.status.get(); len(st) != 1 || st[0].nodes != 1 {
		t.Errorf("status %+v, want one decision leaving 1 node", st)
	}
}

// While a Pod waits for host capacity, the cluster's own idle nodes past the hold go
// first, so they cannot keep the room it waits for.
func TestCapacityWaitRemovesIdleNodesFirst(t *testing.T) {
	r := newRig(t, sizedConfig(), false, []runtime.Object{testPod("big", requests("3", "5Gi", ""))}, "idle")
	r.prov.SetHostCapacity(6144, 0) // the idle node's 2048 MiB and the new node's 5632 do not fit together
	ctx := context.Background()
	r.start(ctx)
	for i, st := range []struct {
		advance time.Duration
		action  scale.Action
		nodes   []string // machines after the pass; "new" for the sized one
	}{
		{0, scale.Provision, []string{"idle"}},                // refused: waits
		{30 * time.Second, scale.Provision, []string{"idle"}}, // within the hold: still waits
		{time.Minute, scale.ScaleDown, nil},                   // past the hold: the idle node goes first
		{time.Second, scale.Provision, []string{"new"}},       // and the waiting Pod gets its node
	} {
		r.clock.advance(st.advance)
		dec, err := r.d.RunPass(ctx)
		if err != nil {
			t.Fatalf("pass %d: %v", i, err)
		}
		r.settle()
		if dec.Action != st.action {
			t.Errorf("pass %d: %s, want %s", i, dec, st.action)
		}
		var got []string
		for _, in := range r.prov.Instances() {
			name := in.Name
			if name != "idle" {
				name = "new"
				if in.MemoryMiB != 5632 {
					t.Errorf("pass %d: new machine of %d MiB, want 5632", i, in.MemoryMiB)
				}
			}
			got = append(got, name)
		}
		if !slices.Equal(got, st.nodes) {
			t.Errorf("pass %d: machines %v, want %v", i, got, st.nodes)
		}
	}
}

// A booting machine counts with its own size: a machine booted big absorbs a big Pod
// while it boots, where one of the smallest size would not.
func TestBootingMachineCountsWithItsSize(t *testing.T) {
	for _, tc := range []struct {
		name    string
		machine scale.NodeSize
		creates int
	}{
		{"booted big", scale.NodeSize{CPUs: 4, MemoryMiB: 8192, DiskMiB: 10240, MaxPods: 20}, 0},
		{"booted small", scale.NodeSize{CPUs: 1, MemoryMiB: 1024, DiskMiB: 10240, MaxPods: 20}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := newRig(t, sizedConfig(), false, []runtime.Object{testPod("big", requests("3", "4Gi", ""))})
			prov := fake.New(fake.WithClock(client.clock.now)) // no tenant: machines stay booting
			client.prov, client.d.provider = prov, prov
			if _, err := prov.Create(context.Background(), nodes.NodeRequest{Cluster: cluster, Name: "boot", CPUs: tc.machine.CPUs,
				MemoryMiB: tc.machine.MemoryMiB, DiskMiB: tc.machine.DiskMiB, MaxPods: 20}); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			client.start(ctx)
			if _, err := client.d.RunPass(ctx); err != nil {
				t.Fatal(err)
			}
			if got := prov.Count(fake.OpCreate) - 1; got != tc.creates {
				t.Errorf("%d creates beside the booting machine, want %d", got, tc.creates)
			}
		})
	}
}
