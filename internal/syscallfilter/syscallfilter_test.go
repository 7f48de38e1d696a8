package syscallfilter

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// run runs Program in x/net/bpf's VM over a seccomp_data of nr and arch. The VM loads
// big-endian, so the fields are written so; the kernel reads them native, which is the
// same value.
func run(t *testing.T, nr, arch uint32) uint32 {
	t.Helper()
	raw, err := Program()
	if err != nil {
		t.Fatal(err)
	}
	insns := make([]bpf.Instruction, len(raw))
	for i, r := range raw {
		insns[i] = r.Disassemble()
	}
	vm, err := bpf.NewVM(insns)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 64) // struct seccomp_data: nr, arch, ip, args[6]
	binary.BigEndian.PutUint32(data[offNr:], nr)
	binary.BigEndian.PutUint32(data[offArch:], arch)
	out, err := vm.Run(data)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(out)
}

func TestProgram(t *testing.T) {
	eperm := unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	tests := []struct {
		name     string
		nr, arch uint32
		want     uint32
	}{
		{"read runs", unix.SYS_READ, auditArchX86_64, unix.SECCOMP_RET_ALLOW},
		{"clone runs (goroutines' threads, exec)", unix.SYS_CLONE, auditArchX86_64, unix.SECCOMP_RET_ALLOW},
		{"clone3 runs", unix.SYS_CLONE3, auditArchX86_64, unix.SECCOMP_RET_ALLOW},
		{"the highest call runs", unix.SYS_FCHMODAT2, auditArchX86_64, unix.SECCOMP_RET_ALLOW},
		{"mount is refused", unix.SYS_MOUNT, auditArchX86_64, eperm},
		{"unshare is refused", unix.SYS_UNSHARE, auditArchX86_64, eperm},
		{"ptrace is refused", unix.SYS_PTRACE, auditArchX86_64, eperm},
		{"iopl is refused", unix.SYS_IOPL, auditArchX86_64, eperm},
		{"keyctl is refused", unix.SYS_KEYCTL, auditArchX86_64, eperm},
		{"x32's read is refused", x32Bit | unix.SYS_READ, auditArchX86_64, unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{"i386 (int 0x80) is refused, even read", 3, 0x40000003, eperm},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := run(t, tt.nr, tt.arch); got != tt.want {
				t.Errorf("filter(%d, %#x) = %#x, want %#x", tt.nr, tt.arch, got, tt.want)
			}
		})
	}
	for name, nr := range Denied() {
		if got := run(t, uint32(nr), auditArchX86_64); got != eperm {
			t.Errorf("%s (%d) = %#x, want EPERM", name, nr, got)
		}
	}
}

// TestLoadInAProcess loads the filter in a child process (it cannot be taken off) and
// checks there: a denied call fails with EPERM, ordinary work (files, threads, a
// listener, starting a program) goes on, and /proc says Seccomp 2 and NoNewPrivs 1.
func TestLoadInAProcess(t *testing.T) {
	if os.Getenv("SYSCALLFILTER_CHILD") == "1" {
		child()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLoadInAProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "SYSCALLFILTER_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "child: ok") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func child() {
	fail := func(f string, a ...any) {
		fmt.Fprintf(os.Stderr, "child: "+f+"\n", a...)
		os.Exit(1)
	}
	if err := Load(); err != nil {
		fail("Load: %v", err)
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != unix.EPERM {
		fail("unshare: %v, want EPERM", err)
	}
	if err := unix.Mount("none", "/nonexistent", "tmpfs", 0, ""); err != unix.EPERM {
		fail("mount: %v, want EPERM", err)
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		fail("reading status: %v", err)
	}
	for _, want := range []string{"Seccomp:\t2", "NoNewPrivs:\t1"} {
		if !strings.Contains(string(status), want) {
			fail("/proc/self/status lacks %q", want)
		}
	}
	// Every thread has it (TSYNC): a new OS thread too.
	done := make(chan error)
	go func() {
		runtime.LockOSThread()
		done <- unix.Unshare(unix.CLONE_NEWUTS)
	}()
	if err := <-done; err != unix.EPERM {
		fail("unshare on another thread: %v, want EPERM", err)
	}
	if out, err := exec.Command("true").CombinedOutput(); err != nil {
		fail("running true: %v %s", err, out)
	}
	fmt.Println("child: ok")
	os.Exit(0)
}
