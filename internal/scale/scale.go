// Package scale is the scale decision: a pure function from what a tenant cluster looks
// like (Observed) to what should happen to its nodes (Decision). It does no I/O and reads
// no clock; "now" and the between-pass idle state are inputs, so every rule can be tested
// as a table and replayed from a recorded observation.
package scale

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Action is what a Decision asks the driver to do.
type Action string

const (
	// None: nothing to do (no intent and no node, or every node busy).
	None Action = "None"
	// Provision: boot Target-Current new nodes.
	Provision Action = "Provision"
	// ScaleDown: cordon and remove the nodes in Remove; others stay.
	ScaleDown Action = "ScaleDown"
	// Teardown: no intent and every node idle past the hold: remove all, target 0.
	Teardown Action = "Teardown"
	// Hold: some node is idle but not yet for the whole hold.
	Hold Action = "Hold"
)

const (
	// LabelManaged marks nodes booted by socialweb.
	LabelManaged = "socialweb.computer/managed"
	// AnnotationDoNotDisrupt, "true" on a Pod (or Node), keeps its node from being removed.
	AnnotationDoNotDisrupt = "socialweb.computer/do-not-disrupt"
	// AnnotationRanJob is put on a node (with FreshNodePerJob) once a CI job Pod is bound
	// to it: the node is cordoned then, and removed as soon as no workload Pod is left.
	AnnotationRanJob = "socialweb.computer/ran-job"
	// LabelCIJob marks the job Pods of a runner minted by `cluster runner-credential`.
	LabelCIJob = "socialweb.computer/ci-job"
	// GitLab Runner's kubernetes executor marks every job Pod with this label.
	labelRunnerJobPod = "job.runner.gitlab.com/pod"
	// annotationMirrorPod marks static pods the kubelet mirrors into the API.
	annotationMirrorPod = corev1.MirrorPodAnnotationKey
)

// ErrIncomplete is returned for an observation whose lists failed or whose caches had
// not synced: a partial view must never read as "idle" and tear nodes down.
var ErrIncomplete = errors.New("scale: observation incomplete (a list failed or a cache is not synced)")

// NodeSize is the shape of a node: a cluster's smallest and largest, or one it boots.
type NodeSize struct {
	CPUs      int64 // vCPUs
	MemoryMiB int64
	// DiskMiB is the node's own container-storage disk (images, writable layers,
	// emptyDirs: the kubelet's ephemeral storage); 0 is none.
	DiskMiB int64
	MaxPods int // kubelet maxPods
}

// InstanceType is the node.kubernetes.io/instance-type value of a node of this size,
// e.g. socialweb-2c-3072Mi.
func (s NodeSize) InstanceType() string {
	return "socialweb-" + strconv.FormatInt(s.CPUs, 10) + "c-" + strconv.FormatInt(s.MemoryMiB, 10) + "Mi"
}

func (s NodeSize) validate() error {
	if s.CPUs <= 0 || s.MemoryMiB <= 0 || s.MaxPods <= 0 || s.DiskMiB < 0 {
		return fmt.Errorf("scale: node size must be positive, got %d CPU, %d MiB, %d MiB disk, %d pods", s.CPUs, s.MemoryMiB, s.DiskMiB, s.MaxPods)
	}
	return nil
}

// Upto is the largest size of a range from s (the smallest) to largest: each field of
// largest that is 0 is s's, so the zero value keeps every node at s. MaxPods is s's.
func (s NodeSize) Upto(largest NodeSize) NodeSize {
	out := s
	if largest.CPUs != 0 {
		out.CPUs = largest.CPUs
	}
	if largest.MemoryMiB != 0 {
		out.MemoryMiB = largest.MemoryMiB
	}
	if largest.DiskMiB != 0 {
		out.DiskMiB = largest.DiskMiB
	}
	return out
}

// ValidateRange says what is wrong with a range of node sizes from lo to hi.
func ValidateRange(lo, hi NodeSize) error {
	if err := lo.validate(); err != nil {
		return err
	}
	var errs []string
	if hi.CPUs < lo.CPUs {
		errs = append(errs, fmt.Sprintf("max %d vCPUs is below the minimum %d", hi.CPUs, lo.CPUs))
	}
	if hi.MemoryMiB < lo.MemoryMiB {
		errs = append(errs, fmt.Sprintf("max %d MiB of memory is below the minimum %d MiB", hi.MemoryMiB, lo.MemoryMiB))
	}
	if hi.DiskMiB < lo.DiskMiB {
		errs = append(errs, fmt.Sprintf("max disk %d MiB is below the minimum %d MiB", hi.DiskMiB, lo.DiskMiB))
	}
	if len(errs) > 0 {
		return fmt.Errorf("scale: node sizes: %s", strings.Join(errs, "; "))
	}
	return nil
}

