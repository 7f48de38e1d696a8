// Package fake is an in-memory nodes.NodeProvider for tests. It records every call, can
// fail the next call of an operation, and, given a tenant clientset, stands in for the
// kubelet: it registers a Ready Node object on Create, removes it on Delete, and can mark
// the pods on a node finished.
package fake

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/socialweb-computer/socialweb/internal/nodes"
)

// Op names a provider operation.
type Op string

const (
	OpCreate Op = "Create"
	OpDelete Op = "Delete"
	OpList   Op = "List"
	// OpForgetJoin is nodes.JoinForgetter's call.
	OpForgetJoin Op = "ForgetJoin"
)

// Call is one recorded call.
type Call struct {
	Op      Op
	Name    string            // node name (Create, Delete)
	Request nodes.NodeRequest // Create only
	Err     error             // what the call returned
	At      time.Time
}

// Option configures a Provider.
type Option func(*Provider)

// WithTenant makes Create register a Node object in client the way a joining kubelet
// would, and Delete remove it. Without it, instances never join (useful to test booting).
func WithTenant(client kubernetes.Interface) Option {
	return func(p *Provider) { p.client = client }
}

// WithClock sets the clock used for Instance.Created and Call.At.
func WithClock(now func() time.Time) Option {
	return func(p *Provider) { p.now = now }
}

// WithOnCall registers f to be called (synchronously, outside the provider's lock)
// after every call, e.g. to measure when Create happened.
func WithOnCall(f func(Call)) Option {
	return func(p *Provider) { p.onCall = f }
}

// WithHostCapacity makes Create refuse, with a nodes.CapacityError, a machine whose
// memory or disk would take the live machines' total beyond memoryMiB or diskMiB (0: no
// limit), as the qemu provider does when the host is full.
func WithHostCapacity(memoryMiB, diskMiB int64) Option {
	return func(p *Provider) { p.hostMemMiB, p.hostDiskMiB = memoryMiB, diskMiB }
}

// Provider is the fake. The zero value is not usable; call New.
type Provider struct {
	client kubernetes.Interface
	now    func() time.Time
	onCall func(Call)

	mu             sync.Mutex
	instances      map[string]nodes.Instance
	calls          []Call
	failNext       map[Op]error
	warmNext       *nodes.WarmStart
	failAfterAdmit error
	hostMemMiB     int64
	hostDiskMiB    int64
}

// SetHostCapacity changes the limits of WithHostCapacity, e.g. as another tenant's
// machines come and go.
func (p *Provider) SetHostCapacity(memoryMiB, diskMiB int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hostMemMiB, p.hostDiskMiB = memoryMiB, diskMiB
}

// capacity says why req does not fit the host now, or "". Call with p.mu held.
func (p *Provider) capacity(req nodes.NodeRequest) string {
	var mem, disk int64
	for _, in := range p.instances {
		mem += in.MemoryMiB
		disk += in.DiskMiB
	}
	switch {
	case p.hostMemMiB > 0 && mem+req.MemoryMiB > p.hostMemMiB:
		return fmt.Sprintf("needs %d MiB of host memory; %d MiB free", req.MemoryMiB, max(p.hostMemMiB-mem, 0))
	case p.hostDiskMiB > 0 && disk+req.DiskMiB > p.hostDiskMiB:
		return fmt.Sprintf("needs %d MiB of host disk; %d MiB free", req.DiskMiB, max(p.hostDiskMiB-disk, 0))
	}
	return ""
}

var (
	_ nodes.NodeProvider = (*Provider)(nil)
	_ nodes.Diagnoser    = (*Provider)(nil)
)

// Crash marks a machine Terminated, as a VM that died on its own: it stays listed until
// Delete. It reports whether the machine existed.
func (p *Provider) Crash(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	in, ok := p.instances[name]
	if ok {
		in.State = nodes.StateTerminated
		p.instances[name] = in
	}
	return ok
}

// Diagnose implements nodes.Diagnoser with a fixed line naming the machine.
func (p *Provider) Diagnose(name string) string {
	return "fake console of " + name + ": kernel panic"
}

