package scale

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func TestDecide(t *testing.T) {
	runner := func(i int) *corev1.Pod {
		return pod(fmt.Sprintf("job-%d", i), lbl("project.runner.gitlab.com/id", "5"), antiExists("project.runner.gitlab.com/id"))
	}
	fivePods := func() []*corev1.Pod {
		var ps []*corev1.Pod
		for i := range 5 {
			ps = append(ps, runner(i))
		}
		return ps
	}

	tests := []struct {
		name       string
		o          Observed
		action     Action
		target     int
		remove     []string
		reason     string // exact, unless contains is set
		contains   []string
		intent     int // checked when non-zero; TestIntentZero covers zero
		wantIdleOf []string
	}{
		// Intent.
		{name: "nothing at all", o: obs(), action: None, target: 0, reason: "no intent and no node"},
		{name: "pending pod and no node", o: obs(pods(pod("a"))), action: Provision, target: 1, reason: "intent and no node", intent: 1},
		{name: "unknown pod is intent", o: obs(pods(pod("a", on("gone"), phase(corev1.PodUnknown)))), action: None, contains: []string{"1 pod and no node"}, intent: 1},
		{name: "succeeded and failed pods are not intent", o: obs(pods(pod("a", phase(corev1.PodSucceeded)), pod("b", phase(corev1.PodFailed)))), action: None, reason: "no intent and no node", intent: 0},
		{name: "daemonset pod is not intent", o: obs(pods(pod("ds", ownedBy("DaemonSet", "proxy")))), action: None, reason: "no intent and no node", intent: 0},
		{name: "mirror pod is not intent", o: obs(pods(pod("static", annotate(corev1.MirrorPodAnnotationKey, "x")))), action: None, reason: "no intent and no node", intent: 0},
		{name: "unbound pod being deleted is not intent", o: obs(pods(pod("a", func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: t0} }))), action: None, reason: "no intent and no node", intent: 0},
		{name: "gated pod is not intent yet", o: obs(pods(pod("a", func(p *corev1.Pod) { p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "x"}} }))), action: None, reason: "no intent and no node"},
		{name: "node being deleted takes no pods", o: obs(pods(pod("a")), nodes(node("n1", func(n *corev1.Node) { n.DeletionTimestamp = &metav1.Time{Time: t0} }))),
			action: Provision, target: 2, reason: "1 pod unschedulable on 1 node: need 2"},
		{name: "job without pods yet is intent", o: obs(func(o *Observed) { o.Jobs = append(o.Jobs, job("build")) }), action: Provision, target: 1, reason: "intent and no node", intent: 1},
		{name: "completed job is not intent", o: obs(func(o *Observed) { o.Jobs = append(o.Jobs, job("build", jobCondition(batchv1.JobComplete))) }), action: None, reason: "no intent and no node", intent: 0},
		{name: "failed job is not intent", o: obs(func(o *Observed) { o.Jobs = append(o.Jobs, job("build", jobCondition(batchv1.JobFailed))) }), action: None, reason: "no intent and no node", intent: 0},
		{name: "suspended job is not intent", o: obs(func(o *Observed) {
			o.Jobs = append(o.Jobs, job("build", func(j *batchv1.Job) { j.Spec.Suspend = ptr.To(true) }))
		}), action: None, reason: "no intent and no node", intent: 0},
		{name: "job parallelism minus active pods", o: obs(
			pods(pod("build-x", ownedBy("Job", "build"), req("1", "1Mi"))),
			func(o *Observed) {
				o.NodeSize.CPUs = 1
				o.Jobs = append(o.Jobs, job("build", func(j *batchv1.Job) { j.Spec.Parallelism = ptr.To[int32](3) }))
			}), action: Provision, target: 3, reason: "intent and no node", intent: 3},
		{name: "job bounded by remaining completions", o: obs(func(o *Observed) {
			o.NodeSize.CPUs = 1
			o.Jobs = append(o.Jobs, job("build", func(j *batchv1.Job) {
				j.Spec.Parallelism, j.Spec.Completions, j.Status.Succeeded = ptr.To[int32](3), ptr.To[int32](4), 3
			}))
		}), action: Provision, target: 1, reason: "intent and no node", intent: 1},
		{name: "deployment with absent replicas counts as 1", o: obs(func(o *Observed) { o.Deployments = append(o.Deployments, deployment("web", nil)) }), action: Provision, target: 1, reason: "intent and no node", intent: 1},
		{name: "deployment with replicas matched by pods", o: obs(
			pods(pod("web-1", lbl("app", "web"), on("n1")), pod("web-2", lbl("app", "web"), on("n1"))), nodes(node("n1")),
			func(o *Observed) { o.Deployments = append(o.Deployments, deployment("web", ptr.To[int32](2))) }),
			action: None, reason: "2 pods on 1 node", intent: 2},
		{name: "statefulset missing replicas become synthetic pods", o: obs(
			pods(pod("db-0", lbl("app", "db"), req("1", "1Mi"))),
			func(o *Observed) {
				o.NodeSize.CPUs = 1
				o.StatefulSets = append(o.StatefulSets, statefulSet("db", ptr.To[int32](3)))
			}), action: Provision, target: 3, reason: "intent and no node", intent: 3},

		// Placement.
		{name: "pending pod fits free capacity of an existing node", o: obs(pods(pod("a")), nodes(node("n1"))), action: None, reason: "1 pod on 1 node", intent: 1},
		{name: "pods unschedulable on a full node", o: obs(
			pods(pod("run", on("n1"), req("2", "1Gi")), pod("a", req("1", "1Gi")), pod("b", req("1", "1Gi")), pod("c", req("1", "1Gi"))),
			nodes(node("n1"))), action: Provision, target: 3, reason: "3 pods unschedulable on 1 node: need 3", intent: 4},
		{name: "limits count as requests when requests are absent", o: obs(pods(pod("a", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m")}}
		})), nodes(node("n1")), pods(pod("run", on("n1"), req("1", "1Mi")))), action: Provision, target: 2, reason: "1 pod unschedulable on 1 node: need 2"},
		{name: "init container raises the request", o: obs(pods(pod("a", func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "i", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")}}}}
		}))), action: None, contains: []string{"pod default/a requests 3 CPU, more than a 2-CPU node: not provisionable"}, intent: 0},
		{name: "max pods per node", o: obs(pods(pod("a"), pod("b"), pod("c")), func(o *Observed) { o.NodeSize.MaxPods = 2 }), action: Provision, target: 2, reason: "intent and no node"},
		{name: "five pods with hostname anti-affinity make five nodes", o: obs(pods(fivePods()...)), action: Provision, target: 5, reason: "intent and no node", intent: 5},
		{name: "anti-affinity against a pod already bound", o: obs(pods(runner(0), pod("old", on("n1"), lbl("project.runner.gitlab.com/id", "1"))), nodes(node("n1"))),
			action: Provision, target: 2, reason: "1 pod unschedulable on 1 node: need 2"},
		{name: "anti-affinity is symmetric", o: obs(pods(pod("new", lbl("project.runner.gitlab.com/id", "1")), runner(0), func() *corev1.Pod { p := runner(9); on("n1")(p); return p }()), nodes(node("n1"))),
			action: Provision, target: 3, reason: "2 pods unschedulable on 1 node: need 3"},
		{name: "anti-affinity only within the namespace", o: obs(pods(runner(0), pod("old", on("n1"), ns("other"), lbl("project.runner.gitlab.com/id", "1"))), nodes(node("n1"))),
			action: None, reason: "2 pods on 1 node"},
		{name: "anti-affinity selector that does not match", o: obs(pods(runner(0), pod("old", on("n1"), lbl("app", "x"))), nodes(node("n1"))),
			action: None, reason: "2 pods on 1 node"},
		{name: "request larger than a node is not provisionable", o: obs(pods(pod("big", req("8", "1Gi")), pod("a"))),
			action: Provision, target: 1, reason: "intent and no node; pod default/big requests 8 CPU, more than a 2-CPU node: not provisionable", intent: 1},
		{name: "memory larger than a node is not provisionable", o: obs(pods(pod("big", req("1", "8Gi")))),
			action: None, reason: "no intent and no node; pod default/big requests 8Gi memory, more than a 2048Mi node: not provisionable", intent: 0},
		{name: "nodeSelector no new node carries", o: obs(pods(pod("ssd", selector("disktype", "ssd")))),
			action: None, contains: []string{"pod default/ssd selects nodes by labels no new node carries: not provisionable"}},
		{name: "nodeSelector on the labels new nodes carry", o: obs(pods(pod("a", selector(corev1.LabelInstanceTypeStable, "socialweb-2c-2048Mi"), selector(LabelManaged, "true"), selector(corev1.LabelArchStable, "amd64")))),
			action: Provision, target: 1, reason: "intent and no node"},
		{name: "hostname selector pins a pod to its node", o: obs(pods(pod("a", selector(corev1.LabelHostname, "n1"))), nodes(node("n1"), node("n2"))),
			action: Hold, reason: "1 node idle, the first past the 1m0s hold in 1m0s", wantIdleOf: []string{"n2"}},
		{name: "booting nodes absorb pending pods", o: obs(pods(pod("a"), pod("b")), func(o *Observed) { o.Booting = []string{"b1"} }),
			action: None, reason: "2 pods on 1 node"},
		{name: "cordoned node takes no pods", o: obs(pods(pod("a")), nodes(node("n1", cordoned))),
			action: Provision, target: 2, reason: "1 pod unschedulable on 1 node: need 2"},
		{name: "young not-ready node is coming capacity", o: obs(pods(pod("a")), nodes(node("n1", notReady(10*time.Second))), func(o *Observed) { o.NotReadyGrace = time.Minute }),
			action: None, reason: "1 pod on 1 node"},
		{name: "old not-ready node is not", o: obs(pods(pod("a")), nodes(node("n1", notReady(10*time.Minute))), func(o *Observed) { o.NotReadyGrace = time.Minute }),
			action: Provision, target: 2, reason: "1 pod unschedulable on 1 node: need 2"},
		// A node that stopped being Ready (a stalled guest) is removed without the hold.
		{name: "not ready past repair-after at the cap is removed", o: obs(pods(pod("a")), nodes(node("n1", notReady(10*time.Minute))), func(o *Observed) {
			o.RepairAfter, o.MaxNodes, o.Hold = 5*time.Minute, 1, time.Hour
		}), action: ScaleDown, target: 0, remove: []string{"n1"}, reason: "1 node not Ready for over 5m0s, removed: n1 (10m0s); 1 pod unplaced: need 2 nodes, capped at max 1"},
		{name: "not ready past repair-after and nothing wanted", o: obs(nodes(node("n1", notReady(3*time.Minute)), node("n2")), func(o *Observed) {
			o.RepairAfter, o.Hold = 2*time.Minute, time.Hour
		}), action: ScaleDown, target: 1, remove: []string{"n1"}, reason: "1 node not Ready for over 2m0s, removed: n1 (3m0s)", wantIdleOf: []string{"n1", "n2"}},
		{name: "the only node not ready and nothing wanted tears down", o: obs(nodes(node("n1", notReady(3*time.Minute))), func(o *Observed) {
			o.RepairAfter, o.Hold = 2*time.Minute, time.Hour
		}), action: Teardown, target: 0, remove: []string{"n1"}, reason: "1 node not Ready for over 2m0s, removed: n1 (3m0s)"},
		{name: "a node that never posted a status is not ready since it registered", o: obs(nodes(node("n1", func(n *corev1.Node) {
			n.Status.Conditions = nil
			n.CreationTimestamp = metav1.NewTime(t0.Add(-6 * time.Minute))
		})), func(o *Observed) { o.RepairAfter = 5 * time.Minute }),
			action: Teardown, target: 0, remove: []string{"n1"}, reason: "1 node not Ready for over 5m0s, removed: n1 (6m0s)"},
		{name: "young not ready node stays", o: obs(pods(pod("a")), nodes(node("n1", notReady(30*time.Second))), func(o *Observed) {
			o.NotReadyGrace, o.RepairAfter, o.MaxNodes = time.Minute, 5*time.Minute, 1
		}), action: None, reason: "1 pod on 1 node"},
		{name: "an old node not ready for a moment stays", o: obs(nodes(node("n1", notReadyFor(10*time.Second))), func(o *Observed) { o.RepairAfter = time.Minute }),
			action: Hold, reason: "nothing running for 0s, 1m0s left of the 1m0s hold", wantIdleOf: []string{"n1"}},
		{name: "an old node not ready past repair-after goes", o: obs(nodes(node("n1", notReadyFor(2*time.Minute)), node("n2")), func(o *Observed) { o.RepairAfter = time.Minute }),
			action: ScaleDown, target: 1, remove: []string{"n1"}, reason: "1 node not Ready for over 1m0s, removed: n1 (2m0s)", wantIdleOf: []string{"n1", "n2"}},
		{name: "a workload pod keeps a not ready node", o: obs(pods(pod("a", on("n1"))), nodes(node("n1", notReady(10*time.Minute))), func(o *Observed) { o.RepairAfter = time.Minute }),
			action: None, reason: "1 pod on 1 node"},
		{name: "do-not-disrupt keeps a not ready node", o: obs(nodes(node("n1", notReady(10*time.Minute), func(n *corev1.Node) {
			n.Annotations = map[string]string{AnnotationDoNotDisrupt: "true"}
		})), func(o *Observed) { o.RepairAfter = time.Minute }),
			action: None, reason: "0 pods on 1 node; node n1 not Ready for 10m0s but kept: node is annotated socialweb.computer/do-not-disrupt"},
		{name: "zero repair-after removes nothing for readiness", o: obs(nodes(node("n1", notReady(10*time.Minute)))),
			action: Hold, reason: "nothing running for 0s, 1m0s left of the 1m0s hold", wantIdleOf: []string{"n1"}},
		{name: "untolerated taint", o: obs(pods(pod("a")), nodes(node("n1", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "gpu", Effect: corev1.TaintEffectNoSchedule}}
		}))), action: Provision, target: 2, reason: "1 pod unschedulable on 1 node: need 2"},

		// Cap.
		{name: "the cap binds and says so", o: obs(pods(append(fivePods(), runner(5), runner(6))...)),
			action: Provision, target: 5, reason: "intent and no node; need 7 nodes, capped at max 5"},
		{name: "the cap binds with nodes present", o: obs(pods(append(fivePods(), runner(5), runner(6))...), nodes(node("n1"))),
			action: Provision, target: 5, reason: "6 pods unschedulable on 1 node: need 7 nodes, capped at max 5"},
		{name: "at the cap nothing to provision", o: obs(pods(runner(0), runner(1)), nodes(node("n1")), func(o *Observed) { o.MaxNodes = 1 }),
			action: None, reason: "2 pods on 1 node; 1 pod unplaced: need 2 nodes, capped at max 1"},

		// Scale down.
		{name: "new idle node starts its clock", o: obs(nodes(node("n1"))), action: Hold, reason: "nothing running for 0s, 1m0s left of the 1m0s hold", wantIdleOf: []string{"n1"}},
		{name: "idle within the hold", o: obs(nodes(node("n1")), idle("n1", 20*time.Second)), action: Hold, target: 1, reason: "nothing running for 20s, 40s left of the 1m0s hold", wantIdleOf: []string{"n1"}},
		{name: "idle past the hold tears down", o: obs(nodes(node("n1"), node("n2")), idle("n1", 90*time.Second), idle("n2", 60917972328*time.Nanosecond)),
			action: Teardown, target: 0, remove: []string{"n1", "n2"}, reason: "nothing running for 1m0.9s, past the 1m0s hold"},
		{name: "daemonset and mirror pods do not keep a node", o: obs(nodes(node("n1")), idle("n1", 2*time.Minute),
			pods(pod("ds", on("n1"), ownedBy("DaemonSet", "proxy")), pod("static", on("n1"), annotate(corev1.MirrorPodAnnotationKey, "x")))),
			action: Teardown, target: 0, remove: []string{"n1"}, reason: "nothing running for 2m0s, past the 1m0s hold"},
		{name: "a node with a running pod is never removed", o: obs(nodes(node("n1")), idle("n1", time.Hour), pods(pod("a", on("n1")))),
			action: None, target: 1, reason: "1 pod on 1 node"},
		{name: "a node with a pending bound pod is never removed", o: obs(nodes(node("n1")), idle("n1", time.Hour), pods(pod("a", on("n1"), phase(corev1.PodPending)))),
			action: None, target: 1, reason: "1 pod on 1 node"},
		{name: "a terminating pod still runs", o: obs(nodes(node("n1")), idle("n1", time.Hour), pods(pod("a", on("n1"), func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: t0} }))),
			action: None, target: 1, reason: "1 pod on 1 node"},
		{name: "finished pods leave a node idle", o: obs(nodes(node("n1")), idle("n1", time.Hour), pods(pod("a", on("n1"), phase(corev1.PodSucceeded)))),
			action: Teardown, target: 0, remove: []string{"n1"}, reason: "nothing running for 1h0m0s, past the 1m0s hold"},
		{name: "scale down the idle node, keep the busy one", o: obs(nodes(node("n1"), node("n2")), idle("n2", 2*time.Minute), pods(pod("a", on("n1")))),
			action: ScaleDown, target: 1, remove: []string{"n2"}, reason: "1 node idle past the 1m0s hold: n2", wantIdleOf: []string{"n2"}},
		{name: "partly idle within the hold", o: obs(nodes(node("n1"), node("n2")), idle("n2", 45*time.Second), pods(pod("a", on("n1")))),
			action: Hold, target: 2, reason: "1 node idle, the first past the 1m0s hold in 15s", wantIdleOf: []string{"n2"}},
		{name: "an idle node a pending pod can use is kept", o: obs(nodes(node("n1")), idle("n1", time.Hour), pods(pod("a"))),
			action: None, target: 1, reason: "1 pod on 1 node", wantIdleOf: []string{}},
		{name: "do-not-disrupt pod blocks removal", o: obs(nodes(node("n1")), idle("n1", time.Hour), pods(pod("ds", on("n1"), ownedBy("DaemonSet", "x"), annotate(AnnotationDoNotDisrupt, "true")))),
			action: None, target: 1, contains: []string{"node n1 idle past the hold but kept: pod default/ds is annotated socialweb.computer/do-not-disrupt"}},
		{name: "do-not-disrupt node blocks removal", o: obs(nodes(node("n1", func(n *corev1.Node) { n.Annotations = map[string]string{AnnotationDoNotDisrupt: "true"} })), idle("n1", time.Hour)),
			action: None, target: 1, contains: []string{"node is annotated"}},
		{name: "do-not-disrupt false does not block", o: obs(nodes(node("n1")), idle("n1", time.Hour), pods(pod("ds", on("n1"), ownedBy("DaemonSet", "x"), annotate(AnnotationDoNotDisrupt, "false")))),
			action: Teardown, target: 0, remove: []string{"n1"}},
		{name: "cordoned idle node is removed after the hold", o: obs(nodes(node("n1", cordoned)), idle("n1", time.Hour)),
			action: Teardown, target: 0, remove: []string{"n1"}},
		{name: "idle past hold but booting node left: scale down, not teardown", o: obs(nodes(node("n1")), idle("n1", time.Hour), func(o *Observed) { o.Booting = []string{"b1"} }),
			action: ScaleDown, target: 1, remove: []string{"n1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Decide(tc.o)
			if err != nil {
				t.Fatalf("Decide: %v", err)
			}
			if d.Action != tc.action {
				t.Errorf("action = %s, want %s (%s)", d.Action, tc.action, d)
			}
			switch tc.action {
			case None, Hold:
				if d.Target != d.Current {
					t.Errorf("%s with target %d != current %d", d.Action, d.Target, d.Current)
				}
			}
			if tc.target != 0 || tc.action == Provision || tc.action == ScaleDown || tc.action == Teardown {
				if d.Target != tc.target {
					t.Errorf("target = %d, want %d (%s)", d.Target, tc.target, d)
				}
			}
			if !slices.Equal(d.Remove, tc.remove) || !slices.Equal(d.Cordon, tc.remove) {
				t.Errorf("remove = %v, cordon = %v, want %v", d.Remove, d.Cordon, tc.remove)
			}
			if tc.reason != "" && d.Reason != tc.reason {
				t.Errorf("reason = %q, want %q", d.Reason, tc.reason)
			}
			for _, s := range tc.contains {
				if !strings.Contains(d.Reason, s) {
					t.Errorf("reason = %q, want it to contain %q", d.Reason, s)
				}
			}
			if tc.intent != 0 && d.Intent != tc.intent {
				t.Errorf("intent = %d, want %d", d.Intent, tc.intent)
			}
			if tc.wantIdleOf != nil {
				got := slices.Sorted(func(yield func(string) bool) {
					for k := range d.IdleSince {
						if !yield(k) {
							return
						}
					}
				})
				if !slices.Equal(got, tc.wantIdleOf) {
					t.Errorf("idle nodes = %v, want %v", got, tc.wantIdleOf)
				}
			}
			if d.Target > tc.o.MaxNodes && d.Target > d.Current {
				t.Errorf("target %d above max %d", d.Target, tc.o.MaxNodes)
			}
		})
	}
}

