package scaledriver

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/boottimeline"
)

// Pod starts: every Pod the driver saw waiting for a node, from its creation to all of
// its containers started, by the path that gave it a node:
//
//	idle  a node that was up before the Pod was created
//	warm  a node started for it (or for Pods with it) from a warm-pool VM
//	cold  a node booted for it from nothing
//
// Unlike the node start breakdown (starts.go), which follows a node's first Pod, this
// counts every Pod, so that a CI admin reads the time its jobs wait.

// maxPodStartSamples bounds the window kept per cluster: a busy cluster's percentiles
// come from its latest starts.
const maxPodStartSamples = 4096

// podStart is one recorded start.
type podStart struct {
	at   time.Time
	path string
	took time.Duration
}

// podStarts follows unbound Pods until their containers start, and keeps the starts of
// the last v1.PodStartWindow.
type podStarts struct {
	now     func() time.Time
	node    func(name string) (*corev1.Node, error)
	observe func(path string, took time.Duration)

	mu sync.Mutex
	// waiting are the Pods seen unbound, by their creation: the informer's first sight
	// when that is within a second of creationTimestamp (whole seconds), else it.
	waiting map[types.UID]time.Time
	window  []podStart // oldest first
}

func newPodStarts(now func() time.Time, node func(string) (*corev1.Node, error), observe func(string, time.Duration)) *podStarts {
	return &podStarts{now: now, node: node, observe: observe, waiting: map[types.UID]time.Time{}}
}

// pod notes an unbound Pod, and records one whose containers have all started.
func (s *podStarts) pod(p *corev1.Pod) {
	if !jobPod(p) {
		return
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	created, waiting := s.waiting[p.UID]
	if p.Spec.NodeName == "" {
		if !waiting {
			created = p.CreationTimestamp.Time
			if age := now.Sub(created); age >= 0 && age < time.Second {
				created = now
			}
			s.waiting[p.UID] = created
		}
		return
	}
	// A Pod first seen bound (the driver started after it was placed) is not counted:
	// its wait is unknown.
	if !waiting || !containersStarted(p) {
		return
	}
	delete(s.waiting, p.UID)
	n, err := s.node(p.Spec.NodeName)
	if err != nil {
		return // its node is gone already: no path to put it under
	}
	path := startPath(n, p.CreationTimestamp)
	took := max(now.Sub(created), 0)
	s.window = append(s.window, podStart{at: now, path: path, took: took})
	if len(s.window) > maxPodStartSamples {
		s.window = slices.Delete(s.window, 0, len(s.window)-maxPodStartSamples)
	}
	if s.observe != nil {
		s.observe(path, took)
	}
}

func (s *podStarts) podGone(p *corev1.Pod) {
	s.mu.Lock()
	delete(s.waiting, p.UID)
	s.mu.Unlock()
}

// startPath says how Pod created at podCreated got node n: idle if n registered no
// later than the Pod's creation (a boot takes seconds, so one second's resolution is
// enough), else warm or cold by n's boot timeline.
func startPath(n *corev1.Node, podCreated metav1.Time) string {
	if !n.CreationTimestamp.After(podCreated.Time) {
		return v1.PodStartIdle
	}
	if tl, err := boottimeline.Parse(n.Annotations[boottimeline.Annotation]); err == nil && tl.Warm() {
		return v1.PodStartWarm
	}
	return v1.PodStartCold
}

// recent returns the starts within the window before now, per path, oldest first, and
// drops older ones.
func (s *podStarts) recent(now time.Time) map[string][]time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	cut := 0
	for cut < len(s.window) && now.Sub(s.window[cut].at) > v1.PodStartWindow {
		cut++
	}
	s.window = slices.Delete(s.window, 0, cut)
	out := map[string][]time.Duration{}
	for _, st := range s.window {
		out[st.path] = append(out[st.path], st.took)
	}
	return out
}

// summary is the percentiles of the last hour, in path order idle, warm, cold.
func (s *podStarts) summary(now time.Time) []v1.PodStartPercentiles {
	byPath := s.recent(now)
	var out []v1.PodStartPercentiles
	for _, path := range []string{v1.PodStartIdle, v1.PodStartWarm, v1.PodStartCold} {
		took := byPath[path]
		if len(took) == 0 {
			continue
		}
		slices.Sort(took)
		out = append(out, v1.PodStartPercentiles{
			Path: path, Count: int32(len(took)),
			P50: metav1.Duration{Duration: percentile(took, 0.5)},
			P90: metav1.Duration{Duration: percentile(took, 0.9)},
		})
	}
	return out
}

// percentile of sorted (nearest rank), rounded to a tenth of a second.
func percentile(sorted []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)].Round(100 * time.Millisecond)
}

// startPrior is a start's duration on path before this cluster has one there: measured
// under TCG on 2 cores (docs/benchmarks.md, busybox from zero nodes: cold 28-37 s, warm
// 19-28 s); KVM's are guesses, not measured on our machines.
func startPrior(accel, path string) time.Duration {
	warm := path == v1.PodStartWarm
	switch {
	case accel == "kvm" && warm:
		return 10 * time.Second
	case accel == "kvm":
		return 15 * time.Second
	case warm:
		return 25 * time.Second
	}
	return 35 * time.Second
}

// estimate is how long a Pod on path may take to start: the median of this cluster's
// last five on that path within the hour, else the prior for accel.
func (s *podStarts) estimate(now time.Time, path, accel string) (took time.Duration, measured bool) {
	recent := s.recent(now)[path]
	if n := len(recent); n > 0 {
		last := slices.Clone(recent[max(n-5, 0):])
		slices.Sort(last)
		return percentile(last, 0.5), true
	}
	return startPrior(accel, path), false
}

// aboutWords says an estimate in words: "about 35 s".
func aboutWords(d time.Duration, measured bool) string {
	s := fmt.Sprintf("about %d s", int(math.Ceil(d.Seconds())))
	if measured {
		return s + " (the median of this cluster's recent starts)"
	}
	return s
}

// handler feeds s from the Pod informer.
func (s *podStarts) handler() cache.ResourceEventHandler {
	on := func(o any) {
		if p, ok := o.(*corev1.Pod); ok {
			s.pod(p)
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    on,
		UpdateFunc: func(_, o any) { on(o) },
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if p, ok := o.(*corev1.Pod); ok {
				s.podGone(p)
			}
		},
	}
}