// ForgetJoin implements nodes.JoinForgetter: it records the call and changes nothing.
func (p *Provider) ForgetJoin(ctx context.Context, name string) error {
	err := p.takeFailure(OpForgetJoin)
	p.record(Call{Op: OpForgetJoin, Name: name, Err: err, At: p.now()})
	return err
}

// New returns an empty fake provider.
func New(opts ...Option) *Provider {
	p := &Provider{
		now:       time.Now,
		instances: map[string]nodes.Instance{},
		failNext:  map[Op]error{},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// FailNext makes the next call of op return err (once) without doing anything.
func (p *Provider) FailNext(op Op, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failNext[op] = err
}

// FailNextAfterAdmit makes the next Create fail with err after it has called the
// request's Admitted, as a boot that fails after the host took it on (a clone or a
// VMM start that fails).
func (p *Provider) FailNextAfterAdmit(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failAfterAdmit = err
}

// WarmNext makes the next successful Create report w as how it started the machine
// (once), as a substrate with a warm pool would.
func (p *Provider) WarmNext(w nodes.WarmStart) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.warmNext = &w
}

// Calls returns a copy of every call so far, in order.
func (p *Provider) Calls() []Call {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

// Count returns how many calls of op were made (failed ones included).
func (p *Provider) Count(op Op) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.calls {
		if c.Op == op {
			n++
		}
	}
	return n
}

// Instances returns the live instances, sorted by name.
func (p *Provider) Instances() []nodes.Instance {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := slices.Collect(maps.Values(p.instances))
	slices.SortFunc(out, func(a, b nodes.Instance) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// takeFailure returns and clears the injected failure for op.
func (p *Provider) takeFailure(op Op) error {
	err := p.failNext[op]
	delete(p.failNext, op)
	return err
}

func (p *Provider) record(c Call) {
	p.mu.Lock()
	p.calls = append(p.calls, c)
	p.mu.Unlock()
	if p.onCall != nil {
		p.onCall(c)
	}
}

// Create implements nodes.NodeProvider.
func (p *Provider) Create(ctx context.Context, req nodes.NodeRequest) (nodes.Instance, error) {
	inst, err := p.create(ctx, req)
	p.record(Call{Op: OpCreate, Name: req.Name, Request: req, Err: err, At: p.now()})
	return inst, err
}

func (p *Provider) create(ctx context.Context, req nodes.NodeRequest) (nodes.Instance, error) {
	if err := req.Validate(); err != nil {
		return nodes.Instance{}, err
	}
	p.mu.Lock()
	if err := p.takeFailure(OpCreate); err != nil {
		p.mu.Unlock()
		return nodes.Instance{}, err
	}
	if _, ok := p.instances[req.Name]; ok {
		p.mu.Unlock()
		return nodes.Instance{}, fmt.Errorf("fake: node %q already exists", req.Name)
	}
	if why := p.capacity(req); why != "" {
		p.mu.Unlock()
		return nodes.Instance{}, &nodes.CapacityError{Name: req.Name, Reason: why}
	}
	inst := nodes.Instance{
		Cluster:    req.Cluster,
		Name:       req.Name,
		ProviderID: nodes.ProviderID(req.Cluster, req.Name),
		Created:    p.now(),
		State:      nodes.StateRunning,
		CPUs:       req.CPUs,
		MemoryMiB:  req.MemoryMiB,
		DiskMiB:    req.DiskMiB,
	}
	p.instances[req.Name] = inst
	var warm nodes.WarmStart
	if p.warmNext != nil {
		warm, p.warmNext = *p.warmNext, nil
	}
	late := p.failAfterAdmit
	p.failAfterAdmit = nil
	p.mu.Unlock()
	req.TellAdmitted(warm.Claimed)
	if late != nil {
		p.mu.Lock()
		delete(p.instances, req.Name)
		p.mu.Unlock()
		return nodes.Instance{}, late
	}

	if p.client != nil {
		if _, err := p.client.CoreV1().Nodes().Create(ctx, NodeObject(req, inst.Created), metav1.CreateOptions{}); err != nil {
			p.mu.Lock()
			delete(p.instances, req.Name)
			p.mu.Unlock()
			return nodes.Instance{}, fmt.Errorf("fake: register node %s: %w", req.Name, err)
		}
	}
	inst.Warm = warm
	return inst, nil
}

// Delete implements nodes.NodeProvider.
func (p *Provider) Delete(ctx context.Context, name string) error {
	err := p.delete(ctx, name)
	p.record(Call{Op: OpDelete, Name: name, Err: err, At: p.now()})
	return err
}

func (p *Provider) delete(ctx context.Context, name string) error {
	p.mu.Lock()
	if err := p.takeFailure(OpDelete); err != nil {
		p.mu.Unlock()
		return err
	}
	_, ok := p.instances[name]
	delete(p.instances, name)
	p.mu.Unlock()
	if !ok {
		return nodes.NewNotFound(name)
	}
	if p.client != nil {
		// The cloud controller would remove the Node once the VM is gone.
		err := p.client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("fake: remove node object %s: %w", name, err)
		}
	}
	return nil
}

// List implements nodes.NodeProvider.
func (p *Provider) List(ctx context.Context) ([]nodes.Instance, error) {
	p.mu.Lock()
	err := p.takeFailure(OpList)
	var out []nodes.Instance
	if err == nil {
		out = slices.Collect(maps.Values(p.instances))
	}
	p.mu.Unlock()
	p.record(Call{Op: OpList, Err: err, At: p.now()})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b nodes.Instance) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// NodeObject is the Node a kubelet on a machine booted for req would register: Ready,
// sized by req (its disk as ephemeral storage), labelled with req.Labels plus hostname/os/arch, and carrying the
// providerID the cloud controller would stamp.
func NodeObject(req nodes.NodeRequest, created time.Time) *corev1.Node {
	lbls := map[string]string{
		corev1.LabelHostname:   req.Name,
		corev1.LabelOSStable:   "linux",
		corev1.LabelArchStable: "amd64",
	}
	maps.Copy(lbls, req.Labels)
	lbls[corev1.LabelHostname] = req.Name // the hostname is the node name, whatever the request says
	res := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(req.CPUs, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(req.MemoryMiB<<20, resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(int64(req.MaxPods), resource.DecimalSI),
	}
	if req.DiskMiB > 0 {
		res[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(req.DiskMiB<<20, resource.BinarySI)
	}
	t := metav1.NewTime(created)
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: req.Name, Labels: lbls, CreationTimestamp: t},
		Spec:       corev1.NodeSpec{ProviderID: nodes.ProviderID(req.Cluster, req.Name)},
		Status: corev1.NodeStatus{
			Capacity:    res,
			Allocatable: res.DeepCopy(),
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				LastHeartbeatTime: t, LastTransitionTime: t,
			}},
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: req.Name}},
		},
	}
}

