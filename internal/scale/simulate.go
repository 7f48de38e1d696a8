package scale

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	"github.com/socialweb-computer/socialweb/internal/identity"
)

// The simulation answers "how many nodes, of which sizes, would the scheduler need":
// place every Pod that wants a node first on the nodes we have (and those booting), then
// on new ones, checking what the scheduler checks for these Pods (requests, ephemeral
// storage, pod count, nodeSelector/affinity, taints, required anti-affinity). It is
// first-fit decreasing, not the scheduler's scoring. A new node may take Pods up to what
// the largest size gives them (Reserve, DaemonSet Pods); once all are placed, it gets
// the smallest size in steps that holds them. Fewer, fuller nodes: each VM costs its own
// kernel, containerd and kubelet on the host, and MaxNodes counts VMs. It can differ
// from the scheduler in how tightly it packs; a new node is modelled as giving Pods no
// more than its kubelet will, so what it places on one fits there.

// antiTerm is one required Pod anti-affinity term, parsed once.
type antiTerm struct {
	topologyKey string
	selector    labels.Selector
	namespaces  []string // nil: every namespace
}

func (t *antiTerm) matches(namespace string, lbls map[string]string) bool {
	if t.namespaces != nil && !slices.Contains(t.namespaces, namespace) {
		return false
	}
	return t.selector.Matches(labels.Set(lbls))
}

// parseAntiTerms parses the required anti-affinity terms of a Pod in namespace with
// labels lbls. A namespaceSelector needs Namespace objects we do not watch; it is taken
// as "every namespace", which can only over-provision, never leave a Pod unplaceable.
func parseAntiTerms(namespace string, lbls map[string]string, aff *corev1.Affinity) []antiTerm {
	if aff == nil || aff.PodAntiAffinity == nil {
		return nil
	}
	terms := aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	out := make([]antiTerm, 0, len(terms))
	for i := range terms {
		term := &terms[i]
		if term.TopologyKey == "" {
			continue
		}
		// A nil selector matches no Pod (LabelSelectorAsSelector returns Nothing).
		sel, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
		if err != nil {
			continue // the apiserver rejects such Pods; nothing to honour
		}
		if term.LabelSelector != nil {
			// matchLabelKeys / mismatchLabelKeys take values from the incoming Pod.
			for _, k := range term.MatchLabelKeys {
				if v, ok := lbls[k]; ok {
					if r, err := labels.NewRequirement(k, selection.Equals, []string{v}); err == nil {
						sel = sel.Add(*r)
					}
				}
			}
			for _, k := range term.MismatchLabelKeys {
				if v, ok := lbls[k]; ok {
					if r, err := labels.NewRequirement(k, selection.NotEquals, []string{v}); err == nil {
						sel = sel.Add(*r)
					}
				}
			}
		}
		var nss []string
		if term.NamespaceSelector == nil {
			nss = term.Namespaces
			if len(nss) == 0 {
				nss = []string{namespace}
			}
		}
		out = append(out, antiTerm{topologyKey: term.TopologyKey, selector: sel, namespaces: nss})
	}
	return out
}

// podRef is a Pod on a node as far as anti-affinity cares.
type podRef struct {
	namespace string
	labels    map[string]string
	anti      []antiTerm
}

// simNode is a node in the simulation: registered, booting, or new.
type simNode struct {
	name      string
	node      *corev1.Node // matched by node affinity; a stand-in for booting and new nodes
	existing  bool         // a registered Node object
	placeable bool         // may take Pods
	taints    []corev1.Taint
	freeCPU   int64 // millicores
	freeMem   int64 // bytes
	freeEph   int64 // bytes of ephemeral storage, if ephKnown
	ephKnown  bool  // the node reports ephemeral storage, or is modelled with a disk
	freePods  int
	pods      []podRef // live Pods, bound or placed
	antiPods  int      // how many of pods carry anti-affinity terms
	busy      bool     // a workload Pod is bound here
	blocked   string   // why the node must not be removed, "" if it may
	// notReadyFor is how long a registered node has not been Ready, when that is past
	// RepairAfter (0 otherwise): such a node is broken, not capacity to keep warm.
	notReadyFor time.Duration
	placed      int // demands the simulation put here
	// ranJob: the node carries AnnotationRanJob (a job ran on it, with FreshNodePerJob);
	// jobBound: a job Pod is bound to it now, in any phase.
	ranJob, jobBound bool

	// A node the simulation opens (fresh) is sized by what it holds, up to bound: the
	// largest size, or the one instance type a Pod on it selects (pinned).
	fresh      bool
	pinned     bool
	bound      NodeSize
	need       resources // what the demands placed here request
	daemon     resources // what the DaemonSet Pods it will run request
	daemonPods int
	refs       []Ref
}

