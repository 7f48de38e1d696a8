package integration

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/nodeimage"
	"github.com/socialweb-computer/socialweb/internal/nodes/qemu"
)

// TestAcceleratorProbeMatchesANodeBoot: the KVM probe's verdict agrees with what booting
// the node image as a node does. Where /dev/kvm opens, the image's kernel is booted with
// the node's own command line and memory under KVM: its kernel shows progress exactly when
// the probe said KVM works (under nested PVM it does not, and TCG is chosen). Where KVM
// does not work, `serve --accel kvm` is refused with what the probe saw and creates
// nothing. (That a node joins under the chosen accelerator is TestFourStepProof's.)
func TestAcceleratorProbeMatchesANodeBoot(t *testing.T) {
	img := nodeImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, err := qemu.ProbeKVM(ctx, qemu.ProbeConfig{ImageDir: img}) // no cache: a fresh boot
	if err != nil {
		t.Fatal(err)
	}
	v, err := qemu.ChooseAccel(qemu.AccelAuto, &r)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("probe: %s; verdict %s", r.Evidence(), v.Accel)

	if r.DeviceErr == "" {
		progressed, console := bootShowsKernel(t, img, 30*time.Second)
		t.Logf("a node-like boot under KVM: kernel progress %v; console: %q", progressed, console)
		if progressed != r.Booted {
			t.Errorf("the probe said booted=%v, but a node-like boot of the same kernel under KVM showed progress=%v", r.Booted, progressed)
		}
	} else if v.Accel != qemu.AccelTCG || !strings.Contains(v.Reason, "/dev/kvm") {
		t.Errorf("no usable /dev/kvm (%s), yet the verdict is %s (%q)", r.DeviceErr, v.Accel, v.Reason)
	}

	if v.Accel == qemu.AccelKVM {
		return // --accel kvm is accepted here; TestFourStepProof runs nodes under it
	}
	state := filepath.Join(stateTempDir(t), "state")
	_, errOut, code := run("serve", "--state-dir", state, "--metrics-address", "", "--node-image", img, "--accel", "kvm")
	if code == 0 || !strings.Contains(errOut, "--accel kvm") || !strings.Contains(errOut, "--accel tcg") {
		t.Errorf("serve --accel kvm where KVM does not boot the image: exit %d, %q; want a refusal naming the way out", code, errOut)
	}
	if r.DeviceErr == "" && !strings.Contains(errOut, "did not reach user space") && !strings.Contains(errOut, "ended after") {
		t.Errorf("the refusal does not say what the probe saw: %q", errOut)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("a refused serve created %s", state)
	}
}

// bootShowsKernel boots the image's kernel and initramfs under KVM the way a node is
// booted (its command line, 512 MiB, microvm; no disks, so the initramfs gives up after
// its banner) and reports whether the console showed the kernel's banner in time.
func bootShowsKernel(t *testing.T, img string, within time.Duration) (bool, string) {
	t.Helper()
	m, err := nodeimage.ReadManifest(img)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("qemu-system-x86_64", "-M", "microvm", "-accel", "kvm", "-cpu", "host", "-smp", "1", "-m", "512",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-serial", "stdio",
		"-kernel", filepath.Join(img, nodeimage.FileKernel), "-initrd", filepath.Join(img, nodeimage.FileInitramfs),
		"-append", m.Cmdline)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	found := make(chan string, 1)
	var (
		mu    sync.Mutex
		lines []string
	)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			l := sc.Text()
			mu.Lock()
			if len(lines) < 5 {
				lines = append(lines, l)
			}
			mu.Unlock()
			if strings.Contains(l, "Linux version ") {
				found <- l
				return
			}
		}
	}()
	select {
	case l := <-found:
		return true, l
	case <-time.After(within):
		mu.Lock()
		defer mu.Unlock()
		return false, strings.Join(lines, " | ")
	}
}
