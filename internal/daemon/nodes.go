package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/dynamic"

	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/images"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/nodes/qemu"
	"github.com/socialweb-computer/socialweb/internal/nodeservice"
	"github.com/socialweb-computer/socialweb/internal/podroutes"
	"github.com/socialweb-computer/socialweb/internal/provider"
	"github.com/socialweb-computer/socialweb/internal/registry"
)

// lateJoiner breaks the construction cycle: the qemu provider needs a Joiner,
// and the Joiner (nodeservice.Host) needs the provider.
type lateJoiner struct{ host *nodeservice.Host }

func (j *lateJoiner) Identity(ctx context.Context, req nodes.NodeRequest, addr net.IP, mac string) (identity.Identity, error) {
	return j.host.Identity(ctx, req, addr, mac)
}

// noNodeImage stands in for the node services of a daemon without a node image: it
// boots nothing, and tells each Ready cluster (its NodeBoot condition) why its Pods stay
// Pending and what the operator does about it.
type noNodeImage struct {
	status provider.ScaleStatus
	mu     sync.Mutex
	told   map[string]bool
}

// noNodeImageMessage is the NodeBoot condition's message on a host without a node image.
const noNodeImageMessage = "this host runs without a node image, so the cluster stays at zero nodes and its Pods stay Pending: " +
	"build one with `socialweb image build` and restart `socialweb serve --node-image DIR` with the dir it prints"

func (n *noNodeImage) Start(ctx context.Context, c nodeservice.Cluster) error {
	n.mu.Lock()
	told := n.told[c.Name]
	n.mu.Unlock()
	if told {
		return nil
	}
	if err := n.status.RecordNodeBoot(ctx, c.Name, false, "NoNodeImage", noNodeImageMessage); err != nil {
		return fmt.Errorf("reporting that cluster %s gets no nodes: %w", c.Name, err)
	}
	n.mu.Lock()
	n.told[c.Name] = true
	n.mu.Unlock()
	return nil
}

func (n *noNodeImage) Stop(name string) {
	n.mu.Lock()
	delete(n.told, name)
	n.mu.Unlock()
}

func (n *noNodeImage) DeleteAll(context.Context, string) error { return nil }

// startNodes builds the node machinery when a node image is configured: the
// qemu provider (recovering VMs of an earlier run), the host registry seeded
// with the images nodes need, and the per-cluster node services.
func startNodes(ctx context.Context, v validated, nets *nodenet.Manager, plan func(string) (nodenet.Plan, error),
	dyn dynamic.Interface, reg prometheus.Registerer, log *slog.Logger) (provider.NodeServices, error) {
	if v.NodeImage == "" {
		log.Info("no --node-image: clusters stay at zero nodes (build one with `socialweb image build`)")
		return &noNodeImage{status: provider.ScaleStatus{Client: dyn}, told: map[string]bool{}}, nil
	}
	if nets == nil {
		return nil, fmt.Errorf("--node-image needs --node-network: nodes live on their cluster's bridge")
	}
	joiner := &lateJoiner{}
	qp, err := qemu.New(qemu.Config{StateDir: filepath.Join(v.StateDir, "nodes"), ImageDir: v.NodeImage, Verdict: v.verdict, TCGCacheMiB: v.TCGCacheMiB},
		qemu.Deps{Networks: nets, Joiner: joiner, Plan: plan, Log: log.With("component", "qemu")})
	if err != nil {
		return nil, err
	}
	if res, err := qp.Recover(ctx); err != nil {
		return nil, fmt.Errorf("recovering node VMs: %w", err)
	} else {
		log.Info("node VMs recovered", "result", fmt.Sprintf("%+v", res))
	}
	regDir := filepath.Join(v.StateDir, "registry")
	if err := os.MkdirAll(regDir, 0o700); err != nil {
		return nil, err
	}
	rs := &registry.Server{Dir: regDir, Logger: log.With("component", "registry")}
	go seedImages(ctx, rs, log)
	// qp itself, not a wrapper: the node services find its optional sides (Addresser,
	// Diagnoser, EarlyBootWatcher, AcceleratorReporter) by type assertion.
	host := nodeservice.New(qp, rs.Handler(), provider.ScaleStatus{Client: dyn}, reg, log.With("component", "nodes"))
	host.BootTimeout = v.NodeBootTimeout
	host.PodRoutes = func(c nodeservice.Cluster) podroutes.Table { return clusterRoutes{nets, c.Minter.Plan} }
	joiner.host = host
	return host, nil
}

// seedImages builds the pause and busybox images locally and loads them into
// the registry; nodes pull them from there.
func seedImages(ctx context.Context, rs *registry.Server, log *slog.Logger) {
	for _, name := range []string{images.Pause, images.Busybox} {
		tarPath, digest, err := images.Build(ctx, name, images.Options{Logger: log})
		if err != nil {
			log.Error("building image", "image", name, "err", err)
			continue
		}
		f, err := os.Open(tarPath)
		if err != nil {
			log.Error("opening image", "image", name, "err", err)
			continue
		}
		refs, err := rs.Import(ctx, f)
		f.Close()
		if err != nil {
			log.Error("loading image into the registry", "image", name, "err", err)
			continue
		}
		log.Info("image ready in the registry", "image", name, "digest", digest, "refs", refs)
	}
}

// clusterRoutes is one cluster's view of the host route table.
type clusterRoutes struct {
	m    *nodenet.Manager
	plan nodenet.Plan
}

func (r clusterRoutes) PodRoutes(ctx context.Context) (map[string]net.IP, error) {
	return r.m.PodRoutes(ctx, r.plan)
}

func (r clusterRoutes) AddPodRoute(ctx context.Context, cidr string, via net.IP) error {
	return r.m.AddPodRoute(ctx, r.plan, cidr, via)
}

func (r clusterRoutes) RemovePodRoute(ctx context.Context, cidr string, via net.IP) error {
	return r.m.RemovePodRoute(ctx, r.plan, cidr, via)
}
