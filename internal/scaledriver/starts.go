package scaledriver

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/socialweb-computer/socialweb/internal/boottimeline"
)

// The start breakdown: for each node this driver boots, where the time went from its
// first Pod's creation to that Pod's containers running. The phases follow each other:
//
//	decision   Pod created -> the pass that decided to boot the node (a node that waited
//	           for host capacity counts the wait here)
//	vmm        decision -> the provider's Create returned (the VMM runs)
//	kernel     guest kernel start -> the agent (PID 1) started (guest uptime)
//	agent      the agent's boot steps, start to up (guest uptime)
//	registered the rest until the Node object appeared: the VMM before the guest kernel
//	           runs, and the kubelet's TLS bootstrap after the agent is up
//	ready      Node registered -> Node Ready
//	image      the kubelet pulling the Pod's images, waiting for other pulls included
//	           (its Pulled events)
//	container  the rest until the Pod's last container started: scheduling, the sandbox
//	           and its network, creating and starting the containers
//
// Without a boot timeline on the Node, kernel and agent are left out and registered is
// the whole of VMM start -> Node registered; without Pulled events, image is left out and
// container is the whole of Node Ready -> containers running.
//
// A warm start is a warm-pool VM's, booted before the decision and claimed for the node
// (its boot timeline has identity-wait): its kernel phase is 0 and its agent phase only
// the steps after the claim (identity done -> up), so registered is still the rest until
// the Node appeared.
const (
	phaseDecision   = "decision"
	phaseVMM        = "vmm"
	phaseKernel     = "kernel"
	phaseAgent      = "agent"
	phaseRegistered = "registered"
	phaseReady      = "ready"
	phaseImage      = "image"
	phaseContainer  = "container"
)

// startSettle is how long after a node's first Pod runs its breakdown is recorded: the
// kubelet writes its Pulled events asynchronously, and they may come after the Pod's
// status.
const startSettle = 2 * time.Second

// startTimes is what was seen of one node's start: host times on the driver's clock,
// taken when its informers saw each change (a pass may come Batch later, and the objects'
// own timestamps have whole seconds), and the guest's boot timeline.
type startTimes struct {
	podCreated time.Time // the first Pod bound to the node was created
	decided    time.Time // the pass decided to boot the node
	vmm        time.Time // the provider's Create returned
	registered time.Time // the Node object appeared
	ready      time.Time // the Node turned Ready
	running    time.Time // the first Pod's containers had all started
	timeline   boottimeline.Timeline
	pull       time.Duration // the kubelet's image pulls for the first Pod, waiting included
	pulled     bool          // pull is known: the kubelet's Pulled events were read
}

type phase struct {
	name string
	took time.Duration
}

// phases splits t into the breakdown's phases, in order. A phase that came out negative
// (events seen out of order, a Pod created after the decision) counts as 0.
func (t startTimes) phases() []phase {
	clamp := func(d time.Duration) time.Duration { return max(d, 0) }
	ps := []phase{
		{phaseDecision, clamp(t.decided.Sub(t.podCreated))},
		{phaseVMM, clamp(t.vmm.Sub(t.decided))},
	}
	boot := t.registered.Sub(t.vmm)
	if kernel, agent, err := t.guest(); err == nil {
		ps = append(ps, phase{phaseKernel, kernel}, phase{phaseAgent, agent})
		boot -= kernel + agent
	}
	ps = append(ps, phase{phaseRegistered, clamp(boot)}, phase{phaseReady, clamp(t.ready.Sub(t.registered))})
	rest := t.running.Sub(t.ready)
	if t.pulled {
		ps = append(ps, phase{phaseImage, t.pull})
		rest -= t.pull
	}
	return append(ps, phase{phaseContainer, clamp(rest)})
}

// guest is the kernel and agent phases from the boot timeline; see warm starts above.
func (t startTimes) guest() (kernel, agent time.Duration, err error) {
	if t.timeline.Warm() {
		agent, err = t.timeline.WarmAgent()
		return 0, agent, err
	}
	return t.timeline.Phases()
}

// podKey names a node's first Pod.
type podKey struct {
	namespace, name string
	uid             types.UID
}

// nodeStart is one followed node.
type nodeStart struct {
	startTimes
	pod         podKey // zero until a Pod is bound
	rawTimeline string
}

