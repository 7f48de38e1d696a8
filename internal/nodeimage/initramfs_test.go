package nodeimage

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestModuleLoadOrder(t *testing.T) {
	ix, err := loadModuleIndex("testdata/modules")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		want        []string
		order       []string
		builtin     []string
		errContains string
	}{
		{
			name: "the initramfs list",
			want: InitramfsModules,
			order: []string{
				"kernel/drivers/virtio/virtio_ring.ko",
				"kernel/drivers/virtio/virtio.ko",
				"kernel/drivers/virtio/virtio_mmio.ko",
				"kernel/drivers/block/virtio_blk.ko",
				"kernel/drivers/net/net_failover.ko",
				"kernel/drivers/net/virtio_net.ko",
				"kernel/crypto/crc32c_generic.ko", // soft pre-dependency of ext4, via alias
				"kernel/fs/jbd2/jbd2.ko.xz",
				"kernel/lib/crc16.ko",
				"kernel/fs/ext4/ext4.ko.xz",
			},
			builtin: []string{"failover"},
		},
		{
			name: "the modules the agent loads from the rootfs",
			want: RootfsModules,
			order: []string{
				"kernel/fs/overlayfs/overlay.ko",
				"kernel/net/llc/llc.ko",
				"kernel/net/802/stp.ko",
				"kernel/net/bridge/bridge.ko",
				"kernel/net/bridge/br_netfilter.ko",
				"kernel/fs/fuse/fuse.ko",
				"kernel/drivers/virtio/virtio_ring.ko",
				"kernel/drivers/virtio/virtio.ko",
				"kernel/fs/fuse/virtiofs.ko",
			},
		},
		{
			name:    "dependencies first, dash and underscore alike",
			want:    []string{"virtio-net"},
			order:   []string{"kernel/drivers/net/net_failover.ko", "kernel/drivers/virtio/virtio_ring.ko", "kernel/drivers/virtio/virtio.ko", "kernel/drivers/net/virtio_net.ko"},
			builtin: []string{"failover"},
		},
		{name: "built in only", want: []string{"mbcache"}, builtin: []string{"mbcache"}},
		{name: "missing module", want: []string{"virtio_blk", "no_such_driver"}, errContains: "kernel module no_such_driver: not in"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			order, builtin, err := ix.loadOrder(tc.want)
			if tc.errContains != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errContains) {
					t.Fatalf("err = %v, want one containing %q", err, tc.errContains)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(order, tc.order) {
				t.Errorf("order\n got %v\nwant %v", order, tc.order)
			}
			if !reflect.DeepEqual(builtin, tc.builtin) {
				t.Errorf("builtin = %v, want %v", builtin, tc.builtin)
			}
		})
	}
}

// The archive must be readable by a real cpio (the kernel's unpacker reads the same newc
// format), with names, types, modes, link targets and contents intact.
func TestWriteCpioReadableByCpio(t *testing.T) {
	needTools(t, "cpio")
	if os.Geteuid() != 0 {
		// extracting a device node needs root; list instead of extract
		t.Log("not root: checking the listing only")
	}
	entries := []cpioEntry{
		{Name: "init", Mode: cpioFile | 0o755, Data: []byte(initScript)},
		{Name: "bin", Mode: cpioDir | 0o755},
		{Name: "bin/sh", Mode: cpioSymlink | 0o777, Data: []byte("busybox")},
		{Name: "bin/busybox", Mode: cpioFile | 0o755, Data: bytes.Repeat([]byte{1, 2, 3}, 1001)},
		{Name: "dev", Mode: cpioDir | 0o755},
		{Name: "dev/console", Mode: cpioChar | 0o600, Major: 5, Minor: 1},
		{Name: "etc/odd", Mode: cpioFile | 0o644, Data: []byte("x")}, // parent not listed
	}
	var buf bytes.Buffer
	if err := writeCpio(&buf, entries); err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	if err := writeCpio(&again, entries); err != nil || !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Fatalf("writeCpio is not deterministic (err %v)", err)
	}
	list := exec.Command("cpio", "-itv", "--quiet")
	list.Stdin = bytes.NewReader(buf.Bytes())
	out, err := list.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio -t: %v\n%s", err, out)
	}
	for _, want := range []string{"-rwxr-xr-x", " init", "lrwxrwxrwx", "bin/sh -> busybox", "crw-------", "5,", "dev/console", "drwxr-xr-x", "etc/odd"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("cpio listing lacks %q:\n%s", want, out)
		}
	}

	dir := t.TempDir()
	ex := exec.Command("cpio", "-id", "--quiet", "--no-absolute-filenames", "--nonmatching", "dev/console")
	ex.Dir = dir
	ex.Stdin = bytes.NewReader(buf.Bytes())
	if out, err := ex.CombinedOutput(); err != nil {
		t.Fatalf("cpio -i: %v\n%s", err, out)
	}
	got, err := os.ReadFile(filepath.Join(dir, "bin/busybox"))
	if err != nil || !bytes.Equal(got, entries[3].Data) {
		t.Errorf("bin/busybox content differs after extraction (err %v)", err)
	}
	if target, err := os.Readlink(filepath.Join(dir, "bin/sh")); err != nil || target != "busybox" {
		t.Errorf("bin/sh -> %q, %v; want busybox", target, err)
	}
	if err := writeCpio(&buf, []cpioEntry{{Name: "/abs", Mode: cpioFile}}); err == nil {
		t.Errorf("an absolute member name was accepted")
	}
}

