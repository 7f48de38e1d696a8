package agent

import (
	"fmt"
	"syscall"

	cadvisormachine "github.com/google/cadvisor/lib/machine"
	"github.com/google/cadvisor/lib/utils/sysfs"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/kubernetes/pkg/kubelet/eviction"
	evictionapi "k8s.io/kubernetes/pkg/kubelet/eviction/api"
)

// Machine is what the kubelet's cAdvisor measures of a node: its logical CPUs, its memory
// (MemTotal) and the size of the filesystem holding the kubelet's root directory.
type Machine struct {
	CPUs         int
	MemoryBytes  int64
	StorageBytes int64
}

// MeasureMachine measures this machine as cAdvisor does for the kubelet (its topology and
// /proc/meminfo readers; FilesystemBytes for kubeletRoot).
func MeasureMachine(kubeletRoot string) (Machine, error) {
	_, cpus, err := cadvisormachine.GetTopology(sysfs.NewRealSysFs())
	if err != nil {
		return Machine{}, fmt.Errorf("counting CPUs as cAdvisor does: %w", err)
	}
	mem, err := cadvisormachine.GetMachineMemoryCapacity()
	if err != nil {
		return Machine{}, fmt.Errorf("memory capacity as cAdvisor reads it: %w", err)
	}
	storage, err := FilesystemBytes(kubeletRoot)
	if err != nil {
		return Machine{}, err
	}
	return Machine{CPUs: cpus, MemoryBytes: int64(mem), StorageBytes: storage}, nil
}

// Resources are the capacity and allocatable a kubelet reports in its Node's status.
type Resources struct {
	Capacity, Allocatable corev1.ResourceList
}

// KubeletResources are the cpu, memory, pods and ephemeral storage a kubelet reports for
// machine m, computed with the kubelet's own arithmetic: capacity as cAdvisor measures
// it, pods maxPods (podsPerCore times the CPUs when that is set and smaller); allocatable
// is the capacity less the kube- and system-reserved amounts and the memory.available and
// nodefs.available hard eviction thresholds (a percentage is of the capacity).
//
// Why: the kubelet admits a Pod against its own informer's copy of its Node, which can
// lag behind the status the scheduler bound the Pod on. A Node the agent registers with
// exactly these values never shows the kubelet less than the scheduler saw. With none
// (a registered Node's status was empty), a Pod bound as the node turned Ready was
// refused "OutOfpods ... capacity: 0" and failed.
func KubeletResources(m Machine, maxPods, podsPerCore int32, evictionHard, kubeReserved, systemReserved map[string]string) (Resources, error) {
	switch {
	case m.CPUs <= 0 || m.MemoryBytes <= 0 || m.StorageBytes <= 0:
		return Resources{}, fmt.Errorf("machine %+v: want CPUs, memory and storage of more than 0", m)
	case maxPods <= 0 || podsPerCore < 0:
		return Resources{}, fmt.Errorf("maxPods %d, podsPerCore %d: want maxPods above 0 and podsPerCore 0 or more", maxPods, podsPerCore)
	}
	thresholds, err := eviction.ParseThresholdConfig([]string{}, evictionHard, nil, nil, nil)
	if err != nil {
		return Resources{}, fmt.Errorf("eviction thresholds: %w", err)
	}
	pods := int64(maxPods)
	if podsPerCore > 0 && int64(podsPerCore)*int64(m.CPUs) < pods {
		pods = int64(podsPerCore) * int64(m.CPUs)
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:              *resource.NewMilliQuantity(int64(m.CPUs)*1000, resource.DecimalSI),
		corev1.ResourceMemory:           *resource.NewQuantity(m.MemoryBytes, resource.BinarySI),
		corev1.ResourcePods:             *resource.NewQuantity(pods, resource.DecimalSI),
		corev1.ResourceEphemeralStorage: *resource.NewQuantity(m.StorageBytes, resource.BinarySI),
	}
	// The hard eviction thresholds that reserve a resource (the kubelet's
	// hardEvictionReservation).
	evictionOf := map[evictionapi.Signal]corev1.ResourceName{
		evictionapi.SignalMemoryAvailable: corev1.ResourceMemory,
		evictionapi.SignalNodeFsAvailable: corev1.ResourceEphemeralStorage,
	}
	allocatable := corev1.ResourceList{}
	for name, c := range capacity {
		reserved := resource.NewQuantity(0, resource.DecimalSI)
		for _, m := range []map[string]string{systemReserved, kubeReserved} {
			v, ok := m[string(name)]
			if !ok {
				continue
			}
			q, err := resource.ParseQuantity(v)
			if err != nil || q.Sign() < 0 {
				return Resources{}, fmt.Errorf("%s: reserved %q is not a quantity of 0 or more", name, v)
			}
			reserved.Add(q)
		}
		for _, th := range thresholds {
			if evictionOf[th.Signal] == name && th.Operator == evictionapi.OpLessThan {
				reserved.Add(*evictionapi.GetThresholdQuantity(th.Value, &c))
			}
		}
		a := c.DeepCopy()
		a.Sub(*reserved)
		if a.Sign() < 0 {
			a.Set(0)
		}
		allocatable[name] = a
	}
	return Resources{Capacity: capacity, Allocatable: allocatable}, nil
}

// ext4Magic is statfs's f_type of ext4 (and ext2/3): a filesystem whose size cAdvisor
// takes from statfs, as FilesystemBytes does.
const ext4Magic = 0xEF53

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
