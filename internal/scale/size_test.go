package scale

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var (
	minSize = NodeSize{CPUs: 1, MemoryMiB: 1024, DiskMiB: 10240, MaxPods: 110}
	maxSize = NodeSize{CPUs: 8, MemoryMiB: 16384, DiskMiB: 51200}
)

// sized lets nodes range from minSize to maxSize, with socialweb's node reserve.
func sized(o *Observed) {
	o.NodeSize, o.MaxNodeSize, o.Reserve = minSize, maxSize, DefaultReserve()
}

func storage(q string) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Requests[corev1.ResourceEphemeralStorage] = resource.MustParse(q)
	}
}

func daemonSet(name, cpu, mem string) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem),
			}},
		}}}}},
	}
}

func TestDecideSizing(t *testing.T) {
	runner := func(i int) *corev1.Pod {
		return pod(fmt.Sprintf("job-%d", i), lbl("ci", "1"), antiExists("ci"))
	}
	tests := []struct {
		name     string
		o        Observed
		action   Action
		target   int
		sizes    []NodeSize // of Decision.New, in order
		podsOn   []int      // how many refs each new node is for; nil: don't check
		unfit    []string   // "ref: why" of Decision.Unfit
		contains []string   // in the reason
		reason   string     // exact, if set
		remove   []string
	}{
		{name: "small pods pack onto one smallest node",
			o:      obs(sized, pods(pod("a"), pod("b"), pod("c"))),
			action: Provision, target: 1, sizes: []NodeSize{minSize}, podsOn: []int{3},
			reason: "intent and no node; 3 pods need 300m CPU, 384Mi memory: a 1 vCPU / 1024 MiB / 10 GiB node (the smallest)"},
		{name: "one big pod gets one big node",
			o:      obs(sized, pods(pod("big", req("3", "5Gi")))),
			action: Provision, target: 1, sizes: []NodeSize{{CPUs: 3, MemoryMiB: 5632, DiskMiB: 10240, MaxPods: 110}},
			reason: "intent and no node; 1 pod needs 3 CPU, 5Gi memory: a 3 vCPU / 5632 MiB / 10 GiB node"},
		{name: "ephemeral storage sizes the disk",
			o:      obs(sized, pods(pod("build", req("1", "1Gi"), storage("20Gi")))),
			action: Provision, target: 1, sizes: []NodeSize{{CPUs: 1, MemoryMiB: 1536, DiskMiB: 26624, MaxPods: 110}},
			contains: []string{"1 pod needs 1 CPU, 1Gi memory, 20Gi ephemeral storage: a 1 vCPU / 1536 MiB / 26 GiB node"}},
		{name: "rounded up to whole vCPUs and 512 MiB",
			o:      obs(sized, pods(pod("a", req("1500m", "1000Mi")))),
			action: Provision, target: 1, sizes: []NodeSize{{CPUs: 2, MemoryMiB: 1536, DiskMiB: 10240, MaxPods: 110}}},
		{name: "a step above the largest is clamped to it",
			o:      obs(sized, func(o *Observed) { o.MaxNodeSize.MemoryMiB = 16000 }, pods(pod("a", req("7500m", "14800Mi")))),
			action: Provision, target: 1, sizes: []NodeSize{{CPUs: 8, MemoryMiB: 16000, DiskMiB: 10240, MaxPods: 110}},
			contains: []string{"a 8 vCPU / 16000 MiB / 10 GiB node"}},
		{name: "a pod beyond the largest CPU is reported and nothing boots",
			o:      obs(sized, pods(pod("huge", req("16", "1Gi")))),
			action: None, target: 0, unfit: []string{"pod default/huge: needs 16 CPU; the largest node is 8 vCPU"},
			reason: "no intent and no node; pod default/huge requests 16 CPU, more than a 8-CPU node: not provisionable"},
		{name: "memory a pod needs beyond what the largest node gives Pods",
			o:      obs(sized, pods(pod("huge", req("1", "16Gi")))),
			action: None, unfit: []string{"pod default/huge: needs 16Gi memory; the largest node (16384 MiB) gives Pods 15232Mi"},
			contains: []string{"pod default/huge requests 16Gi memory, more than the 15232Mi a 16384Mi node gives Pods: not provisionable"}},
		{name: "storage beyond the largest disk",
			o:      obs(sized, pods(pod("huge", storage("60Gi")))),
			action: None, unfit: []string{"pod default/huge: needs 60Gi ephemeral storage; the largest node's disk (50 GiB) gives Pods 42752Mi"}},
		{name: "one unfit pod does not keep the others from their node",
			o:      obs(sized, pods(pod("huge", req("16", "1Gi")), pod("a"))),
			action: Provision, target: 1, sizes: []NodeSize{minSize}, podsOn: []int{1},
			unfit: []string{"pod default/huge: needs 16 CPU; the largest node is 8 vCPU"}},
		{name: "a job without pods yet is reported by the job",
			o: obs(sized, func(o *Observed) {
				j := job("build")
				j.Spec.Template.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("9")
				o.Jobs = append(o.Jobs, j)
			}),
			action: None, unfit: []string{"job default/build: needs 9 CPU; the largest node is 8 vCPU"}},
		{name: "a booting machine counts with its own size",
			o: obs(sized, pods(pod("big", req("3", "4Gi"))), func(o *Observed) {
				o.Booting = []string{"b1"}
				o.BootingSizes = map[string]NodeSize{"b1": {CPUs: 4, MemoryMiB: 8192, DiskMiB: 10240}}
			}),
			action: None, reason: "1 pod on 1 node"},
		{name: "a booting machine of unknown size counts as the smallest",
			o:      obs(sized, pods(pod("big", req("3", "4Gi"))), func(o *Observed) { o.Booting = []string{"b1"} }),
			action: Provision, target: 2, sizes: []NodeSize{{CPUs: 3, MemoryMiB: 4608, DiskMiB: 10240, MaxPods: 110}}},
		{name: "small pods fill the big pod's node",
			o:      obs(sized, pods(pod("big", req("3", "5Gi")), pod("a"), pod("b"), pod("c"), pod("d"))),
			action: Provision, target: 1, sizes: []NodeSize{{CPUs: 4, MemoryMiB: 6144, DiskMiB: 10240, MaxPods: 110}}, podsOn: []int{5},
			contains: []string{"5 pods need 3400m CPU, 5632Mi memory: a 4 vCPU / 6144 MiB / 10 GiB node"}},
		{name: "pods beyond one largest node open another, sized for what is left",
			o:      obs(sized, pods(pod("a", req("3", "1Gi")), pod("b", req("3", "1Gi")), pod("c", req("3", "1Gi")))),
			action: Provision, target: 2, podsOn: []int{2, 1},
			sizes: []NodeSize{{CPUs: 6, MemoryMiB: 2560, DiskMiB: 10240, MaxPods: 110}, {CPUs: 3, MemoryMiB: 1536, DiskMiB: 10240, MaxPods: 110}}},
		{name: "anti-affinity pods get a smallest node each",
			o:      obs(sized, pods(runner(0), runner(1), runner(2))),
			action: Provision, target: 3, sizes: []NodeSize{minSize, minSize, minSize},
			reason: "intent and no node; 3× (1 pod needs 100m CPU, 128Mi memory: a 1 vCPU / 1024 MiB / 10 GiB node (the smallest))"},
		{name: "daemonsets take their share of a new node",
			o: obs(sized, pods(pod("a", req("1", "512Mi"))), func(o *Observed) {
				o.DaemonSets = append(o.DaemonSets, daemonSet("agent", "500m", "256Mi"))
			}),
			action: Provision, target: 1, sizes: []NodeSize{{CPUs: 2, MemoryMiB: 1024, DiskMiB: 10240, MaxPods: 110}},
			contains: []string{"1 pod needs 1 CPU, 512Mi memory (and 1 DaemonSet pod: 500m CPU, 256Mi memory): a 2 vCPU / 1024 MiB / 10 GiB node"}},
		{name: "daemonsets count in what the largest node has for a pod",
			o: obs(sized, pods(pod("a", req("8", "1Gi"))), func(o *Observed) {
				o.DaemonSets = append(o.DaemonSets, daemonSet("agent", "500m", "256Mi"))
			}),
			action: None, unfit: []string{"pod default/a: needs 8 CPU; the largest node is 8 vCPU, 7500m beside its DaemonSet Pods"}},
		{name: "a daemonset that selects other nodes takes nothing",
			o: obs(sized, pods(pod("a", req("1", "512Mi"))), func(o *Observed) {
				ds := daemonSet("gpu", "500m", "256Mi")
				ds.Spec.Template.Spec.NodeSelector = map[string]string{"gpu": "true"}
				o.DaemonSets = append(o.DaemonSets, ds)
			}),
			action: Provision, target: 1, sizes: []NodeSize{minSize}},
		{name: "a selected instance type pins the size",
			o:      obs(sized, pods(pod("a", req("1", "1Gi"), selector(corev1.LabelInstanceTypeStable, "socialweb-4c-4096Mi")))),
			action: Provision, target: 1, sizes: []NodeSize{{CPUs: 4, MemoryMiB: 4096, DiskMiB: 10240, MaxPods: 110}},
			contains: []string{"a 4 vCPU / 4096 MiB / 10 GiB node (the instance type selected)"}},
		{name: "a selected instance type outside the sizes",
			o:      obs(sized, pods(pod("a", selector(corev1.LabelInstanceTypeStable, "socialweb-16c-4096Mi")))),
			action: None, unfit: []string{"pod default/a: selects instance type socialweb-16c-4096Mi; this cluster's nodes are 1-8 vCPU, 1024-16384 MiB"}},
		{name: "capped: the largest pods get the nodes there are",
			o:      obs(sized, pods(pod("a", req("6", "1Gi")), pod("b", req("7", "1Gi")), pod("c")), func(o *Observed) { o.MaxNodes = 1 }),
			action: Provision, target: 1, sizes: []NodeSize{{CPUs: 8, MemoryMiB: 1536, DiskMiB: 10240, MaxPods: 110}}, podsOn: []int{2},
			contains: []string{"need 2 nodes, capped at max 1"}},
		{name: "host full: an idle node past the hold goes before another boots",
			o: obs(sized, nodes(node("n1")), idle("n1", time.Hour), pods(pod("big", req("4", "4Gi"))),
				func(o *Observed) { o.HostFull = true }),
			action: ScaleDown, target: 0, remove: []string{"n1"},
			reason: "1 node idle past the 1m0s hold: n1; 1 pod waits for host capacity: idle nodes go first"},
		{name: "host not full: boot beside the idle node",
			o:      obs(sized, nodes(node("n1")), idle("n1", time.Hour), pods(pod("big", req("4", "4Gi")))),
			action: Provision, target: 2, sizes: []NodeSize{{CPUs: 4, MemoryMiB: 4608, DiskMiB: 10240, MaxPods: 110}}},
		{name: "host full and nothing idle: boot again",
			o:      obs(sized, pods(pod("big", req("4", "4Gi"))), func(o *Observed) { o.HostFull = true }),
			action: Provision, target: 1, sizes: []NodeSize{{CPUs: 4, MemoryMiB: 4608, DiskMiB: 10240, MaxPods: 110}}},
		{name: "a fixed size names no size",
			o:      obs(pods(pod("a"))),
			action: Provision, target: 1, sizes: []NodeSize{size}, reason: "intent and no node"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Decide(tc.o)
			if err != nil {
				t.Fatalf("Decide: %v", err)
			}
			if d.Action != tc.action || (tc.target != 0 || tc.action != None) && d.Target != tc.target {
				t.Errorf("decision %s, want %s nodes=%d", d, tc.action, tc.target)
			}
			if !slices.Equal(d.Remove, tc.remove) {
				t.Errorf("remove %v, want %v", d.Remove, tc.remove)
			}
			var sizes []NodeSize
			var podsOn []int
			for _, n := range d.New {
				sizes = append(sizes, n.Size)
				podsOn = append(podsOn, len(n.For))
			}
			if !slices.Equal(sizes, tc.sizes) {
				t.Errorf("sizes %v, want %v (%s)", sizes, tc.sizes, d)
			}
			if tc.podsOn != nil && !slices.Equal(podsOn, tc.podsOn) {
				t.Errorf("pods per new node %v, want %v", podsOn, tc.podsOn)
			}
			var unfit []string
			for _, u := range d.Unfit {
				unfit = append(unfit, u.Ref.String()+": "+u.Why)
			}
			if !slices.Equal(unfit, tc.unfit) {
				t.Errorf("unfit %q, want %q", unfit, tc.unfit)
			}
			if tc.reason != "" && d.Reason != tc.reason {
				t.Errorf("reason %q, want %q", d.Reason, tc.reason)
			}
			for _, s := range tc.contains {
				if !strings.Contains(d.Reason, s) {
					t.Errorf("reason %q, want it to contain %q", d.Reason, s)
				}
			}
			// Every new node holds what was placed on it, by the model it was sized with.
			for _, n := range d.New {
				if n.Size.CPUs < tc.o.NodeSize.CPUs || n.Size.MemoryMiB < tc.o.NodeSize.MemoryMiB {
					t.Errorf("new node %s below the minSize %s", n.Size, tc.o.NodeSize)
				}
				if hi := tc.o.NodeSize.Upto(tc.o.MaxNodeSize); n.Size.CPUs > hi.CPUs || n.Size.MemoryMiB > hi.MemoryMiB || n.Size.DiskMiB > hi.DiskMiB {
					t.Errorf("new node %s above the largest %s", n.Size, hi)
				}
			}
		})
	}
}

