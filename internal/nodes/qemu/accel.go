package qemu

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/socialweb-computer/socialweb/internal/atomicfile"
	"github.com/socialweb-computer/socialweb/internal/nodeimage"
)

// Why a probe and not a look at /dev/kvm: on our nested-PVM machines /dev/kvm opens and
// creates VMs, yet no stock kernel boots under it (it stops after the real-mode stub).
// Only a guest of the image's own kernel reaching user space proves KVM works.

// DefaultProbeTimeout bounds the probe's boot. A guest under working KVM reaches the
// probe's init in about a second; one that has not within this is taken as not booting.
const DefaultProbeTimeout = 15 * time.Second

// ParseAccel reads an --accel value: auto, kvm or tcg.
func ParseAccel(s string) (Accel, error) {
	switch s {
	case "auto", "":
		return AccelAuto, nil
	case "kvm":
		return AccelKVM, nil
	case "tcg":
		return AccelTCG, nil
	}
	return "", fmt.Errorf("accelerator %q: want auto (KVM if a guest of the node image boots under it, else TCG), kvm or tcg", s)
}

// ProbeResult is what trying KVM on this host showed.
type ProbeResult struct {
	// DeviceErr says why /dev/kvm cannot be opened read-write; empty if it can. Nothing is
	// booted without a device.
	DeviceErr string `json:"deviceErr,omitempty"`
	// Booted: a guest of the image's kernel printed nodeimage.ProbeMarker under KVM.
	Booted bool `json:"booted"`
	// TimedOut: the guest printed no marker within the probe's deadline.
	TimedOut bool `json:"timedOut,omitempty"`
	// Exit is qemu's exit when it ended before the marker (and what it printed).
	Exit string `json:"exit,omitempty"`
	// Took is how long the boot (or the wait for it) took.
	Took time.Duration `json:"took,omitempty"`
	// Console is the guest console's last lines.
	Console string `json:"console,omitempty"`
	// Kernel is what was booted: the kernel's banner if it printed one, else its path.
	Kernel string `json:"kernel,omitempty"`
	// Qemu is qemu's version line.
	Qemu string `json:"qemu,omitempty"`
	// Note is set when the daemon overrode a probe that booted (see Provider.noteStall).
	Note string `json:"note,omitempty"`
	// At is when the probe ran.
	At time.Time `json:"at"`
	// Cached: read from the verdict cache, not run now.
	Cached bool `json:"-"`
}

// Evidence is the probe in one line, for logs and messages.
func (r ProbeResult) Evidence() string {
	if r.DeviceErr != "" {
		return "/dev/kvm is not usable: " + r.DeviceErr
	}
	var b strings.Builder
	switch {
	case r.Booted:
		fmt.Fprintf(&b, "a guest of %s booted to user space under KVM in %s", r.Kernel, r.Took.Round(time.Millisecond))
	case r.TimedOut:
		fmt.Fprintf(&b, "/dev/kvm opens, but a guest of %s did not reach user space under KVM within %s", r.Kernel, r.Took.Round(time.Second))
	default:
		fmt.Fprintf(&b, "/dev/kvm opens, but qemu -accel kvm ended after %s without booting a guest of %s: %s", r.Took.Round(time.Millisecond), r.Kernel, r.Exit)
	}
	if !r.Booted {
		if c := strings.TrimSpace(r.Console); c != "" {
			fmt.Fprintf(&b, "; its console said: %q", lastLines(c, 3))
		} else {
			b.WriteString("; its console stayed empty")
		}
	}
	if r.Note != "" {
		b.WriteString("; " + r.Note)
	}
	if r.Cached {
		fmt.Fprintf(&b, " (verdict cached for this host boot, from %s)", r.At.UTC().Format(time.RFC3339))
	}
	return b.String()
}

// Verdict is the accelerator nodes run with, and why.
type Verdict struct {
	Accel  Accel
	Reason string
	// Probe is what the probe saw; nil when none ran (--accel tcg).
	Probe *ProbeResult
}

