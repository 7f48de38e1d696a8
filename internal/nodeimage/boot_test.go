package nodeimage

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const bootMarker = "SOCIALWEB-BOOT-OK"

// testInit is the rootfs init of the smoke test: print the marker and the kernel release
// to the console, then reboot at once (qemu -no-reboot turns that into an exit).
const testInit = `#!/bin/sh
echo "` + bootMarker + ` $(uname -r) uptime=$(cut -d' ' -f1 /proc/uptime)"
echo b > /proc/sysrq-trigger
sleep 10
`

// TestNodeImageBootsUnderQemu builds a node image (debootstrap on a cold layer cache takes
// a minute or two), checks Ensure's cache states, then boots the image with qemu -M microvm
// (TCG here, KVM where /dev/kvm exists) and waits for the marker the staged init prints.
//
// Images go to a temporary cache; the debootstrap layer and .deb downloads use the shared
// layer cache (DefaultCacheDir()/layers), so later runs skip debootstrap.
// SOCIALWEB_NODEIMAGE_COLD=1 uses a temporary layer cache too.
func TestNodeImageBootsUnderQemu(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the image build and boot")
	}
	needRoot(t, "debootstrap, chroot")
	needTools(t, append(append([]string{}, BuildTools...), "qemu-system-x86_64")...)
	if _, err := os.Stat(filepath.Join(aptListsDir, aptListName(HostMirror(DefaultSuite))+"_dists_"+DefaultSuite+"_InRelease")); err != nil {
		needLive(t, "no apt lists for "+DefaultSuite+": run apt-get update")
	}

	dir := t.TempDir()
	initPath := filepath.Join(dir, "socialweb-test-init")
	if err := os.WriteFile(initPath, []byte(testInit), 0o755); err != nil {
		t.Fatal(err)
	}
	spec, err := ParseSpec([]byte(`{"memMiB":512,"headroomMiB":128,"init":"/usr/local/bin/socialweb-test-init"}`))
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{
		CacheDir:      filepath.Join(dir, "cache"),
		LayerCacheDir: filepath.Join(DefaultCacheDir(), "layers"),
		ExtraFiles:    map[string]string{"/usr/local/bin/socialweb-test-init": initPath},
		Progress: func(step, msg string) {
			if !strings.HasPrefix(msg, "I: ") || strings.Contains(msg, "Base system installed") {
				t.Logf("[%s] %s", step, msg)
			}
		},
	}
	if os.Getenv("SOCIALWEB_NODEIMAGE_COLD") == "1" {
		opts.LayerCacheDir = filepath.Join(dir, "layers")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	if _, err := Lookup(ctx, spec, opts); !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("Lookup before the build: err = %v, want ErrNotBuilt", err)
	}
	res, err := Ensure(ctx, spec, opts)
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	if res.State != StateBuilt {
		t.Fatalf("first Ensure: state %q, want %q", res.State, StateBuilt)
	}
	m := res.Manifest
	t.Logf("built %s in %s (debootstrap layer reused: %v)", res.Fingerprint[:16], res.Duration.Round(time.Millisecond), res.LayerReused)
	for _, f := range []string{FileKernel, FileInitramfs, FileRootfs} {
		t.Logf("  %-18s %s", f, diskUsage(filepath.Join(res.Dir, f)))
	}
	t.Logf("  rootfs tree %d MiB, image %d MiB via %s; kernel %s; %d packages",
		m.Rootfs.TreeBytes>>20, m.Rootfs.ImageBytes>>20, m.Rootfs.Method, m.KernelVersion, len(m.Packages))

	// the manifest describes what was built
	checks := []struct {
		what string
		ok   bool
	}{
		{"fingerprint", m.Fingerprint == res.Fingerprint && filepath.Base(res.Dir) == res.Fingerprint},
		{"sizes", m.VCPU == 1 && m.MemMiB == 512 && m.HeadroomMiB == 128 && m.DiskMiB > 128},
		{"cmdline", strings.Contains(m.Cmdline, "socialweb.init=/usr/local/bin/socialweb-test-init")},
		{"kernel version", m.KernelVersion != "" && strings.Contains(m.KernelPackage, m.KernelVersion)},
		{"packages", m.Packages["containerd"] != "" && m.Packages["runc"] != "" && m.Packages["kmod"] != ""},
		{"initramfs modules", strings.Contains(strings.Join(m.InitramfsModules, " "), "virtio_blk.ko")},
		{"extra files", len(m.ExtraFiles) == 1 && m.ExtraFiles[0].Guest == "/usr/local/bin/socialweb-test-init"},
		{"not left behind", noBuildDirs(t, opts.ImagesDir())},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("manifest: %s wrong: %+v", c.what, m)
		}
	}

	// cache states
	again, err := Ensure(ctx, spec, opts)
	if err != nil || again.State != StateReused || again.Dir != res.Dir {
		t.Fatalf("second Ensure: %+v, %v; want state reused in %s", again, err, res.Dir)
	}
	t.Logf("Ensure reuse took %s", again.Duration.Round(time.Millisecond))
	if got, err := Lookup(ctx, spec, opts); err != nil || got.State != StatePresent {
		t.Fatalf("Lookup after the build: %+v, %v", got, err)
	}

	// boot a copy, as the node provider will
	disk := filepath.Join(dir, "node-rootfs.ext4")
	if out, err := exec.Command("cp", "--sparse=always", filepath.Join(res.Dir, FileRootfs), disk).CombinedOutput(); err != nil {
		t.Fatalf("copying rootfs: %v\n%s", err, out)
	}
	line, took, exited, console := bootImage(t, res.Dir, m.Cmdline, disk, 90*time.Second)
	if line == "" {
		t.Fatalf("no %q on the console within the deadline; console:\n%s", bootMarker, console)
	}
	if !exited {
		t.Errorf("qemu did not exit after the guest rebooted (-no-reboot); console:\n%s", console)
	}
	if f := strings.Fields(line); len(f) < 2 || f[1] != m.KernelVersion {
		t.Errorf("marker %q does not name kernel %s", line, m.KernelVersion)
	}
	t.Logf("boot to marker: %s (%q)", took.Round(time.Millisecond), line)

	// an interrupted build leaves nothing that looks complete
	opts2 := opts
	opts2.ExtraFiles = map[string]string{"/usr/local/bin/socialweb-test-init": initPath, "/etc/socialweb-extra": initPath}
	opts2.Steps, _ = DefaultSteps().Replace(StepMkfs, func(context.Context, *Build) error { return errors.New("injected failure") })
	if _, err := Ensure(ctx, spec, opts2); err == nil || !strings.Contains(err.Error(), "injected failure") {
		t.Fatalf("Ensure with a failing step: %v", err)
	}
	if _, err := Lookup(ctx, spec, opts2); !errors.Is(err, ErrNotBuilt) {
		t.Errorf("after a failed build Lookup says %v, want ErrNotBuilt", err)
	}
	if !noBuildDirs(t, opts.ImagesDir()) {
		t.Errorf("a failed build left its directory behind")
	}
}