// starts follows the nodes this driver booted, from the decision to their first Pod's
// containers running. Informer handlers stamp each change as they see it; passes record
// the nodes whose first Pod runs (recorded). Nodes adopted from an earlier daemon are not
// followed. A node is forgotten once recorded, or when it goes.
type starts struct {
	now func() time.Time

	mu    sync.Mutex
	nodes map[string]*nodeStart
	// unbound are Pods not yet bound, by when the informer first saw them, kept only
	// while that is finer than their creationTimestamp (whole seconds): seen within a
	// second of it.
	unbound map[types.UID]time.Time
}

func newStarts(now func() time.Time) *starts {
	return &starts{now: now, nodes: map[string]*nodeStart{}, unbound: map[types.UID]time.Time{}}
}

// booted starts following node name: decided in the pass at decided, its VMM started at
// vmm. n is its Node if the cache has it already.
func (s *starts) booted(name string, decided, vmm time.Time, n *corev1.Node) {
	s.mu.Lock()
	s.nodes[name] = &nodeStart{startTimes: startTimes{decided: decided, vmm: vmm}}
	s.mu.Unlock()
	if n != nil {
		s.node(n)
	}
}

// node notes a followed node's registration, Ready and boot timeline.
func (s *starts) node(n *corev1.Node) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	ns := s.nodes[n.Name]
	if ns == nil {
		return
	}
	if ns.registered.IsZero() {
		ns.registered = now
	}
	if ns.ready.IsZero() && nodeReady(n) {
		ns.ready = now
	}
	if raw := n.Annotations[boottimeline.Annotation]; ns.timeline == nil && raw != "" {
		if tl, err := boottimeline.Parse(raw); err == nil {
			ns.timeline, ns.rawTimeline = tl, raw
		}
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// decidedAt is when the pass that boots followed node name decided to; false if it is
// not followed.
func (s *starts) decidedAt(name string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ns, ok := s.nodes[name]
	if !ok {
		return time.Time{}, false
	}
	return ns.decided, true
}

// forget stops following node name.
func (s *starts) forget(name string) {
	s.mu.Lock()
	delete(s.nodes, name)
	s.mu.Unlock()
}

// pod notes when an unbound Pod was first seen, which Pod is a followed node's first, and
// when that Pod's containers had all started.
func (s *starts) pod(p *corev1.Pod) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.Spec.NodeName == "" {
		if _, ok := s.unbound[p.UID]; !ok {
			if age := now.Sub(p.CreationTimestamp.Time); age >= 0 && age < time.Second {
				s.unbound[p.UID] = now
			}
		}
		return
	}
	seen, fine := s.unbound[p.UID]
	delete(s.unbound, p.UID)
	ns := s.nodes[p.Spec.NodeName]
	if ns == nil || !ns.running.IsZero() {
		return
	}
	if ns.pod.uid == "" {
		if !jobPod(p) {
			return
		}
		ns.pod = podKey{p.Namespace, p.Name, p.UID}
		ns.podCreated = p.CreationTimestamp.Time
		if fine {
			ns.podCreated = seen
		}
	}
	if ns.pod.uid == p.UID && containersStarted(p) {
		ns.running = now
	}
}

// podGone forgets a deleted Pod; a node whose first Pod went before it ran takes the next.
func (s *starts) podGone(p *corev1.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.unbound, p.UID)
	if ns := s.nodes[p.Spec.NodeName]; ns != nil && ns.pod.uid == p.UID && ns.running.IsZero() {
		ns.pod = podKey{}
	}
}

// jobPod: the Pods a node is booted for, not a DaemonSet's or a static Pod's mirror.
func jobPod(p *corev1.Pod) bool {
	if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return false
	}
	for _, o := range p.OwnerReferences {
		if o.Kind == "DaemonSet" {
			return false
		}
	}
	return true
}

// containersStarted: every container of p has started (running, or ended after it ran).
func containersStarted(p *corev1.Pod) bool {
	if len(p.Status.ContainerStatuses) < len(p.Spec.Containers) || len(p.Spec.Containers) == 0 {
		return false
	}
	for _, cs := range p.Status.ContainerStatuses {
		st := cs.State
		if st.Running == nil && (st.Terminated == nil || st.Terminated.StartedAt.IsZero()) {
			return false
		}
	}
	return true
}

