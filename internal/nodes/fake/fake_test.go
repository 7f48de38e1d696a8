package fake

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sfake "k8s.io/client-go/kubernetes/fake"

	"github.com/socialweb-computer/socialweb/internal/nodes"
)

func req(name string) nodes.NodeRequest {
	return nodes.NodeRequest{Cluster: "c", Name: name, CPUs: 2, MemoryMiB: 3072, MaxPods: 30, Labels: map[string]string{"socialweb.computer/managed": "true"}}
}

func TestProviderRecordsAndFails(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := New(WithClock(func() time.Time { return at }))

	inst, err := p.Create(ctx, req("c-a"))
	if err != nil {
		t.Fatal(err)
	}
	if inst.ProviderID != "socialweb://c/c-a" || inst.Cluster != "c" || !inst.Created.Equal(at) || inst.State != nodes.StateRunning {
		t.Errorf("instance %+v", inst)
	}
	if _, err := p.Create(ctx, req("c-a")); err == nil {
		t.Error("Create reused a name")
	}
	if _, err := p.Create(ctx, nodes.NodeRequest{Name: "x"}); err == nil {
		t.Error("Create accepted an invalid request")
	}

	boom := errors.New("boom")
	p.FailNext(OpCreate, boom)
	if _, err := p.Create(ctx, req("c-b")); !errors.Is(err, boom) {
		t.Errorf("Create after FailNext: %v", err)
	}
	if _, err := p.Create(ctx, req("c-b")); err != nil {
		t.Errorf("FailNext failed more than once: %v", err)
	}
	p.FailNext(OpList, boom)
	if l, err := p.List(ctx); !errors.Is(err, boom) || l != nil {
		t.Errorf("List after FailNext: %v, %v", l, err)
	}
	if l, err := p.List(ctx); err != nil || len(l) != 2 || l[0].Name != "c-a" || l[1].Name != "c-b" {
		t.Errorf("List = %v, %v", l, err)
	}
	p.FailNext(OpDelete, boom)
	if err := p.Delete(ctx, "c-a"); !errors.Is(err, boom) {
		t.Errorf("Delete after FailNext: %v", err)
	}
	if err := p.Delete(ctx, "c-a"); err != nil {
		t.Error(err)
	}
	if err := p.Delete(ctx, "c-a"); !nodes.IsNotFound(err) {
		t.Errorf("second Delete: %v, want not found", err)
	}

	want := []Op{OpCreate, OpCreate, OpCreate, OpCreate, OpCreate, OpList, OpList, OpDelete, OpDelete, OpDelete}
	calls := p.Calls()
	if len(calls) != len(want) {
		t.Fatalf("%d calls, want %d: %+v", len(calls), len(want), calls)
	}
	for i, c := range calls {
		if c.Op != want[i] {
			t.Errorf("call %d is %s, want %s", i, c.Op, want[i])
		}
	}
	if p.Count(OpDelete) != 3 || len(p.Instances()) != 1 {
		t.Errorf("count %d, instances %v", p.Count(OpDelete), p.Instances())
	}
}

func TestProviderConcurrent(t *testing.T) {
	p := New()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := p.Create(context.Background(), req(fmt.Sprintf("c-%d", i))); err != nil {
				t.Error(err)
			}
			_, _ = p.List(context.Background())
		}()
	}
	wg.Wait()
	if p.Count(OpCreate) != 50 || len(p.Instances()) != 50 {
		t.Errorf("%d creates, %d instances", p.Count(OpCreate), len(p.Instances()))
	}
}

