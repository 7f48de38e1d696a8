package nodeservice

import (
	"context"
	"fmt"
	"sync"
)

// bootReporter is the side of the Cluster status the stand-in writes: its
// NodeBoot condition.
type bootReporter interface {
	RecordNodeBoot(ctx context.Context, cluster string, ok bool, reason, message string) error
}

// noNodeImage stands in for the node services of a daemon without a node image: it
// boots nothing, and tells each Ready cluster (its NodeBoot condition) why its Pods stay
// Pending and what the operator does about it.
type noNodeImage struct {
	status bootReporter
	mu     sync.Mutex
	told   map[string]bool
}

// noNodeImageMessage is the NodeBoot condition's message on a host without a node image.
const noNodeImageMessage = "this host runs without a node image, so the cluster stays at zero nodes and its Pods stay Pending: " +
	"build one with `socialweb image build` and restart `socialweb serve --node-image DIR` with the dir it prints"

func newNoNodeImage(status bootReporter) *noNodeImage {
	return &noNodeImage{status: status, told: map[string]bool{}}
}

// Start tells the cluster once (until Stop) that it gets no nodes; the status
// is written outside the lock, and told only once it was.
func (n *noNodeImage) Start(ctx context.Context, c Cluster) error {
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