func (n *simNode) add(r podRef, req resources) {
	n.freeCPU -= req.cpu
	n.freeMem -= req.mem
	n.freeEph -= req.eph
	n.freePods--
	n.pods = append(n.pods, r)
	if len(r.anti) > 0 {
		n.antiPods++
	}
}

// transientTaints come and go with a node's readiness or initialisation; NotReadyGrace
// and cordoning already account for them, so they do not make a node unfit.
var transientTaints = map[string]bool{
	corev1.TaintNodeNotReady:                         true,
	corev1.TaintNodeUnreachable:                      true,
	corev1.TaintNodeUnschedulable:                    true,
	"node.cloudprovider.kubernetes.io/uninitialized": true,
	identity.StorageTaintKey:                         true,
	identity.KubeletNotReadyTaintKey:                 true,
}

// daemon is a DaemonSet's Pod as every new node it selects will run it.
type daemon struct {
	ref         podRef
	affinity    nodeaffinity.RequiredNodeAffinity
	tolerations []corev1.Toleration
	req         resources
}

type sim struct {
	min, max NodeSize
	reserve  Reserve
	// ephModel: new nodes get a disk sized from ephemeral-storage requests (the largest
	// size has one). Without, storage is not modelled on new nodes.
	ephModel bool
	daemons  []daemon
	nodes    []*simNode // registered (by name), booting (by name), then new ones
	byName   map[string]*simNode
	known    int // len of registered + booting
	newCount int
	orphans  int                   // live workload Pods bound to a node we do not see
	probes   map[probeKey]*simNode // empty new nodes, for newNodeFor
}

type probeKey struct {
	size   NodeSize
	pinned bool
}

