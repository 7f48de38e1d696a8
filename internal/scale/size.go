package scale

import (
	"fmt"
	"strconv"
	"strings"
)

// Node sizes are chosen in steps: whole vCPUs (qemu's unit), memory in 512 MiB (a node is
// never more than half a GiB above what its Pods need, and sizes, hence instance types,
// repeat), disk in whole GiB (it is a sparse file: a larger step would cost nothing until
// written, a smaller one would only multiply sizes).
const (
	MemoryStepMiB = 512
	DiskStepMiB   = 1024
)

// Reserve is what a node keeps from its Pods. The scheduler places Pods by a Node's
// allocatable, which is less than the VM it runs in; a simulation that took the VM's
// size would boot nodes too small for the Pods it put there.
type Reserve struct {
	// A node of M MiB gives Pods M - MemoryMiB - M/MemoryShare (no share if 0).
	MemoryMiB, MemoryShare int64
	// A node disk of D MiB gives Pods D - DiskMiB - D/DiskShare (no share if 0).
	DiskMiB, DiskShare int64
}

// DefaultReserve is the reserve of a node of socialweb's node image, whose kubelet has no
// kube/system reservations and the default hard eviction thresholds:
//   - memory: 128 MiB + 1/16, the guest kernel's own memory (about 3% + 20 MiB of Debian's
//     cloud kernel) and the kubelet's memory.available<100Mi, as gitlab.MemoryReserve
//     budgets job Pods (a test keeps the two equal);
//   - disk: 1/8 for the kubelet's nodefs.available<10% and ext4's metadata, and 2 GiB for
//     images, which share the disk but are not in any Pod's ephemeral-storage request
//     (ext4's reserve for containerd and the kubelet, at most 256 MiB, comes out of it).
//
// CPU has no reserve: the kubelet reserves none, so a node gives Pods every vCPU.
func DefaultReserve() Reserve {
	return Reserve{MemoryMiB: 128, MemoryShare: 16, DiskMiB: 2048, DiskShare: 8}
}

// resources are requests or what a node offers: millicores, bytes, bytes.
type resources struct{ cpu, mem, eph int64 }

func (r resources) plus(o resources) resources {
	return resources{r.cpu + o.cpu, r.mem + o.mem, r.eph + o.eph}
}

// Allocatable is what a node of size s gives Pods: millicores, memory and ephemeral
// storage in bytes (0 storage for a node without a disk of its own).
func (r Reserve) Allocatable(s NodeSize) (cpuMilli, memory, storage int64) {
	a := r.allocatable(s)
	return a.cpu, a.mem, a.eph
}

func (r Reserve) allocatable(s NodeSize) resources {
	mem := s.MemoryMiB<<20 - r.MemoryMiB<<20
	if r.MemoryShare > 0 {
		mem -= (s.MemoryMiB << 20) / r.MemoryShare
	}
	var eph int64
	if s.DiskMiB > 0 {
		eph = s.DiskMiB<<20 - r.DiskMiB<<20
		if r.DiskShare > 0 {
			eph -= (s.DiskMiB << 20) / r.DiskShare
		}
	}
	return resources{cpu: s.CPUs * 1000, mem: max(mem, 0), eph: max(eph, 0)}
}

// fit returns the smallest size between lo and hi, in steps, whose allocatable holds
// need, or false if not even hi does. A step above hi is clamped to hi; lo need not be
// on a step. MaxPods is lo's.
func (r Reserve) fit(need resources, lo, hi NodeSize) (NodeSize, bool) {
	out := NodeSize{MaxPods: lo.MaxPods}
	out.CPUs = max(lo.CPUs, ceilDiv(need.cpu, 1000))
	if out.CPUs > hi.CPUs {
		return NodeSize{}, false
	}
	mem, ok := smallest(lo.MemoryMiB, hi.MemoryMiB, MemoryStepMiB, need.mem, func(m int64) int64 {
		return r.allocatable(NodeSize{MemoryMiB: m}).mem
	})
	if !ok {
		return NodeSize{}, false
	}
	out.MemoryMiB = mem
	if need.eph > 0 || lo.DiskMiB > 0 {
		disk, ok := smallest(max(lo.DiskMiB, 0), hi.DiskMiB, DiskStepMiB, need.eph, func(d int64) int64 {
			return r.allocatable(NodeSize{DiskMiB: d}).eph
		})
		if !ok {
			return NodeSize{}, false
		}
		out.DiskMiB = disk
	}
	return out, true
}

// smallest is the least v in [lo, hi], lo or a multiple of step, with alloc(v) >= need.
func smallest(lo, hi, step, need int64, alloc func(int64) int64) (int64, bool) {
	if alloc(lo) >= need {
		return lo, true
	}
	if alloc(hi) < need {
		return 0, false
	}
	// The first step above lo; allocatable grows by at most a MiB per MiB, so need (in
	// MiB) is a lower bound too.
	v := ceilDiv(max(ceilDiv(need, 1<<20), lo+1), step) * step
	for v < hi && alloc(v) < need {
		v += step
	}
	return min(v, hi), true
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

// String is e.g. "4 vCPU / 6144 MiB / 20 GiB" (no disk part for a node without one).
func (s NodeSize) String() string {
	out := fmt.Sprintf("%d vCPU / %d MiB", s.CPUs, s.MemoryMiB)
	if s.DiskMiB > 0 {
		out += " / " + fmtMiB(s.DiskMiB)
	}
	return out
}

// fmtMiB is "20 GiB" for whole GiB, else "1536 MiB".
func fmtMiB(mib int64) string {
	if mib%1024 == 0 {
		return strconv.FormatInt(mib/1024, 10) + " GiB"
	}
	return strconv.FormatInt(mib, 10) + " MiB"
}

// ParseInstanceType reads an InstanceType value back: socialweb-2c-3072Mi is 2 vCPUs and
// 3072 MiB.
func ParseInstanceType(v string) (cpus, memoryMiB int64, ok bool) {
	rest, ok := strings.CutPrefix(v, "socialweb-")
	if !ok {
		return 0, 0, false
	}
	c, m, ok := strings.Cut(rest, "c-")
	if !ok {
		return 0, 0, false
	}
	m, ok = strings.CutSuffix(m, "Mi")
	if !ok {
		return 0, 0, false
	}
	cpus, err1 := strconv.ParseInt(c, 10, 64)
	memoryMiB, err2 := strconv.ParseInt(m, 10, 64)
	if err1 != nil || err2 != nil || cpus <= 0 || memoryMiB <= 0 {
		return 0, 0, false
	}
	return cpus, memoryMiB, true
}