// NodeLabels returns the labels a node named name of this size registers with. The
// simulation matches nodeSelectors against exactly these, so the driver must boot nodes
// with them (NodeRequest.Labels) for its predictions to hold.
func NodeLabels(name string, size NodeSize) map[string]string {
	return map[string]string{
		corev1.LabelHostname:           name,
		corev1.LabelOSStable:           "linux",
		corev1.LabelArchStable:         "amd64",
		corev1.LabelInstanceTypeStable: size.InstanceType(),
		LabelManaged:                   "true",
	}
}

// Observed is one consistent look at a tenant cluster plus the driver's state.
// Decide reads it and never modifies anything it points to (the slices may be the
// driver's informer caches).
type Observed struct {
	// Synced is true only if every list succeeded and every cache had synced. The driver
	// should rather fail than build an Observed; false here is still an error.
	Synced bool

	Pods         []*corev1.Pod
	Jobs         []*batchv1.Job
	Deployments  []*appsv1.Deployment
	StatefulSets []*appsv1.StatefulSet
	Nodes        []*corev1.Node
	// Booting names machines the provider has booted whose Node has not registered yet.
	// They count as nodes of their BootingSizes entry, or of NodeSize: without them
	// every pass during a boot would provision again.
	Booting      []string
	BootingSizes map[string]NodeSize
	// DaemonSets put a Pod on every node they select, so a new node keeps their
	// requests from the Pods the simulation places there.
	DaemonSets []*appsv1.DaemonSet

	// NodeSize is the smallest node to boot (and MaxPods of every node), MaxNodeSize the
	// largest (a field of 0 is NodeSize's: the zero value boots every node at NodeSize).
	// Each new node's size is chosen between them from the Pods placed on it.
	NodeSize    NodeSize
	MaxNodeSize NodeSize
	// Reserve is what a node keeps from Pods (DefaultReserve for socialweb's node
	// image); the zero value takes a node to give Pods its whole size.
	Reserve Reserve
	// MaxNodes caps the node count (registered + booting). 0 allows no nodes.
	MaxNodes int
	// Hold is how long a node must have had no workload Pod before it is removed.
	Hold time.Duration
	// NotReadyGrace: a registered node that is not Ready and younger than this is taken
	// as capacity about to arrive (kubelet and CNI still starting); older, it is not a
	// place pods can go. Zero: not-Ready nodes never take pods in the simulation.
	NotReadyGrace time.Duration
	// RepairAfter: a registered node not Ready for this long (since its Ready condition
	// last changed, or since it registered if it never was Ready: a guest that stalled)
	// and without workload Pods is removed without waiting out the hold, so at the cap
	// it does not stand in the way of a node that works. Zero removes none for it.
	RepairAfter time.Duration

	// IdleNodes is how many nodes of NodeSize to keep up with nothing on them, so that a
	// Pod starts without a boot (0 for none; the driver puts 0 outside the cluster's
	// window). They count against MaxNodes; a node a Pod takes is replaced.
	IdleNodes int
	// FreshNodePerJob: a node a CI job Pod (JobPod) was bound to takes no other Pod after
	// it (Decision.Seal) and is removed once no workload Pod is on it, without the hold:
	// one job per VM, never reused.
	FreshNodePerJob bool

	// HostFull says the driver's last boot for this cluster waited for host capacity.
	// Idle nodes past the hold then go before more are booted: the cluster's own idle
	// nodes must not keep the host's memory from its waiting Pods.
	HostFull bool

	// IdleSince maps node name to when it was first seen without workload Pods, as the
	// driver kept it from the previous Decision's IdleSince.
	IdleSince map[string]time.Time
	// WereIdle are the nodes the previous Decision counted Spare or Claimed (its Idle), as
	// the driver kept them: one a Pod has taken since is Claimed, not merely busy.
	WereIdle []string
	Now      time.Time
}

func (o *Observed) validate() error {
	if !o.Synced {
		return ErrIncomplete
	}
	if o.Now.IsZero() {
		return errors.New("scale: observation has no time")
	}
	if err := ValidateRange(o.NodeSize, o.NodeSize.Upto(o.MaxNodeSize)); err != nil {
		return err
	}
	if o.Reserve.MemoryMiB < 0 || o.Reserve.MemoryShare < 0 || o.Reserve.DiskMiB < 0 || o.Reserve.DiskShare < 0 {
		return fmt.Errorf("scale: reserve %+v must not be negative", o.Reserve)
	}
	if o.MaxNodes < 0 || o.IdleNodes < 0 {
		return fmt.Errorf("scale: max nodes (%d) and idle nodes (%d) must not be negative", o.MaxNodes, o.IdleNodes)
	}
	if o.Hold < 0 || o.NotReadyGrace < 0 || o.RepairAfter < 0 {
		return fmt.Errorf("scale: hold (%s), not-ready grace (%s) and repair-after (%s) must not be negative", o.Hold, o.NotReadyGrace, o.RepairAfter)
	}
	for _, p := range o.Pods {
		if p == nil {
			return errors.New("scale: nil pod in observation")
		}
	}
	for _, n := range o.Nodes {
		if n == nil {
			return errors.New("scale: nil node in observation")
		}
	}
	for _, j := range o.Jobs {
		if j == nil {
			return errors.New("scale: nil job in observation")
		}
	}
	for _, d := range o.Deployments {
		if d == nil {
			return errors.New("scale: nil deployment in observation")
		}
	}
	for _, s := range o.StatefulSets {
		if s == nil {
			return errors.New("scale: nil statefulset in observation")
		}
	}
	for _, d := range o.DaemonSets {
		if d == nil {
			return errors.New("scale: nil daemonset in observation")
		}
	}
	return nil
}