// ChooseAccel turns what the operator asked for and what the probe saw into the
// accelerator nodes use. It is pure. probe may be nil only for mode tcg. Asking for kvm
// where KVM does not boot a guest is an error that says what the probe saw.
func ChooseAccel(mode Accel, probe *ProbeResult) (Verdict, error) {
	switch mode {
	case AccelTCG:
		return Verdict{Accel: AccelTCG, Reason: "TCG, as configured (--accel tcg)"}, nil
	case AccelAuto, AccelKVM:
	default:
		return Verdict{}, fmt.Errorf("accelerator %q: want auto, kvm or tcg", string(mode))
	}
	if probe == nil {
		return Verdict{}, errors.New("choosing an accelerator: no probe result (run ProbeKVM first)")
	}
	if probe.Booted {
		return Verdict{Accel: AccelKVM, Reason: "KVM: " + probe.Evidence(), Probe: probe}, nil
	}
	if mode == AccelKVM {
		return Verdict{}, fmt.Errorf("--accel kvm: KVM cannot run this node image here: %s. Use --accel tcg, or --accel auto to fall back to TCG", probe.Evidence())
	}
	return Verdict{Accel: AccelTCG, Reason: "TCG, because " + probe.Evidence(), Probe: probe}, nil
}

// ProbeConfig says how to probe KVM.
type ProbeConfig struct {
	// Qemu is the qemu binary ("" looks up qemu-system-x86_64).
	Qemu string
	// ImageDir is the node image whose kernel (and initramfs busybox) is booted.
	ImageDir string
	// CacheDir keeps verdicts, keyed by host boot, kernel, initramfs and qemu version;
	// "" caches nothing.
	CacheDir string
	// Timeout bounds the boot (DefaultProbeTimeout if 0).
	Timeout time.Duration
	// Device is the KVM device (default /dev/kvm).
	Device string
	// BootID identifies this host boot (default /proc/sys/kernel/random/boot_id).
	BootID string
	Log    *slog.Logger
}

// SelectAccel resolves mode on this host: tcg as asked; auto and kvm by ProbeKVM (its
// cached verdict when there is one). Its error for kvm names what the probe saw.
func SelectAccel(ctx context.Context, mode Accel, pc ProbeConfig) (Verdict, error) {
	if mode == AccelTCG {
		return ChooseAccel(mode, nil)
	}
	if _, err := ParseAccel(string(mode)); err != nil {
		return Verdict{}, err
	}
	r, err := ProbeKVM(ctx, pc)
	if err != nil {
		return Verdict{}, err
	}
	return ChooseAccel(mode, &r)
}

