package agent

import (
	"fmt"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/kubernetes/pkg/kubelet/eviction"
	evictionapi "k8s.io/kubernetes/pkg/kubelet/eviction/api"
)

// Storage is a node's ephemeral storage as its kubelet reports it in the Node's status.
type Storage struct {
	Capacity    resource.Quantity
	Allocatable resource.Quantity
}

// ext4Magic is statfs's f_type of ext4 (and ext2/3): a filesystem whose size cAdvisor
// takes from statfs, as NodeStorage does.
const ext4Magic = 0xEF53

// KubeletStorage is the ephemeral storage a kubelet reports for a root directory on a
// filesystem of capacity bytes, computed with the kubelet's own arithmetic: allocatable
// is the capacity less the kube- and system-reserved ephemeral storage and the
// nodefs.available hard eviction threshold (a percentage is of the capacity).
//
// Why: a Node the agent registers with exactly these values never shows the kubelet
// (whose admission reads its own informer's copy of the Node) less storage than the
// scheduler saw, so the node needs no storage startup taint and its settle.
func KubeletStorage(capacity int64, evictionHard, kubeReserved, systemReserved map[string]string) (Storage, error) {
	if capacity <= 0 {
		return Storage{}, fmt.Errorf("ephemeral storage: capacity %d bytes, want more than 0", capacity)
	}
	thresholds, err := eviction.ParseThresholdConfig([]string{}, evictionHard, nil, nil, nil)
	if err != nil {
		return Storage{}, fmt.Errorf("ephemeral storage: eviction thresholds: %w", err)
	}
	c := *resource.NewQuantity(capacity, resource.BinarySI)
	reserved := resource.NewQuantity(0, resource.DecimalSI)
	for _, m := range []map[string]string{systemReserved, kubeReserved} {
		v, ok := m[string(corev1.ResourceEphemeralStorage)]
		if !ok {
			continue
		}
		q, err := resource.ParseQuantity(v)
		if err != nil || q.Sign() < 0 {
			return Storage{}, fmt.Errorf("ephemeral storage: reserved %q is not a quantity of 0 or more", v)
		}
		reserved.Add(q)
	}
	for _, th := range thresholds {
		if th.Signal == evictionapi.SignalNodeFsAvailable && th.Operator == evictionapi.OpLessThan {
			reserved.Add(*evictionapi.GetThresholdQuantity(th.Value, &c))
		}
	}
	a := c.DeepCopy()
	a.Sub(*reserved)
	if a.Sign() < 0 {
		a.Set(0)
	}
	return Storage{Capacity: c, Allocatable: a}, nil
}

// FilesystemBytes is the size of the ext4 filesystem holding path, as cAdvisor measures
// it (fragment size times blocks). Another filesystem is an error: cAdvisor may measure
// it otherwise.
func FilesystemBytes(path string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", path, err)
	}
	if st.Type != ext4Magic {
		return 0, fmt.Errorf("%s is on a filesystem of type %#x, not ext4", path, st.Type)
	}
	return int64(st.Frsize) * int64(st.Blocks), nil
}