// CompletePods marks every non-terminal Pod bound to node as Succeeded, as the kubelet
// would when its containers exit 0, and returns how many it changed. It needs WithTenant.
func (p *Provider) CompletePods(ctx context.Context, node string) (int, error) {
	if p.client == nil {
		return 0, errors.New("fake: CompletePods needs WithTenant")
	}
	// The field selector narrows a real apiserver's answer; the fake clientset ignores
	// it, so filter again here.
	list, err := p.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return 0, fmt.Errorf("fake: list pods on %s: %w", node, err)
	}
	n := 0
	for i := range list.Items {
		pod := &list.Items[i]
		if pod.Spec.NodeName != node || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		pod.Status.Phase = corev1.PodSucceeded
		now := metav1.NewTime(p.now())
		pod.Status.ContainerStatuses = nil
		for _, c := range pod.Spec.Containers {
			pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
					ExitCode: 0, Reason: "Completed", FinishedAt: now,
				}},
			})
		}
		if _, err := p.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			return n, fmt.Errorf("fake: complete pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		n++
	}
	return n, nil
}

// String summarises the provider for test failure messages.
func (p *Provider) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return "fake provider: " + strconv.Itoa(len(p.instances)) + " instances, " + strconv.Itoa(len(p.calls)) + " calls"
}
