package integration

import (
	"context"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/socialweb-computer/socialweb/internal/identity"
)

// firstNodeVersions watches a cluster's Nodes from now on and keeps the first version of
// each it sees: the object as it was created. Call it while the cluster has no Node.
func firstNodeVersions(t *testing.T, ctx context.Context, k kubernetes.Interface) func(name string) *corev1.Node {
	t.Helper()
	nl, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing nodes: %v", err)
	}
	w, err := k.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: nl.ResourceVersion})
	if err != nil {
		t.Fatalf("watching nodes: %v", err)
	}
	var mu sync.Mutex
	first := map[string]*corev1.Node{}
	go func() {
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			mu.Lock()
			if first[n.Name] == nil {
				first[n.Name] = n.DeepCopy()
			}
			mu.Unlock()
		}
	}()
	t.Cleanup(w.Stop)
	return func(name string) *corev1.Node {
		mu.Lock()
		defer mu.Unlock()
		return first[name]
	}
}

// checkRegisteredResources: the agent created the Node (first, as first seen) with the
// cpu, memory, pods and ephemeral storage its kubelet went on to report (now), exactly,
// and without the storage startup taint: the kubelet's admission, which reads its own
// informer's copy of the Node, never saw less than the scheduler.
func checkRegisteredResources(t *testing.T, first, now *corev1.Node) {
	t.Helper()
	if first == nil {
		t.Errorf("the node's first version was not seen")
		return
	}
	notReady := false
	for _, taint := range first.Spec.Taints {
		if taint.Key == identity.StorageTaintKey {
			t.Errorf("node %s was created with the storage startup taint: the agent did not register it with its resources (its console says why)", first.Name)
		}
		notReady = notReady || taint.Key == identity.KubeletNotReadyTaintKey && taint.Effect == corev1.TaintEffectNoSchedule
	}
	// Not schedulable before its kubelet has said Ready, and no Ready condition of its own.
	if !notReady || len(first.Status.Conditions) != 0 {
		t.Errorf("node %s was created with taints %v and conditions %v; want the %s NoSchedule taint and no conditions",
			first.Name, first.Spec.Taints, first.Status.Conditions, identity.KubeletNotReadyTaintKey)
	}
	for _, l := range []struct {
		what       string
		first, now corev1.ResourceList
	}{{"capacity", first.Status.Capacity, now.Status.Capacity}, {"allocatable", first.Status.Allocatable, now.Status.Allocatable}} {
		for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourcePods, corev1.ResourceEphemeralStorage} {
			f, fok := l.first[name]
			n, nok := l.now[name]
			if !fok || !nok || f.Cmp(n) != 0 {
				t.Errorf("node %s: %s %s registered %s (%v), the kubelet reports %s (%v); want the same",
					first.Name, name, l.what, f.String(), fok, n.String(), nok)
			} else {
				t.Logf("node %s: %s %s %s, registered and reported", first.Name, name, l.what, n.String())
			}
		}
	}
}
