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

// The IdleSchedule condition appears only once a schedule was bad, and turns True when a
// later driver reads a good one; a report that changes nothing writes nothing.
func TestRecordIdleSchedule(t *testing.T) {
	c := &v1.Cluster{TypeMeta: metav1.TypeMeta{APIVersion: v1.Group + "/" + v1.Version, Kind: "Cluster"},
		ObjectMeta: metav1.ObjectMeta{Name: "ci", Generation: 2}}
	u, err := c.ToUnstructured()
	if err != nil {
		t.Fatal(err)
	}
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{v1.ClusterResource: "ClusterList"}, u)
	s := ScaleStatus{Client: client}
	ctx := context.Background()
	writes := func() int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "update" && a.GetSubresource() == "status" {
				n++
			}
		}
		return n
	}
	const bad = `no idle nodes are kept: spec.idleSchedule does not parse: window "Mon 08:00-18:00 Mars/Olympus": zone "Mars/Olympus" is not an IANA time zone name`
	tests := []struct {
		name   string
		ok     bool
		reason string
		want   metav1.ConditionStatus // "" for no condition
		writes int                    // status writes so far
	}{
		{"a good schedule, never bad: nothing to say", true, "IdleScheduleParsed", "", 0},
		{"a bad one", false, v1.ReasonBadIdleSchedule, metav1.ConditionFalse, 1},
		{"the same again (another start)", false, v1.ReasonBadIdleSchedule, metav1.ConditionFalse, 1},
		{"fixed", true, "IdleScheduleParsed", metav1.ConditionTrue, 2},
		{"still good", true, "IdleScheduleParsed", metav1.ConditionTrue, 2},
	}
	for _, tt := range tests {
		msg := "spec.idleSchedule parses"
		if !tt.ok {
			msg = bad
		}
		if err := s.RecordIdleSchedule(ctx, "ci", tt.ok, tt.reason, msg); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		u, err := client.Resource(v1.ClusterResource).Get(ctx, "ci", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got, err := v1.FromUnstructured(u)
		if err != nil {
			t.Fatal(err)
		}
		cond := meta.FindStatusCondition(got.Status.Conditions, v1.ConditionIdleSchedule)
		switch {
		case tt.want == "" && cond != nil:
			t.Errorf("%s: condition %+v, want none", tt.name, cond)
		case tt.want != "" && (cond == nil || cond.Status != tt.want || cond.Reason != tt.reason || cond.Message != msg || cond.ObservedGeneration != 2):
			t.Errorf("%s: condition %+v, want %s %s %q", tt.name, cond, tt.want, tt.reason, msg)
		}
		if n := writes(); n != tt.writes {
			t.Errorf("%s: %d status writes so far, want %d", tt.name, n, tt.writes)
		}
	}
}
