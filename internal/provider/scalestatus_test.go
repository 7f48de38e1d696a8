package provider

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/scale"
)

func TestScaleStatusRecords(t *testing.T) {
	c := &v1.Cluster{TypeMeta: metav1.TypeMeta{APIVersion: v1.Group + "/" + v1.Version, Kind: "Cluster"},
		ObjectMeta: metav1.ObjectMeta{Name: "ci", Generation: 3}}
	u, err := c.ToUnstructured()
	if err != nil {
		t.Fatal(err)
	}
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{v1.ClusterResource: "ClusterList"}, u)
	now := time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)
	s := ScaleStatus{Client: client, Clock: func() time.Time { return now }}
	ctx := context.Background()
	get := func() *v1.Cluster {
		t.Helper()
		u, err := client.Resource(v1.ClusterResource).Get(ctx, "ci", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c, err := v1.FromUnstructured(u)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	if err := s.RecordDecision(ctx, "ci", scale.Decision{Action: scale.Provision, Target: 2, Reason: "intent and no node"}, 2); err != nil {
		t.Fatal(err)
	}
	got := get()
	if d := got.Status.LastScaleDecision; got.Status.Nodes != 2 || d == nil || d.Action != "Provision" || d.Target != 2 || !d.Time.Time.Equal(now) {
		t.Errorf("after RecordDecision: nodes %d, decision %+v", got.Status.Nodes, d)
	}

	for _, tc := range []struct {
		ok     bool
		reason string
		msg    string
		want   metav1.ConditionStatus
	}{
		{false, "JoinTimeout", "node ci-x did not register within 5m0s\nlast console lines:\n...", metav1.ConditionFalse},
		{true, "NodeJoined", "node ci-y registered 14s after its machine was created", metav1.ConditionTrue},
	} {
		if err := s.RecordNodeBoot(ctx, "ci", tc.ok, tc.reason, tc.msg); err != nil {
			t.Fatal(err)
		}
		cond := meta.FindStatusCondition(get().Status.Conditions, v1.ConditionNodeBoot)
		if cond == nil || cond.Status != tc.want || cond.Reason != tc.reason || cond.Message != tc.msg || cond.ObservedGeneration != 3 {
			t.Errorf("NodeBoot after %s: %+v", tc.reason, cond)
		}
	}
	for _, tc := range []struct {
		ok     bool
		reason string
		msg    string
		want   metav1.ConditionStatus
	}{
		{false, "PodsExceedNodeSize", "pod default/big: needs 16 CPU; the largest node is 8 vCPU: no node is booted for it", metav1.ConditionFalse},
		{true, "PodsProvisionable", "every Pod that wants a node fits a node this cluster may boot", metav1.ConditionTrue},
	} {
		if err := s.RecordPodsProvisionable(ctx, "ci", tc.ok, tc.reason, tc.msg); err != nil {
			t.Fatal(err)
		}
		cond := meta.FindStatusCondition(get().Status.Conditions, v1.ConditionPodsProvisionable)
		if cond == nil || cond.Status != tc.want || cond.Reason != tc.reason || cond.Message != tc.msg {
			t.Errorf("PodsProvisionable after %s: %+v", tc.reason, cond)
		}
	}
	// A long message keeps its end (the last console lines) within the limit.
	long := string(make([]byte, 3*maxConditionMessage)) + "the last line"
	if err := s.RecordNodeBoot(ctx, "ci", false, "VMExited", long); err != nil {
		t.Fatal(err)
	}
	cond := meta.FindStatusCondition(get().Status.Conditions, v1.ConditionNodeBoot)
	if len(cond.Message) != maxConditionMessage || cond.Message[len(cond.Message)-13:] != "the last line" {
		t.Errorf("long message: %d bytes, ends %q", len(cond.Message), cond.Message[len(cond.Message)-13:])
	}
	if got := get(); got.Status.LastScaleDecision == nil {
		t.Error("RecordNodeBoot dropped the last scale decision")
	}
}
