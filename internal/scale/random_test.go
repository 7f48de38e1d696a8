package scale

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// world is a toy cluster driven by Decide: pods arrive, a naive scheduler binds them,
// they finish, nodes boot and register late, and the provider sometimes fails.
type world struct {
	t       *testing.T
	rng     *rand.Rand
	now     time.Time
	size    NodeSize
	max     int
	nodes   map[string]*corev1.Node
	booting map[string]time.Time // name -> when it registers
	pods    []*corev1.Pod
	finish  map[*corev1.Pod]time.Time
	jobs    []*batchv1.Job
	idle    map[string]time.Time
	seq     int
	removed int
}

const step = 5 * time.Second

func newWorld(t *testing.T, seed uint64) *world {
	return &world{
		t: t, rng: rand.New(rand.NewPCG(seed, seed*7919)), now: t0,
		size: NodeSize{CPUs: 2, MemoryMiB: 2048, MaxPods: 8}, max: 6,
		nodes: map[string]*corev1.Node{}, booting: map[string]time.Time{},
		finish: map[*corev1.Pod]time.Time{},
	}
}

func (w *world) name(prefix string) string { w.seq++; return fmt.Sprintf("%s-%d", prefix, w.seq) }

func (w *world) newPod(prefix string, cpuMilli int64, memMi int64) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: w.name(prefix), Namespace: "default", CreationTimestamp: metav1.NewTime(w.now)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU:    *resource.NewMilliQuantity(cpuMilli, resource.DecimalSI),
			corev1.ResourceMemory: *resource.NewQuantity(memMi<<20, resource.BinarySI),
		}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	return p
}

// arrive adds random workload: plain pods, runner pods with anti-affinity, oversized
// pods, do-not-disrupt pods, and Jobs whose pods come a round later.
func (w *world) arrive() {
	for range w.rng.IntN(3) {
		switch r := w.rng.IntN(10); {
		case r < 5:
			w.pods = append(w.pods, w.newPod("web", 100+w.rng.Int64N(1500), 64+w.rng.Int64N(1500)))
		case r < 7:
			p := w.newPod("ci", 100+w.rng.Int64N(400), 128)
			lbl("ci", "1")(p)
			antiExists("ci")(p)
			w.pods = append(w.pods, p)
		case r < 8:
			w.pods = append(w.pods, w.newPod("huge", 2500+w.rng.Int64N(4000), 128))
		case r < 9:
			p := w.newPod("pinned", 200, 128)
			annotate(AnnotationDoNotDisrupt, "true")(p)
			w.pods = append(w.pods, p)
		default:
			name := w.name("job")
			j := job(name, func(j *batchv1.Job) {
				j.UID = types.UID("uid-" + name)
				j.Spec.Parallelism = ptr.To(int32(1 + w.rng.IntN(2)))
				j.Spec.Completions = j.Spec.Parallelism
				j.Spec.Template = template(name, "300m")
			})
			w.jobs = append(w.jobs, j)
		}
	}
}

// jobController creates a Job's pods (one round after the Job) and completes Jobs.
func (w *world) jobController() {
	for _, j := range w.jobs {
		if jobFinished(j) {
			continue
		}
		var active, succeeded int32
		for _, p := range w.pods {
			if ref := metav1.GetControllerOf(p); ref != nil && ref.UID == j.UID {
				switch {
				case p.Status.Phase == corev1.PodSucceeded:
					succeeded++
				case !isTerminal(p):
					active++
				}
			}
		}
		j.Status.Active, j.Status.Succeeded = active, succeeded
		if succeeded >= *j.Spec.Completions {
			jobCondition(batchv1.JobComplete)(j)
			continue
		}
		if j.CreationTimestamp.IsZero() {
			j.CreationTimestamp = metav1.NewTime(w.now) // seen once without pods first
			continue
		}
		for range *j.Spec.Parallelism - active - succeeded {
			p := w.newPod(j.Name, 300, 0)
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "Job", Name: j.Name, UID: j.UID, Controller: ptr.To(true)}}
			w.pods = append(w.pods, p)
		}
	}
}