func TestProviderRegistersNodes(t *testing.T) {
	ctx := context.Background()
	client := k8sfake.NewClientset()
	p := New(WithTenant(client))
	if _, err := p.Create(ctx, req("c-a")); err != nil {
		t.Fatal(err)
	}
	n, err := client.CoreV1().Nodes().Get(ctx, "c-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Spec.ProviderID != "socialweb://c/c-a" {
		t.Errorf("providerID %q", n.Spec.ProviderID)
	}
	for k, v := range map[string]string{corev1.LabelHostname: "c-a", corev1.LabelOSStable: "linux", corev1.LabelArchStable: "amd64", "socialweb.computer/managed": "true"} {
		if n.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, n.Labels[k], v)
		}
	}
	alloc := n.Status.Allocatable
	if alloc.Cpu().Value() != 2 || alloc.Memory().Value() != 3072<<20 || alloc.Pods().Value() != 30 {
		t.Errorf("allocatable %v", alloc)
	}
	if len(n.Status.Conditions) != 1 || n.Status.Conditions[0].Type != corev1.NodeReady || n.Status.Conditions[0].Status != corev1.ConditionTrue {
		t.Errorf("conditions %v", n.Status.Conditions)
	}

	// CompletePods finishes only the live pods on that node.
	mk := func(name, node string, ph corev1.PodPhase) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
			Status: corev1.PodStatus{Phase: ph}}
		if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mk("run", "c-a", corev1.PodRunning)
	mk("pend", "c-a", corev1.PodPending)
	mk("done", "c-a", corev1.PodFailed)
	mk("other", "c-b", corev1.PodRunning)
	if n, err := p.CompletePods(ctx, "c-a"); err != nil || n != 2 {
		t.Errorf("CompletePods = %d, %v; want 2", n, err)
	}
	for name, want := range map[string]corev1.PodPhase{"run": corev1.PodSucceeded, "pend": corev1.PodSucceeded, "done": corev1.PodFailed, "other": corev1.PodRunning} {
		pod, err := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil || pod.Status.Phase != want {
			t.Errorf("pod %s: %v, phase %s, want %s", name, err, pod.Status.Phase, want)
		}
	}

	if err := p.Delete(ctx, "c-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Get(ctx, "c-a", metav1.GetOptions{}); err == nil {
		t.Error("Node object survived Delete")
	}
	if _, err := New().CompletePods(ctx, "c-a"); err == nil {
		t.Error("CompletePods without a tenant succeeded")
	}
}

// With a host capacity, Create refuses what would not fit beside the live machines, with
// a CapacityError, and accepts it once a machine is gone or the limit is raised.
func TestHostCapacity(t *testing.T) {
	ctx := context.Background()
	sized := func(name string, mem, disk int64) nodes.NodeRequest {
		r := req(name)
		r.MemoryMiB, r.DiskMiB = mem, disk
		return r
	}
	p := New(WithHostCapacity(4096, 20480))
	steps := []struct {
		name     string
		do       func() error
		capacity bool // the error is a CapacityError
		wantErr  string
	}{
		{"fits", func() error { _, err := p.Create(ctx, sized("c-a", 3072, 10240)); return err }, false, ""},
		{"memory full", func() error { _, err := p.Create(ctx, sized("c-b", 2048, 1024)); return err }, true, "needs 2048 MiB of host memory; 1024 MiB free"},
		{"disk full", func() error { _, err := p.Create(ctx, sized("c-c", 1024, 12288)); return err }, true, "needs 12288 MiB of host disk; 10240 MiB free"},
		{"exactly full", func() error { _, err := p.Create(ctx, sized("c-d", 1024, 10240)); return err }, false, ""},
		{"freed by a delete", func() error {
			if err := p.Delete(ctx, "c-a"); err != nil {
				return err
			}
			_, err := p.Create(ctx, sized("c-e", 2048, 1024))
			return err
		}, false, ""},
		{"limit raised", func() error {
			p.SetHostCapacity(0, 0)
			_, err := p.Create(ctx, sized("c-f", 65536, 1<<20))
			return err
		}, false, ""},
	}
	for _, s := range steps {
		err := s.do()
		if nodes.IsCapacity(err) != s.capacity || (err == nil) != (s.wantErr == "") || err != nil && !strings.Contains(err.Error(), s.wantErr) {
			t.Errorf("%s: %v, want capacity error %t containing %q", s.name, err, s.capacity, s.wantErr)
		}
	}
	if n := len(p.Instances()); n != 3 {
		t.Errorf("%d instances, want 3 (refused creates leave nothing)", n)
	}
}
