package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/socialweb-computer/socialweb/internal/identity"
)

// RegisteredNode is the Node object the kubelet would create at registration: its
// name, providerID, the labels it sets (defaults and --node-labels), the uninitialized taint of an
// external cloud provider and the annotations it adds. The agent creates it as soon as
// the kubelet has its client certificate.
//
// With resources (KubeletResources), the Node's status carries the cpu, memory, pods and
// ephemeral storage the kubelet will report, and it has no storage startup taint. Without
// them, it has the taint, which the host removes once the kubelet has reported its storage.
//
// It carries the startup taint identity.KubeletNotReadyTaintKey, which the host removes
// once the kubelet reports Ready: with capacity and no taint a Pod was bound to a node
// whose kubelet never started (a stalled 2-vCPU TCG guest), which kept the node from
// being replaced as stalled. Not a Ready False condition with the not-ready taint: a
// Ready condition that is not True runs the kubelet's fast status loop (a CRI status
// call and every status setter, each 100 ms) from its first second, and five starved
// TCG nodes registered so ran slower until containerd's exit handling timed out.
//
// Why register at all: the kubelet's CSINode initialization needs the Node to exist. It retries
// 30 ms x 8^n apart, so a Node registered more than ~18 s after the kubelet got its
// credentials (five TCG nodes booting at once on two cores) leaves the node NotReady
// for another two minutes. The kubelet takes an existing Node as "previously
// registered" and reconciles it (default labels, attach-detach annotation).
func RegisteredNode(id identity.Identity, res *Resources) (*corev1.Node, error) {
	ip, err := NodeIP(id)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{
		corev1.LabelHostname:      id.NodeName,
		corev1.LabelOSStable:      runtime.GOOS,
		corev1.LabelArchStable:    runtime.GOARCH,
		"beta.kubernetes.io/os":   runtime.GOOS,
		"beta.kubernetes.io/arch": runtime.GOARCH,
	}
	maps.Copy(labels, id.Labels)
	taints := []corev1.Taint{
		{Key: "node.cloudprovider.kubernetes.io/uninitialized", Value: "true", Effect: corev1.TaintEffectNoSchedule},
		{Key: identity.KubeletNotReadyTaintKey, Value: "true", Effect: corev1.TaintEffectNoSchedule},
	}
	var status corev1.NodeStatus
	if res != nil {
		status.Capacity = res.Capacity.DeepCopy()
		status.Allocatable = res.Allocatable.DeepCopy()
	} else {
		taints = append(taints, StorageTaint())
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   id.NodeName,
			Labels: labels,
			Annotations: map[string]string{
				"volumes.kubernetes.io/controller-managed-attach-detach": "true",
				"alpha.kubernetes.io/provided-node-ip":                   ip.String(),
			},
		},
		Spec:   corev1.NodeSpec{ProviderID: id.ProviderID, Taints: taints},
		Status: status,
	}, nil
}

// StorageTaint is the startup taint the host removes once the kubelet has measured
// the node's storage (identity.StorageTaintKey).
func StorageTaint() corev1.Taint {
	return corev1.Taint{Key: identity.StorageTaintKey, Value: "true", Effect: corev1.TaintEffectNoSchedule}
}

// stepRegister creates the node's Node object once the kubelet's TLS bootstrap is done
// (see RegisteredNode). It does not wait: if it fails, the kubelet registers the node
// itself, only later.
func stepRegister(ctx context.Context, a *Agent) error {
	res, err := a.registeredResources()
	if err != nil {
		a.Log.Info("registering the node with the storage startup taint", "why", err)
	}
	node, err := RegisteredNode(a.Identity, res)
	if err != nil {
		return err
	}
	go func() {
		a.waitKubeletCredentials()
		client, err := a.kubeletClient()
		for attempt := 0; err == nil && attempt < 10; attempt++ {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var created *corev1.Node
			created, err = client.CoreV1().Nodes().Create(cctx, node, metav1.CreateOptions{})
			cancel()
			switch {
			case err == nil:
				a.Log.Info("node registered", "node", node.Name, "uptime", fmt.Sprintf("%.2fs", a.Uptime().Seconds()),
					"storageTaint", res == nil)
				a.handPodCIDR(client, created)
				return
			case apierrors.IsAlreadyExists(err):
				return // the kubelet was first
			case apierrors.IsForbidden(err) || apierrors.IsInvalid(err):
				a.Log.Warn("registering the node; the kubelet will", "err", err)
				return
			}
			a.Log.Info("registering the node: retrying", "err", err)
			time.Sleep(time.Second)
			err = nil
		}
		if err != nil {
			a.Log.Warn("registering the node; the kubelet will", "err", err)
		}
	}()
	return nil
}