// Decision is what to do, and why.
type Decision struct {
	Action Action
	// Current is the node count observed (registered + booting).
	Current int
	// Target is the node count after the action.
	Target int
	// Cordon lists nodes to mark unschedulable before removal, Remove the nodes to
	// delete (provider instance and Node object). Today they are the same nodes; they are
	// separate so a driver cannot delete what it did not cordon first.
	Cordon []string
	Remove []string
	// Seal lists nodes a CI job Pod is bound to, with FreshNodePerJob, that are not
	// marked yet: the driver cordons them and puts AnnotationRanJob on them, whatever the
	// Action.
	Seal []string
	// Spare is how many nodes (registered or booting) have nothing on them and could take
	// a Pod, after this decision's placements: the idle nodes kept for IdleNodes.
	Spare int
	// SpareBooting is how many of Spare are still booting (no Node registered yet).
	SpareBooting int
	// Claimed is how many of Observed.WereIdle a Pod has taken since: a workload Pod is
	// bound there, or the simulation put a pending one there. They work, so they are not
	// Spare; with IdleNodes, refills boot in their place.
	Claimed int
	// Idle names the nodes counted in Spare or Claimed: the next Observed.WereIdle.
	Idle []string
	// Reason is for humans: events, status, logs.
	Reason string

	// Intent counts Pods (real, or synthetic for workloads whose Pods do not exist yet)
	// that want to run and could run on a node of this size.
	Intent int
	// Unplaced counts intent that fits no existing or booting node.
	Unplaced int
	// Need is the node count the simulation wanted before the cap (Current if none).
	Need int
	// Capped is true when MaxNodes kept Target below Need.
	Capped bool
	// NotProvisionable describes Pods no node of an allowed size could ever run.
	NotProvisionable []string
	// Unfit says the same per Pod (or workload, for Pods not created yet), once each:
	// nothing is booted for them.
	Unfit []Unfit
	// New is each node to boot (Target-Current of them, Provision only): its size and
	// what the simulation placed on it.
	New []NewNode
	// WaitFor are the Pods the simulation put on a machine still booting (in Booting):
	// no node is booted for them, they wait for that one.
	WaitFor map[Ref]string
	// PendingSince is the creation time of the oldest real Pod among Unplaced (zero if
	// none): the start of the pending-to-provision latency.
	PendingSince time.Time
	// IdleSince is the driver's state for the next pass. Adopt it only if this
	// Decision's action was carried out; otherwise keep the previous one.
	IdleSince map[string]time.Time
}

// JobPod says whether p is a CI job's Pod: GitLab Runner's (its job.runner.gitlab.com/pod
// label) or one carrying LabelCIJob.
func JobPod(p *corev1.Pod) bool {
	_, runner := p.Labels[labelRunnerJobPod]
	_, ours := p.Labels[LabelCIJob]
	return runner || ours
}

// Ref names what a demand came from: a Pod, or the Job, Deployment or StatefulSet whose
// Pod does not exist yet.
type Ref struct {
	Kind, Namespace, Name string
	UID                   types.UID
}

func (r Ref) String() string { return strings.ToLower(r.Kind) + " " + r.Namespace + "/" + r.Name }

// Unfit is a Pod that no node this cluster may boot could run.
type Unfit struct {
	Ref Ref
	// Why, e.g. "needs 16 CPU; the largest node is 8 vCPU".
	Why string
}

// NewNode is one node to boot.
type NewNode struct {
	Size NodeSize
	// For is what the simulation placed on it (a Ref may repeat: a Job's Pods).
	For []Ref
	// Why is its size in words: "1 pod needs 3 CPU, 5Gi memory: a 3 vCPU / 6144 MiB / 10 GiB node".
	Why string
}

// String is a one-line summary, e.g. "Provision nodes=3: intent and no node".
func (d Decision) String() string {
	var b strings.Builder
	b.WriteString(string(d.Action))
	b.WriteString(" nodes=")
	b.WriteString(strconv.Itoa(d.Target))
	if d.Reason != "" {
		b.WriteString(": ")
		b.WriteString(d.Reason)
	}
	return b.String()
}