func newSim(o *Observed) *sim {
	s := &sim{
		min: o.NodeSize, max: o.NodeSize.Upto(o.MaxNodeSize), reserve: o.Reserve,
		byName: make(map[string]*simNode, len(o.Nodes)+len(o.Booting)),
	}
	s.ephModel = s.max.DiskMiB > 0
	for _, ds := range o.DaemonSets {
		if ds.DeletionTimestamp != nil {
			continue
		}
		t := &ds.Spec.Template
		s.daemons = append(s.daemons, daemon{
			ref:         podRef{namespace: ds.Namespace, labels: t.Labels, anti: parseAntiTerms(ds.Namespace, t.Labels, t.Spec.Affinity)},
			affinity:    nodeaffinity.NewRequiredNodeAffinity(t.Spec.NodeSelector, t.Spec.Affinity),
			tolerations: t.Spec.Tolerations,
			req:         requestsOf(&t.Spec),
		})
	}
	for _, n := range o.Nodes {
		if _, dup := s.byName[n.Name]; dup {
			continue
		}
		sn := &simNode{name: n.Name, node: n, existing: true}
		sn.placeable = !n.Spec.Unschedulable && n.DeletionTimestamp == nil && (nodeReady(n) || o.Now.Sub(n.CreationTimestamp.Time) < o.NotReadyGrace)
		alloc := n.Status.Allocatable
		if len(alloc) == 0 {
			alloc = n.Status.Capacity
		}
		if q, ok := alloc[corev1.ResourceCPU]; ok {
			sn.freeCPU = q.MilliValue()
		}
		if q, ok := alloc[corev1.ResourceMemory]; ok {
			sn.freeMem = q.Value()
		}
		// A kubelet always reports it; a Node that does not (a test's) is not limited by it.
		if q, ok := alloc[corev1.ResourceEphemeralStorage]; ok {
			sn.freeEph, sn.ephKnown = q.Value(), true
		}
		sn.freePods = 110 // the kubelet's default maxPods
		if q, ok := alloc[corev1.ResourcePods]; ok {
			sn.freePods = int(q.Value())
		}
		for _, t := range n.Spec.Taints {
			if (t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute) && !transientTaints[t.Key] {
				sn.taints = append(sn.taints, t)
			}
		}
		if doNotDisrupt(n.Annotations) {
			sn.blocked = "node is annotated " + AnnotationDoNotDisrupt
		}
		_, sn.ranJob = n.Annotations[AnnotationRanJob]
		if since, ok := notReadySince(n); ok && o.RepairAfter > 0 && o.Now.Sub(since) >= o.RepairAfter {
			sn.notReadyFor = o.Now.Sub(since)
		}
		s.nodes = append(s.nodes, sn)
		s.byName[n.Name] = sn
	}
	slices.SortFunc(s.nodes, func(a, b *simNode) int { return cmp.Compare(a.name, b.name) })
	registered := len(s.nodes)
	for _, name := range o.Booting {
		if _, dup := s.byName[name]; dup {
			continue // registered already, or listed twice
		}
		size, ok := o.BootingSizes[name]
		if !ok || size.CPUs <= 0 || size.MemoryMiB <= 0 {
			size = s.min
		}
		if size.MaxPods <= 0 {
			size.MaxPods = s.min.MaxPods
		}
		sn := s.sizedNode(name, size)
		s.nodes = append(s.nodes, sn)
		s.byName[name] = sn
	}
	slices.SortFunc(s.nodes[registered:], func(a, b *simNode) int { return cmp.Compare(a.name, b.name) })
	s.known = len(s.nodes)

	// What is already bound uses capacity (DaemonSet and mirror Pods included) and
	// constrains anti-affinity.
	for _, p := range o.Pods {
		if n := s.byName[p.Spec.NodeName]; n != nil && JobPod(p) {
			n.jobBound = true
		}
		if p.Spec.NodeName == "" || isTerminal(p) {
			continue
		}
		n := s.byName[p.Spec.NodeName]
		if n == nil {
			if isWorkload(p) {
				s.orphans++
			}
			continue
		}
		n.add(podRef{namespace: p.Namespace, labels: p.Labels, anti: parseAntiTerms(p.Namespace, p.Labels, p.Spec.Affinity)}, requestsOf(&p.Spec))
		if isWorkload(p) {
			n.busy = true
		}
		if n.blocked == "" && doNotDisrupt(p.Annotations) {
			n.blocked = "pod " + p.Namespace + "/" + p.Name + " is annotated " + AnnotationDoNotDisrupt
		}
	}
	if o.FreshNodePerJob {
		// A node a job ran on takes nothing more: it is sealed, or about to be.
		for _, n := range s.nodes[:s.known] {
			if n.ranJob || n.jobBound {
				n.placeable = false
			}
		}
	}
	return s
}

// sizedNode is an empty booting node of size, labelled as the driver boots it, with the
// DaemonSet Pods it will run.
func (s *sim) sizedNode(name string, size NodeSize) *simNode {
	a := s.reserve.allocatable(size)
	n := &simNode{
		name:      name,
		node:      &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: NodeLabels(name, size)}},
		placeable: true,
		freeCPU:   a.cpu,
		freeMem:   a.mem,
		freeEph:   a.eph,
		ephKnown:  size.DiskMiB > 0,
		freePods:  size.MaxPods,
	}
	s.addDaemons(n)
	return n
}

