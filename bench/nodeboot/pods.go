package main

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// The CI-shaped Pod's images: together about the 140 MB of a GitLab job's helper and
// job images (issue 12's CI-shaped row).
const (
	ciHelperMiB = 60
	ciJobMiB    = 80
)

// podShape is what each measured Pod runs: one container of image, or with helper set, a
// GitLab Runner kubernetes executor's job Pod: an init container of the helper image
// (the executor's init-permissions), a build container of image and a helper container.
type podShape struct {
	image, helper string
}

func (s podShape) String() string {
	if s.helper == "" {
		return "image " + s.image
	}
	return fmt.Sprintf("CI-shaped Pods (init container and helper %s, build %s)", s.helper, s.image)
}

// fill sets spec's containers.
func (s podShape) fill(spec *corev1.PodSpec) {
	sleep := []string{"sleep", "3600"}
	if s.helper == "" {
		spec.Containers = []corev1.Container{{Name: "main", Image: s.image, Command: sleep}}
		return
	}
	spec.InitContainers = []corev1.Container{{Name: "init-permissions", Image: s.helper, Command: []string{"sh", "-c", "mkdir -p /builds && echo ok"}}}
	spec.Containers = []corev1.Container{
		{Name: "build", Image: s.image, Command: sleep},
		{Name: "helper", Image: s.helper, Command: sleep},
	}
}

// allRunning says whether every container of p runs (a Pod is Running once one does).
func allRunning(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) < len(p.Spec.Containers) {
		return false
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Running == nil {
			return false
		}
	}
	return true
}

// podEventReasons are the events of a Pod's start, in the order they come: bound by the
// scheduler, then the kubelet's, for each container (the first one seen counts).
var podEventReasons = []string{"Scheduled", "Pulling", "Pulled", "Created", "Started"}

// podTimes is when each of podEventReasons was first seen for a node's first Pod, in
// seconds from the Pods created; 0 until seen.
type podTimes map[string]float64

// observe records the reasons first seen now.
func (t *podTimes) observe(now float64, reasons map[string]bool) {
	if *t == nil {
		*t = podTimes{}
	}
	for r := range reasons {
		if _, seen := (*t)[r]; !seen {
			(*t)[r] = now
		}
	}
}

// row is the times in podEventReasons order, NaN where not seen (an image already
// present has no Pulling).
func (t podTimes) row() []float64 {
	out := make([]float64, len(podEventReasons))
	for i, r := range podEventReasons {
		out[i] = math.NaN()
		if v, ok := t[r]; ok {
			out[i] = v
		}
	}
	return out
}

// podEvents is, per Pod of the default namespace, the reasons of its events so far.
func podEvents(ctx context.Context, k kubernetes.Interface) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	el, err := k.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Pod"})
	if err != nil {
		return out
	}
	for _, e := range el.Items {
		if out[e.InvolvedObject.Name] == nil {
			out[e.InvolvedObject.Name] = map[string]bool{}
		}
		out[e.InvolvedObject.Name][e.Reason] = true
	}
	return out
}

// runningAt is when a Pod was first seen with all its containers started (seconds from
// the Pods' creation), with qemu's CPU seconds for its node's VM and the host's at that
// moment.
type runningAt struct {
	at, qemuCPU, hostCPU float64
}

// runningWatch follows Pods through a watch, so that a Pod running is stamped when the
// API server says so, not at the bench's next poll (whose rounds take a few tenths of a
// second: they list Pods, events and Nodes).
type runningWatch struct {
	mu   sync.Mutex
	seen map[string]runningAt
}

// watchRunning watches the Pods matching selector until ctx ends, stamping times from
// t0; cpu gives the CPU seconds of the VM running a node. A Pod runs seconds after its
// creation, so a watch from "now" misses none; if the watch fails, get reports nothing
// and the caller's poll decides.
func watchRunning(ctx context.Context, k kubernetes.Interface, selector string, t0 time.Time, cpu func(node string) float64) *runningWatch {
	w := &runningWatch{seen: map[string]runningAt{}}
	go func() {
		rv := ""
		for ctx.Err() == nil {
			wi, err := k.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: rv})
			if err != nil {
				return
			}
			for ev := range wi.ResultChan() {
				if ev.Type == watch.Error { // e.g. its version expired: start again from now
					rv = ""
					continue
				}
				p, ok := ev.Object.(*corev1.Pod)
				if !ok {
					continue
				}
				rv = p.ResourceVersion
				if !allRunning(p) {
					continue
				}
				w.mu.Lock()
				if _, done := w.seen[p.Name]; !done {
					w.seen[p.Name] = runningAt{at: time.Since(t0).Seconds(), qemuCPU: cpu(p.Spec.NodeName), hostCPU: hostCPUSeconds()}
				}
				w.mu.Unlock()
			}
			wi.Stop()
		}
	}()
	return w
}

// get is when Pod name was first seen running, if it was.
func (w *runningWatch) get(name string) (runningAt, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	r, ok := w.seen[name]
	return r, ok
}
