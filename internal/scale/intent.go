package scale

import (
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// Intent: what wants a node. Pods that are Pending, Running or Unknown want one; so do
// workloads whose Pods do not exist yet (a Job before its controller made the Pod), so the
// boot starts a controller round-trip earlier. Finished Pods and Jobs do not, and neither
// do Pods that exist because a node exists (DaemonSet and mirror Pods): counting those
// would keep every node alive forever.

// isTerminal: Succeeded and Failed Pods hold no resources and are not intent.
func isTerminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// isNodeBound reports Pods that exist because their node does.
func isNodeBound(p *corev1.Pod) bool {
	if _, ok := p.Annotations[annotationMirrorPod]; ok {
		return true
	}
	for i := range p.OwnerReferences {
		if p.OwnerReferences[i].Kind == "DaemonSet" {
			return true
		}
	}
	return false
}

// isWorkload: a non-terminal Pod that is neither DaemonSet nor mirror. Phase "" counts
// as Pending (a Pod the apiserver has not defaulted, e.g. in a fake clientset).
func isWorkload(p *corev1.Pod) bool {
	if isTerminal(p) || isNodeBound(p) {
		return false
	}
	switch p.Status.Phase {
	case corev1.PodPending, corev1.PodRunning, corev1.PodUnknown, "":
		return true
	}
	return false
}

// placeable: an unbound Pod that may be scheduled. One being deleted will never run; a
// gated one may not be scheduled yet, so booting a node for it would only idle.
func placeable(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && len(p.Spec.SchedulingGates) == 0
}

// Wanting counts what asks for a node in a cluster that has none: unbound workload Pods
// that may be scheduled, and the Pods Jobs, Deployments and StatefulSets still lack. It
// is Decide's intent before the node sizes are tried (a Pod no size fits still asks),
// from o's Pods and workloads only; the sleep decision reads it.
func Wanting(o Observed) int {
	n := 0
	for _, p := range o.Pods {
		if isWorkload(p) && p.Spec.NodeName == "" && placeable(p) {
			n++
		}
	}
	return n + len(workloadDemands(&o))
}

// BlocksRemoval reports whether p, bound to a node, keeps that node: a live workload Pod,
// or any live Pod annotated do-not-disrupt. The driver re-checks a node with it right
// before deleting, to close the race between a decision and a Pod being bound.
func BlocksRemoval(p *corev1.Pod) bool {
	return isWorkload(p) || (!isTerminal(p) && doNotDisrupt(p.Annotations))
}

func doNotDisrupt(annotations map[string]string) bool {
	return annotations[AnnotationDoNotDisrupt] == "true"
}

// jobFinished: Complete/Failed, or their precursors SuccessCriteriaMet/FailureTarget
// (the controller is only cleaning up), or a completion time.
func jobFinished(j *batchv1.Job) bool {
	if j.Status.CompletionTime != nil {
		return true
	}
	for _, c := range j.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete, batchv1.JobFailed, batchv1.JobSuccessCriteriaMet, batchv1.JobFailureTarget:
			return true
		}
	}
	return false
}

// jobMissing is how many Pods a Job wants that do not exist yet: parallelism, bounded
// by completions still to go, minus active Pods. Both counts take the larger of the
// Job's status and the Pods we see, so a lagging cache never adds phantom Pods.
func jobMissing(j *batchv1.Job, seenActive, seenSucceeded int) int {
	if j.DeletionTimestamp != nil || jobFinished(j) || (j.Spec.Suspend != nil && *j.Spec.Suspend) {
		return 0
	}
	want := 1
	if j.Spec.Parallelism != nil {
		want = int(*j.Spec.Parallelism)
	}
	if j.Spec.Completions != nil {
		remaining := int(*j.Spec.Completions) - max(int(j.Status.Succeeded), seenSucceeded)
		want = min(want, remaining)
	}
	return max(0, want-max(int(j.Status.Active), seenActive))
}

// replicas: absent spec.replicas means 1, as the apiserver defaults it.
func replicas(r *int32) int {
	if r == nil {
		return 1
	}
	return int(*r)
}