// openNode is an empty new node that may grow to the largest size, or, pinned, to pin's
// CPUs and memory (and the largest disk). Unpinned, it carries no instance type yet:
// that follows from the size chosen once it is full.
func (s *sim) openNode(name string, pin *NodeSize) *simNode {
	bound := s.max
	if pin != nil {
		bound.CPUs, bound.MemoryMiB = pin.CPUs, pin.MemoryMiB
	}
	lbls := NodeLabels(name, bound)
	if pin == nil {
		delete(lbls, corev1.LabelInstanceTypeStable)
	}
	a := s.reserve.allocatable(bound)
	n := &simNode{
		name:      name,
		node:      &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}},
		placeable: true,
		freeCPU:   a.cpu,
		freeMem:   a.mem,
		freeEph:   a.eph,
		ephKnown:  s.ephModel,
		freePods:  bound.MaxPods,
		fresh:     true,
		pinned:    pin != nil,
		bound:     bound,
	}
	s.addDaemons(n)
	return n
}

// addDaemons puts on n the Pods of the DaemonSets that select it.
func (s *sim) addDaemons(n *simNode) {
	for i := range s.daemons {
		d := &s.daemons[i]
		if ok, err := d.affinity.Match(n.node); err != nil || !ok {
			continue
		}
		n.add(d.ref, d.req)
		n.daemon = n.daemon.plus(d.req)
		n.daemonPods++
	}
}

// notReadySince is when a node that is not Ready stopped being Ready: its Ready
// condition's last transition, or its creation if it has never been Ready (a kubelet
// that stalled before its first status has no Ready condition until the node lifecycle
// controller sets Unknown). ok is false for a Ready node.
func notReadySince(n *corev1.Node) (since time.Time, ok bool) {
	since = n.CreationTimestamp.Time
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeReady {
			continue
		}
		if c.Status == corev1.ConditionTrue {
			return time.Time{}, false
		}
		if c.LastTransitionTime.After(since) {
			since = c.LastTransitionTime.Time
		}
	}
	return since, true
}

func nodeReady(n *corev1.Node) bool {
	_, notReady := notReadySince(n)
	return !notReady
}

// fits reports whether d can go on n given everything placed so far.
func (s *sim) fits(d *demand, n *simNode) bool {
	if !n.placeable || !capacityFits(d, n) {
		return false
	}
	for i := range n.taints {
		if !tolerated(d.tolerations, &n.taints[i]) {
			return false
		}
	}
	if ok, err := d.affinity.Match(n.node); err != nil || !ok {
		return false
	}
	return s.antiAffinityOK(d, n)
}

func capacityFits(d *demand, n *simNode) bool {
	return n.freePods >= 1 && d.cpu <= n.freeCPU && d.mem <= n.freeMem && (!n.ephKnown || d.eph <= n.freeEph)
}

func tolerated(tols []corev1.Toleration, t *corev1.Taint) bool {
	for i := range tols {
		if tols[i].ToleratesTaint(klog.Background(), t, false) {
			return true
		}
	}
	return false
}

// antiAffinityOK checks d's required anti-affinity against the Pods in n's topology
// domain, and, as the scheduler does, the anti-affinity of Pods already placed against d.
func (s *sim) antiAffinityOK(d *demand, n *simNode) bool {
	for i := range d.anti {
		t := &d.anti[i]
		v, ok := n.node.Labels[t.topologyKey]
		if !ok {
			continue // a node without the key is in no domain of it
		}
		if t.topologyKey == corev1.LabelHostname {
			// Hostnames are unique per node: the domain is n alone, no scan needed.
			if conflicts(t, n) {
				return false
			}
			continue
		}
		for _, m := range s.nodes {
			if mv, ok := m.node.Labels[t.topologyKey]; ok && mv == v && conflicts(t, m) {
				return false
			}
		}
	}
	for _, m := range s.nodes {
		if m.antiPods == 0 {
			continue
		}
		for j := range m.pods {
			for k := range m.pods[j].anti {
				t := &m.pods[j].anti[k]
				mv, ok := m.node.Labels[t.topologyKey]
				if !ok {
					continue
				}
				if nv, ok := n.node.Labels[t.topologyKey]; ok && nv == mv && t.matches(d.namespace, d.labels) {
					return false
				}
			}
		}
	}
	return true
}

// conflicts reports whether any Pod on n matches t.
func conflicts(t *antiTerm, n *simNode) bool {
	for j := range n.pods {
		if t.matches(n.pods[j].namespace, n.pods[j].labels) {
			return true
		}
	}
	return false
}

