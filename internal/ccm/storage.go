package ccm

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
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

// KubeletReady says whether the kubelet has reported the node Ready, so the startup
// taint identity.KubeletNotReadyTaintKey may go.
func KubeletReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// startupTaints are the taints a node registers with and the host removes: each goes
// once its condition holds, after its settle.
// A function, not a package variable, so nothing can change the table.
func startupTaints() []startupTaint {
	return []startupTaint{
		{identity.StorageTaintKey, StorageMeasured, storageSettle},
		{identity.KubeletNotReadyTaintKey, KubeletReady, 0},
	}
}

type startupTaint struct {
	key    string
	lifted func(*corev1.Node) bool
	settle time.Duration
}

// liftable is the startup taints of n whose condition holds, and the longest settle
// among them.
func liftable(n *corev1.Node) (map[string]bool, time.Duration) {
	keys := map[string]bool{}
	var settle time.Duration
	for _, st := range startupTaints() {
		if !st.lifted(n) {
			continue
		}
		for _, t := range n.Spec.Taints {
			if t.Key == st.key {
				keys[st.key] = true
				settle = max(settle, st.settle)
			}
		}
	}
	return keys, settle
}

// storageController removes the startup taints (startupTaints) from Nodes whose kubelet
// has reported what each waits for.
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
		if n, ok := obj.(*corev1.Node); ok {
			if keys, settle := liftable(n); len(keys) > 0 {
				c.queue.AddAfter(n.Name, settle)
			}
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
	keys, _ := liftable(n)
	if len(keys) == 0 {
		return nil
	}
	var kept []corev1.Taint
	for _, t := range n.Spec.Taints {
		if !keys[t.Key] {
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
	c.log.Info("startup taints removed", "node", name, "taints", slices.Sorted(maps.Keys(keys)), "ephemeralStorage", eph.String())
	return nil
}
