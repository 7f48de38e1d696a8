package qemu

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/socialweb-computer/socialweb/internal/nodes"
)

var _ nodes.EarlyBootWatcher = (*Provider)(nil)

// kernelProgress are console texts that only a running guest kernel (or what it starts)
// prints: the kernel's banner, and the initramfs's and agent's own lines for images whose
// command line has "quiet". A guest stuck in the real-mode stub prints at most
// "Probing EDD (edd=off to disable)... ok".
var kernelProgress = [][]byte{[]byte("Linux version "), []byte("socialweb-initramfs:"), []byte("step=")}

// consoleShowsProgress reads the start of a console log for kernelProgress.
func consoleShowsProgress(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	head, _ := io.ReadAll(io.LimitReader(f, 256<<10))
	for _, m := range kernelProgress {
		if bytes.Contains(head, m) {
			return true
		}
	}
	return false
}

// EarlyBootStall implements nodes.EarlyBootWatcher: a running VM whose console shows no
// kernel progress EarlyBootTimeout after qemu started. The second such stall in a row
// under KVM turns KVM off for this provider's image (new VMs use TCG).
func (p *Provider) EarlyBootStall(name string) string {
	p.mu.Lock()
	inst := p.insts[name]
	if inst == nil || inst.creating || inst.progressed || inst.stalled != "" {
		var s string
		if inst != nil {
			s = inst.stalled
		}
		p.mu.Unlock()
		return s
	}
	started, accel, dir := inst.started, inst.rec.Accel, inst.dir
	if started.IsZero() {
		started = inst.rec.Created // adopted after a restart
	}
	p.mu.Unlock()

	if consoleShowsProgress(filepath.Join(dir, fileConsole)) {
		p.mu.Lock()
		inst.progressed = true
		if accel == AccelKVM {
			p.kvmStalls = 0
		}
		p.mu.Unlock()
		return ""
	}
	age := p.now().Sub(started)
	if age < p.cfg.EarlyBootTimeout || !inst.alive() {
		return "" // too early; or gone, which the driver reports as VMExited
	}
	why := fmt.Sprintf("node %s: its guest kernel showed no progress %s after qemu started under %s (no kernel banner on its console)",
		name, age.Round(time.Second), accel)
	p.mu.Lock()
	inst.stalled = why
	fallback := false
	if accel == AccelKVM {
		p.kvmStalls++
		if p.kvmStalls >= kvmStallsBeforeTCG && p.accel == AccelKVM {
			fallback = true
			p.accel = AccelTCG
			p.accelReason = fmt.Sprintf("TCG, because %d node boots in a row stalled in early boot under KVM (the latest: %s); KVM stays off for this image until the probe's cache is removed",
				p.kvmStalls, name)
			p.log.Warn("turning KVM off: node guests do not boot under it; new nodes use TCG",
				"stalls", p.kvmStalls, "node", name, "image", p.imageDir)
		}
	}
	p.mu.Unlock()
	if fallback {
		p.forgetKVM(why)
	}
	return why
}

// forgetKVM records in the probe cache that KVM failed real boots, so a restarted daemon
// does not try it again on this host boot. Best effort.
func (p *Provider) forgetKVM(why string) {
	cache := p.cfg.ProbeCacheDir
	if cache == "" {
		return
	}
	key, err := probeKey(ProbeConfig{ImageDir: p.imageDir, Timeout: DefaultProbeTimeout, BootID: "/proc/sys/kernel/random/boot_id"},
		qemuVersion(context.Background(), p.qemu))
	if err != nil {
		return
	}
	r := ProbeResult{TimedOut: true, Kernel: filepath.Join(p.imageDir, "vmlinuz"), At: p.now(),
		Note: "node boots stalled under KVM after the probe passed: " + why}
	if err := writeProbeCache(filepath.Join(cache, "accel-"+key+".json"), r); err != nil {
		p.log.Warn("could not record the KVM fallback in the probe cache", "err", err)
	}
}
