// Package podroutes keeps the host's routes to a cluster's pod subnets in step with its
// Nodes: each Node's spec.podCIDR (assigned by the controller-manager's node IPAM) is
// routed via the Node's InternalIP on the cluster bridge, so a Pod on one node reaches a
// Pod on another through the gateway, with its source address intact.
//
// The work is split as in the scale driver: Plan computes the changes from observed
// state (a pure function), and Sync carries them out against a Table.
package podroutes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Table is the host's routing for one cluster (nodenet.Manager with the cluster's plan).
type Table interface {
	// PodRoutes lists the routes: pod subnet -> node address.
	PodRoutes(ctx context.Context) (map[string]net.IP, error)
	AddPodRoute(ctx context.Context, podCIDR string, nodeIP net.IP) error
	RemovePodRoute(ctx context.Context, podCIDR string, nodeIP net.IP) error
}

// Route is one pod subnet and the node address it is routed via.
type Route struct {
	CIDR string
	Via  net.IP
}

// Changes are what Plan wants done: routes to add (or replace) and to remove.
type Changes struct {
	Add, Remove []Route
}

// Desired is the route table the Nodes call for: for each Node with a pod CIDR and an
// InternalIP, its pod CIDR via that address. Nodes without either are skipped (they have
// no pods yet, or the kubelet has not reported its address).
func Desired(nodes []*corev1.Node) map[string]net.IP {
	want := map[string]net.IP{}
	for _, n := range nodes {
		if n.Spec.PodCIDR == "" || n.DeletionTimestamp != nil {
			continue
		}
		_, cidr, err := net.ParseCIDR(n.Spec.PodCIDR)
		if err != nil {
			continue
		}
		for _, a := range n.Status.Addresses {
			if ip := net.ParseIP(a.Address); a.Type == corev1.NodeInternalIP && ip.To4() != nil {
				want[cidr.String()] = ip.To4()
				break
			}
		}
	}
	return want
}

// Plan compares the desired routes with the actual ones. Removals come for routes no
// Node wants and for routes via a different address (those are then re-added).
func Plan(want, have map[string]net.IP) Changes {
	var c Changes
	for _, cidr := range slices.Sorted(maps.Keys(want)) {
		if via, ok := have[cidr]; !ok || !via.Equal(want[cidr]) {
			c.Add = append(c.Add, Route{cidr, want[cidr]})
		}
	}
	for _, cidr := range slices.Sorted(maps.Keys(have)) {
		if via, ok := want[cidr]; !ok || !via.Equal(have[cidr]) {
			c.Remove = append(c.Remove, Route{cidr, have[cidr]})
		}
	}
	return c
}

// Sync applies c: removals first, so a subnet that moved to another node is re-added.
func Sync(ctx context.Context, t Table, c Changes) error {
	var errs []error
	for _, r := range c.Remove {
		if err := t.RemovePodRoute(ctx, r.CIDR, r.Via); err != nil {
			errs = append(errs, fmt.Errorf("removing pod route %s via %s: %w", r.CIDR, r.Via, err))
		}
	}
	for _, r := range c.Add {
		if err := t.AddPodRoute(ctx, r.CIDR, r.Via); err != nil {
			errs = append(errs, fmt.Errorf("adding pod route %s via %s: %w", r.CIDR, r.Via, err))
		}
	}
	return errors.Join(errs...)
}

// Run keeps t in step with the tenant's Nodes until ctx ends: a pass on every Node change
// and every resync period (which also repairs routes removed behind its back). It never
// decides before the Node cache has synced.
func Run(ctx context.Context, tenant kubernetes.Interface, t Table, resync time.Duration, log *slog.Logger) error {
	factory := informers.NewSharedInformerFactory(tenant, 0)
	nodes := factory.Core().V1().Nodes()
	kick := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	if _, err := nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, n any) { poke(n) }, DeleteFunc: poke,
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced) {
		return ctx.Err()
	}
	tick := time.NewTicker(resync)
	defer tick.Stop()
	for {
		list, err := nodes.Lister().List(labels.Everything())
		if err == nil {
			var have map[string]net.IP
			if have, err = t.PodRoutes(ctx); err == nil {
				c := Plan(Desired(list), have)
				if len(c.Add)+len(c.Remove) > 0 {
					err = Sync(ctx, t, c)
					log.Info("pod routes synced", "added", len(c.Add), "removed", len(c.Remove), "err", err)
				}
			}
		}
		if err != nil && ctx.Err() == nil {
			log.Error("syncing pod routes", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
		case <-tick.C:
		}
	}
}