// ProbeKVM boots the image's kernel under KVM with an initramfs whose init prints
// nodeimage.ProbeMarker, and reports whether the marker came within the deadline. It
// returns an error only when it cannot try (no qemu, no image): a guest that does not
// boot is a result, not an error.
func ProbeKVM(ctx context.Context, pc ProbeConfig) (ProbeResult, error) {
	if pc.Device == "" {
		pc.Device = "/dev/kvm"
	}
	if pc.BootID == "" {
		pc.BootID = "/proc/sys/kernel/random/boot_id"
	}
	if pc.Timeout <= 0 {
		pc.Timeout = DefaultProbeTimeout
	}
	if pc.Log == nil {
		pc.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	now := time.Now()
	if f, err := os.OpenFile(pc.Device, os.O_RDWR, 0); err != nil {
		return ProbeResult{DeviceErr: err.Error(), At: now}, nil
	} else {
		f.Close()
	}
	qemu, err := findQemu(pc.Qemu)
	if err != nil {
		return ProbeResult{}, err
	}
	if _, _, err := checkImage(pc.ImageDir); err != nil {
		return ProbeResult{}, err
	}
	version := qemuVersion(ctx, qemu)
	key, err := probeKey(pc, version)
	if err != nil {
		return ProbeResult{}, err
	}
	cacheFile := ""
	if pc.CacheDir != "" {
		cacheFile = filepath.Join(pc.CacheDir, "accel-"+key+".json")
		if r, ok := readProbeCache(cacheFile); ok {
			r.Cached = true
			if !strings.HasPrefix(r.Kernel, "Linux version") {
				// The same kernel may have been probed from another image's dir.
				r.Kernel = filepath.Join(pc.ImageDir, nodeimage.FileKernel)
			}
			return r, nil
		}
	}
	pc.Log.Info("probing KVM: booting the node image's kernel under it", "kernel", filepath.Join(pc.ImageDir, nodeimage.FileKernel), "deadline", pc.Timeout)
	r, err := runProbe(ctx, qemu, pc)
	if err != nil {
		return ProbeResult{}, err
	}
	r.Qemu = version
	if cacheFile != "" && ctx.Err() == nil {
		if err := writeProbeCache(cacheFile, r); err != nil {
			pc.Log.Warn("could not cache the KVM probe's verdict; the next start probes again", "file", cacheFile, "err", err)
		}
	}
	return r, nil
}

// probeArgs is the probe guest's qemu command line: the same machine and CPU as a node
// under KVM, one vCPU, no disks, the console on stdout.
func probeArgs(kernel, initrd string) []string {
	return []string{
		"-M", "microvm", "-accel", "kvm", "-cpu", "host",
		"-smp", "1", "-m", "256",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-serial", "stdio",
		"-kernel", kernel, "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 rdinit=" + nodeimage.ProbeInit,
	}
}

func runProbe(ctx context.Context, qemu string, pc ProbeConfig) (ProbeResult, error) {
	tmp, err := os.MkdirTemp("", "socialweb-accel-probe-")
	if err != nil {
		return ProbeResult{}, err
	}
	defer os.RemoveAll(tmp)
	initrd := filepath.Join(tmp, "initramfs")
	f, err := os.Create(initrd)
	if err != nil {
		return ProbeResult{}, err
	}
	err = nodeimage.WriteProbeInitramfs(f, pc.ImageDir)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return ProbeResult{}, err
	}
	kernel := filepath.Join(pc.ImageDir, nodeimage.FileKernel)
	cmd := exec.Command(qemu, probeArgs(kernel, initrd)...)
	cmd.Dir = tmp
	out, err := cmd.StdoutPipe()
	if err != nil {
		return ProbeResult{}, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	r := ProbeResult{Kernel: kernel, At: time.Now()}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return ProbeResult{}, fmt.Errorf("starting %s for the KVM probe: %w", qemu, err)
	}
	var (
		mu     sync.Mutex
		lines  []string
		marker = make(chan struct{})
		eof    = make(chan struct{})
	)
	go func() {
		defer close(eof)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		seen := false
		for sc.Scan() {
			l := strings.TrimRight(sc.Text(), "\r")
			mu.Lock()
			if i := strings.Index(l, "Linux version "); i >= 0 && r.Kernel == kernel {
				r.Kernel = strings.Join(strings.Fields(l[i:])[:min(3, len(strings.Fields(l[i:])))], " ")
			}
			lines = append(lines, l)
			if len(lines) > 20 {
				lines = lines[1:]
			}
			mu.Unlock()
			if !seen && strings.Contains(l, nodeimage.ProbeMarker) {
				seen = true
				close(marker)
			}
		}
	}()
	timer := time.NewTimer(pc.Timeout)
	defer timer.Stop()
	select {
	case <-marker:
		r.Booted = true
	case <-eof:
		// qemu closed the console: it exited. The marker may be in the last read.
		select {
		case <-marker:
			r.Booted = true
		default:
		}
	case <-timer.C:
		r.TimedOut = true
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return ProbeResult{}, fmt.Errorf("KVM probe interrupted: %w", ctx.Err())
	}
	r.Took = time.Since(t0)
	_ = cmd.Process.Kill()
	werr := cmd.Wait()
	<-eof
	mu.Lock()
	r.Console = strings.Join(lines, "\n")
	mu.Unlock()
	if !r.Booted && !r.TimedOut {
		r.Exit = exitText(werr)
		if s := strings.TrimSpace(stderr.String()); s != "" {
			r.Exit += "; qemu said: " + lastLines(s, 3)
		}
	}
	return r, nil
}

// probeKey folds every input of a verdict: the host boot (KVM modules and their
// parameters change only across reboots), the kernel and initramfs booted, qemu's version,
// the probe's own command line and init.
func probeKey(pc ProbeConfig, qemuVersion string) (string, error) {
	h := sha256.New()
	boot, err := os.ReadFile(pc.BootID)
	if err != nil {
		return "", fmt.Errorf("reading the host boot id for the KVM probe's cache: %w", err)
	}
	fmt.Fprintf(h, "boot %s\nqemu %s\nargs %q\ninit %q\ntimeout %s\n", strings.TrimSpace(string(boot)), qemuVersion,
		probeArgs("K", "I"), nodeimage.ProbeScript, pc.Timeout)
	for _, name := range []string{nodeimage.FileKernel, nodeimage.FileInitramfs} {
		f, err := os.Open(filepath.Join(pc.ImageDir, name))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s ", name)
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:32], nil
}

func qemuVersion(ctx context.Context, qemu string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, qemu, "--version").Output()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	first, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(first)
}

func readProbeCache(path string) (ProbeResult, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return ProbeResult{}, false
	}
	var r ProbeResult
	if json.Unmarshal(b, &r) != nil || r.At.IsZero() {
		return ProbeResult{}, false
	}
	return r, true
}

func writeProbeCache(path string, r ProbeResult) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(path, append(b, '\n'), 0o600)
}

// lastLines is the last n lines of s joined with " | ".
func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, " | ")
}
