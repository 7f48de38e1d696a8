package agent

import (
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/google/cadvisor/lib/fs/vfs"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestKubeletResources: what the agent registers is the kubelet's arithmetic: capacity
// as measured (cpu in millicores, memory and storage in bytes, pods maxPods or
// podsPerCore x CPUs), allocatable = capacity - reserved - the memory.available and
// nodefs.available hard thresholds (a percentage parsed to float32 and taken of the
// capacity, truncated).
func TestKubeletResources(t *testing.T) {
	const gi, mi = int64(1) << 30, int64(1) << 20
	node := Machine{CPUs: 2, MemoryBytes: 4 * gi, StorageBytes: 10 * gi}
	type want struct{ cpu, mem, pods, storage int64 } // cpu in millicores
	cases := []struct {
		name               string
		m                  Machine
		maxPods, perCore   int32
		hard, kube, system map[string]string
		capacity, alloc    want
		wantErr            bool
	}{
		{name: "the node's thresholds", m: node, maxPods: 110, hard: EvictionHard(),
			capacity: want{2000, 4 * gi, 110, 10 * gi},
			alloc:    want{2000, 4*gi - 100*mi, 110, 10*gi - int64(float64(10*gi)*float64(float32(0.10)))}},
		{name: "quantity thresholds", m: node, maxPods: 110, hard: map[string]string{"nodefs.available": "1Gi", "memory.available": "1Gi"},
			capacity: want{2000, 4 * gi, 110, 10 * gi}, alloc: want{2000, 3 * gi, 110, 9 * gi}},
		{name: "reserved too", m: node, maxPods: 110, hard: map[string]string{"nodefs.available": "1Gi"},
			kube:     map[string]string{"ephemeral-storage": "1Gi", "cpu": "100m", "memory": "256Mi"},
			system:   map[string]string{"ephemeral-storage": "512Mi", "cpu": "150m"},
			capacity: want{2000, 4 * gi, 110, 10 * gi}, alloc: want{1750, 4*gi - 256*mi, 110, 10*gi - gi - gi - gi/2}},
		{name: "no thresholds", m: Machine{CPUs: 1, MemoryBytes: gi, StorageBytes: 3 * gi}, maxPods: 110,
			capacity: want{1000, gi, 110, 3 * gi}, alloc: want{1000, gi, 110, 3 * gi}},
		{name: "imagefs thresholds do not count", m: Machine{CPUs: 1, MemoryBytes: gi, StorageBytes: 3 * gi}, maxPods: 110,
			hard:     map[string]string{"imagefs.available": "50%"},
			capacity: want{1000, gi, 110, 3 * gi}, alloc: want{1000, gi, 110, 3 * gi}},
		{name: "pods per core", m: node, maxPods: 110, perCore: 10,
			capacity: want{2000, 4 * gi, 20, 10 * gi}, alloc: want{2000, 4 * gi, 20, 10 * gi}},
		{name: "pods per core above maxPods", m: node, maxPods: 16, perCore: 10,
			capacity: want{2000, 4 * gi, 16, 10 * gi}, alloc: want{2000, 4 * gi, 16, 10 * gi}},
		{name: "more reserved than there is", m: node, maxPods: 110, kube: map[string]string{"ephemeral-storage": "20Gi", "cpu": "3"},
			capacity: want{2000, 4 * gi, 110, 10 * gi}, alloc: want{0, 4 * gi, 110, 0}},
		{name: "no storage", m: Machine{CPUs: 1, MemoryBytes: gi}, maxPods: 110, wantErr: true},
		{name: "no CPUs", m: Machine{MemoryBytes: gi, StorageBytes: gi}, maxPods: 110, wantErr: true},
		{name: "no maxPods", m: node, wantErr: true},
		{name: "a bad threshold", m: node, maxPods: 110, hard: map[string]string{"nodefs.available": "lots"}, wantErr: true},
		{name: "a bad reservation", m: node, maxPods: 110, system: map[string]string{"memory": "-1Gi"}, wantErr: true},
	}
	get := func(l corev1.ResourceList) want {
		cpu, mem, pods, st := l[corev1.ResourceCPU], l[corev1.ResourceMemory], l[corev1.ResourcePods], l[corev1.ResourceEphemeralStorage]
		return want{cpu.MilliValue(), mem.Value(), pods.Value(), st.Value()}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := KubeletResources(tc.m, tc.maxPods, tc.perCore, tc.hard, tc.kube, tc.system)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("got %v, want an error", r)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := get(r.Capacity); got != tc.capacity || len(r.Capacity) != 4 {
				t.Errorf("capacity %+v (%d resources), want %+v (4)", got, len(r.Capacity), tc.capacity)
			}
			if got := get(r.Allocatable); got != tc.alloc || len(r.Allocatable) != 4 {
				t.Errorf("allocatable %+v (%d resources), want %+v (4)", got, len(r.Allocatable), tc.alloc)
			}
		})
	}
	// As the kubelet formats them: bytes in binary SI, cpu and pods in decimal SI.
	r, _ := KubeletResources(node, 110, 0, nil, nil, nil)
	for name, f := range map[corev1.ResourceName]resource.Format{corev1.ResourceEphemeralStorage: resource.BinarySI,
		corev1.ResourceMemory: resource.BinarySI, corev1.ResourceCPU: resource.DecimalSI, corev1.ResourcePods: resource.DecimalSI} {
		if q := r.Capacity[name]; q.Format != f {
			t.Errorf("%s capacity format %s, want %s", name, q.Format, f)
		}
	}
}

// TestMeasureMachine: this machine as cAdvisor measures it, where the test's directory is
// on ext4.
func TestMeasureMachine(t *testing.T) {
	m, err := MeasureMachine(t.TempDir())
	if err != nil {
		t.Skipf("not measurable here (the temporary directory must be on ext4): %v", err)
	}
	if m.CPUs != runtime.NumCPU() || m.MemoryBytes <= 0 || m.StorageBytes <= 0 {
		t.Errorf("measured %+v; want %d CPUs and some memory and storage", m, runtime.NumCPU())
	}
	if _, err := MeasureMachine("/proc"); err == nil {
		t.Error("a kubelet root on procfs was measured")
	}
}

// TestFilesystemBytes: only a filesystem cAdvisor measures with statfs is measured here.
func TestFilesystemBytes(t *testing.T) {
	if _, err := FilesystemBytes("/proc"); err == nil {
		t.Error("/proc (procfs) was measured; want an error naming its type")
	}
	if _, err := FilesystemBytes("/no/such/path"); err == nil {
		t.Error("a missing path was measured")
	}
	dir := t.TempDir()
	n, err := FilesystemBytes(dir)
	if err != nil {
		t.Skipf("the test's temporary directory is not on ext4: %v", err)
	}
	// The kubelet's number: cAdvisor's own measure of the filesystem.
	total, _, _, _, _, err := vfs.GetVfsStats(dir)
	if err != nil {
		t.Fatal(err)
	}
	if n <= 0 || uint64(n) != total {
		t.Errorf("%s: %d bytes, cAdvisor measures %d", dir, n, total)
	}
}