// registeredResources are the resources the kubelet will report for this machine and its
// root directory, or an error saying why the agent cannot tell.
func (a *Agent) registeredResources() (*Resources, error) {
	if a.KubeletServer == nil {
		return nil, errors.New("no kubelet configuration")
	}
	m, err := MeasureMachine(a.Layout.KubeletRoot)
	if err != nil {
		return nil, err
	}
	kc := &a.KubeletServer.KubeletConfiguration
	r, err := KubeletResources(m, kc.MaxPods, kc.PodsPerCore, kc.EvictionHard, kc.KubeReserved, kc.SystemReserved)
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// podCIDRWait bounds how long handPodCIDR waits for node IPAM.
const podCIDRWait = 10 * time.Second

// handPodCIDR gives containerd the Node's pod CIDRs once node IPAM has assigned them, as
// the kubelet does at its first status update. containerd then writes its CNI config and
// reports the network ready before the kubelet first asks, so that first update can
// already say Ready, instead of one status round later. The kubelet's own call changes
// nothing after it: containerd keeps a CNI config it has. Best effort: on any failure the
// kubelet does it as before.
func (a *Agent) handPodCIDR(client kubernetes.Interface, node *corev1.Node) {
	ctx, cancel := context.WithTimeout(context.Background(), podCIDRWait)
	defer cancel()
	cidrs, err := waitPodCIDRs(ctx, client, node)
	if err == nil {
		err = a.updatePodCIDR(ctx, cidrs)
	}
	if err != nil {
		a.Log.Info("pod CIDR: left to the kubelet", "err", err)
		return
	}
	a.Log.Info("pod CIDR given to containerd", "cidrs", cidrs, "uptime", fmt.Sprintf("%.2fs", a.Uptime().Seconds()))
}

// updatePodCIDR makes the kubelet's CRI call for the pod CIDRs.
func (a *Agent) updatePodCIDR(ctx context.Context, cidrs []string) error {
	cri, closeCRI, err := criClient(a.Layout.ContainerdSocket)
	if err != nil {
		return err
	}
	defer closeCRI()
	if _, err := cri.UpdateRuntimeConfig(ctx, podCIDRRequest(cidrs)); err != nil {
		return fmt.Errorf("the CRI's UpdateRuntimeConfig: %w", err)
	}
	return nil
}

// podCIDRRequest is the CRI request the kubelet sends for a Node's pod CIDRs.
func podCIDRRequest(cidrs []string) *runtimeapi.UpdateRuntimeConfigRequest {
	return &runtimeapi.UpdateRuntimeConfigRequest{RuntimeConfig: &runtimeapi.RuntimeConfig{
		NetworkConfig: &runtimeapi.NetworkConfig{PodCidr: strings.Join(cidrs, ",")},
	}}
}

// waitPodCIDRs returns node's pod CIDRs, watching the Node from the version given until
// node IPAM sets them or ctx ends.
func waitPodCIDRs(ctx context.Context, client kubernetes.Interface, node *corev1.Node) ([]string, error) {
	if len(node.Spec.PodCIDRs) > 0 {
		return node.Spec.PodCIDRs, nil
	}
	w, err := client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", node.Name).String(),
		ResourceVersion: node.ResourceVersion,
	})
	if err != nil {
		return nil, fmt.Errorf("watching Node %s for its pod CIDR: %w", node.Name, err)
	}
	defer w.Stop()
	// Select on ctx too: not every watch closes its channel when ctx ends.
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no pod CIDR on Node %s yet from node IPAM: %w", node.Name, context.Cause(ctx))
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, fmt.Errorf("the watch of Node %s ended before node IPAM gave it a pod CIDR", node.Name)
			}
			if n, isNode := ev.Object.(*corev1.Node); isNode && len(n.Spec.PodCIDRs) > 0 {
				return n.Spec.PodCIDRs, nil
			}
		}
	}
}