// Intent 0 cases above are checked here so a zero want is not skipped.
func TestIntentZero(t *testing.T) {
	for name, o := range map[string]Observed{
		"succeeded":     obs(pods(pod("a", phase(corev1.PodSucceeded)))),
		"daemonset":     obs(pods(pod("a", ownedBy("DaemonSet", "x")))),
		"mirror":        obs(pods(pod("a", annotate(corev1.MirrorPodAnnotationKey, "")))),
		"completed job": obs(func(o *Observed) { o.Jobs = append(o.Jobs, job("j", jobCondition(batchv1.JobComplete))) }),
		"too big":       obs(pods(pod("a", req("3", "1Mi")))),
		"replicas 0":    obs(func(o *Observed) { o.Deployments = append(o.Deployments, deployment("d", ptr.To[int32](0))) }),
	} {
		d, err := Decide(o)
		if err != nil {
			t.Fatal(err)
		}
		if d.Intent != 0 || d.Action != None {
			t.Errorf("%s: intent %d, action %s, want 0 and None", name, d.Intent, d.Action)
		}
	}
}

func TestDecideErrors(t *testing.T) {
	tests := []struct {
		name string
		o    Observed
		is   error
	}{
		{"unsynced observation", obs(func(o *Observed) { o.Synced = false }), ErrIncomplete},
		{"unsynced even with nodes idle past hold", obs(nodes(node("n1")), idle("n1", time.Hour), func(o *Observed) { o.Synced = false }), ErrIncomplete},
		{"no time", obs(func(o *Observed) { o.Now = time.Time{} }), nil},
		{"zero node size", obs(func(o *Observed) { o.NodeSize = NodeSize{} }), nil},
		{"negative max", obs(func(o *Observed) { o.MaxNodes = -1 }), nil},
		{"negative hold", obs(func(o *Observed) { o.Hold = -time.Second }), nil},
		{"nil pod", obs(func(o *Observed) { o.Pods = []*corev1.Pod{nil} }), nil},
		{"nil node", obs(func(o *Observed) { o.Nodes = []*corev1.Node{nil} }), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Decide(tc.o)
			if err == nil {
				t.Fatalf("Decide = %s, want an error", d)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("err = %v, want %v", err, tc.is)
			}
		})
	}
}