// schedule binds pending pods to a random node that fits: requests, pod count and the
// "ci" anti-affinity. It is not the simulation's algorithm on purpose.
func (w *world) schedule() {
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range w.nodes {
			if !yield(n) {
				return
			}
		}
	})
	for _, p := range w.pods {
		if p.Spec.NodeName != "" || isTerminal(p) {
			continue
		}
		var fit []string
		for _, n := range names {
			if w.nodes[n].Spec.Unschedulable {
				continue
			}
			var cpu, mem int64
			count, ci := 0, false
			for _, q := range w.pods {
				if q.Spec.NodeName == n && !isTerminal(q) {
					c, m := podRequests(&q.Spec)
					cpu, mem, count = cpu+c, mem+m, count+1
					ci = ci || q.Labels["ci"] != ""
				}
			}
			c, m := podRequests(&p.Spec)
			if cpu+c <= w.size.CPUs*1000 && mem+m <= w.size.MemoryMiB<<20 && count < w.size.MaxPods && !(ci && p.Labels["ci"] != "") {
				fit = append(fit, n)
			}
		}
		if len(fit) > 0 && w.rng.IntN(4) > 0 { // sometimes the scheduler is slow
			p.Spec.NodeName = fit[w.rng.IntN(len(fit))]
			p.Status.Phase = corev1.PodRunning
			w.finish[p] = w.now.Add(time.Duration(1+w.rng.IntN(40)) * step)
		}
	}
}

// progress finishes pods whose time is up and registers booted nodes with a DaemonSet pod.
func (w *world) progress() {
	for _, p := range w.pods {
		if at, ok := w.finish[p]; ok && !isTerminal(p) && !w.now.Before(at) {
			p.Status.Phase = corev1.PodSucceeded
		}
	}
	for name, at := range w.booting {
		if w.now.Before(at) {
			continue
		}
		delete(w.booting, name)
		n := node(name)
		n.CreationTimestamp = metav1.NewTime(w.now)
		if w.rng.IntN(3) == 0 { // registers NotReady first
			n.Status.Conditions[0].Status = corev1.ConditionFalse
		}
		w.nodes[name] = n
		ds := w.newPod("proxy", 50, 32)
		ownedBy("DaemonSet", "proxy")(ds)
		on(name)(ds)
		w.pods = append(w.pods, ds)
	}
	for _, n := range w.nodes {
		if w.now.Sub(n.CreationTimestamp.Time) > 2*step {
			n.Status.Conditions[0].Status = corev1.ConditionTrue
		}
	}
}

func (w *world) observe() Observed {
	o := Observed{
		Synced: true, NodeSize: w.size, MaxNodes: w.max, Hold: time.Minute, NotReadyGrace: time.Minute,
		Pods: w.pods, Jobs: w.jobs, IdleSince: w.idle, Now: w.now,
	}
	for _, n := range w.nodes {
		o.Nodes = append(o.Nodes, n)
	}
	for b := range w.booting {
		o.Booting = append(o.Booting, b)
	}
	return o
}

// check asserts the invariants of one decision against the world it was made in.
func (w *world) check(round int, d Decision) {
	t := w.t
	t.Helper()
	if !slices.Equal(d.Cordon, d.Remove) {
		t.Fatalf("round %d: cordon %v != remove %v", round, d.Cordon, d.Remove)
	}
	for _, name := range d.Remove {
		if w.nodes[name] == nil {
			t.Fatalf("round %d: %s removes unknown node %s", round, d, name)
		}
		for _, p := range w.pods {
			if p.Spec.NodeName != name || isTerminal(p) {
				continue
			}
			if isWorkload(p) {
				t.Fatalf("round %d: %s removes %s while pod %s is %s there", round, d, name, p.Name, p.Status.Phase)
			}
			if p.Annotations[AnnotationDoNotDisrupt] == "true" {
				t.Fatalf("round %d: %s removes %s despite do-not-disrupt pod %s", round, d, name, p.Name)
			}
		}
		if since, ok := w.idle[name]; !ok || w.now.Sub(since) < time.Minute {
			t.Fatalf("round %d: %s removes %s, idle since %v (known %v), before the hold", round, d, name, since, ok)
		}
	}
	if d.Target > w.max && d.Target > d.Current {
		t.Fatalf("round %d: target %d above max %d", round, d.Target, w.max)
	}
	switch d.Action {
	case Provision:
		if d.Target <= d.Current || len(d.Remove) > 0 {
			t.Fatalf("round %d: bad provision %s (current %d)", round, d, d.Current)
		}
	case ScaleDown, Teardown:
		if len(d.Remove) == 0 || d.Target != d.Current-len(d.Remove) || (d.Action == Teardown && d.Target != 0) {
			t.Fatalf("round %d: bad %s (current %d, remove %v)", round, d, d.Current, d.Remove)
		}
	default:
		if len(d.Remove) > 0 || d.Target != d.Current {
			t.Fatalf("round %d: %s changes nodes", round, d)
		}
	}
}