func (s *sim) put(d *demand, n *simNode) {
	n.add(podRef{namespace: d.namespace, labels: d.labels, anti: d.anti}, d.requests())
	n.placed++
	n.need = n.need.plus(d.requests())
	n.refs = append(n.refs, d.ref)
}

// newNodeName names the k-th simulated node. The parentheses make it an invalid label
// value, so no nodeSelector can pick a node that does not exist yet by hostname.
func newNodeName(k int) string { return "(new node " + strconv.Itoa(k) + ")" }

func fmtCPU(milli int64) string {
	if milli%1000 == 0 {
		return strconv.FormatInt(milli/1000, 10)
	}
	return strconv.FormatInt(milli, 10) + "m"
}

// placement is what the simulation found.
type placement struct {
	unplaced         int // demands that needed a new node (placed there or overflowed)
	overflow         int // demands left over after newLimit new nodes
	notProvisionable []string
	unfit            []Unfit
	pendingSince     metav1.Time
	waitFor          map[Ref]string // Pods put on a booting node: that node
}

func (res *placement) refuse(d *demand, v *verdict) {
	res.notProvisionable = append(res.notProvisionable, v.long)
	if !slices.ContainsFunc(res.unfit, func(u Unfit) bool { return u.Ref == d.ref }) {
		res.unfit = append(res.unfit, Unfit{Ref: d.ref, Why: v.short})
	}
}

// place puts every demand somewhere, opening at most newLimit new nodes.
func (s *sim) place(ds []*demand, newLimit int) placement {
	// Largest first packs close to optimal; the key makes ties deterministic.
	slices.SortFunc(ds, func(a, b *demand) int {
		if c := cmp.Compare(b.cpu, a.cpu); c != 0 {
			return c
		}
		if c := cmp.Compare(b.mem, a.mem); c != 0 {
			return c
		}
		if c := cmp.Compare(b.eph, a.eph); c != 0 {
			return c
		}
		return cmp.Compare(a.key, b.key)
	})
	var res placement
next:
	for _, d := range ds {
		for _, n := range s.nodes[:s.known] {
			if s.fits(d, n) {
				s.put(d, n)
				if !n.existing && !d.synthetic {
					if res.waitFor == nil {
						res.waitFor = map[Ref]string{}
					}
					res.waitFor[d.ref] = n.name
				}
				continue next
			}
		}
		pin, why := s.newNodeFor(d)
		if why != nil {
			res.refuse(d, why)
			continue
		}
		res.unplaced++
		if !d.synthetic && (res.pendingSince.IsZero() || d.created.Before(&res.pendingSince)) {
			res.pendingSince = d.created
		}
		for _, n := range s.nodes[s.known:] {
			if s.fits(d, n) {
				s.put(d, n)
				continue next
			}
		}
		if s.newCount >= newLimit {
			res.overflow++
			continue
		}
		n := s.openNode(newNodeName(s.newCount+1), pin)
		if !s.fits(d, n) {
			// Only anti-affinity over a topology wider than one node gets here.
			res.unplaced--
			res.refuse(d, &verdict{
				long:  d.key + " is kept off every new node by required anti-affinity: not provisionable",
				short: "is kept off every new node by its required anti-affinity",
			})
			continue
		}
		s.newCount++
		s.nodes = append(s.nodes, n)
		s.put(d, n)
	}
	return res
}

// verdict says why a demand fits no new node: long for the Decision's reason, short for
// an Event on the Pod.
type verdict struct{ long, short string }

