package provider

import (
	"context"
	"fmt"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodeservice"
)

// BuildCacheSecretName is the management-API Secret holding a cluster's build cache
// access (buildcache.Access), which `cluster runner-credential` writes into the
// runner's [runners.cache]. It exists only while the host serves the cache.
func BuildCacheSecretName(cluster string) string { return cluster + "-build-cache" }

// writeBuildCacheAccess keeps the cluster's build cache Secret in step with the host:
// written when the cache is on, deleted when the operator turned it off (a runner
// credential minted then carries no cache).
func (p *Provider) writeBuildCacheAccess(ctx context.Context, c *v1.Cluster, plan nodenet.Plan) error {
	name := BuildCacheSecretName(c.Name)
	cache := p.cfg.BuildCache
	if cache == nil || !cache.On() {
		if err := p.deleteSecret(ctx, name); err != nil {
			return fmt.Errorf("removing the build cache access of %s (the cache is off): %w", c.Name, err)
		}
		return nil
	}
	if plan.Gateway == nil {
		return nil // no node network yet: the Secret is written when it has one
	}
	access, _ := cache.Access(c.Name, string(c.UID), nodeservice.BuildCacheAddr(plan))
	if err := p.putSecret(ctx, c.Name, name, access.SecretData()); err != nil {
		return fmt.Errorf("writing the build cache access of %s: %w", c.Name, err)
	}
	return nil
}

// removeBuildCache deletes a deleted cluster's cached objects and its access Secret.
func (p *Provider) removeBuildCache(ctx context.Context, cluster string) error {
	if p.cfg.BuildCache != nil {
		if err := p.cfg.BuildCache.Remove(cluster); err != nil {
			return err
		}
	}
	if err := p.deleteSecret(ctx, BuildCacheSecretName(cluster)); err != nil {
		return fmt.Errorf("removing the build cache access of %s: %w", cluster, err)
	}
	return nil
}
