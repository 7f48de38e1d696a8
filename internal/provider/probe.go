package provider

import (
	"context"
	"path/filepath"
	"time"

	"github.com/socialweb-computer/socialweb/internal/controlplane"
)

// probeInterval is how often each running control plane's /readyz is read.
const probeInterval = 2 * time.Second

// probeLoop reads /readyz of every running control plane and requeues a
// cluster whenever its answer changes.
func (p *Provider) probeLoop(ctx context.Context) {
	t := time.NewTicker(probeInterval)
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
			p.probeOne(ctx, name)
		}
	}
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
		pr = &probe{client: client, url: cfg.URL()}
		p.probeMu.Lock()
		p.probes[name] = pr
		p.probeMu.Unlock()
	}
	err := controlplane.Probe(ctx, pr.client, pr.url)
	p.probeMu.Lock()
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
