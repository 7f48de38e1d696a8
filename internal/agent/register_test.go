package agent

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/socialweb-computer/socialweb/internal/identity"
)

// TestRegisteredNode: the Node the agent creates carries what the kubelet sets at
// registration and does not reconcile on an existing Node: --node-labels, the external
// cloud provider's uninitialized taint (without it the cloud controller never
// initializes the node) and the node-IP annotation.
func TestRegisteredNode(t *testing.T) {
	id := sampleIdentity()
	n, err := RegisteredNode(id)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"socialweb.computer/pool": "default",
		corev1.LabelHostname:      "ci-abc123",
		corev1.LabelOSStable:      "linux",
	} {
		if n.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, n.Labels[k], v)
		}
	}
	if n.Name != "ci-abc123" || n.Annotations["alpha.kubernetes.io/provided-node-ip"] != "10.250.3.2" {
		t.Errorf("name %q annotations %v", n.Name, n.Annotations)
	}
	// The cloud provider's and the storage startup taint, both NoSchedule.
	if len(n.Spec.Taints) != 2 || n.Spec.Taints[0].Key != "node.cloudprovider.kubernetes.io/uninitialized" ||
		n.Spec.Taints[1].Key != identity.StorageTaintKey ||
		n.Spec.Taints[0].Effect != corev1.TaintEffectNoSchedule || n.Spec.Taints[1].Effect != corev1.TaintEffectNoSchedule {
		t.Errorf("taints %v", n.Spec.Taints)
	}
	id.Address = "not-an-address"
	if _, err := RegisteredNode(id); err == nil {
		t.Error("a bad node address was accepted")
	}
}
