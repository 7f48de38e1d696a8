package scaledriver

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/socialweb-computer/socialweb/internal/nodes/fake"
	"github.com/socialweb-computer/socialweb/internal/scale"
)

// With FreshNodePerJob, the node a job Pod runs on is sealed (cordoned, marked) while the
// job runs, and deleted, machine and Node, in the first pass after the job Pod is gone.
func TestFreshNodePerJobSealsAndRemoves(t *testing.T) {
	job := testPod("job-1", func(p *corev1.Pod) {
		p.Labels = map[string]string{"job.runner.gitlab.com/pod": "job-1"}
	}, boundTo("n1"))
	r := newRig(t, Config{FreshNodePerJob: true}, false, []runtime.Object{job}, "n1")
	ctx := context.Background()
	r.start(ctx)
	if dec, err := r.d.RunPass(ctx); err != nil || dec.Action != scale.None || len(dec.Seal) != 1 {
		t.Fatalf("pass with the job running: %s (seal %v), %v; want None sealing n1", dec, dec.Seal, err)
	}
	n, err := r.client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !n.Spec.Unschedulable || n.Annotations[scale.AnnotationRanJob] != "true" {
		t.Fatalf("node n1 after the pass: unschedulable %t, annotations %v; want sealed", n.Spec.Unschedulable, n.Annotations)
	}
	if r.prov.Count(fake.OpDelete) != 0 {
		t.Fatal("the node of a running job was deleted")
	}
	if err := r.client.CoreV1().Pods("default").Delete(ctx, "job-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.settle()
	dec, err := r.d.RunPass(ctx)
	if err != nil || dec.Action != scale.Teardown {
		t.Fatalf("pass after the job: %s, %v; want Teardown without the hold", dec, err)
	}
	if r.prov.Count(fake.OpDelete) != 1 || len(r.nodeNames()) != 0 {
		t.Errorf("after the job: %d machine deletes, nodes %v; want n1 gone", r.prov.Count(fake.OpDelete), r.nodeNames())
	}
}
