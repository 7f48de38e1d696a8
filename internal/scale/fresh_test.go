package scale

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// With FreshNodePerJob a node a job ran on is sealed while the job runs, takes nothing
// else, and goes as soon as the job is over, without the hold; without it, nothing
// changes.
func TestFreshNodePerJob(t *testing.T) {
	fresh := func(o *Observed) { o.FreshNodePerJob = true; o.Hold = time.Hour }
	jobPod := func(name string, opts ...podOpt) *corev1.Pod {
		return pod(name, append([]podOpt{lbl(labelRunnerJobPod, name)}, opts...)...)
	}
	ranJob := func(n *corev1.Node) {
		n.Spec.Unschedulable = true
		n.Annotations = map[string]string{AnnotationRanJob: "true"}
	}
	tests := []struct {
		name     string
		o        Observed
		action   Action
		seal     []string
		remove   []string
		contains string
	}{
		{name: "a running job's node is sealed, and kept while the job runs",
			o:      obs(fresh, nodes(node("n1")), pods(jobPod("job-1", on("n1"), phase(corev1.PodRunning)))),
			action: None, seal: []string{"n1"}},
		{name: "a Pod labelled ci-job counts as a job too",
			o:      obs(fresh, nodes(node("n1")), pods(pod("job-1", lbl(LabelCIJob, "true"), on("n1"), phase(corev1.PodRunning)))),
			action: None, seal: []string{"n1"}},
		{name: "a sealed node is not sealed again",
			o:      obs(fresh, nodes(node("n1", ranJob)), pods(jobPod("job-1", on("n1"), phase(corev1.PodRunning)))),
			action: None},
		{name: "the job is over (Pod succeeded): removed at once, no hold",
			o:      obs(fresh, nodes(node("n1", ranJob)), pods(jobPod("job-1", on("n1"), phase(corev1.PodSucceeded)))),
			action: Teardown, remove: []string{"n1"}, contains: "1 node ran a job (a fresh node per job), removed without the hold: n1"},
		{name: "the job Pod is deleted: removed at once",
			o:      obs(fresh, nodes(node("n1", ranJob))),
			action: Teardown, remove: []string{"n1"}},
		{name: "a job Pod that ended before the seal still spends its node",
			o:      obs(fresh, nodes(node("n1")), pods(jobPod("job-1", on("n1"), phase(corev1.PodFailed)))),
			action: Teardown, seal: []string{"n1"}, remove: []string{"n1"}},
		{name: "the next job does not land on a node a job ran on: a new one boots",
			o:      obs(fresh, nodes(node("n1")), pods(jobPod("job-1", on("n1"), phase(corev1.PodRunning)), jobPod("job-2"))),
			action: Provision, seal: []string{"n1"}},
		{name: "an ordinary Pod's node keeps the hold",
			o:      obs(fresh, nodes(node("n1")), idle("n1", time.Minute), pods(pod("web", on("n1"), phase(corev1.PodSucceeded)))),
			action: Hold},
		{name: "off: a job's node is neither sealed nor removed before the hold",
			o:      obs(func(o *Observed) { o.Hold = time.Hour }, nodes(node("n1")), idle("n1", time.Minute), pods(jobPod("job-1", on("n1"), phase(corev1.PodSucceeded)))),
			action: Hold},
		{name: "do-not-disrupt still wins",
			o:      obs(fresh, nodes(node("n1", ranJob, func(n *corev1.Node) { n.Annotations[AnnotationDoNotDisrupt] = "true" }))),
			action: None},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Decide(tt.o)
			if err != nil {
				t.Fatal(err)
			}
			if d.Action != tt.action || !slices.Equal(d.Seal, tt.seal) || !slices.Equal(d.Remove, tt.remove) {
				t.Fatalf("%s, seal %v, remove %v; want %s, seal %v, remove %v", d, d.Seal, d.Remove, tt.action, tt.seal, tt.remove)
			}
			if !strings.Contains(d.Reason, tt.contains) {
				t.Errorf("reason %q, want it to say %q", d.Reason, tt.contains)
			}
		})
	}
}
