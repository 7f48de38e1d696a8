// Package v1alpha1 holds the management API's types: a Cluster is one tenant
// Kubernetes cluster that the host runs.
package v1alpha1

import (
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

const (
	Group    = "socialweb.computer"
	Version  = "v1alpha1"
	Kind     = "Cluster"
	Resource = "clusters"

	// Finalizer holds a Cluster object until its processes, port lease and
	// data are gone, so deleting the object never leaks them.
	Finalizer = "socialweb.computer/teardown"

	// SystemNamespace holds the daemon's own objects in the management API
	// (leases, tenant admin kubeconfigs).
	SystemNamespace = "socialweb-system"

	// MaxNameLength keeps "<cluster>-<node suffix>" within a DNS-1123 label.
	MaxNameLength = 40
)

// GroupVersionResource of Cluster objects, for dynamic clients.
var ClusterResource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: Resource}

// Phase is a Cluster's coarse state. The conditions say why.
type Phase string

const (
	PhaseInitializing Phase = "Initializing"
	PhaseReady        Phase = "Ready"
	PhaseUnavailable  Phase = "Unavailable"
	PhaseDraining     Phase = "Draining"
	// PhaseAsleep: the control-plane process is stopped (its datastore, lease and port
	// kept) and the daemon listens on its port; the first connection wakes it.
	PhaseAsleep Phase = "Asleep"
)

// Condition types on a Cluster.
const (
	ConditionLeased      = "Leased"      // a port and a network are leased
	ConditionProvisioned = "Provisioned" // datastore, PKI and config are on disk
	ConditionRunning     = "Running"     // the control-plane process is up
	ConditionReady       = "Ready"       // the tenant apiserver answers /readyz
	// ConditionNodeBoot is about the last node boot: True when a node joined, False when
	// one died or did not join in time (the message carries its last console lines).
	ConditionNodeBoot = "NodeBoot"
	// ConditionNodeNetwork is True when no node reports a network problem (it cannot
	// reach the gateway, or its cluster DNS does not answer); False lists the problems.
	ConditionNodeNetwork = "NodeNetwork"
	// ConditionNodeAccelerator says which accelerator the cluster's nodes boot under: its
	// reason is KVM or TCG, its message why (what the host's KVM probe saw, or that KVM
	// was turned off after node boots stalled under it).
	ConditionNodeAccelerator = "NodeAccelerator"
	// ConditionPodsProvisionable is True when every Pod that wants a node fits a node
	// size the cluster may boot and the host has room for it; False (PodsExceedNodeSize,
	// or WaitingForHostCapacity) names the Pods that get none yet, and why.
	ConditionPodsProvisionable = "PodsProvisionable"
	// ConditionWarmStart is about the last node the host tried to start warm (from its
	// warm pool): True when it did, False (WarmStartFailed) with why the node booted cold.
	// Absent while no node of the cluster was tried warm.
	ConditionWarmStart = "WarmStart"
	// ConditionWake is about the last wake from Asleep: True when the control plane
	// answered, False (WakeFailed) with the reason when it did not in time.
	ConditionWake = "Wake"
	// ConditionIdleSchedule is about spec.idleSchedule as the scale driver read it when it
	// started: False (ReasonBadIdleSchedule) when it does not parse, and then no idle
	// nodes are kept; True once a later start reads it. Absent while it never failed.
	ConditionIdleSchedule = "IdleSchedule"
	// ConditionPlaced says which host runs the cluster and why there (its reason
	// Placed, Adopted or Unplaceable; the message is placement's reason).
	ConditionPlaced = "Placed"
)

// ReasonBadIdleSchedule: spec.idleSchedule does not parse (a zone the tz database does
// not know, or an object written before the CRD checked it).
const ReasonBadIdleSchedule = "BadIdleSchedule"

// MinSleepAfter is the shortest sleepAfter other than 0 (never): a shorter idle time
// would put a cluster to sleep between the requests of one kubectl session.
const MinSleepAfter = 30 * time.Second

// Cluster is a tenant Kubernetes cluster.
type Cluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ClusterSpec   `json:"spec,omitempty"`
	Status ClusterStatus `json:"status,omitempty"`
}

