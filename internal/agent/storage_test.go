package agent

import (
	"testing"

	"github.com/google/cadvisor/lib/fs/vfs"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestKubeletStorage: the storage the agent registers is the kubelet's arithmetic:
// allocatable = capacity - reserved - the nodefs.available hard threshold (a percentage
// parsed to float32 and taken of the capacity, truncated).
func TestKubeletStorage(t *testing.T) {
	const gi = int64(1) << 30
	cases := []struct {
		name               string
		capacity           int64
		hard, kube, system map[string]string
		wantAlloc          int64
		wantErr            bool
	}{
		{name: "the node's thresholds", capacity: 10 * gi, hard: EvictionHard(),
			wantAlloc: 10*gi - int64(float64(10*gi)*float64(float32(0.10)))},
		{name: "a quantity threshold", capacity: 10 * gi, hard: map[string]string{"nodefs.available": "1Gi"}, wantAlloc: 9 * gi},
		{name: "reserved too", capacity: 10 * gi, hard: map[string]string{"nodefs.available": "1Gi"},
			kube: map[string]string{"ephemeral-storage": "1Gi", "cpu": "100m"}, system: map[string]string{"ephemeral-storage": "512Mi"},
			wantAlloc: 10*gi - gi - gi - gi/2},
		{name: "no thresholds", capacity: 3 * gi, wantAlloc: 3 * gi},
		{name: "memory and imagefs thresholds do not count", capacity: 3 * gi,
			hard: map[string]string{"memory.available": "100Mi", "imagefs.available": "50%"}, wantAlloc: 3 * gi},
		{name: "more reserved than there is", capacity: gi, kube: map[string]string{"ephemeral-storage": "2Gi"}, wantAlloc: 0},
		{name: "no capacity", capacity: 0, wantErr: true},
		{name: "a bad threshold", capacity: gi, hard: map[string]string{"nodefs.available": "lots"}, wantErr: true},
		{name: "a bad reservation", capacity: gi, system: map[string]string{"ephemeral-storage": "-1Gi"}, wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := KubeletStorage(tc.capacity, tc.hard, tc.kube, tc.system)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("got %v, want an error", s)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Capacity.Value() != tc.capacity || s.Allocatable.Value() != tc.wantAlloc {
				t.Errorf("capacity %d allocatable %d, want %d and %d", s.Capacity.Value(), s.Allocatable.Value(), tc.capacity, tc.wantAlloc)
			}
		})
	}
	// As the kubelet formats it: bytes in binary SI.
	s, _ := KubeletStorage(10*gi, nil, nil, nil)
	if s.Capacity.Format != resource.BinarySI {
		t.Errorf("capacity format %s, want BinarySI", s.Capacity.Format)
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