// demand is one Pod to place: a real unbound Pending Pod or a synthetic one made from a
// workload's template.
type demand struct {
	key       string // "pod ns/name" for real Pods, "<kind> ns/name" for synthetic ones
	ref       Ref
	namespace string
	labels    map[string]string
	cpu, mem  int64 // millicores, bytes
	eph       int64 // ephemeral storage, bytes
	created   metav1.Time
	synthetic bool

	affinity    nodeaffinity.RequiredNodeAffinity
	tolerations []corev1.Toleration
	anti        []antiTerm
	// types are the instance types the Pod's nodeSelector or required node affinity
	// names (In): the sizes a new node for it may take. Nil if it names none.
	types []string
}

func newDemand(ref Ref, lbls map[string]string, spec *corev1.PodSpec, created metav1.Time, synthetic bool) *demand {
	r := requestsOf(spec)
	return &demand{
		key:         ref.String(),
		ref:         ref,
		namespace:   ref.Namespace,
		labels:      lbls,
		cpu:         r.cpu,
		mem:         r.mem,
		eph:         r.eph,
		created:     created,
		synthetic:   synthetic,
		affinity:    nodeaffinity.NewRequiredNodeAffinity(spec.NodeSelector, spec.Affinity),
		tolerations: spec.Tolerations,
		anti:        parseAntiTerms(ref.Namespace, lbls, spec.Affinity),
		types:       instanceTypes(spec),
	}
}

func (d *demand) requests() resources { return resources{d.cpu, d.mem, d.eph} }

// instanceTypes lists the instance types spec selects by nodeSelector or by a required
// node affinity term's In.
func instanceTypes(spec *corev1.PodSpec) []string {
	var out []string
	if v, ok := spec.NodeSelector[corev1.LabelInstanceTypeStable]; ok {
		out = append(out, v)
	}
	if a := spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		for _, t := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, e := range t.MatchExpressions {
				if e.Key == corev1.LabelInstanceTypeStable && e.Operator == corev1.NodeSelectorOpIn {
					out = append(out, e.Values...)
				}
			}
		}
	}
	return out
}

// workloadDemands turns Jobs, Deployments and StatefulSets whose Pods do not exist yet
// into synthetic demands from their Pod templates.
func workloadDemands(o *Observed) []*demand {
	if len(o.Jobs) == 0 && len(o.Deployments) == 0 && len(o.StatefulSets) == 0 {
		return nil
	}
	var out []*demand
	synth := func(kind string, meta *metav1.ObjectMeta, n int, tmpl *corev1.PodTemplateSpec) {
		ref := Ref{Kind: kind, Namespace: meta.Namespace, Name: meta.Name, UID: meta.UID}
		for i := 0; i < n; i++ {
			out = append(out, newDemand(ref, tmpl.Labels, &tmpl.Spec, meta.CreationTimestamp, true))
		}
	}

	if len(o.Jobs) > 0 {
		type counts struct{ active, succeeded int }
		byJob := map[types.UID]*counts{}
		for _, j := range o.Jobs {
			byJob[j.UID] = &counts{}
		}
		for _, p := range o.Pods {
			ref := metav1.GetControllerOfNoCopy(p)
			if ref == nil || ref.Kind != "Job" {
				continue
			}
			c := byJob[ref.UID]
			if c == nil {
				continue
			}
			switch {
			case p.Status.Phase == corev1.PodSucceeded:
				c.succeeded++
			case !isTerminal(p) && p.DeletionTimestamp == nil:
				c.active++
			}
		}
		for _, j := range o.Jobs {
			c := byJob[j.UID]
			synth("Job", &j.ObjectMeta, jobMissing(j, c.active, c.succeeded), &j.Spec.Template)
		}
	}

	if len(o.Deployments) > 0 || len(o.StatefulSets) > 0 {
		// Deployment Pods belong to ReplicaSets we do not watch, so match by selector, as
		// the controllers do; only live Pods count as matching a replica.
		byNS := map[string][]*corev1.Pod{}
		for _, p := range o.Pods {
			if !isTerminal(p) && p.DeletionTimestamp == nil {
				byNS[p.Namespace] = append(byNS[p.Namespace], p)
			}
		}
		missing := func(ns string, sel *metav1.LabelSelector, want int) int {
			if want <= 0 || sel == nil {
				return 0
			}
			s, err := metav1.LabelSelectorAsSelector(sel)
			if err != nil || s.Empty() {
				return 0 // the apiserver rejects these; nothing sensible to count
			}
			have := 0
			for _, p := range byNS[ns] {
				if s.Matches(labels.Set(p.Labels)) {
					have++
				}
			}
			return max(0, want-have)
		}
		for _, d := range o.Deployments {
			if d.DeletionTimestamp != nil {
				continue
			}
			synth("Deployment", &d.ObjectMeta, missing(d.Namespace, d.Spec.Selector, replicas(d.Spec.Replicas)), &d.Spec.Template)
		}
		for _, s := range o.StatefulSets {
			if s.DeletionTimestamp != nil {
				continue
			}
			synth("StatefulSet", &s.ObjectMeta, missing(s.Namespace, s.Spec.Selector, replicas(s.Spec.Replicas)), &s.Spec.Template)
		}
	}
	return out
}

