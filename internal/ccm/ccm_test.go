package ccm

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

type machines struct {
	mu sync.Mutex
	m  map[string]Machine
}

func (f *machines) Machine(_ context.Context, cluster, node string) (Machine, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.m[cluster+"/"+node]
	return m, ok, nil
}

func node(name, providerID string, ready corev1.ConditionStatus, uninitialized bool) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{ProviderID: providerID},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: ready, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
		}}},
	}
	if uninitialized {
		n.Spec.Taints = []corev1.Taint{{Key: cloudproviderapi.TaintExternalCloudProvider, Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	}
	return n
}

func TestInstancesV2(t *testing.T) {
	ms := &machines{m: map[string]Machine{"ci/ci-a": {Address: net.ParseIP("10.250.3.2"), InstanceType: "socialweb-1c-1024Mi", Running: true}}}
	c := &Cloud{Cluster: "ci", Machines: ms}
	ctx := context.Background()
	tests := []struct {
		name       string
		node       *corev1.Node
		wantExists bool
	}{
		{"by providerID", node("ci-a", "socialweb://ci/ci-a", corev1.ConditionTrue, false), true},
		{"by name before providerID is set", node("ci-a", "", corev1.ConditionTrue, false), true},
		{"gone", node("ci-b", "socialweb://ci/ci-b", corev1.ConditionTrue, false), false},
		{"another cluster's machine is not ours", node("ci-a", "socialweb://other/ci-a", corev1.ConditionTrue, false), false},
	}
	for _, tt := range tests {
		got, err := c.InstanceExists(ctx, tt.node)
		if err != nil || got != tt.wantExists {
			t.Errorf("%s: InstanceExists = %v, %v; want %v", tt.name, got, err, tt.wantExists)
		}
	}
	md, err := c.InstanceMetadata(ctx, node("ci-a", "", corev1.ConditionTrue, false))
	if err != nil {
		t.Fatal(err)
	}
	if md.ProviderID != "socialweb://ci/ci-a" || md.NodeAddresses[0].Address != "10.250.3.2" || md.InstanceType != "socialweb-1c-1024Mi" {
		t.Errorf("metadata = %+v", md)
	}
	if _, err := c.InstanceMetadata(ctx, node("ci-b", "", corev1.ConditionTrue, false)); err == nil {
		t.Error("metadata of a missing machine")
	}
}

// TestControllers: the upstream controllers, driven by our InstancesV2,
// initialise a new node and delete a node whose machine is gone.
func TestControllers(t *testing.T) {
	ms := &machines{m: map[string]Machine{"ci/ci-a": {Address: net.ParseIP("10.250.3.2"), InstanceType: "socialweb-1c-1024Mi", Running: true}}}
	kube := fake.NewSimpleClientset(
		node("ci-a", "", corev1.ConditionTrue, true),
		node("ci-gone", "socialweb://ci/ci-gone", corev1.ConditionUnknown, false),
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, kube, &Cloud{Cluster: "ci", Machines: ms}, Options{MonitorPeriod: 200 * time.Millisecond})
	}()
	livetest.Eventually(t, 20*time.Second, 100*time.Millisecond, "the new node to be initialised", func() bool {
		n, err := kube.CoreV1().Nodes().Get(ctx, "ci-a", metav1.GetOptions{})
		if err != nil || len(n.Spec.Taints) != 0 || n.Spec.ProviderID != "socialweb://ci/ci-a" {
			return false
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP && a.Address == "10.250.3.2" {
				return true
			}
		}
		return false
	})
	livetest.Eventually(t, 20*time.Second, 100*time.Millisecond, "the node without a machine to be deleted", func() bool {
		_, err := kube.CoreV1().Nodes().Get(ctx, "ci-gone", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
