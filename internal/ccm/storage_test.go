package ccm

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/livetest"
)

func storageNode(name string, eph string, taints ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, k := range taints {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: k, Value: "true", Effect: corev1.TaintEffectNoSchedule})
	}
	if eph != "" {
		q := resource.MustParse(eph)
		n.Status.Capacity = corev1.ResourceList{corev1.ResourceEphemeralStorage: q}
		n.Status.Allocatable = corev1.ResourceList{corev1.ResourceEphemeralStorage: q}
	}
	return n
}

func taintKeys(n *corev1.Node) []string {
	var keys []string
	for _, t := range n.Spec.Taints {
		keys = append(keys, t.Key)
	}
	return keys
}

func TestStorageMeasured(t *testing.T) {
	tests := []struct {
		name string
		node *corev1.Node
		want bool
	}{
		{"not reported", storageNode("a", ""), false},
		{"zero", storageNode("a", "0"), false},
		{"reported", storageNode("a", "9Gi"), true},
	}
	for _, tt := range tests {
		if got := StorageMeasured(tt.node); got != tt.want {
			t.Errorf("%s: StorageMeasured = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestStartupTaints: the storage taint goes once the kubelet reports ephemeral storage,
// the kubelet-not-ready taint once it reports Ready, each only then; other taints stay.
func TestStartupTaints(t *testing.T) {
	const other = "example.com/other"
	kube := fake.NewSimpleClientset(
		storageNode("measured", "9Gi", other, identity.StorageTaintKey),
		storageNode("unmeasured", "", identity.StorageTaintKey),
		storageNode("plain", "9Gi", other),
		storageNode("starting", "9Gi", identity.KubeletNotReadyTaintKey),
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	factory := informers.NewSharedInformerFactory(kube, 0)
	c, err := newStorageController(kube, factory.Core().V1().Nodes(), slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	go c.run(ctx)

	get := func(name string) *corev1.Node {
		n, err := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	livetest.Eventually(t, 10*time.Second, 50*time.Millisecond, "the measured node's storage taint to go", func() bool {
		return slices.Equal(taintKeys(get("measured")), []string{other})
	})
	if got := taintKeys(get("unmeasured")); !slices.Equal(got, []string{identity.StorageTaintKey}) {
		t.Errorf("unmeasured node's taints = %v; the taint must stay until storage is reported", got)
	}
	if got := taintKeys(get("plain")); !slices.Equal(got, []string{other}) {
		t.Errorf("plain node's taints = %v", got)
	}
	n := get("unmeasured")
	n.Status = storageNode("", "5Gi").Status
	if _, err := kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	livetest.Eventually(t, 10*time.Second, 50*time.Millisecond, "the taint to go once storage is reported", func() bool {
		return len(get("unmeasured").Spec.Taints) == 0
	})

	if got := taintKeys(get("starting")); !slices.Equal(got, []string{identity.KubeletNotReadyTaintKey}) {
		t.Errorf("starting node's taints = %v; the taint must stay until the kubelet reports Ready", got)
	}
	n = get("starting")
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	if _, err := kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	livetest.Eventually(t, 10*time.Second, 50*time.Millisecond, "the kubelet-not-ready taint to go at Ready", func() bool {
		return len(get("starting").Spec.Taints) == 0
	})
}

func TestKubeletReady(t *testing.T) {
	for _, tc := range []struct {
		name string
		cs   []corev1.NodeCondition
		want bool
	}{
		{"no conditions", nil, false},
		{"ready", []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}, true},
		{"not ready", []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse}}, false},
		{"unknown", []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown}}, false},
		{"other condition true", []corev1.NodeCondition{{Type: corev1.NodeDiskPressure, Status: corev1.ConditionTrue}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := KubeletReady(&corev1.Node{Status: corev1.NodeStatus{Conditions: tc.cs}}); got != tc.want {
				t.Errorf("KubeletReady = %v, want %v", got, tc.want)
			}
		})
	}
}
