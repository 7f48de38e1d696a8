package nodeservice

import (
	"context"
	"fmt"
	"net"
	"sync"

	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/join"
	"github.com/socialweb-computer/socialweb/internal/nodes"
)

// Joiners holds the identity minter of each cluster whose node services run,
// and is the qemu provider's Joiner. It is built before both the provider and
// the Host, so neither needs the other to exist first. Safe for concurrent use;
// the zero value is empty and ready.
type Joiners struct {
	mu      sync.RWMutex
	minters map[string]join.Minter
}

// Register makes m the minter of cluster's nodes, replacing any earlier one.
func (j *Joiners) Register(cluster string, m join.Minter) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.minters == nil {
		j.minters = map[string]join.Minter{}
	}
	j.minters[cluster] = m
}

// Remove forgets cluster's minter: its nodes get no identity from now on.
func (j *Joiners) Remove(cluster string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.minters, cluster)
}

// Minter returns cluster's minter, if it has one.
func (j *Joiners) Minter(cluster string) (join.Minter, bool) {
	j.mu.RLock()
	defer j.mu.RUnlock()
	m, ok := j.minters[cluster]
	return m, ok
}

// Identity mints a booting node's identity with its cluster's minter.
func (j *Joiners) Identity(ctx context.Context, req nodes.NodeRequest, addr net.IP, mac string) (identity.Identity, error) {
	m, ok := j.Minter(req.Cluster)
	if !ok {
		return identity.Identity{}, fmt.Errorf("cluster %s has no node services running", req.Cluster)
	}
	return m.Identity(ctx, req, addr, mac)
}