// apply carries d out; the provider fails one time in eight, and then the idle state is
// not advanced.
func (w *world) apply(d Decision) {
	if w.rng.IntN(8) == 0 && d.Action != None && d.Action != Hold {
		return
	}
	switch d.Action {
	case Provision:
		for range d.Target - d.Current {
			w.booting[w.name("node")] = w.now.Add(time.Duration(1+w.rng.IntN(4)) * step)
		}
	case ScaleDown, Teardown:
		for _, name := range d.Remove {
			delete(w.nodes, name)
			w.removed++
			w.pods = slices.DeleteFunc(w.pods, func(p *corev1.Pod) bool { return p.Spec.NodeName == name })
		}
	}
	w.idle = d.IdleSince
}

func (w *world) round(i int, arrive bool) Decision {
	w.now = w.now.Add(step)
	if arrive {
		w.arrive()
	}
	w.jobController()
	w.progress()
	w.schedule()
	d, err := Decide(w.observe())
	if err != nil {
		w.t.Fatalf("round %d: %v", i, err)
	}
	w.check(i, d)
	w.apply(d)
	if n := len(w.nodes) + len(w.booting); n > w.max {
		w.t.Fatalf("round %d: %d nodes, max %d", i, n, w.max)
	}
	// Drop finished pods now and then, as pod GC and job TTLs would.
	if i%20 == 0 {
		w.pods = slices.DeleteFunc(w.pods, func(p *corev1.Pod) bool { return isTerminal(p) && w.rng.IntN(2) == 0 })
	}
	return d
}

func TestRandomizedCluster(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			w := newWorld(t, seed)
			actions := map[Action]int{}
			for i := range 500 {
				// Bursts of work with quiet spells between, so both directions happen.
				actions[w.round(i, (i/60)%2 == 0).Action]++
			}
			// With no new work the cluster must drain back to zero on its own hold.
			drained := false
			for i := 500; i < 1500 && !drained; i++ {
				w.round(i, false)
				// Pinned (do-not-disrupt) and oversized pods never go away by themselves.
				for _, p := range w.pods {
					if p.Annotations[AnnotationDoNotDisrupt] == "true" && !isTerminal(p) && p.Spec.NodeName != "" && w.finish[p].After(w.now) {
						w.finish[p] = w.now
					}
				}
				w.pods = slices.DeleteFunc(w.pods, func(p *corev1.Pod) bool {
					return p.Spec.NodeName == "" && p.Status.Phase == corev1.PodPending && w.now.Sub(p.CreationTimestamp.Time) > time.Hour
				})
				drained = len(w.nodes) == 0 && len(w.booting) == 0
			}
			if !drained {
				t.Fatalf("did not drain to zero: %d nodes, %d booting", len(w.nodes), len(w.booting))
			}
			if actions[Provision] == 0 || actions[ScaleDown]+actions[Teardown] == 0 || w.removed == 0 {
				t.Errorf("the run did not exercise both directions: %v", actions)
			}
			t.Logf("actions %v, nodes removed %d", actions, w.removed)
		})
	}
}