// newNodeFor says which new node d could run on alone: any size up to the largest (nil
// pin), or one of the instance types it selects; or why none.
func (s *sim) newNodeFor(d *demand) (*NodeSize, *verdict) {
	if p := s.probe(nil); s.labelsMatch(d, p) {
		return nil, s.capacityVerdict(d, p)
	}
	var pins []NodeSize
	var outside []string
	for _, t := range d.types {
		c, m, ok := ParseInstanceType(t)
		switch {
		case !ok:
		case c < s.min.CPUs || c > s.max.CPUs || m < s.min.MemoryMiB || m > s.max.MemoryMiB:
			outside = append(outside, t)
		default:
			pins = append(pins, NodeSize{CPUs: c, MemoryMiB: m, DiskMiB: s.max.DiskMiB, MaxPods: s.max.MaxPods})
		}
	}
	slices.SortFunc(pins, func(a, b NodeSize) int {
		return cmp.Or(cmp.Compare(a.CPUs, b.CPUs), cmp.Compare(a.MemoryMiB, b.MemoryMiB))
	})
	var tooSmall *verdict
	for i := range pins {
		p := s.probe(&pins[i])
		if !s.labelsMatch(d, p) {
			continue
		}
		v := s.capacityVerdict(d, p)
		if v == nil {
			return &pins[i], nil
		}
		if tooSmall == nil {
			tooSmall = v
		}
	}
	switch {
	case tooSmall != nil:
		return nil, tooSmall
	case len(outside) > 0:
		rng := fmt.Sprintf("%d-%d vCPU, %d-%d MiB", s.min.CPUs, s.max.CPUs, s.min.MemoryMiB, s.max.MemoryMiB)
		return nil, &verdict{
			long:  fmt.Sprintf("%s selects instance type %s, outside this cluster's node sizes (%s): not provisionable", d.key, strings.Join(outside, ", "), rng),
			short: fmt.Sprintf("selects instance type %s; this cluster's nodes are %s", strings.Join(outside, ", "), rng),
		}
	}
	return nil, &verdict{
		long:  d.key + " selects nodes by labels no new node carries: not provisionable",
		short: "selects nodes by labels no new node carries",
	}
}

// probe is an empty new node (of pin's type, or unpinned), for newNodeFor's checks.
func (s *sim) probe(pin *NodeSize) *simNode {
	key := probeKey{size: s.max}
	if pin != nil {
		key = probeKey{size: *pin, pinned: true}
	}
	if s.probes == nil {
		s.probes = map[probeKey]*simNode{}
	}
	p := s.probes[key]
	if p == nil {
		p = s.openNode(newNodeName(0), pin)
		s.probes[key] = p
	}
	return p
}

func (s *sim) labelsMatch(d *demand, n *simNode) bool {
	ok, err := d.affinity.Match(n.node)
	return err == nil && ok
}

// capacityVerdict says why d does not fit the empty new node n, or nil if it does.
func (s *sim) capacityVerdict(d *demand, n *simNode) *verdict {
	largest := "the largest node"
	if n.pinned {
		largest = "a " + n.bound.InstanceType() + " node"
	}
	switch {
	case d.cpu > n.freeCPU:
		if n.freeCPU == n.bound.CPUs*1000 {
			return &verdict{
				long:  fmt.Sprintf("%s requests %s CPU, more than a %d-CPU node: not provisionable", d.key, fmtCPU(d.cpu), n.bound.CPUs),
				short: fmt.Sprintf("needs %s CPU; %s is %d vCPU", fmtCPU(d.cpu), largest, n.bound.CPUs),
			}
		}
		return &verdict{
			long: fmt.Sprintf("%s requests %s CPU, more than the %s a %d-CPU node has beside its DaemonSet Pods: not provisionable",
				d.key, fmtCPU(d.cpu), fmtCPU(max(n.freeCPU, 0)), n.bound.CPUs),
			short: fmt.Sprintf("needs %s CPU; %s is %d vCPU, %s beside its DaemonSet Pods", fmtCPU(d.cpu), largest, n.bound.CPUs, fmtCPU(max(n.freeCPU, 0))),
		}
	case d.mem > n.freeMem:
		if n.freeMem == n.bound.MemoryMiB<<20 {
			return &verdict{
				long:  fmt.Sprintf("%s requests %s memory, more than a %dMi node: not provisionable", d.key, fmtBytes(d.mem, true), n.bound.MemoryMiB),
				short: fmt.Sprintf("needs %s memory; %s is %d MiB", fmtBytes(d.mem, true), largest, n.bound.MemoryMiB),
			}
		}
		return &verdict{
			long: fmt.Sprintf("%s requests %s memory, more than the %s a %dMi node gives Pods: not provisionable",
				d.key, fmtBytes(d.mem, true), fmtBytes(max(n.freeMem, 0), false), n.bound.MemoryMiB),
			short: fmt.Sprintf("needs %s memory; %s (%d MiB) gives Pods %s", fmtBytes(d.mem, true), largest, n.bound.MemoryMiB, fmtBytes(max(n.freeMem, 0), false)),
		}
	case n.ephKnown && d.eph > n.freeEph:
		return &verdict{
			long: fmt.Sprintf("%s requests %s ephemeral storage, more than the %s a %s node disk gives Pods: not provisionable",
				d.key, fmtBytes(d.eph, true), fmtBytes(max(n.freeEph, 0), false), fmtMiB(n.bound.DiskMiB)),
			short: fmt.Sprintf("needs %s ephemeral storage; %s's disk (%s) gives Pods %s", fmtBytes(d.eph, true), largest, fmtMiB(n.bound.DiskMiB), fmtBytes(max(n.freeEph, 0), false)),
		}
	case n.freePods < 1:
		return &verdict{
			long:  fmt.Sprintf("%s does not fit: DaemonSet Pods take all %d Pods a node may run: not provisionable", d.key, n.bound.MaxPods),
			short: fmt.Sprintf("DaemonSet Pods take all %d Pods a node may run", n.bound.MaxPods),
		}
	}
	return nil
}

