package scale

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestWanting(t *testing.T) {
	three := int32(3)
	gated := pod("gated")
	gated.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "wait"}}
	deleting := pod("deleting")
	now := metav1.Now()
	deleting.DeletionTimestamp = &now
	tests := []struct {
		name string
		o    Observed
		want int
	}{
		{"nothing", Observed{}, 0},
		{"a pending pod", Observed{Pods: []*corev1.Pod{pod("a")}}, 1},
		{"a pod too big for any node still asks", Observed{Pods: []*corev1.Pod{pod("big", req("64", "1Ti"))}}, 1},
		{"finished pods do not", Observed{Pods: []*corev1.Pod{pod("done", phase(corev1.PodSucceeded)), pod("failed", phase(corev1.PodFailed))}}, 0},
		{"a bound pod does not", Observed{Pods: []*corev1.Pod{pod("bound", on("n1"))}}, 0},
		{"DaemonSet pods do not", Observed{Pods: []*corev1.Pod{pod("ds", ownedBy("DaemonSet", "x"))}}, 0},
		{"gated and deleting pods do not", Observed{Pods: []*corev1.Pod{gated, deleting}}, 0},
		{"a job before its pod", Observed{Jobs: []*batchv1.Job{job("j")}}, 1},
		{"a finished job", Observed{Jobs: []*batchv1.Job{job("j", jobCondition(batchv1.JobComplete))}}, 0},
		{"a deployment with one of three pods", Observed{
			Deployments: []*appsv1.Deployment{deployment("web", &three)},
			Pods:        []*corev1.Pod{pod("web-1", lbl("app", "web"))},
		}, 3},
		{"a statefulset scaled to zero", Observed{StatefulSets: []*appsv1.StatefulSet{statefulSet("db", new(int32))}}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Wanting(tt.o); got != tt.want {
				t.Errorf("Wanting = %d, want %d", got, tt.want)
			}
		})
	}
}
