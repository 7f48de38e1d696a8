// Package syscallfilter walls a control-plane process in with a seccomp filter: the
// system calls a kube-apiserver, its controllers and kine never make (mounts, namespaces,
// modules, keys, ptrace, bpf, io_uring...) fail with EPERM, so a flaw in a tenant's
// apiserver does not reach those parts of the host kernel.
//
// A deny-list over an allow-list: the apiserver's set of system calls follows Go's
// runtime and its libraries from release to release, and a call missing from an
// allow-list would crash a tenant. The program is written here with x/net/bpf, not
// taken from elastic/go-seccomp-bpf, because that library's program lets a call of
// another architecture (int 0x80, the i386 ABI) through to the default action, which
// for a deny-list is "allow"; ours refuses every foreign architecture and the x32 ABI.
package syscallfilter

import (
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Denied are the system calls refused (EPERM) to a control plane, by name, grouped by why.
func Denied() map[string]uintptr {
	return map[string]uintptr{
		// Mounts and namespaces: a way out of any confinement.
		"mount": unix.SYS_MOUNT, "umount2": unix.SYS_UMOUNT2, "pivot_root": unix.SYS_PIVOT_ROOT,
		"chroot": unix.SYS_CHROOT, "unshare": unix.SYS_UNSHARE, "setns": unix.SYS_SETNS,
		"fsopen": unix.SYS_FSOPEN, "fsconfig": unix.SYS_FSCONFIG, "fsmount": unix.SYS_FSMOUNT,
		"fspick": unix.SYS_FSPICK, "move_mount": unix.SYS_MOVE_MOUNT, "open_tree": unix.SYS_OPEN_TREE,
		"mount_setattr":     unix.SYS_MOUNT_SETATTR,
		"name_to_handle_at": unix.SYS_NAME_TO_HANDLE_AT, "open_by_handle_at": unix.SYS_OPEN_BY_HANDLE_AT,
		// Kernel modules, kexec, reboot, swap, clocks, host names, accounting.
		"init_module": unix.SYS_INIT_MODULE, "finit_module": unix.SYS_FINIT_MODULE,
		"delete_module": unix.SYS_DELETE_MODULE, "kexec_load": unix.SYS_KEXEC_LOAD,
		"kexec_file_load": unix.SYS_KEXEC_FILE_LOAD, "reboot": unix.SYS_REBOOT,
		"swapon": unix.SYS_SWAPON, "swapoff": unix.SYS_SWAPOFF,
		"settimeofday": unix.SYS_SETTIMEOFDAY, "clock_settime": unix.SYS_CLOCK_SETTIME,
		"clock_adjtime": unix.SYS_CLOCK_ADJTIME, "adjtimex": unix.SYS_ADJTIMEX,
		"sethostname": unix.SYS_SETHOSTNAME, "setdomainname": unix.SYS_SETDOMAINNAME,
		"acct": unix.SYS_ACCT, "quotactl": unix.SYS_QUOTACTL, "syslog": unix.SYS_SYSLOG,
		"vhangup": unix.SYS_VHANGUP, "iopl": unix.SYS_IOPL, "ioperm": unix.SYS_IOPERM,
		"modify_ldt": unix.SYS_MODIFY_LDT, "uselib": unix.SYS_USELIB, "ustat": unix.SYS_USTAT,
		"sysfs": unix.SYS_SYSFS, "_sysctl": unix.SYS__SYSCTL, "lookup_dcookie": unix.SYS_LOOKUP_DCOOKIE,
		"nfsservctl": unix.SYS_NFSSERVCTL,
		// Other processes' memory and files: the daemon's and other tenants' secrets.
		"ptrace": unix.SYS_PTRACE, "process_vm_readv": unix.SYS_PROCESS_VM_READV,
		"process_vm_writev": unix.SYS_PROCESS_VM_WRITEV, "kcmp": unix.SYS_KCMP,
		"pidfd_getfd": unix.SYS_PIDFD_GETFD, "process_madvise": unix.SYS_PROCESS_MADVISE,
		// Large kernel attack surfaces a control plane does not use.
		"bpf": unix.SYS_BPF, "perf_event_open": unix.SYS_PERF_EVENT_OPEN,
		"userfaultfd": unix.SYS_USERFAULTFD, "io_uring_setup": unix.SYS_IO_URING_SETUP,
		"io_uring_enter": unix.SYS_IO_URING_ENTER, "io_uring_register": unix.SYS_IO_URING_REGISTER,
		"add_key": unix.SYS_ADD_KEY, "request_key": unix.SYS_REQUEST_KEY, "keyctl": unix.SYS_KEYCTL,
	}
}

// auditArchX86_64 is AUDIT_ARCH_X86_64: the only architecture this filter allows.
const auditArchX86_64 = 0xc000003e

// x32Bit marks a system call of the x32 ABI, which shares x86_64's audit arch.
const x32Bit = 0x40000000

// offsets in struct seccomp_data.
const (
	offNr   = 0
	offArch = 4
)

// Program is the filter: a foreign architecture or the x32 ABI gets EPERM or ENOSYS,
// each Denied call EPERM, anything else runs.
func Program() ([]bpf.RawInstruction, error) {
	deny := unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	var nrs []uint32
	for _, nr := range Denied() {
		nrs = append(nrs, uint32(nr))
	}
	slices.Sort(nrs) // the same program every time
	n := len(nrs)
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: auditArchX86_64, SkipTrue: 1},
		bpf.RetConstant{Val: deny},
		bpf.LoadAbsolute{Off: offNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpLessThan, Val: x32Bit, SkipTrue: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
	}
	// Each denied number jumps to the EPERM return after the last comparison and the
	// allow: from the i-th comparison that is n-1-i comparisons and 1 return away.
	if n > 250 {
		return nil, fmt.Errorf("%d denied calls: more than one BPF jump can skip", n)
	}
	for i, nr := range nrs {
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipTrue: uint8(n - i)})
	}
	prog = append(prog, bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW}, bpf.RetConstant{Val: deny})
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, fmt.Errorf("assembling the seccomp filter: %w", err)
	}
	return raw, nil
}

// Load sets no_new_privs and installs Program on every thread of this process
// (SECCOMP_FILTER_FLAG_TSYNC: the Go runtime already runs several; the kernel sets
// no_new_privs on each thread it syncs). Threads made later inherit both, and so does
// any process this one starts.
func Load() error {
	raw, err := Program()
	if err != nil {
		return err
	}
	// One thread for both calls: TSYNC passes no_new_privs on from the caller's thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no_new_privs: %w", err)
	}
	filters := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filters[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(filters)), Filter: &filters[0]}
	ret, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	switch {
	case errno != 0:
		return fmt.Errorf("installing the seccomp filter: %w", errno)
	case ret != 0:
		// TSYNC returns the id of a thread that could not take the filter.
		return fmt.Errorf("installing the seccomp filter: thread %d refused it", ret)
	}
	return nil
}
