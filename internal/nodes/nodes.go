// Package nodes defines how the scale driver asks a substrate (qemu, firecracker, or a
// fake in tests) for worker nodes. The interface is deliberately small, modelled on
// karpenter's CloudProvider: the substrate boots and destroys machines; everything
// Kubernetes-side (cordoning, deciding how many) belongs to the caller.
package nodes

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"time"
)

// NodeProvider boots and destroys the microVMs that back a tenant's nodes. One provider
// may serve many clusters; every Instance says which cluster it belongs to.
//
// Implementations must be safe for concurrent use: the driver creates nodes in parallel.
type NodeProvider interface {
	// Create boots a machine for req and returns once the substrate has accepted it
	// (the VM is launched, not necessarily joined: the Node object appears later, when
	// the guest's kubelet registers). req.Name must not be in use; a provider returns an
	// error rather than reusing or adopting an existing machine of that name. On error
	// nothing is left running that List would report, or, if the provider cannot
	// guarantee that, List reports it so the caller can Delete it.
	Create(ctx context.Context, req NodeRequest) (Instance, error)

	// Delete destroys the machine named name and releases everything it held (disk
	// clone, tap device, address). It returns an error satisfying IsNotFound if no such
	// machine exists (already gone); callers that only want it gone treat that as success.
	// Delete does not touch the tenant's Node object.
	Delete(ctx context.Context, name string) error

	// List returns every machine the provider knows of, for all clusters, including
	// ones still booting: once Create has returned, List reports the machine until
	// Delete removes it (the driver counts such machines as nodes on their way, so a
	// gap would make it boot another). An error means the listing is unknown, never
	// "no machines".
	List(ctx context.Context) ([]Instance, error)
}

// Diagnoser is implemented by providers that can say why a machine failed: what its VMM
// and console printed last. The driver puts it in the Event and status it reports.
type Diagnoser interface {
	// Diagnose returns a few human-readable lines about machine name, or "" if there is
	// nothing to say. It never fails: diagnostics are best effort.
	Diagnose(name string) string
}

// EarlyBootWatcher is implemented by providers that can tell a machine stuck before its
// guest kernel got going (a VMM that runs but a kernel that never starts, as under a KVM
// that cannot run the image's kernel). The driver reports such a machine as
// EarlyBootStall and deletes it, well before its boot timeout.
type EarlyBootWatcher interface {
	// EarlyBootStall returns why machine name is stuck in early boot, or "" if it is not
	// (it showed progress, is still within its deadline, or is unknown).
	EarlyBootStall(name string) string
}

// JoinForgetter is implemented by providers that hand a machine a join secret (a
// bootstrap token) it needs only until its Node registers. The driver calls ForgetJoin
// once the Node has registered, and again after a restart: the provider takes the secret
// from wherever the machine could still read it.
type JoinForgetter interface {
	// ForgetJoin removes machine name's join secret. An unknown machine, a machine of
	// another cluster, or one whose secret is already gone is not an error.
	ForgetJoin(ctx context.Context, name string) error
}

// AcceleratorReporter is implemented by providers whose machines run under a chosen
// accelerator (kvm, tcg). The choice may change while the provider runs; the driver
// shows the current one on its Cluster.
type AcceleratorReporter interface {
	// Accelerator returns the accelerator new machines get and why.
	Accelerator() (name, reason string)
}

// NodeRequest describes one node to boot.
type NodeRequest struct {
	// Cluster is the tenant cluster the node joins.
	Cluster string
	// Name is the node's name (and hostname). Unique per boot: see NewNodeName.
	Name string
	// CPUs is the number of vCPUs.
	CPUs int64
	// MemoryMiB is the guest memory in MiB.
	MemoryMiB int64
	// DiskMiB is the size of the node's own container-storage disk (images, container
	// layers, emptyDirs, logs: the kubelet's ephemeral storage). 0 gives it none: that
	// storage then lives in the root disk's headroom.
	DiskMiB int64
	// MaxPods is the kubelet's maxPods.
	MaxPods int
	// Labels the kubelet registers the Node with (--node-labels).
	Labels map[string]string
	// Admitted, if set, is called once, when the provider has taken the machine on (host
	// capacity reserved, or a pre-booted machine handed over) and before the slow part
	// of a boot, so whoever waits for the node hears of it in time. warm says it is a
	// pre-booted machine. Not called when Create fails first. It must not block.
	Admitted func(warm bool) `json:"-"`
}

// TellAdmitted calls r.Admitted if it is set.
func (r NodeRequest) TellAdmitted(warm bool) {
	if r.Admitted != nil {
		r.Admitted(warm)
	}
}

// Validate reports whether r can be handed to a provider.
func (r NodeRequest) Validate() error {
	switch {
	case r.Cluster == "":
		return errors.New("node request: empty cluster")
	case r.Name == "":
		return errors.New("node request: empty name")
	case r.CPUs <= 0:
		return fmt.Errorf("node request %s: cpus must be positive, got %d", r.Name, r.CPUs)
	case r.MemoryMiB <= 0:
		return fmt.Errorf("node request %s: memory must be positive, got %d MiB", r.Name, r.MemoryMiB)
	case r.DiskMiB < 0:
		return fmt.Errorf("node request %s: disk must not be negative, got %d MiB", r.Name, r.DiskMiB)
	case r.MaxPods <= 0:
		return fmt.Errorf("node request %s: max pods must be positive, got %d", r.Name, r.MaxPods)
	}
	return nil
}

