package scaledriver

import (
	"context"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/socialweb-computer/socialweb/internal/nodes"
)

// joinForgetter tells the provider, once per Node, that the Node registered, so that
// its machine's join secret goes (nodes.JoinForgetter). A Node seen again after a
// daemon restart is told again; the provider finds nothing left to do.
type joinForgetter struct {
	provider nodes.JoinForgetter
	log      *slog.Logger
	mu       sync.Mutex
	told     map[string]bool // Nodes told, or being told
}

func newJoinForgetter(p nodes.JoinForgetter, log *slog.Logger) *joinForgetter {
	return &joinForgetter{provider: p, log: log, told: map[string]bool{}}
}

// nodeHandler feeds f from the Node informer. A registered Node is enough: the kubelet
// registers with the credentials its join gave it.
func (f *joinForgetter) nodeHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { f.registered(o) },
		UpdateFunc: func(_, o any) { f.registered(o) },
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if n, ok := o.(*corev1.Node); ok {
				f.mu.Lock()
				delete(f.told, n.Name)
				f.mu.Unlock()
			}
		},
	}
}

func (f *joinForgetter) registered(o any) {
	n, ok := o.(*corev1.Node)
	if !ok {
		return
	}
	f.mu.Lock()
	if f.told[n.Name] {
		f.mu.Unlock()
		return
	}
	f.told[n.Name] = true
	f.mu.Unlock()
	// Off the informer's goroutine: the provider reads and writes a disk.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := f.provider.ForgetJoin(ctx, n.Name); err != nil {
			f.log.Warn("a registered node's join secret is still on its machine; trying again at its next update", "node", n.Name, "err", err)
			f.mu.Lock()
			delete(f.told, n.Name)
			f.mu.Unlock()
		}
	}()
}
