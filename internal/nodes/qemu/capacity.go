package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/socialweb-computer/socialweb/internal/nodeimage"
	"github.com/socialweb-computer/socialweb/internal/nodes"
)

// TCG translation cache bounds (MiB): below the minimum a guest retranslates its hot
// code over and over; the maximum is qemu's own default.
const (
	MinTCGCacheMiB = 32
	MaxTCGCacheMiB = 1024
)

// ValidateTCGCache checks a TCG translation cache size; 0 means qemu's default.
func ValidateTCGCache(mib int64) error {
	if mib != 0 && (mib < MinTCGCacheMiB || mib > MaxTCGCacheMiB) {
		return fmt.Errorf("TCG translation cache %d MiB: want 0 (qemu's default, 1024) or %d to %d MiB", mib, MinTCGCacheMiB, MaxTCGCacheMiB)
	}
	return nil
}

// vmmOverheadMiB is host memory a VM costs beyond its guest memory: qemu itself, and
// under TCG its translation cache. Measured: a 512 MiB TCG guest's qemu holds about
// 1 GiB RSS, a 2 GiB one about 1.1 GiB once booted, with qemu's default 1 GiB cache
// (docs/benchmarks.md). A smaller cache bounds that part.
func vmmOverheadMiB(a Accel, tcgCacheMiB int64) int64 {
	if a == AccelKVM {
		return 128
	}
	if tcgCacheMiB > 0 {
		return min(512, tcgCacheMiB+128)
	}
	return 512
}

// memAvailableMiB is the host's MemAvailable.
func memAvailableMiB() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	return meminfoMiB(b, "MemAvailable")
}

// rssMiB is a process's resident memory, 0 if unknown.
func rssMiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb / 1024
			}
		}
	}
	return 0
}

// unallocatedBytes is how much a sparse file may still grow: its size less the blocks it
// holds.
func unallocatedBytes(path string) int64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0
	}
	return max(st.Size-st.Blocks*512, 0)
}

// hostUse is what the host has free for one more VM, with what the running ones may
// still take counted as taken.
type hostUse struct {
	memFreeMiB  int64 // MemAvailable - reserve - what running VMs may still grow into
	diskFreeMiB int64 // free space of the state dir - what their disks may still grow into
}

// checkCapacity returns a *nodes.CapacityError when req (guest memory plus the VMM's
// overhead; root clone plus data disk) does not fit what the host has free now. Called
// with p.mu held, so that parallel Creates see each other's claims.
func (p *Provider) checkCapacity(req nodes.NodeRequest) error {
	avail, err := p.memAvailable()
	if err != nil {
		return fmt.Errorf("node %s: reading the host's free memory: %w", req.Name, err)
	}
	free, err := freeBytes(p.cfg.StateDir)
	if err != nil {
		return fmt.Errorf("node %s: reading free space in %s: %w", req.Name, p.cfg.StateDir, err)
	}
	u := hostUse{memFreeMiB: avail - p.cfg.HostReserveMiB, diskFreeMiB: free>>20 - p.cfg.DiskReserveMiB}
	for _, in := range p.insts {
		r := in.rec.Request
		commit := r.MemoryMiB + vmmOverheadMiB(in.rec.Accel, in.rec.TCGCacheMiB)
		if in.rec.Process != nil && in.alive() {
			commit -= rssMiB(in.rec.Process.PID)
		}
		if in.rec.LayersDir != "" {
			commit += virtiofsdOverheadMiB
			if in.rec.Virtiofsd != nil && in.virtiofsdAlive() {
				commit -= rssMiB(in.rec.Virtiofsd.PID)
			}
		}
		u.memFreeMiB -= max(commit, 0)
		if in.creating && in.rec.Process == nil {
			// Not cloned or made yet, or only just: count the whole of both disks.
			u.diskFreeMiB -= p.image.Files[nodeimage.FileRootfs].Size>>20 + r.DiskMiB
			continue
		}
		u.diskFreeMiB -= (unallocatedBytes(filepath.Join(in.dir, fileRootfs)) + unallocatedBytes(filepath.Join(in.dir, fileData))) >> 20
	}
	needMem := req.MemoryMiB + vmmOverheadMiB(p.accel, p.cfg.TCGCacheMiB)
	if p.cfg.Layers != nil {
		needMem += virtiofsdOverheadMiB
	}
	needDisk := p.image.Files[nodeimage.FileRootfs].Size>>20 + req.DiskMiB
	var why []string
	if needMem > u.memFreeMiB {
		why = append(why, fmt.Sprintf("needs %d MiB of host memory (%d MiB guest, %d MiB VMM); %d MiB free after the %d MiB reserve and what running nodes may still take",
			needMem, req.MemoryMiB, needMem-req.MemoryMiB, max(u.memFreeMiB, 0), p.cfg.HostReserveMiB))
	}
	if needDisk > u.diskFreeMiB {
		why = append(why, fmt.Sprintf("needs %d MiB of disk in %s (root clone and a %d MiB data disk, which it may fill); %d MiB free after the %d MiB reserve and what running nodes may still fill",
			needDisk, p.cfg.StateDir, req.DiskMiB, max(u.diskFreeMiB, 0), p.cfg.DiskReserveMiB))
	}
	if len(why) > 0 {
		return &nodes.CapacityError{Name: req.Name, Reason: strings.Join(why, "; ")}
	}
	return nil
}

// makeDataDisk makes the node's container-storage disk: a sparse file of sizeMiB with an
// empty ext4 on it (lazy init: mkfs writes a few MiB, not the whole disk). The guest
// mounts it with discard, so space freed there is given back.
func makeDataDisk(ctx context.Context, path string, sizeMiB int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(sizeMiB << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	// -m: the reserve DataDiskReservePercent describes. nodiscard: the file is sparse
	// already.
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", DataDiskReservePercent(sizeMiB), "-L", "socialweb-data",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4 (apt-get install e2fsprogs): %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// DataDiskReservePercent is the share of a data disk (mkfs.ext4 -m) that ext4 keeps for
// processes holding CAP_SYS_RESOURCE: 5%, at most 256 MiB. The guest mounts the disk
// with no owner for the reserve (see agent.DataMountOptions), and Pods run without that
// capability, so a Pod filling the disk through an emptyDir stops short of it while
// containerd and the kubelet can still write their metadata, status and logs: the
// kubelet's eviction thresholds alone left no headroom, because a fast writer fills the
// disk between two of its 10 s eviction checks. (Writes to a container's own root
// filesystem go through overlayfs with containerd's credentials, so they can reach
// into the reserve: it delays a full disk for them rather than preventing it.)
func DataDiskReservePercent(sizeMiB int64) string {
	if sizeMiB <= 0 {
		return "0"
	}
	reserve := min(float64(sizeMiB)*0.05, 256)
	return strconv.FormatFloat(reserve*100/float64(sizeMiB), 'f', 3, 64)
}