// ClusterSpec is what the tenant asked for. Zero values take the daemon's
// defaults when the object is created through the CLI.
type ClusterSpec struct {
	// MaxNodes caps how many worker microVMs the cluster may run at once.
	MaxNodes int32 `json:"maxNodes,omitempty"`
	// Hold is how long a node must be idle before it is removed.
	Hold metav1.Duration `json:"hold,omitempty"`
	// NodeCPUs is the vCPU count of the smallest worker microVM (of every one, when
	// MaxNodeCPUs is 0 or the same).
	NodeCPUs int32 `json:"nodeCPUs,omitempty"`
	// MaxNodeCPUs is the vCPU count of the largest: each worker is sized between the two
	// from the requests of the Pods it is booted for. 0 is NodeCPUs.
	MaxNodeCPUs int32 `json:"maxNodeCPUs,omitempty"`
	// NodeMemory is the memory of the smallest worker microVM.
	NodeMemory resource.Quantity `json:"nodeMemory,omitempty"`
	// MaxNodeMemory is the memory of the largest; 0 is NodeMemory.
	MaxNodeMemory resource.Quantity `json:"maxNodeMemory,omitempty"`
	// NodeDisk is the smallest worker's own container-storage disk (images, writable
	// layers, emptyDirs); a sparse file, it takes host disk only as it fills.
	NodeDisk resource.Quantity `json:"nodeDisk,omitempty"`
	// MaxNodeDisk is the largest, for Pods that request ephemeral storage; 0 is NodeDisk.
	MaxNodeDisk resource.Quantity `json:"maxNodeDisk,omitempty"`
	// PodsPerNode is the kubelet's max pods on each worker.
	PodsPerNode int32 `json:"podsPerNode,omitempty"`
	// ControlPlaneMemory caps the memory of the cluster's control-plane process
	// (apiserver, controllers, scheduler, kine) in its own cgroup; past it the kernel
	// kills that process alone and the daemon restarts it. 0 takes the daemon's
	// --default-control-plane-memory.
	ControlPlaneMemory resource.Quantity `json:"controlPlaneMemory,omitempty"`
	// ControlPlanePIDs caps its threads and processes (pids.max); 0 takes the default.
	ControlPlanePIDs int32 `json:"controlPlanePIDs,omitempty"`
	// ControlPlaneCPUWeight is its CPU share against other tenants (cpu.weight, 1 to
	// 10000, 100 being an ordinary process); 0 takes the default.
	ControlPlaneCPUWeight int32 `json:"controlPlaneCPUWeight,omitempty"`
	// IdleNodes is how many joined, Ready nodes of the smallest size are kept up with
	// nothing on them, so a Pod starts without a boot; they count against maxNodes and
	// the host's capacity, and a cluster with them does not sleep.
	IdleNodes int32 `json:"idleNodes,omitempty"`
	// IdleSchedule limits IdleNodes to a weekly window, e.g. "Mon-Fri 08:00-18:00
	// Europe/Berlin" (internal/window); outside it they go after the hold. Empty is
	// always; one that does not parse keeps none (ConditionIdleSchedule says why).
	IdleSchedule string `json:"idleSchedule,omitempty"`
	// FreshNodePerJob: a node a CI job Pod ran on (GitLab Runner's, or one labelled
	// socialweb.computer/ci-job) takes no other Pod after it and is removed as soon as the
	// job's Pod ends, without the hold: one job per VM, never reused.
	FreshNodePerJob bool `json:"freshNodePerJob,omitempty"`
	// Egress narrows, for this cluster's nodes and Pods, where the host's egress policy
	// (serve --egress, --egress-allow, --egress-deny) lets their forwarded traffic go:
	// "" or "host" is the host's policy, "none" forwards nothing (not even what the host
	// allows). A cluster can narrow the host's policy, never widen it.
	Egress string `json:"egress,omitempty"`
	// EgressDeny are IPv4 CIDRs this cluster's forwarded traffic may not reach, on top of
	// the host's --egress-deny.
	EgressDeny []string `json:"egressDeny,omitempty"`
	// Datastore names the kind of datastore ("sqlite" or "postgres"); the
	// daemon's configuration says where it is.
	Datastore string `json:"datastore,omitempty"`
	// SleepAfter is how long the cluster may be idle (no API request from outside
	// socialweb, no node, none wanted, no CronJob due soon) before its control plane
	// sleeps; 0 is never, and unset takes the daemon's --default-sleep-after.
	SleepAfter *metav1.Duration `json:"sleepAfter,omitempty"`
}

