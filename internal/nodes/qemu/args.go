package qemu

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/layershare"
	"github.com/socialweb-computer/socialweb/internal/nodeimage"
)

// Sandbox is qemu's -sandbox option for node VMs: qemu's seccomp filter with every
// optional deny. qemu needs none of these once started (the tap is opened with
// script=no, disks and sockets are opened at start).
const Sandbox = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// SandboxRunAs is Sandbox for a qemu that drops to a user with -runas. qemu loads its
// filter before it drops (and checks that setuid(0) then fails), so set*id must stay
// allowed for the drop itself; once dropped the process holds no capability and every
// id it has is the user's, so no set*id call can take it back to root.
const SandboxRunAs = "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny"

// launch is everything one qemu command line is made of.
type launch struct {
	Name         string
	Accel        Accel // kvm or tcg
	TCGCacheMiB  int64 // TCG's translation cache (tb-size); 0: qemu's default
	CPUs         int64
	MemoryMiB    int64
	Kernel       string
	Initrd       string
	Cmdline      string // the full kernel command line (see kernelCmdline)
	Rootfs       string // -> /dev/vda, read-write
	IdentityDisk string // -> /dev/vdb, read-only
	DataDisk     string // -> /dev/vdc, read-write, discard on; "" for none
	Tap          string
	MAC          string
	Console      string // serial console file
	// UID, if not 0, is the user (and group) qemu drops to once it has opened its disks,
	// its tap, its sockets and the accelerator (-runas UID:UID).
	UID int
	QMP string // QMP unix socket
	// LayersSocket is virtiofsd's vhost-user socket for the shared layer store; "" for
	// no virtio-fs device.
	LayersSocket string
}

// args is qemu's argument list (without the binary). Device order matters: microvm puts
// virtio-mmio devices on transports in command-line order and the guest kernel names the
// disks in that order, so the root disk is /dev/vda and the identity disk /dev/vdb. The
// serial numbers let a guest find them by role as well (/sys/block/vd*/serial).
func (l launch) args() []string {
	machine := "microvm"
	if l.LayersSocket != "" {
		// vhost-user devices need guest RAM the backend (virtiofsd) can map: a shared
		// memfd as the machine's memory.
		machine += ",memory-backend=mem"
	}
	a := []string{
		"-name", "guest=" + l.Name,
		"-M", machine,
	}
	if l.Accel == AccelKVM {
		a = append(a, "-accel", "kvm", "-cpu", "host")
	} else {
		// qemu64 lacks RDRAND, and without it the guest kernel's entropy pool takes about
		// 20 s to initialise under TCG, which stalls every TLS handshake of the agent.
		accel := "tcg"
		if l.TCGCacheMiB > 0 {
			accel += ",tb-size=" + strconv.FormatInt(l.TCGCacheMiB, 10)
		}
		a = append(a, "-accel", accel, "-cpu", "qemu64,+rdrand")
	}
	a = append(a,
		"-smp", strconv.FormatInt(l.CPUs, 10),
		"-m", strconv.FormatInt(l.MemoryMiB, 10),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		// The guest is tenant code, and TCG is no security boundary (QEMU's security
		// guide): a seccomp filter (and NoNewPrivs) so an escape into qemu cannot
		// spawn programs, change its ids or its scheduling, or use obsolete calls.
		"-sandbox", l.sandbox(),
		"-serial", "file:"+l.Console,
		"-qmp", "unix:"+l.QMP+",server=on,wait=off",
		"-kernel", l.Kernel,
		"-initrd", l.Initrd,
		"-append", l.Cmdline,
		"-drive", "id=root,file="+l.Rootfs+",format=raw,if=none,discard=unmap",
		"-device", "virtio-blk-device,drive=root,serial=socialweb-root",
		"-drive", "id=identity,file="+l.IdentityDisk+",format=raw,if=none,readonly=on",
		"-device", "virtio-blk-device,drive=identity,serial=socialweb-identity",
	)
	if l.DataDisk != "" {
		// discard=unmap with detect-zeroes: space the guest frees (online discard) goes
		// back to the host, so the sparse file holds only what is in use.
		a = append(a,
			"-drive", "id=data,file="+l.DataDisk+",format=raw,if=none,discard=unmap,detect-zeroes=unmap",
			"-device", "virtio-blk-device,drive=data,serial="+identity.DataDiskSerial,
		)
	}
	if l.UID != 0 {
		a = append(a, "-runas", strconv.Itoa(l.UID)+":"+strconv.Itoa(l.UID))
	}
	a = append(a,
		"-netdev", "tap,id="+nicNetdev+",ifname="+l.Tap+",script=no,downscript=no",
		"-device", "virtio-net-device,netdev="+nicNetdev+",mac="+l.MAC,
	)
	if l.LayersSocket != "" {
		// Last, after the disks and the NIC, so their virtio-mmio slots (and the guest's
		// vda/vdb/vdc) stay where they were. microvm has no PCI: the mmio variant.
		// virtio-mmio is legacy (virtio 0.9) by default, which virtiofsd's libvhost-user
		// refuses ("virtio legacy devices aren't supported"): modern virtio-mmio for every
		// device of the VM (the guest kernel drives both).
		a = append(a,
			"-global", "virtio-mmio.force-legacy=false",
			"-object", "memory-backend-memfd,id=mem,share=on,size="+strconv.FormatInt(l.MemoryMiB, 10)+"M",
			"-chardev", "socket,id=layers,path="+l.LayersSocket,
			"-device", "vhost-user-fs-device,chardev=layers,tag="+layershare.Tag+",queue-size=1024",
		)
	}
	return a
}

