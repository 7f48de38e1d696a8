package provider

import (
	"context"
	"fmt"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/lease"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodeservice"
)

// Plan returns a cluster's network plan from its lease, for the node
// provider.
func (p *Provider) Plan(cluster string) (nodenet.Plan, error) {
	l, err := p.leases.Get(context.Background(), cluster)
	if err != nil {
		return nodenet.Plan{}, err
	}
	if l == nil || !l.HasNetwork() {
		return nodenet.Plan{}, fmt.Errorf("cluster %s holds no node network (it is asleep or not yet leased)", cluster)
	}
	return nodenet.ForIndex(l.Network)
}

// startNodeServices starts a Ready cluster's node services (idempotent).
func (p *Provider) startNodeServices(ctx context.Context, c *v1.Cluster, l lease.Lease) error {
	if p.cfg.NodeServices == nil {
		return nil
	}
	nc, err := nodeservice.ClusterFrom(c, l, ClusterDir(p.cfg.StateDir, c.Name))
	if err != nil {
		return err
	}
	return p.cfg.NodeServices.Start(ctx, nc)
}

// stopNodeServices stops a cluster's node services and deletes its machines.
func (p *Provider) stopNodeServices(ctx context.Context, cluster string) error {
	if p.cfg.NodeServices == nil {
		return nil
	}
	p.cfg.NodeServices.Stop(cluster)
	return p.cfg.NodeServices.DeleteAll(ctx, cluster)
}
