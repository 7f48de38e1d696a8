package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
			_, err = client.CoreV1().Nodes().Create(cctx, node, metav1.CreateOptions{})
			cancel()
			switch {
			case err == nil:
				a.Log.Info("node registered", "node", node.Name, "uptime", fmt.Sprintf("%.2fs", a.Uptime().Seconds()),
					"storageTaint", res == nil)
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