// fmtBytes is a quantity in Gi or Mi, rounded up (a request) or down (what is offered)
// to whole MiB.
func fmtBytes(b int64, up bool) string {
	mib := b >> 20
	if up && b&(1<<20-1) != 0 {
		mib++
	}
	if mib%1024 == 0 && mib > 0 {
		return strconv.FormatInt(mib/1024, 10) + "Gi"
	}
	return strconv.FormatInt(mib, 10) + "Mi"
}

// chosen is the size of a new node: the smallest, in steps, that holds what was placed
// there and its DaemonSet Pods.
func (s *sim) chosen(n *simNode) NodeSize {
	lo, hi := s.min, n.bound
	if n.pinned {
		lo.CPUs, lo.MemoryMiB = hi.CPUs, hi.MemoryMiB
	}
	need := n.need.plus(n.daemon)
	if !s.ephModel {
		need.eph = 0
	}
	size, ok := s.reserve.fit(need, lo, hi)
	if !ok {
		return hi // placement kept need within hi's allocatable; not reached
	}
	return size
}

// newNodes describes the first k new nodes, in the order they were opened.
func (s *sim) newNodes(k int) []NewNode {
	fresh := s.nodes[s.known:]
	out := make([]NewNode, 0, min(k, len(fresh)))
	for _, n := range fresh[:min(k, len(fresh))] {
		size := s.chosen(n)
		out = append(out, NewNode{Size: size, For: n.refs, Why: s.describe(n, size)})
	}
	return out
}

// describe is the size of n in words: what its Pods need, and the size that holds it.
func (s *sim) describe(n *simNode, size NodeSize) string {
	out := plural(n.placed, "pod") + " " + verb(n.placed, "needs", "need") + " " + fmtNeed(n.need)
	if n.daemonPods > 0 {
		out += fmt.Sprintf(" (and %s: %s)", plural(n.daemonPods, "DaemonSet pod"), fmtNeed(n.daemon))
	}
	out += ": a " + size.String() + " node"
	switch {
	case n.pinned:
		out += " (the instance type selected)"
	case size == s.min:
		out += " (the smallest)"
	case size == s.max:
		out += " (the largest)"
	}
	return out
}

func fmtNeed(r resources) string {
	var parts []string
	if r.cpu > 0 {
		parts = append(parts, fmtCPU(r.cpu)+" CPU")
	}
	if r.mem > 0 {
		parts = append(parts, fmtBytes(r.mem, true)+" memory")
	}
	if r.eph > 0 {
		parts = append(parts, fmtBytes(r.eph, true)+" ephemeral storage")
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}
