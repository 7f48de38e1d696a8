package qemu

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/nodes"
)

func TestChooseAccel(t *testing.T) {
	noDevice := &ProbeResult{DeviceErr: "open /dev/kvm: no such file or directory"}
	works := &ProbeResult{Booted: true, Kernel: "Linux version 6.1.0-28-cloud-amd64", Took: 900 * time.Millisecond}
	stuck := &ProbeResult{TimedOut: true, Kernel: "vmlinuz", Took: 15 * time.Second,
		Console: "Probing EDD (edd=off to disable)... ok"}
	exited := &ProbeResult{Kernel: "vmlinuz", Took: 40 * time.Millisecond,
		Exit: "exit status 1; qemu said: Could not access KVM kernel module: Permission denied"}
	for _, tc := range []struct {
		name    string
		mode    Accel
		probe   *ProbeResult
		want    Accel
		errHas  []string // non-empty: an error mentioning these
		reasons []string // the reason mentions these
	}{
		{"auto, kvm works", AccelAuto, works, AccelKVM, nil, []string{"KVM", "booted to user space", "900ms"}},
		{"auto, kvm opens but no guest boots", AccelAuto, stuck, AccelTCG, nil, []string{"TCG, because", "did not reach user space", "Probing EDD"}},
		{"auto, no device", AccelAuto, noDevice, AccelTCG, nil, []string{"TCG, because", "/dev/kvm is not usable", "no such file"}},
		{"auto, qemu refuses kvm", AccelAuto, exited, AccelTCG, nil, []string{"TCG, because", "Permission denied"}},
		{"kvm, kvm works", AccelKVM, works, AccelKVM, nil, []string{"KVM"}},
		{"kvm, probe times out", AccelKVM, stuck, "", []string{"--accel kvm", "did not reach user space", "Probing EDD", "--accel tcg", "--accel auto"}, nil},
		{"kvm, no device", AccelKVM, noDevice, "", []string{"/dev/kvm is not usable", "--accel tcg"}, nil},
		{"tcg needs no probe", AccelTCG, nil, AccelTCG, nil, []string{"--accel tcg"}},
		{"tcg even where kvm works", AccelTCG, works, AccelTCG, nil, []string{"as configured"}},
		{"unknown mode", "hvf", works, "", []string{`"hvf"`, "auto, kvm or tcg"}, nil},
		{"auto without a probe", AccelAuto, nil, "", []string{"no probe result"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := ChooseAccel(tc.mode, tc.probe)
			if len(tc.errHas) > 0 {
				if err == nil {
					t.Fatalf("verdict %+v; want an error", v)
				}
				for _, w := range tc.errHas {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not mention %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if v.Accel != tc.want {
				t.Errorf("accel %s, want %s (reason %q)", v.Accel, tc.want, v.Reason)
			}
			for _, w := range tc.reasons {
				if !strings.Contains(v.Reason, w) {
					t.Errorf("reason %q does not mention %q", v.Reason, w)
				}
			}
		})
	}
}

func TestParseAccel(t *testing.T) {
	for in, want := range map[string]Accel{"auto": AccelAuto, "": AccelAuto, "kvm": AccelKVM, "tcg": AccelTCG} {
		if got, err := ParseAccel(in); err != nil || got != want {
			t.Errorf("ParseAccel(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseAccel("KVM"); err == nil || !strings.Contains(err.Error(), "want auto") {
		t.Errorf("ParseAccel(KVM): %v; want an error listing the choices", err)
	}
}

// fakeProbeQemu writes a qemu stand-in for the probe: it answers --version, records each
// boot in calls, and boots the way behaviour says.
func fakeProbeQemu(t *testing.T, behaviour string) (qemu, calls string) {
	t.Helper()
	dir := t.TempDir()
	calls = filepath.Join(dir, "calls")
	var boot string
	switch behaviour {
	case "boots":
		boot = `echo "[    0.000000] Linux version 6.1.0-fake (probe test)"; echo "SOCIALWEB-ACCEL-PROBE-OK"; sleep 30`
	case "stuck":
		boot = `echo "Probing EDD (edd=off to disable)... ok"; sleep 30`
	case "fails":
		boot = `echo "qemu-system-x86_64: Could not access KVM kernel module: Permission denied" >&2; exit 1`
	}
	script := "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'QEMU emulator version 7.2.0 (fake)'; exit 0; fi\n" +
		"echo \"$*\" >>" + calls + "\n" + boot + "\n"
	qemu = filepath.Join(dir, "qemu")
	if err := os.WriteFile(qemu, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return qemu, calls
}

func countLines(t *testing.T, path string) int {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

func TestProbeKVM(t *testing.T) {
	image := fakeImage(t)
	dir := t.TempDir()
	device := filepath.Join(dir, "kvm") // a file stands in for a device that opens
	bootID := filepath.Join(dir, "boot_id")
	for _, f := range []string{device, bootID} {
		if err := os.WriteFile(f, []byte("0b3f-boot-1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name      string
		behaviour string
		device    string
		check     func(t *testing.T, r ProbeResult)
		boots     int // qemu boots expected
	}{
		{"kvm works", "boots", device, func(t *testing.T, r ProbeResult) {
			if !r.Booted || r.Kernel != "Linux version 6.1.0-fake" || !strings.Contains(r.Qemu, "7.2.0") {
				t.Errorf("result %+v; want booted, the banner as the kernel, qemu's version", r)
			}
		}, 1},
		{"kvm opens but no guest boots", "stuck", device, func(t *testing.T, r ProbeResult) {
			if r.Booted || !r.TimedOut || !strings.Contains(r.Console, "Probing EDD") || r.Took < time.Second {
				t.Errorf("result %+v; want a timeout after the 1s deadline with the console's line", r)
			}
		}, 1},
		{"qemu refuses", "fails", device, func(t *testing.T, r ProbeResult) {
			if r.Booted || r.TimedOut || !strings.Contains(r.Exit, "Permission denied") {
				t.Errorf("result %+v; want qemu's exit and what it said", r)
			}
		}, 1},
		{"no device", "boots", filepath.Join(dir, "missing"), func(t *testing.T, r ProbeResult) {
			if r.DeviceErr == "" || r.Booted {
				t.Errorf("result %+v; want the device's error and nothing booted", r)
			}
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			qemu, calls := fakeProbeQemu(t, tc.behaviour)
			pc := ProbeConfig{Qemu: qemu, ImageDir: image, CacheDir: t.TempDir(), Timeout: time.Second, Device: tc.device, BootID: bootID}
			r, err := ProbeKVM(context.Background(), pc)
			if err != nil {
				t.Fatal(err)
			}
			if r.Cached {
				t.Error("first probe reported as cached")
			}
			tc.check(t, r)
			if n := countLines(t, calls); n != tc.boots {
				t.Errorf("%d boots, want %d", n, tc.boots)
			}
			// Same host boot, kernel and qemu: the verdict comes from the cache.
			again, err := ProbeKVM(context.Background(), pc)
			if err != nil {
				t.Fatal(err)
			}
			if tc.boots > 0 {
				if !again.Cached || again.Booted != r.Booted || countLines(t, calls) != tc.boots {
					t.Errorf("second probe %+v, %d boots; want the cached verdict and no boot", again, countLines(t, calls))
				}
				if !strings.Contains(again.Evidence(), "cached") {
					t.Errorf("evidence %q does not say it is cached", again.Evidence())
				}
			}
		})
	}

	t.Run("a new host boot probes again", func(t *testing.T) {
		qemu, calls := fakeProbeQemu(t, "boots")
		pc := ProbeConfig{Qemu: qemu, ImageDir: image, CacheDir: t.TempDir(), Timeout: time.Second, Device: device, BootID: bootID}
		if _, err := ProbeKVM(context.Background(), pc); err != nil {
			t.Fatal(err)
		}
		other := filepath.Join(t.TempDir(), "boot_id")
		os.WriteFile(other, []byte("0b3f-boot-2\n"), 0o600)
		pc.BootID = other
		r, err := ProbeKVM(context.Background(), pc)
		if err != nil || r.Cached || countLines(t, calls) != 2 {
			t.Errorf("after a reboot: %+v, %v, %d boots; want a fresh probe", r, err, countLines(t, calls))
		}
	})

	t.Run("a probe that cannot run is an error", func(t *testing.T) {
		_, err := ProbeKVM(context.Background(), ProbeConfig{Qemu: "/nonexistent/qemu", ImageDir: image, Device: device, BootID: bootID})
		if err == nil || !strings.Contains(err.Error(), "apt-get install qemu-system-x86") {
			t.Errorf("missing qemu: %v", err)
		}
	})

	t.Run("SelectAccel kvm is refused where the guest does not boot", func(t *testing.T) {
		qemu, _ := fakeProbeQemu(t, "stuck")
		_, err := SelectAccel(context.Background(), AccelKVM, ProbeConfig{Qemu: qemu, ImageDir: image, Timeout: time.Second, Device: device, BootID: bootID})
		if err == nil || !strings.Contains(err.Error(), "Probing EDD") || !strings.Contains(err.Error(), "--accel tcg") {
			t.Errorf("SelectAccel(kvm) on a stuck guest: %v; want a refusal with the console line and the way out", err)
		}
	})
}

// TestEarlyBootStall: a VM whose console shows no kernel banner is reported after the
// early-boot deadline; two in a row under KVM turn KVM off, and a booting one is never
// reported.
func TestEarlyBootStall(t *testing.T) {
	e := newFakeEnv(t)
	e.cfg.Verdict = &Verdict{Accel: AccelKVM, Reason: "KVM: probe booted"}
	e.cfg.EarlyBootTimeout = 300 * time.Millisecond
	p := e.provider(t)
	ctx := context.Background()
	var w nodes.EarlyBootWatcher = p

	for _, n := range []string{"a-ok1", "a-edd1"} {
		if _, err := p.Create(ctx, req("a", n)); err != nil {
			t.Fatal(err)
		}
	}
	if s := w.EarlyBootStall("a-edd1"); s != "" {
		t.Errorf("stall reported before the deadline: %q", s)
	}
	time.Sleep(500 * time.Millisecond)
	if s := w.EarlyBootStall("a-ok1"); s != "" {
		t.Errorf("a VM whose kernel printed its banner reported as stalled: %q", s)
	}
	s := w.EarlyBootStall("a-edd1")
	if !strings.Contains(s, "no progress") || !strings.Contains(s, "kvm") {
		t.Errorf("stall %q; want what was seen and under which accelerator", s)
	}
	if p.Accel() != AccelKVM {
		t.Errorf("one stall turned KVM off")
	}
	if _, err := p.Create(ctx, req("a", "a-edd2")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if w.EarlyBootStall("a-edd2") == "" {
		t.Fatal("second stuck VM not reported")
	}
	name, why := p.Accelerator()
	if name != string(AccelTCG) || !strings.Contains(why, "2 node boots in a row") {
		t.Errorf("after two KVM stalls: %s (%q); want tcg and why", name, why)
	}
	// The next node boots under TCG.
	if _, err := p.Create(ctx, req("a", "a-ok2")); err != nil {
		t.Fatal(err)
	}
	info, err := p.Info("a-ok2")
	if err != nil || info.Accel != AccelTCG {
		t.Errorf("node after the fallback: %+v, %v; want tcg", info, err)
	}
	for _, n := range []string{"a-ok1", "a-edd1", "a-edd2", "a-ok2"} {
		if err := p.Delete(ctx, n); err != nil {
			t.Error(err)
		}
	}
}
