package scale

import (
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

var (
	t0   = time.Date(2026, 10, 6, 12, 0, 0, 0, time.UTC)
	size = NodeSize{CPUs: 2, MemoryMiB: 2048, MaxPods: 110}
)

// obs is a synced observation at t0 with a 1m hold, max 5 nodes of size.
func obs(mods ...func(*Observed)) Observed {
	o := Observed{Synced: true, NodeSize: size, MaxNodes: 5, Hold: time.Minute, Now: t0}
	for _, m := range mods {
		m(&o)
	}
	return o
}

type podOpt func(*corev1.Pod)

// pod is a Pending, unbound Pod in default asking 100m/128Mi.
func pod(name string, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(t0.Add(-time.Second))},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func on(node string) podOpt {
	return func(p *corev1.Pod) { p.Spec.NodeName = node; p.Status.Phase = corev1.PodRunning }
}
func phase(ph corev1.PodPhase) podOpt { return func(p *corev1.Pod) { p.Status.Phase = ph } }
func ns(n string) podOpt              { return func(p *corev1.Pod) { p.Namespace = n } }
func req(cpu, mem string) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}
	}
}
func lbl(k, v string) podOpt {
	return func(p *corev1.Pod) {
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		p.Labels[k] = v
	}
}
func annotate(k, v string) podOpt {
	return func(p *corev1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[k] = v
	}
}
func ownedBy(kind, name string) podOpt {
	return func(p *corev1.Pod) {
		p.OwnerReferences = append(p.OwnerReferences, metav1.OwnerReference{Kind: kind, Name: name, UID: types.UID("uid-" + name), Controller: ptr.To(true)})
	}
}
func selector(k, v string) podOpt {
	return func(p *corev1.Pod) {
		if p.Spec.NodeSelector == nil {
			p.Spec.NodeSelector = map[string]string{}
		}
		p.Spec.NodeSelector[k] = v
	}
}

// antiExists repels Pods carrying key, one per hostname (the GitLab runner's config).
func antiExists(key string) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				TopologyKey: corev1.LabelHostname,
				LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
					Key: key, Operator: metav1.LabelSelectorOpExists,
				}}},
			}},
		}}
	}
}

type nodeOpt func(*corev1.Node)

// node is a Ready node of size, created at t0-1h, labelled as the driver boots it.
func node(name string, opts ...nodeOpt) *corev1.Node {
	res := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(size.CPUs, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(size.MemoryMiB<<20, resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(int64(size.MaxPods), resource.DecimalSI),
	}
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: NodeLabels(name, size), CreationTimestamp: metav1.NewTime(t0.Add(-time.Hour))},
		Status: corev1.NodeStatus{
			Capacity: res, Allocatable: res,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
	for _, o := range opts {
		o(n)
	}
	return n
}

func cordoned(n *corev1.Node) { n.Spec.Unschedulable = true }
func notReady(age time.Duration) nodeOpt {
	return func(n *corev1.Node) {
		n.Status.Conditions[0].Status = corev1.ConditionFalse
		n.CreationTimestamp = metav1.NewTime(t0.Add(-age))
	}
}

// notReadyFor: an old node whose Ready condition turned False d before t0.
func notReadyFor(d time.Duration) nodeOpt {
	return func(n *corev1.Node) {
		n.Status.Conditions[0].Status = corev1.ConditionFalse
		n.Status.Conditions[0].LastTransitionTime = metav1.NewTime(t0.Add(-d))
	}
}

func template(name string, cpu string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)},
		}}}},
	}
}

func job(name string, mods ...func(*batchv1.Job)) *batchv1.Job {
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec:       batchv1.JobSpec{Template: template(name, "1")},
	}
	for _, m := range mods {
		m(j)
	}
	return j
}

func jobCondition(t batchv1.JobConditionType) func(*batchv1.Job) {
	return func(j *batchv1.Job) {
		j.Status.Conditions = append(j.Status.Conditions, batchv1.JobCondition{Type: t, Status: corev1.ConditionTrue})
	}
}

func deployment(name string, replicas *int32) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: template(name, "1"),
		},
	}
}

func statefulSet(name string, replicas *int32) *appsv1.StatefulSet {
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: appsv1.StatefulSetSpec{
			Replicas: replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: template(name, "1"),
		},
	}
}

func pods(ps ...*corev1.Pod) func(*Observed) {
	return func(o *Observed) { o.Pods = append(o.Pods, ps...) }
}
func nodes(ns ...*corev1.Node) func(*Observed) {
	return func(o *Observed) { o.Nodes = append(o.Nodes, ns...) }
}
func idle(name string, since time.Duration) func(*Observed) {
	return func(o *Observed) {
		if o.IdleSince == nil {
			o.IdleSince = map[string]time.Time{}
		}
		o.IdleSince[name] = t0.Add(-since)
	}
}