// ClusterStatus is what the daemon observed and did.
type ClusterStatus struct {
	Phase Phase `json:"phase,omitempty"`
	// Host is the host that runs the control plane and the nodes: the holder of the
	// cluster's Lease in the management API.
	Host string `json:"host,omitempty"`
	// MovingTo is the host the cluster is being handed to (its host is drained):
	// front doors hold its new connections until it answers there.
	MovingTo string `json:"movingTo,omitempty"`
	// URL is the tenant apiserver's address on the host loopback.
	URL string `json:"url,omitempty"`
	// Port is the leased apiserver port; it stays the same for the cluster's life.
	Port int32 `json:"port,omitempty"`
	// Gateway is the host's address on the cluster's node network; the
	// apiserver's serving certificate is valid for it. It and the CIDRs are
	// empty while Asleep: the node network is given back at sleep, and a wake
	// may lease another.
	Gateway     string `json:"gateway,omitempty"`
	NodeCIDR    string `json:"nodeCIDR,omitempty"`
	PodCIDR     string `json:"podCIDR,omitempty"`
	ServiceCIDR string `json:"serviceCIDR,omitempty"`
	// Nodes is the number of worker nodes the cluster has now.
	Nodes int32 `json:"nodes"`
	// LastScaleDecision is the last decision that changed something.
	LastScaleDecision *ScaleDecision `json:"lastScaleDecision,omitempty"`
	// AsleepSince is when the control plane went to sleep; set only while Asleep.
	AsleepSince *metav1.Time `json:"asleepSince,omitempty"`
	// NextWake is when a sleeping cluster wakes by itself, ahead of its next CronJob.
	NextWake *metav1.Time `json:"nextWake,omitempty"`
	// IdleNodes says how the idle nodes kept for spec.idleNodes stand: wanted now (0
	// outside the schedule), spare (up with nothing on them, or booting to refill), and
	// claimed (taken by a Pod since).
	IdleNodes *IdleNodesStatus `json:"idleNodes,omitempty"`
	// PodStarts are the percentiles of Pod start times (created to every container
	// started) over the last hour, one entry per path that had a start.
	PodStarts []PodStartPercentiles `json:"podStarts,omitempty"`
	// Restarts counts control-plane process restarts since the daemon started.
	Restarts           int32              `json:"restarts,omitempty"`
	ObservedGeneration int64              `json:"observedGeneration,omitempty"`
	Conditions         []metav1.Condition `json:"conditions,omitempty"`
}

// ScaleDecision records a scale decision in a form a person can read.
type ScaleDecision struct {
	Action string      `json:"action"`
	Target int32       `json:"target"`
	Reason string      `json:"reason"`
	Time   metav1.Time `json:"time"`
}

// Paths a Pod takes to a node, in PodStartPercentiles and socialweb_pod_start_seconds.
const (
	PodStartIdle = "idle" // a node that was up before the Pod was created
	PodStartWarm = "warm" // a warm-pool VM claimed for a node booted for it
	PodStartCold = "cold" // a node booted for it from nothing
)

// PodStartWindow is how far back PodStartPercentiles look.
const PodStartWindow = time.Hour

// PodStartPercentiles sum up one path's Pod starts within PodStartWindow.
type PodStartPercentiles struct {
	Path  string          `json:"path"`
	Count int32           `json:"count"`
	P50   metav1.Duration `json:"p50"`
	P90   metav1.Duration `json:"p90"`
}

// IdleNodesStatus is the idle-node count a cluster wants and has.
type IdleNodesStatus struct {
	// Wanted is how many idle nodes the cluster keeps now (0 outside its schedule).
	Wanted int32 `json:"wanted"`
	// Spare is how many nodes have nothing on them, joined or booting.
	Spare int32 `json:"spare"`
	// Booting is how many of Spare are still booting (to refill after a Pod took one).
	Booting int32 `json:"booting"`
	// Claimed is how many nodes that were spare a Pod has taken since: they work now, and
	// refills boot in their place. Counted from what the scale driver saw spare; a daemon
	// restart starts it again at 0.
	Claimed int32 `json:"claimed"`
}

// ClusterList is a list of Clusters.
type ClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Cluster `json:"items"`
}
