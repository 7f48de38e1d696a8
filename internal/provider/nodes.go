package provider

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/controlplane"
	"github.com/socialweb-computer/socialweb/internal/join"
	"github.com/socialweb-computer/socialweb/internal/lease"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodeservice"
	"github.com/socialweb-computer/socialweb/internal/pki"
	"github.com/socialweb-computer/socialweb/internal/scale"
)

// RegistryPort is where the host registry serves each cluster's nodes, on
// the cluster's gateway address.
const RegistryPort = 5000

// NodeServices gives Ready clusters their nodes (nodeservice.Host).
type NodeServices interface {
	Start(ctx context.Context, c nodeservice.Cluster) error
	Stop(name string)
	DeleteAll(ctx context.Context, cluster string) error
}

// Plan returns a cluster's network plan from its lease, for the node
// provider.
func (p *Provider) Plan(cluster string) (nodenet.Plan, error) {
	l, err := p.leases.Get(context.Background(), cluster)
	if err != nil {
		return nodenet.Plan{}, err
	}
	if l == nil {
		return nodenet.Plan{}, fmt.Errorf("cluster %s has no network lease", cluster)
	}
	return nodenet.ForIndex(l.Network)
}

// startNodeServices starts a Ready cluster's node services (idempotent).
func (p *Provider) startNodeServices(ctx context.Context, c *v1.Cluster, l lease.Lease) error {
	if p.cfg.NodeServices == nil {
		return nil
	}
	plan, err := nodenet.ForIndex(l.Network)
	if err != nil {
		return err
	}
	dir := ClusterDir(p.cfg.StateDir, c.Name)
	restCfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, pki.Admin.Name+".kubeconfig"))
	if err != nil {
		return fmt.Errorf("tenant credentials of %s: %w", c.Name, err)
	}
	tenant, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	paths := controlplane.Config{Dir: dir}.PKI()
	ca, err := os.ReadFile(paths.ServerCA)
	if err != nil {
		return err
	}
	clientCA, err := os.ReadFile(paths.ClientCA)
	if err != nil {
		return err
	}
	gw := plan.Gateway.String()
	return p.cfg.NodeServices.Start(ctx, nodeservice.Cluster{
		Name:   c.Name,
		Tenant: tenant,
		Minter: join.Minter{
			Tenant: tenant, APIServer: fmt.Sprintf("https://%s:%d", gw, l.Port), CACert: ca, ClientCA: clientCA, Plan: plan,
			Registry: fmt.Sprintf("http://%s:%d", gw, RegistryPort),
		},
		NodeSize: scale.NodeSize{
			CPUs: int64(c.Spec.NodeCPUs), MemoryMiB: c.Spec.NodeMemory.Value() >> 20, DiskMiB: c.Spec.NodeDisk.Value() >> 20,
			MaxPods: int(c.Spec.PodsPerNode),
		},
		// A cluster from before sizes had a maximum has 0s here: a fixed size, as it was.
		MaxNodeSize: scale.NodeSize{
			CPUs: int64(c.Spec.MaxNodeCPUs), MemoryMiB: c.Spec.MaxNodeMemory.Value() >> 20, DiskMiB: c.Spec.MaxNodeDisk.Value() >> 20,
		},
		MaxNodes:     int(c.Spec.MaxNodes),
		Hold:         c.Spec.Hold.Duration,
		RegistryAddr: fmt.Sprintf("%s:%d", gw, RegistryPort),
		DNSAddr:      net.JoinHostPort(gw, "53"),
	})
}

// stopNodeServices stops a cluster's node services and deletes its machines.
func (p *Provider) stopNodeServices(ctx context.Context, cluster string) error {
	if p.cfg.NodeServices == nil {
		return nil
	}
	p.cfg.NodeServices.Stop(cluster)
	return p.cfg.NodeServices.DeleteAll(ctx, cluster)
}