// finishedStart is a node whose breakdown is ready to record.
type finishedStart struct {
	node        string
	pod         podKey
	times       startTimes
	rawTimeline string
}

// due takes out the nodes whose first Pod has run for settle.
func (s *starts) due(now time.Time, settle time.Duration) []finishedStart {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []finishedStart
	for name, ns := range s.nodes {
		if !ns.running.IsZero() && now.Sub(ns.running) >= settle {
			out = append(out, finishedStart{name, ns.pod, ns.startTimes, ns.rawTimeline})
			delete(s.nodes, name)
		}
	}
	return out
}

// nodeHandler feeds s from the Node informer.
func (s *starts) nodeHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { s.onNode(o) },
		UpdateFunc: func(_, o any) { s.onNode(o) },
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if n, ok := o.(*corev1.Node); ok {
				s.forget(n.Name)
			}
		},
	}
}

func (s *starts) onNode(o any) {
	if n, ok := o.(*corev1.Node); ok {
		s.node(n)
	}
}

// podHandler feeds s from the Pod informer.
func (s *starts) podHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { s.onPod(o) },
		UpdateFunc: func(_, o any) { s.onPod(o) },
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if p, ok := o.(*corev1.Pod); ok {
				s.podGone(p)
			}
		},
	}
}

func (s *starts) onPod(o any) {
	if p, ok := o.(*corev1.Pod); ok {
		s.pod(p)
	}
}

// pulledRE matches the kubelet's Pulled event for an image it pulled (one already present
// took no pull): `Successfully pulled image "x" in 1.2s (3.4s including waiting). ...`.
var pulledRE = regexp.MustCompile(`^Successfully pulled image .* in \S+ \((\S+) including waiting\)`)

// imagePulls sums the time the kubelet spent getting p's images, waiting for other pulls
// included, from its Pulled events. ok is false when there are none (yet): every
// container's image gets one, pulled or already present.
func (d *Driver) imagePulls(ctx context.Context, p podKey) (took time.Duration, ok bool, err error) {
	sel := fields.AndSelectors(
		fields.OneTermEqualSelector("involvedObject.uid", string(p.uid)),
		fields.OneTermEqualSelector("reason", "Pulled"),
	).String()
	el, err := d.tenant.CoreV1().Events(p.namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return 0, false, fmt.Errorf("list the Pulled events of pod %s/%s: %w", p.namespace, p.name, err)
	}
	for _, e := range el.Items {
		// Field selectors narrow a real apiserver's answer; the fake clientset ignores them.
		if e.InvolvedObject.UID != p.uid || e.Reason != "Pulled" {
			continue
		}
		ok = true
		if m := pulledRE.FindStringSubmatch(e.Message); m != nil {
			if dur, perr := time.ParseDuration(m[1]); perr == nil {
				took += dur
			}
		}
	}
	return took, ok, nil
}

// recordStarts records the breakdown of every node whose first Pod has run for
// startSettle: the histogram, and one log line with every phase.
func (d *Driver) recordStarts(ctx context.Context) {
	for _, f := range d.starts.due(d.now(), startSettle) {
		t := f.times
		var err error
		t.pull, t.pulled, err = d.imagePulls(ctx, f.pod)
		if err != nil {
			d.log.Warn("node start breakdown without its image phase", "node", f.node, "err", err)
		}
		ps := t.phases()
		warm := t.timeline.Warm()
		d.metrics.startedNode(d.cfg.Cluster, warm)
		secs := make([]any, 0, len(ps)+1)
		for _, p := range ps {
			d.metrics.started(d.cfg.Cluster, p.name, p.took)
			secs = append(secs, slog.Float64(p.name, seconds(p.took)))
		}
		secs = append(secs, slog.Float64("total", seconds(t.running.Sub(t.podCreated))))
		d.log.Info("node start", "node", f.node, "pod", f.pod.namespace+"/"+f.pod.name, "warm", warm,
			slog.Group("seconds", secs...), "bootTimeline", f.rawTimeline)
	}
}

// seconds to the millisecond, for log lines.
func seconds(d time.Duration) float64 { return math.Round(d.Seconds()*1000) / 1000 }
