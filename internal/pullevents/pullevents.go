// Package pullevents tells a Pod why its image could not be had. kubelet's own
// message for a failed pull is containerd's ("unexpected status 401"); the host
// registry knows the reason (the image is another tenant's, upstream is down, the
// operator denies the registry, ...). For every container of a tenant's Pods waiting
// in ErrImagePull or ImagePullBackOff, Run asks the registry why and records a
// Warning Event on the Pod, in its own namespace, once per reason.
package pullevents

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/socialweb-computer/socialweb/internal/registry"
)

// Component is the Events' source.
const Component = "socialweb-registry"

// Lookup says why the cluster's nodes were last refused image.
type Lookup func(image string) (registry.PullFailure, bool)

// Run watches the tenant's Pods until ctx ends.
func Run(ctx context.Context, tenant kubernetes.Interface, lookup Lookup, log *slog.Logger) error {
	r := &reporter{client: tenant, lookup: lookup, log: log, sent: map[string]string{}}
	f := informers.NewSharedInformerFactory(tenant, 10*time.Minute)
	inf := f.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { r.check(ctx, o) },
		UpdateFunc: func(_, o any) { r.check(ctx, o) },
		DeleteFunc: func(o any) { r.forget(o) },
	}); err != nil {
		return fmt.Errorf("watching pods for failed pulls: %w", err)
	}
	f.Start(ctx.Done())
	<-ctx.Done()
	f.Shutdown()
	return nil
}

type reporter struct {
	client kubernetes.Interface
	lookup Lookup
	log    *slog.Logger
	mu     sync.Mutex
	sent   map[string]string // pod UID/container -> message last reported
}

// Waiting is what a container waits in when its image could not be pulled.
func Waiting(reason string) bool { return reason == "ErrImagePull" || reason == "ImagePullBackOff" }

func (r *reporter) check(ctx context.Context, o any) {
	pod, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	images, field := map[string]string{}, map[string]string{}
	for _, c := range pod.Spec.InitContainers {
		images[c.Name], field[c.Name] = c.Image, fmt.Sprintf("spec.initContainers{%s}", c.Name)
	}
	for _, c := range pod.Spec.Containers {
		images[c.Name], field[c.Name] = c.Image, fmt.Sprintf("spec.containers{%s}", c.Name)
	}
	for _, st := range append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		if st.State.Waiting == nil || !Waiting(st.State.Waiting.Reason) {
			continue
		}
		image := images[st.Name]
		f, ok := r.lookup(image)
		if !ok {
			continue
		}
		key := string(pod.UID) + "/" + st.Name
		msg := fmt.Sprintf("image %s: %s", image, f.Message)
		r.mu.Lock()
		dup := r.sent[key] == f.Reason+msg
		if !dup {
			r.sent[key] = f.Reason + msg
		}
		r.mu.Unlock()
		if dup {
			continue
		}
		if err := r.record(ctx, pod, field[st.Name], f.Reason, msg); err != nil {
			r.log.Warn("recording a pull failure event", "namespace", pod.Namespace, "pod", pod.Name, "err", err)
			r.mu.Lock()
			delete(r.sent, key)
			r.mu.Unlock()
			continue
		}
		r.log.Info("pull failure reported to the pod", "namespace", pod.Namespace, "pod", pod.Name, "container", st.Name, "reason", f.Reason, "message", msg)
	}
}

func (r *reporter) forget(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	pod, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.sent {
		if len(k) > len(pod.UID) && k[:len(pod.UID)] == string(pod.UID) {
			delete(r.sent, k)
		}
	}
}

func (r *reporter) record(ctx context.Context, pod *corev1.Pod, fieldPath, reason, msg string) error {
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: pod.Name + ".", Namespace: pod.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: types.UID(pod.UID),
			ResourceVersion: pod.ResourceVersion, FieldPath: fieldPath},
		Reason: reason, Message: msg, Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: Component},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: Component, ReportingInstance: Component,
	}
	_, err := r.client.CoreV1().Events(pod.Namespace).Create(ctx, ev, metav1.CreateOptions{})
	return err
}
