package provider

import (
	"context"
	"path/filepath"
	"time"

	"github.com/socialweb-computer/socialweb/internal/controlplane"
)

// A Ready control plane is probed every probeInterval; one that is starting
// is probed every startingProbeInterval, so Ready is seen within a fraction
// of a second of /readyz answering.
const (
	probeInterval         = 2 * time.Second
	startingProbeInterval = 100 * time.Millisecond
)

// probeLoop reads /readyz of every running control plane and requeues a
// cluster whenever its answer changes.
func (p *Provider) probeLoop(ctx context.Context) {
	t := time.NewTicker(startingProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		objs, err := p.lister.List(everything())
		if err != nil {
			continue
		}
		for _, o := range objs {
			name := nameOf(o)
			if st, ok := p.sup.State(ProcessName(name)); !ok || (!st.Running && !p.hasProbe(name)) {
				continue
			}
			if p.claimProbe(name) {
				// Concurrently: one slow apiserver must not delay the others.
				go func() {
					defer p.releaseProbe(name)
					p.probeOne(ctx, name)
				}()
			}
		}
	}
}

// claimProbe reports whether a probe of name is due and none is in flight,
// and if so marks one in flight.
func (p *Provider) claimProbe(name string) bool {
	p.probeMu.Lock()
	defer p.probeMu.Unlock()
	if p.probing[name] {
		return false
	}
	pr := p.probes[name]
	if pr != nil && pr.state.OK && time.Since(pr.last) < probeInterval {
		return false
	}
	p.probing[name] = true
	return true
}

func (p *Provider) releaseProbe(name string) {
	p.probeMu.Lock()
	delete(p.probing, name)
	p.probeMu.Unlock()
}

func (p *Provider) hasProbe(name string) bool {
	p.probeMu.Lock()
	defer p.probeMu.Unlock()
	return p.probes[name] != nil
}

func (p *Provider) probeOne(ctx context.Context, name string) {
	p.probeMu.Lock()
	pr := p.probes[name]
	p.probeMu.Unlock()
	if pr == nil {
		cfg, err := controlplane.ReadConfig(filepath.Join(ClusterDir(p.cfg.StateDir, name), controlplane.ConfigFile))
		if err != nil {
			return
		}
		client, err := controlplane.AdminHTTPClient(cfg)
		if err != nil {
			return
		}
		pr = &probe{client: client, cfg: cfg}
		p.probeMu.Lock()
		p.probes[name] = pr
		p.probeMu.Unlock()
	}
	err := controlplane.ProbeUp(ctx, pr.client, pr.cfg)
	p.probeMu.Lock()
	pr.last = time.Now()
	prev := pr.state
	pr.state.OK = err == nil
	pr.state.Err = ""
	if err != nil {
		pr.state.Err = err.Error()
	}
	if prev.OK != pr.state.OK {
		pr.state.Since = time.Now()
	}
	changed := prev.OK != pr.state.OK || (prev.Err == "") != (pr.state.Err == "")
	p.probeMu.Unlock()
	if changed {
		p.queue.Add(name)
	}
}

func (p *Provider) forgetProbe(name string) {
	p.probeMu.Lock()
	delete(p.probes, name)
	p.probeMu.Unlock()
}
