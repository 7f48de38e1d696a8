package ccm

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/socialweb-computer/socialweb/internal/identity"
)

// storageSettle is how long a Node must have reported its ephemeral storage before
// the taint goes: the kubelet's own informer must see its status before the scheduler
// can bind a Pod that the kubelet admits against it.
const storageSettle = time.Second

// StorageMeasured says whether the kubelet has reported the node's ephemeral storage,
// so the startup taint identity.StorageTaintKey may go.
func StorageMeasured(n *corev1.Node) bool {
	q, ok := n.Status.Allocatable[corev1.ResourceEphemeralStorage]
	c, cok := n.Status.Capacity[corev1.ResourceEphemeralStorage]
	return ok && cok && q.Sign() > 0 && c.Sign() > 0
}

func hasStorageTaint(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == identity.StorageTaintKey {
			return true
		}
	}
	return false
}

// storageController removes the startup taint from Nodes whose kubelet has reported
// their ephemeral storage.
type storageController struct {
	kube  kubernetes.Interface
	nodes coreinformers.NodeInformer
	queue workqueue.TypedRateLimitingInterface[string]
	log   *slog.Logger
}

func newStorageController(kube kubernetes.Interface, nodes coreinformers.NodeInformer, log *slog.Logger) (*storageController, error) {
	c := &storageController{
		kube: kube, nodes: nodes, log: log,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "storage-taint"}),
	}
	enqueue := func(obj any) {
		if n, ok := obj.(*corev1.Node); ok && hasStorageTaint(n) && StorageMeasured(n) {
			c.queue.AddAfter(n.Name, storageSettle)
		}
	}
	_, err := nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	})
	if err != nil {
		return nil, fmt.Errorf("storage taint controller: %w", err)
	}
	return c, nil
}

func (c *storageController) run(ctx context.Context) {
	defer c.queue.ShutDown()
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		for c.next(ctx) {
		}
	}, time.Second)
	<-ctx.Done()
}

func (c *storageController) next(ctx context.Context) bool {
	name, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(name)
	if err := c.untaint(ctx, name); err != nil {
		c.log.Warn("removing the storage startup taint; will retry", "node", name, "err", err)
		c.queue.AddRateLimited(name)
		return true
	}
	c.queue.Forget(name)
	return true
}

// untaint removes the taint with a patch that fails if the taints changed meanwhile.
func (c *storageController) untaint(ctx context.Context, name string) error {
	n, err := c.nodes.Lister().Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !hasStorageTaint(n) || !StorageMeasured(n) {
		return nil
	}
	var kept []corev1.Taint
	for _, t := range n.Spec.Taints {
		if t.Key != identity.StorageTaintKey {
			kept = append(kept, t)
		}
	}
	patch, err := json.Marshal([]map[string]any{
		{"op": "test", "path": "/spec/taints", "value": n.Spec.Taints},
		{"op": "replace", "path": "/spec/taints", "value": kept},
	})
	if err != nil {
		return err
	}
	_, err = c.kube.CoreV1().Nodes().Patch(ctx, name, types.JSONPatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("patch taints of %s: %w", name, err)
	}
	eph := n.Status.Allocatable[corev1.ResourceEphemeralStorage]
	c.log.Info("node storage measured; schedulable", "node", name, "ephemeralStorage", eph.String())
	return nil
}