// The init script is POSIX sh that busybox runs; at least make sure it parses.
func TestInitScriptParses(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	f := filepath.Join(t.TempDir(), "init")
	if err := os.WriteFile(f, []byte(initScript), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(context.Background(), sh, "-n", f).CombinedOutput(); err != nil {
		t.Fatalf("sh -n init: %v\n%s", err, out)
	}
	for _, m := range []string{"socialweb.init=", "switch_root", "/etc/socialweb/modules", "root=/dev/vda"} {
		if !strings.Contains(initScript, m) {
			t.Errorf("init script lacks %q", m)
		}
	}
}

func TestStepsEditing(t *testing.T) {
	s := DefaultSteps()
	noop := func(context.Context, *Build) error { return nil }
	s2, err := s.InsertAfter(StepRootfs, Step{"agent-config", noop})
	if err != nil {
		t.Fatal(err)
	}
	s2, err = s2.InsertBefore(StepKernel, Step{"check", noop})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s2.names(), "check, kernel, rootfs, agent-config, initramfs, mkfs, manifest"; got != want {
		t.Errorf("steps = %s, want %s", got, want)
	}
	if got := s.names(); got != "kernel, rootfs, initramfs, mkfs, manifest" {
		t.Errorf("editing changed the original chain: %s", got)
	}
	if _, err := s.InsertAfter("nope", Step{"x", noop}); err == nil {
		t.Errorf("inserting after a missing step succeeded")
	}
	if err := s.Remove(StepManifest).validate(); err == nil {
		t.Errorf("a chain without the manifest step validated")
	}
	dup := append(DefaultSteps()[:1:1], DefaultSteps()...)
	if err := dup.validate(); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate step names: err = %v", err)
	}
	var ran []string
	rec := func(name string) func(context.Context, *Build) error {
		return func(context.Context, *Build) error { ran = append(ran, name); return nil }
	}
	chain := Steps{{"a", rec("a")}, {"b", func(context.Context, *Build) error { return os.ErrInvalid }}, {StepManifest, rec("m")}}
	var progress []string
	err = chain.Run(context.Background(), &Build{Options: Options{Progress: func(step, msg string) {
		progress = append(progress, step+":"+msg)
	}}})
	if err == nil || !strings.Contains(err.Error(), "step b") {
		t.Errorf("err = %v, want one naming step b", err)
	}
	if !reflect.DeepEqual(ran, []string{"a"}) {
		t.Errorf("ran %v; want only a (the chain stops at the first error)", ran)
	}
	if len(progress) < 3 || progress[0] != "a:start" {
		t.Errorf("progress = %v", progress)
	}
}

func TestCheckTools(t *testing.T) {
	err := CheckTools(map[string]string{}, "sh", "socialweb-no-such-tool", "debootstrap")
	if err == nil {
		t.Fatal("missing tool not reported")
	}
	if !strings.Contains(err.Error(), "socialweb-no-such-tool (package ?)") {
		t.Errorf("error %q lacks the missing tool", err)
	}
	if err := CheckTools(map[string]string{"debootstrap": "/bin/sh"}, "debootstrap"); err != nil {
		t.Errorf("override not honoured: %v", err)
	}
	err = CheckTools(nil, "socialweb-no-such-tool", "debootstrap")
	if mt, ok := err.(*MissingToolsError); !ok {
		t.Errorf("error type %T", err)
	} else if len(mt.Tools) != 1 || mt.Tools[0] != "socialweb-no-such-tool" {
		t.Errorf("tools = %v", mt.Tools)
	}
	// every build tool names its package
	for _, tool := range append(BuildTools, "qemu-system-x86_64", "mount", "umount") {
		if ToolPackages[tool] == "" {
			t.Errorf("no package known for %s", tool)
		}
	}
	if p := ToolPackages["qemu-system-x86_64"]; p != "qemu-system-x86" {
		t.Errorf("qemu package = %s", p)
	}
}
