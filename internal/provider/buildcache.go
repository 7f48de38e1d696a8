package provider

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/buildcache"
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
	secrets := p.kube.CoreV1().Secrets(v1.SystemNamespace)
	name := BuildCacheSecretName(c.Name)
	var access buildcache.Access
	on := false
	if p.cfg.BuildCache != nil && p.cfg.BuildCache.On() && plan.Gateway == nil {
		return nil // no node network yet: the Secret is written when it has one
	}
	if p.cfg.BuildCache != nil {
		access, on = p.cfg.BuildCache.Access(c.Name, string(c.UID), nodeservice.BuildCacheAddr(plan))
	}
	if !on {
		if err := secrets.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("removing the build cache access of %s (the cache is off): %w", c.Name, err)
		}
		return nil
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: v1.SystemNamespace,
			Labels: map[string]string{"socialweb.computer/cluster": c.Name}},
		Data: access.SecretData(),
	}
	_, err := secrets.Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
	}
	if err != nil {
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
	err := p.kube.CoreV1().Secrets(v1.SystemNamespace).Delete(ctx, BuildCacheSecretName(cluster), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing the build cache access of %s: %w", cluster, err)
	}
	return nil
}
