package scale

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/klog/v2"
)

// The simulation answers "how many nodes of this size would the scheduler need": place
// every Pod that wants a node first on the nodes we have (and those booting), then on
// new ones, checking what the scheduler checks for these Pods (requests, pod count,
// nodeSelector/affinity, taints, required anti-affinity). It is first-fit decreasing,
// not the scheduler's scoring: it can only differ from the scheduler in how tightly it
// packs, never in whether a Pod fits a node.

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
	freePods  int
	pods      []podRef // live Pods, bound or placed
	antiPods  int      // how many of pods carry anti-affinity terms
	busy      bool     // a workload Pod is bound here
	blocked   string   // why the node must not be removed, "" if it may
	placed    int      // demands the simulation put here
}

func (n *simNode) add(r podRef, cpu, mem int64) {
	n.freeCPU -= cpu
	n.freeMem -= mem
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
}

type sim struct {
	size     NodeSize
	nodes    []*simNode // registered (by name), booting (by name), then new ones
	byName   map[string]*simNode
	known    int // len of registered + booting
	newCount int
	orphans  int      // live workload Pods bound to a node we do not see
	probe    *simNode // an empty new node, for neverFits
}

func newSim(o *Observed) *sim {
	s := &sim{size: o.NodeSize, byName: make(map[string]*simNode, len(o.Nodes)+len(o.Booting))}
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
		s.nodes = append(s.nodes, sn)
		s.byName[n.Name] = sn
	}
	slices.SortFunc(s.nodes, func(a, b *simNode) int { return cmp.Compare(a.name, b.name) })
	registered := len(s.nodes)
	for _, name := range o.Booting {
		if _, dup := s.byName[name]; dup {
			continue // registered already, or listed twice
		}
		sn := s.freshNode(name)
		s.nodes = append(s.nodes, sn)
		s.byName[name] = sn
	}
	slices.SortFunc(s.nodes[registered:], func(a, b *simNode) int { return cmp.Compare(a.name, b.name) })
	s.known = len(s.nodes)

	// What is already bound uses capacity (DaemonSet and mirror Pods included) and
	// constrains anti-affinity.
	for _, p := range o.Pods {
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
		cpu, mem := podRequests(&p.Spec)
		n.add(podRef{namespace: p.Namespace, labels: p.Labels, anti: parseAntiTerms(p.Namespace, p.Labels, p.Spec.Affinity)}, cpu, mem)
		if isWorkload(p) {
			n.busy = true
		}
		if n.blocked == "" && doNotDisrupt(p.Annotations) {
			n.blocked = "pod " + p.Namespace + "/" + p.Name + " is annotated " + AnnotationDoNotDisrupt
		}
	}
	return s
}

// freshNode is an empty node of the configured size, labelled as the driver boots it.
func (s *sim) freshNode(name string) *simNode {
	return &simNode{
		name:      name,
		node:      &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: NodeLabels(name, s.size)}},
		placeable: true,
		freeCPU:   s.size.CPUs * 1000,
		freeMem:   s.size.MemoryMiB << 20,
		freePods:  s.size.MaxPods,
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

// fits reports whether d can go on n given everything placed so far.
func (s *sim) fits(d *demand, n *simNode) bool {
	if !n.placeable || n.freePods < 1 || d.cpu > n.freeCPU || d.mem > n.freeMem {
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
	n.add(podRef{namespace: d.namespace, labels: d.labels, anti: d.anti}, d.cpu, d.mem)
	n.placed++
}

// neverFits says why d could not run on an empty node of the configured size, or "".
func (s *sim) neverFits(d *demand) string {
	if d.cpu > s.size.CPUs*1000 {
		return fmt.Sprintf("%s requests %s CPU, more than a %d-CPU node: not provisionable", d.key, fmtCPU(d.cpu), s.size.CPUs)
	}
	if d.mem > s.size.MemoryMiB<<20 {
		return fmt.Sprintf("%s requests %s memory, more than a %dMi node: not provisionable",
			d.key, resource.NewQuantity(d.mem, resource.BinarySI).String(), s.size.MemoryMiB)
	}
	if s.probe == nil {
		s.probe = s.freshNode(newNodeName(0))
	}
	if ok, err := d.affinity.Match(s.probe.node); err != nil || !ok {
		return fmt.Sprintf("%s selects nodes by labels no new node carries: not provisionable", d.key)
	}
	return ""
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
	pendingSince     metav1.Time
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
		return cmp.Compare(a.key, b.key)
	})
	var res placement
next:
	for _, d := range ds {
		for _, n := range s.nodes[:s.known] {
			if s.fits(d, n) {
				s.put(d, n)
				continue next
			}
		}
		if why := s.neverFits(d); why != "" {
			res.notProvisionable = append(res.notProvisionable, why)
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
		n := s.freshNode(newNodeName(s.newCount + 1))
		if !s.fits(d, n) {
			// Only anti-affinity over a topology wider than one node gets here.
			res.unplaced--
			res.notProvisionable = append(res.notProvisionable, d.key+" is kept off every new node by required anti-affinity: not provisionable")
			continue
		}
		s.newCount++
		s.nodes = append(s.nodes, n)
		s.put(d, n)
	}
	return res
}