func (l launch) sandbox() string {
	if l.UID != 0 {
		return SandboxRunAs
	}
	return Sandbox
}

// kernelCmdline is the image's command line, with socialweb.init= from the manifest if
// the command line lacks it and, under TCG, norandmaps when fixedMaps is set and, when
// the host's TSC rate is known, tsc_early_khz=<rate> tsc=reliable.
//
// norandmaps: qemu 7.2's TCG finds a translated block by the guest's virtual address.
// With ASLR every process maps its shared libraries (and a PIE binary) at new addresses,
// so what one nft, CNI plugin or mount translated is thrown away for the next, and what
// a warm-pool VM translated while it waited (its prewarm) is not reused by the Pod start.
// Fixed maps make those runs hit the cache (docs/benchmarks.md, issue 12). It is a
// TCG-only trade: under KVM nothing is translated and ASLR stays.
//
// Under TCG microvm has no kvmclock, HPET or ACPI PM timer. tsc_early_khz= skips the TSC
// calibration against the PIT, which fails on a loaded host and stalls the boot (see
// nodeimage's boot test). tsc=reliable turns off the clocksource watchdog: without it the
// guest compares the TSC (which under TCG follows the host clock) with jiffies (which
// fall behind whenever the emulator is starved), marks the TSC unstable ("skew is too
// large", observed here on every loaded boot) and keeps time with refined-jiffies, so the
// node's clock drifts behind the host's -- bad for certificates and leases.
func kernelCmdline(m *nodeimage.Manifest, accel Accel, tscKHz int64, fixedMaps bool) string {
	c := strings.TrimSpace(m.Cmdline)
	has := func(k string) bool { return strings.Contains(" "+c, " "+k) }
	if !has("socialweb.init=") && m.Init != "" {
		c += " socialweb.init=" + m.Init
	}
	if accel == AccelTCG && fixedMaps && !has("norandmaps") {
		c += " norandmaps"
	}
	if accel == AccelTCG && tscKHz > 0 {
		if !has("tsc_early_khz=") {
			c += fmt.Sprintf(" tsc_early_khz=%d", tscKHz)
		}
		if !has("tsc=") {
			c += " tsc=reliable"
		}
	}
	return strings.TrimSpace(c)
}