func noBuildDirs(t *testing.T, images string) bool {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(images, ".build-*"))
	if len(m) > 0 {
		t.Logf("left behind: %v", m)
	}
	return len(m) == 0
}

// tcgCmdline is appended to the kernel command line under TCG. The guest has no kvmclock,
// HPET or ACPI PM timer on microvm, so the kernel calibrates the TSC against the PIT; on a
// loaded host (a compile on both cores) that calibration fails, the delay loop is never
// calibrated and boot stalls right after "tsc: Marking TSC unstable due to could not
// calculate TSC khz" (observed here). Under TCG the guest TSC runs at the host's TSC rate,
// so telling the kernel that rate skips the fragile calibration.
func tcgCmdline(t *testing.T) string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "cpu MHz"); ok {
			var mhz float64
			if _, err := fmt.Sscanf(strings.TrimLeft(v, " \t:"), "%f", &mhz); err == nil && mhz > 0 {
				return fmt.Sprintf(" tsc_early_khz=%d", int64(mhz*1000))
			}
		}
	}
	t.Log("no cpu MHz in /proc/cpuinfo; booting without tsc_early_khz")
	return ""
}

// bootImage boots an image with qemu -M microvm and returns the marker line, the time from
// starting qemu to seeing it, whether qemu exited by itself before the deadline, and the
// console output.
func bootImage(t *testing.T, imageDir, cmdline, disk string, deadline time.Duration) (string, time.Duration, bool, string) {
	t.Helper()
	// TCG always: this test is about the image, and whether KVM can run it is the qemu
	// provider's probe's to say (a nested-PVM /dev/kvm opens and boots no stock kernel).
	accel := []string{"-accel", "tcg"}
	cmdline += tcgCmdline(t)
	args := append(append([]string{"-M", "microvm"}, accel...),
		"-m", "512", "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-serial", "stdio",
		"-kernel", filepath.Join(imageDir, FileKernel),
		"-initrd", filepath.Join(imageDir, FileInitramfs),
		"-append", cmdline,
		"-drive", "id=root,file="+disk+",format=raw,if=none",
		"-device", "virtio-blk-device,drive=root",
	)
	t.Logf("qemu-system-x86_64 %s", strings.Join(args, " "))
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	cmd.WaitDelay = 5 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		console strings.Builder
		found   string
		took    time.Duration
	)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		l := strings.TrimRight(sc.Text(), "\r")
		fmt.Fprintln(&console, l)
		if i := strings.Index(l, bootMarker); i >= 0 && found == "" {
			found, took = l[i:], time.Since(start)
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	werr := cmd.Wait()
	exited := ctx.Err() == nil
	t.Logf("qemu ended %s after start: %v (deadline hit: %v)", time.Since(start).Round(time.Millisecond), werr, !exited)
	return found, took, exited, console.String()
}