func TestFit(t *testing.T) {
	r := DefaultReserve()
	lo, hi := NodeSize{CPUs: 1, MemoryMiB: 1000, MaxPods: 10}, NodeSize{CPUs: 4, MemoryMiB: 4000, DiskMiB: 20480}
	tests := []struct {
		name string
		need resources
		want NodeSize
		ok   bool
	}{
		{"nothing: the minSize", resources{}, NodeSize{CPUs: 1, MemoryMiB: 1000, MaxPods: 10}, true},
		{"a minSize off the steps, then steps", resources{mem: 1100 << 20}, NodeSize{CPUs: 1, MemoryMiB: 1536, MaxPods: 10}, true},
		{"exactly a step's allocatable", resources{mem: (1536*15/16 - 128) << 20}, NodeSize{CPUs: 1, MemoryMiB: 1536, MaxPods: 10}, true},
		{"a byte more is the next step", resources{mem: (1536*15/16-128)<<20 + 1}, NodeSize{CPUs: 1, MemoryMiB: 2048, MaxPods: 10}, true},
		{"millicores round up", resources{cpu: 2001}, NodeSize{CPUs: 3, MemoryMiB: 1000, MaxPods: 10}, true},
		{"storage gives a disk", resources{eph: 1}, NodeSize{CPUs: 1, MemoryMiB: 1000, DiskMiB: 3072, MaxPods: 10}, true},
		{"clamped to the largest", resources{mem: 3600 << 20}, NodeSize{CPUs: 1, MemoryMiB: 4000, MaxPods: 10}, true},
		{"too much CPU", resources{cpu: 4001}, NodeSize{}, false},
		{"too much memory", resources{mem: 3700 << 20}, NodeSize{}, false},
		{"too much storage", resources{eph: 20 << 30}, NodeSize{}, false},
	}
	for _, tc := range tests {
		got, ok := r.fit(tc.need, lo, hi)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: fit = %+v, %t; want %+v, %t", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func TestParseInstanceType(t *testing.T) {
	for _, s := range []NodeSize{{CPUs: 1, MemoryMiB: 512}, {CPUs: 16, MemoryMiB: 65536}} {
		c, m, ok := ParseInstanceType(s.InstanceType())
		if !ok || c != s.CPUs || m != s.MemoryMiB {
			t.Errorf("ParseInstanceType(%q) = %d, %d, %t", s.InstanceType(), c, m, ok)
		}
	}
	for _, bad := range []string{"", "m5.large", "socialweb-c-1Mi", "socialweb-2c-", "socialweb-2c-1024", "socialweb-0c-1024Mi", "socialweb-2c--5Mi"} {
		if _, _, ok := ParseInstanceType(bad); ok {
			t.Errorf("ParseInstanceType(%q) ok", bad)
		}
	}
}

func TestValidateRange(t *testing.T) {
	lo := NodeSize{CPUs: 2, MemoryMiB: 2048, DiskMiB: 10240, MaxPods: 110}
	tests := []struct {
		name    string
		hi      NodeSize
		wantErr string
	}{
		{"fixed", lo, ""},
		{"wider", NodeSize{CPUs: 8, MemoryMiB: 8192, DiskMiB: 20480}, ""},
		{"cpu below", NodeSize{CPUs: 1, MemoryMiB: 8192, DiskMiB: 20480}, "max 1 vCPUs is below the minimum 2"},
		{"memory below", NodeSize{CPUs: 2, MemoryMiB: 1024, DiskMiB: 20480}, "max 1024 MiB of memory is below the minimum 2048 MiB"},
		{"disk below", NodeSize{CPUs: 2, MemoryMiB: 2048, DiskMiB: 1024}, "max disk 1024 MiB is below the minimum 10240 MiB"},
	}
	for _, tc := range tests {
		err := ValidateRange(lo, tc.hi)
		if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.wantErr)
		}
	}
	if _, err := Decide(obs(func(o *Observed) { o.MaxNodeSize = NodeSize{CPUs: 1} })); err == nil {
		t.Error("Decide with a largest node below the minSize: no error")
	}
}
