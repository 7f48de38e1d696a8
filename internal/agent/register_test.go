package agent

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/socialweb-computer/socialweb/internal/identity"
)

// TestRegisteredNode: the Node the agent creates carries what the kubelet sets at
// registration and does not reconcile on an existing Node: --node-labels, the external
// cloud provider's uninitialized taint (without it the cloud controller never
// initializes the node) and the node-IP annotation.
func TestRegisteredNode(t *testing.T) {
	id := sampleIdentity()
	n, err := RegisteredNode(id, nil)
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
	// Without its resources: the cloud provider's, the kubelet-not-ready and the storage
	// startup taint, all NoSchedule, and no capacity.
	if got, want := noScheduleTaints(n), []string{"node.cloudprovider.kubernetes.io/uninitialized", identity.KubeletNotReadyTaintKey, identity.StorageTaintKey}; !slices.Equal(got, want) {
		t.Errorf("taints %v, want %v, all NoSchedule", n.Spec.Taints, want)
	}
	// No conditions: a Ready condition that is not True starts the kubelet's fast status
	// loop at once; the startup taint keeps the node unschedulable instead.
	if c := n.Status.Conditions; len(c) != 0 {
		t.Errorf("conditions %+v, want none", c)
	}
	if n.Status.Capacity != nil || n.Status.Allocatable != nil {
		t.Errorf("without storage, status %v / %v, want none", n.Status.Capacity, n.Status.Allocatable)
	}
	// With it: the storage in the status, and no storage taint.
	st, err := KubeletResources(Machine{CPUs: 1, MemoryBytes: 1 << 30, StorageBytes: 10 << 30}, 110, 0,
		map[string]string{"nodefs.available": "1Gi"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	n, err = RegisteredNode(id, &st)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := noScheduleTaints(n), []string{"node.cloudprovider.kubernetes.io/uninitialized", identity.KubeletNotReadyTaintKey}; !slices.Equal(got, want) {
		t.Errorf("with resources, taints %v, want %v (no storage taint), all NoSchedule", n.Spec.Taints, want)
	}
	if !equality.Semantic.DeepEqual(n.Status.Capacity, st.Capacity) || !equality.Semantic.DeepEqual(n.Status.Allocatable, st.Allocatable) {
		t.Errorf("with resources, status %v / %v, want %v / %v", n.Status.Capacity, n.Status.Allocatable, st.Capacity, st.Allocatable)
	}
	if p := n.Status.Allocatable[corev1.ResourcePods]; p.Value() != 110 {
		t.Errorf("registered with %s pods allocatable, want 110: the kubelet admits against it", p.String())
	}
	id.Address = "not-an-address"
	if _, err := RegisteredNode(id, nil); err == nil {
		t.Error("a bad node address was accepted")
	}
}

// noScheduleTaints are the keys of n's taints, "!"-prefixed for one of another effect.
func noScheduleTaints(n *corev1.Node) []string {
	var keys []string
	for _, t := range n.Spec.Taints {
		if t.Effect != corev1.TaintEffectNoSchedule {
			keys = append(keys, "!"+t.Key)
			continue
		}
		keys = append(keys, t.Key)
	}
	return keys
}

func TestWaitPodCIDRs(t *testing.T) {
	withCIDR := func(n *corev1.Node) *corev1.Node {
		n = n.DeepCopy()
		n.Spec.PodCIDR, n.Spec.PodCIDRs = "10.180.3.0/24", []string{"10.180.3.0/24"}
		return n
	}
	bare := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	for _, tc := range []struct {
		name    string
		created *corev1.Node // as the agent's Create returned it
		later   *corev1.Node // node IPAM's update, if any
		want    []string
	}{
		{name: "already assigned", created: withCIDR(bare), want: []string{"10.180.3.0/24"}},
		{name: "assigned after the create", created: bare, later: withCIDR(bare), want: []string{"10.180.3.0/24"}},
		{name: "never assigned", created: bare},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(tc.created)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if tc.later != nil {
				// The fake's watch sees only what comes after it starts: update until then.
				go func() {
					for ctx.Err() == nil {
						_, _ = client.CoreV1().Nodes().Update(ctx, tc.later, metav1.UpdateOptions{})
						time.Sleep(50 * time.Millisecond)
					}
				}()
			}
			got, err := waitPodCIDRs(ctx, client, tc.created)
			if tc.want == nil {
				if err == nil || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("got %v, %v; want the deadline's error", got, err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestPodCIDRRequest(t *testing.T) {
	for _, tc := range []struct {
		cidrs []string
		want  string
	}{
		{[]string{"10.180.0.0/24"}, "10.180.0.0/24"},
		{[]string{"10.180.0.0/24", "fd00:180::/64"}, "10.180.0.0/24,fd00:180::/64"},
	} {
		if got := podCIDRRequest(tc.cidrs).GetRuntimeConfig().GetNetworkConfig().GetPodCidr(); got != tc.want {
			t.Errorf("podCIDRRequest(%v) = %q, want %q (the kubelet's form)", tc.cidrs, got, tc.want)
		}
	}
}