func TestPodRequests(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	c := func(cpu string) corev1.Container {
		return corev1.Container{Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}
	}
	sidecar := func(cpu string) corev1.Container { x := c(cpu); x.RestartPolicy = &always; return x }
	tests := []struct {
		name string
		spec corev1.PodSpec
		cpu  int64
	}{
		{"sum of containers", corev1.PodSpec{Containers: []corev1.Container{c("1"), c("500m")}}, 1500},
		{"init container max", corev1.PodSpec{InitContainers: []corev1.Container{c("2")}, Containers: []corev1.Container{c("1")}}, 2000},
		{"init smaller than containers", corev1.PodSpec{InitContainers: []corev1.Container{c("200m")}, Containers: []corev1.Container{c("1")}}, 1000},
		{"sidecar adds to containers", corev1.PodSpec{InitContainers: []corev1.Container{sidecar("300m")}, Containers: []corev1.Container{c("1")}}, 1300},
		{"init after sidecar includes it", corev1.PodSpec{InitContainers: []corev1.Container{sidecar("500m"), c("2")}, Containers: []corev1.Container{c("100m")}}, 2500},
		{"limit when no request", corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}}}, 1000},
		{"overhead", corev1.PodSpec{Containers: []corev1.Container{c("1")}, Overhead: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}}, 1250},
		{"pod-level resources override", corev1.PodSpec{Containers: []corev1.Container{c("1"), c("1")}, Resources: &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}, 1000},
	}
	for _, tc := range tests {
		if got, _ := podRequests(&tc.spec); got != tc.cpu {
			t.Errorf("%s: cpu = %dm, want %dm", tc.name, got, tc.cpu)
		}
	}
}