// podRequests is the effective request the scheduler places a Pod by: the sum over
// containers, raised to the largest init-container step (sidecars, i.e. restartable init
// containers, stay running and add up), pod-level requests overriding when set, plus
// overhead. A limit with no request counts as the request, as the apiserver defaults it;
// the seed lost a run to exactly that (a helper limit of 1 CPU made every Pod ask ~2 CPU).
func podRequests(spec *corev1.PodSpec) (cpu, mem int64) {
	r := requestsOf(spec)
	return r.cpu, r.mem
}

// requestsOf is podRequests with ephemeral storage.
func requestsOf(spec *corev1.PodSpec) resources {
	var total, sidecars, init resources
	for i := range spec.Containers {
		total = total.plus(containerRequests(&spec.Containers[i].Resources))
	}
	for i := range spec.InitContainers {
		ic := &spec.InitContainers[i]
		v := containerRequests(&ic.Resources)
		if ic.RestartPolicy != nil && *ic.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			total = total.plus(v)
			sidecars = sidecars.plus(v)
			v = sidecars
		} else {
			v = v.plus(sidecars)
		}
		init = resources{max(init.cpu, v.cpu), max(init.mem, v.mem), max(init.eph, v.eph)}
	}
	total = resources{max(total.cpu, init.cpu), max(total.mem, init.mem), max(total.eph, init.eph)}
	// Pod-level resources cover CPU and memory only.
	if spec.Resources != nil {
		if q, ok := effective(spec.Resources, corev1.ResourceCPU); ok {
			total.cpu = q.MilliValue()
		}
		if q, ok := effective(spec.Resources, corev1.ResourceMemory); ok {
			total.mem = q.Value()
		}
	}
	if len(spec.Overhead) > 0 {
		total = total.plus(quantities(spec.Overhead))
	}
	return total
}

// containerRequests is what a container requests, a limit standing in for a request.
func containerRequests(r *corev1.ResourceRequirements) resources {
	var out resources
	if q, ok := effective(r, corev1.ResourceCPU); ok {
		out.cpu = q.MilliValue()
	}
	if q, ok := effective(r, corev1.ResourceMemory); ok {
		out.mem = q.Value()
	}
	if q, ok := effective(r, corev1.ResourceEphemeralStorage); ok {
		out.eph = q.Value()
	}
	return out
}

func quantities(l corev1.ResourceList) resources {
	var out resources
	if q, ok := l[corev1.ResourceCPU]; ok {
		out.cpu = q.MilliValue()
	}
	if q, ok := l[corev1.ResourceMemory]; ok {
		out.mem = q.Value()
	}
	if q, ok := l[corev1.ResourceEphemeralStorage]; ok {
		out.eph = q.Value()
	}
	return out
}

// effective is a container's (or Pod's) request for name, falling back to its limit.
func effective(r *corev1.ResourceRequirements, name corev1.ResourceName) (resource.Quantity, bool) {
	if q, ok := r.Requests[name]; ok {
		return q, true
	}
	q, ok := r.Limits[name]
	return q, ok
}