// State is where a machine is in its life.
type State string

const (
	StatePending    State = "Pending"    // accepted, booting
	StateRunning    State = "Running"    // the VM runs (the node may or may not have joined)
	StateStopping   State = "Stopping"   // Delete in progress
	StateTerminated State = "Terminated" // gone; kept in List only until the provider forgets it
)

// Instance is one machine as the provider sees it.
type Instance struct {
	Cluster    string
	Name       string
	ProviderID string // socialweb://<cluster>/<node>, as the cloud controller stamps it
	Created    time.Time
	State      State
	// The size it was booted with (its NodeRequest's CPUs, MemoryMiB and DiskMiB).
	CPUs, MemoryMiB, DiskMiB int64
	// Warm says how Create started it; set only by Create.
	Warm WarmStart
}

// WarmStart says how Create started a machine on a substrate that can start one warm
// (hand it a pre-booted VM from a warm pool). The zero value: no warm start was tried
// (none of the machine's size was there, or the substrate has no pool).
type WarmStart struct {
	// Claimed: the machine is a pre-booted VM, handed to this node.
	Claimed bool
	// Failed says why a warm start was tried and did not happen ("" if it did not
	// fail); the machine then booted cold, and Create still succeeded.
	Failed string
}

// CapacityError says a machine cannot be booted now because the host lacks the memory
// or disk for it (what it would use, with the VMM's own overhead, beyond what is free
// after the host's reserve). It is temporary: it fits once other machines are gone.
type CapacityError struct {
	Name   string
	Reason string // e.g. "needs 3328 MiB of host memory (guest and VMM); 1200 MiB free after the 1024 MiB reserve"
}

func (e *CapacityError) Error() string {
	return fmt.Sprintf("node %s does not fit the host now: %s", e.Name, e.Reason)
}

// IsCapacity reports whether err (or anything it wraps) is a CapacityError.
func IsCapacity(err error) bool {
	var ce *CapacityError
	return errors.As(err, &ce)
}

// providerIDScheme prefixes every providerID this host hands out.
const providerIDScheme = "socialweb://"

// ProviderID returns the providerID of node in cluster: socialweb://<cluster>/<node>.
func ProviderID(cluster, node string) string {
	return providerIDScheme + cluster + "/" + node
}

// ParseProviderID splits a providerID made by ProviderID.
func ParseProviderID(id string) (cluster, node string, err error) {
	rest, ok := strings.CutPrefix(id, providerIDScheme)
	if !ok {
		return "", "", fmt.Errorf("providerID %q: want prefix %s", id, providerIDScheme)
	}
	cluster, node, ok = strings.Cut(rest, "/")
	if !ok || cluster == "" || node == "" || strings.Contains(node, "/") {
		return "", "", fmt.Errorf("providerID %q: want %s<cluster>/<node>", id, providerIDScheme)
	}
	return cluster, node, nil
}

// suffixAlphabet is lower-case alphanumerics: node names are DNS labels.
const suffixAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// suffixLen random characters give 36^10 (about 2^51) names per cluster, so a name is
// not reused by chance over any realistic number of boots. Reuse would be a real bug:
// a new VM would inherit the old Node object, its pods and its certificate identity.
const suffixLen = 10

// maxNodeNameLen keeps a node name usable as the kubernetes.io/hostname label value.
const maxNodeNameLen = 63

// NewNodeName returns a fresh node name <cluster>-<random suffix>. Call it once per boot,
// including retries: a failed Create's name is never reused.
func NewNodeName(cluster string) (string, error) {
	if cluster == "" {
		return "", errors.New("node name: empty cluster")
	}
	if len(cluster)+1+suffixLen > maxNodeNameLen {
		return "", fmt.Errorf("node name: cluster name %q too long for a %d-character hostname", cluster, maxNodeNameLen)
	}
	var b [suffixLen]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("node name: %w", err)
	}
	for i := range b {
		// 256 % 36 != 0, so this is very slightly biased; uniqueness, not uniformity,
		// is what matters here.
		b[i] = suffixAlphabet[int(b[i])%len(suffixAlphabet)]
	}
	return cluster + "-" + string(b[:]), nil
}

// NotFoundError says a machine does not exist.
type NotFoundError struct {
	Name string
}

func (e *NotFoundError) Error() string { return fmt.Sprintf("node %q not found", e.Name) }

// NewNotFound returns an error satisfying IsNotFound.
func NewNotFound(name string) error { return &NotFoundError{Name: name} }

// IsNotFound reports whether err (or anything it wraps) is a NotFoundError.
func IsNotFound(err error) bool {
	var nf *NotFoundError
	return errors.As(err, &nf)
}