// Decide must not write to what it is given: the driver passes its informer caches.
func TestDecideDoesNotModifyInput(t *testing.T) {
	o := obs(pods(pod("a"), pod("b", on("n1"))), nodes(node("n1")), idle("n1", time.Hour),
		func(o *Observed) { o.Jobs = append(o.Jobs, job("j")) })
	before := fmt.Sprintf("%+v %+v %+v %v", *o.Pods[0], *o.Nodes[0], *o.Jobs[0], o.IdleSince)
	if _, err := Decide(o); err != nil {
		t.Fatal(err)
	}
	if after := fmt.Sprintf("%+v %+v %+v %v", *o.Pods[0], *o.Nodes[0], *o.Jobs[0], o.IdleSince); after != before {
		t.Errorf("input changed:\n%s\n%s", before, after)
	}
}

// A Pod the simulation puts on a machine still booting waits for that machine, and says
// so; one on a registered node, one a new node is booted for, and a workload's Pod not
// created yet wait for none.
func TestWaitFor(t *testing.T) {
	ref := func(name string) Ref {
		return Ref{Kind: "Pod", Namespace: "default", Name: name, UID: types.UID("uid-" + name)}
	}
	tests := []struct {
		name string
		o    Observed
		want map[Ref]string
	}{
		{"pending pods on a booting node", obs(pods(pod("a"), pod("b")), func(o *Observed) { o.Booting = []string{"b1"} }),
			map[Ref]string{ref("a"): "b1", ref("b"): "b1"}},
		{"a pending pod on a registered node", obs(pods(pod("a")), nodes(node("n1"))), nil},
		{"a pending pod and no node", obs(pods(pod("a"))), nil},
		{"a job's pod not created yet", obs(func(o *Observed) {
			o.Jobs = append(o.Jobs, job("build"))
			o.Booting = []string{"b1"}
		}), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Decide(tt.o)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(d.WaitFor, tt.want) {
				t.Errorf("WaitFor = %v, want %v", d.WaitFor, tt.want)
			}
		})
	}
}
