package scaledriver

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/boottimeline"
	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/scale"
)

func (s *recStatus) RecordPodStarts(_ context.Context, c string, starts []v1.PodStartPercentiles) error {
	if c != cluster {
		return errors.New("cluster " + c)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.starts = append(s.starts, slices.Clone(starts))
	return nil
}

func (s *recStatus) RecordIdleNodes(_ context.Context, c string, idle v1.IdleNodesStatus) error {
	if c != cluster {
		return errors.New("cluster " + c)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.idle = append(s.idle, [4]int{int(idle.Wanted), int(idle.Spare), int(idle.Booting), int(idle.Claimed)})
	return nil
}

func (s *recStatus) getStarts() [][]v1.PodStartPercentiles {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.starts)
}

// nodeAt is a Node registered at created; warm gives it a warm-pool VM's boot timeline.
func nodeAt(name string, created time.Time, warm bool) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)}}
	raw := `{"start":0,"up":3}`
	if warm {
		raw = `{"start":0,"identity-wait":2,"identity":40,"up":42}`
	}
	if _, err := boottimeline.Parse(raw); err != nil {
		panic(err)
	}
	n.Annotations = map[string]string{boottimeline.Annotation: raw}
	return n
}

// TestPodStartPaths drives the tracker by hand: which Pods count, under which path, and
// for how long.
func TestPodStartPaths(t *testing.T) {
	nodesByName := map[string]*corev1.Node{
		"up":   nodeAt("up", t0.Add(-time.Hour), false),
		"cold": nodeAt("cold", t0.Add(20*time.Second), false),
		"warm": nodeAt("warm", t0.Add(8*time.Second), true),
	}
	lookup := func(name string) (*corev1.Node, error) {
		if n, ok := nodesByName[name]; ok {
			return n, nil
		}
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, name)
	}
	tests := []struct {
		name string
		// run feeds s; the clock is at t0+30s.
		run      func(s *podStarts)
		wantPath string // "" for nothing recorded
		wantTook time.Duration
	}{
		{
			name: "a Pod on a node that was up is idle, timed from its first sight",
			run: func(s *podStarts) {
				s.pod(startPod("a", "a", t0.Add(29500*time.Millisecond)))
				s.pod(startPod("a", "a", t0.Add(29500*time.Millisecond), onNode("up"), running))
			},
			wantPath: v1.PodStartIdle, wantTook: 0,
		},
		{
			name: "a Pod on a node registered after it is cold",
			run: func(s *podStarts) {
				s.pod(startPod("a", "a", t0))
				s.pod(startPod("a", "a", t0, onNode("cold"), running))
			},
			wantPath: v1.PodStartCold, wantTook: 30 * time.Second,
		},
		{
			name: "a Pod on a claimed warm-pool VM is warm",
			run: func(s *podStarts) {
				s.pod(startPod("a", "a", t0))
				s.pod(startPod("a", "a", t0, onNode("warm"), running))
			},
			wantPath: v1.PodStartWarm, wantTook: 30 * time.Second,
		},
		{
			name: "bound but not all containers started: nothing yet",
			run: func(s *podStarts) {
				s.pod(startPod("a", "a", t0))
				s.pod(startPod("a", "a", t0, onNode("cold")))
			},
		},
		{
			name: "a Pod first seen running (the driver started after it) is not counted",
			run: func(s *podStarts) {
				s.pod(startPod("a", "a", t0, onNode("cold"), running))
			},
		},
		{
			name: "a DaemonSet's Pod is not counted",
			run: func(s *podStarts) {
				ds := func(p *corev1.Pod) { p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds"}} }
				s.pod(startPod("a", "a", t0, ds))
				s.pod(startPod("a", "a", t0, onNode("cold"), ds, running))
			},
		},
		{
			name: "a Pod deleted while waiting is forgotten",
			run: func(s *podStarts) {
				s.pod(startPod("a", "a", t0))
				s.podGone(startPod("a", "a", t0))
				s.pod(startPod("a", "a", t0, onNode("cold"), running))
			},
		},
		{
			name: "a Pod whose node is gone is not counted",
			run: func(s *podStarts) {
				s.pod(startPod("a", "a", t0))
				s.pod(startPod("a", "a", t0, onNode("gone"), running))
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []podStart
			now := func() time.Time { return t0.Add(30 * time.Second) }
			s := newPodStarts(now, lookup, func(path string, took time.Duration) {
				got = append(got, podStart{path: path, took: took})
			})
			tt.run(s)
			if tt.wantPath == "" {
				if len(got) != 0 {
					t.Fatalf("recorded %+v, want nothing", got)
				}
				return
			}
			if len(got) != 1 || got[0].path != tt.wantPath || got[0].took != tt.wantTook {
				t.Fatalf("recorded %+v, want one %s start of %s", got, tt.wantPath, tt.wantTook)
			}
			// Seen again (a later update), it is not counted twice.
			s.pod(startPod("a", "a", t0, onNode("cold"), running))
			if len(got) != 1 {
				t.Errorf("recorded %d starts after a repeat update, want 1", len(got))
			}
		})
	}
}

func TestPodStartSummary(t *testing.T) {
	secs := func(ss ...float64) []time.Duration {
		var out []time.Duration
		for _, s := range ss {
			out = append(out, time.Duration(s*float64(time.Second)))
		}
		return out
	}
	tests := []struct {
		name     string
		cold     []time.Duration // recorded at t0 + i seconds
		old      int             // how many of them are older than the window at the summary
		want     []v1.PodStartPercentiles
		estimate time.Duration // for the cold path
		measured bool
	}{
		{name: "none: no entry, the TCG prior", estimate: 35 * time.Second},
		{name: "one", cold: secs(31.04), want: []v1.PodStartPercentiles{{Path: "cold", Count: 1,
			P50: metav1.Duration{Duration: 31 * time.Second}, P90: metav1.Duration{Duration: 31 * time.Second}}},
			estimate: 31 * time.Second, measured: true},
		{name: "ten: nearest rank", cold: secs(10, 1, 9, 2, 8, 3, 7, 4, 6, 5), want: []v1.PodStartPercentiles{{Path: "cold", Count: 10,
			P50: metav1.Duration{Duration: 5 * time.Second}, P90: metav1.Duration{Duration: 9 * time.Second}}},
			estimate: 5 * time.Second, measured: true}, // the median of the last five: 3 7 4 6 5
		{name: "older than an hour drop out", cold: secs(100, 100, 20), old: 2, want: []v1.PodStartPercentiles{{Path: "cold", Count: 1,
			P50: metav1.Duration{Duration: 20 * time.Second}, P90: metav1.Duration{Duration: 20 * time.Second}}},
			estimate: 20 * time.Second, measured: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newPodStarts(time.Now, nil, nil)
			for i, took := range tt.cold {
				s.window = append(s.window, podStart{at: t0.Add(time.Duration(i) * time.Second), path: v1.PodStartCold, took: took})
			}
			at := t0.Add(time.Duration(len(tt.cold)) * time.Second)
			if tt.old > 0 {
				at = t0.Add(time.Duration(tt.old-1)*time.Second + v1.PodStartWindow + time.Millisecond)
			}
			if got := s.summary(at); !slices.Equal(got, tt.want) {
				t.Errorf("summary %+v, want %+v", got, tt.want)
			}
			got, measured := s.estimate(at, v1.PodStartCold, "tcg")
			if got != tt.estimate || measured != tt.measured {
				t.Errorf("estimate %s (measured %t), want %s (%t)", got, measured, tt.estimate, tt.measured)
			}
		})
	}
}

// podEvents lists the Events about Pods in namespace, as "Type Reason: note".
func podEvents(t *testing.T, r *rig, namespace string) []string {
	t.Helper()
	el, err := r.client.EventsV1().Events(namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range el.Items {
		if e.Regarding.Kind == "Pod" {
			out = append(out, e.Type+" "+e.Reason+" "+e.Regarding.Name+": "+e.Note)
		}
	}
	slices.Sort(out)
	return out
}

// A Pod that waits for a node hears, in its own namespace, that a node is booting for it,
// its size and about how long; if that node fails, the Pod hears that too, and then of
// the next one.
func TestPodsHearWhyTheyWait(t *testing.T) {
	inCI := func(p *corev1.Pod) { p.Namespace = "ci" }
	tests := []struct {
		name string
		warm bool
		want string
	}{
		{"cold", false, "Normal NodeBooting job: booting node liveweb-"},
		{"warm", true, "Normal NodeBooting job: starting node liveweb-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, Config{}, false, []runtime.Object{testPod("job", inCI)})
			if tt.warm {
				r.prov.WarmNext(nodes.WarmStart{Claimed: true})
			}
			ctx := context.Background()
			r.start(ctx)
			if dec, err := r.d.RunPass(ctx); err != nil || dec.Action != scale.Provision {
				t.Fatalf("first pass: %s, %v; want Provision", dec, err)
			}
			evs := podEvents(t, r, "ci")
			if len(evs) != 1 || !strings.HasPrefix(evs[0], tt.want) ||
				!strings.Contains(evs[0], "(2 vCPU / 2048 MiB) for this Pod") || !strings.Contains(evs[0], "it starts in about ") {
				t.Fatalf("events in the Pod's namespace %q, want one starting %q naming the size and an estimate", evs, tt.want)
			}
			if got := podEvents(t, r, "default"); len(got) != 0 {
				t.Errorf("Pod events in default %q, want none", got)
			}

			name := r.prov.Instances()[0].Name
			r.prov.Crash(name)
			r.clock.advance(time.Second)
			if _, err := r.d.RunPass(ctx); err != nil {
				t.Fatal(err)
			}
			evs = podEvents(t, r, "ci")
			var failed, booting int
			for _, e := range evs {
				switch {
				case strings.HasPrefix(e, "Warning NodeBootFailed job: node "+name+" failed to start (VMExited): node "+name+": its VM stopped"):
					failed++
				case strings.HasPrefix(e, "Normal NodeBooting job: "):
					booting++
				}
			}
			if failed != 1 || booting != 2 {
				t.Errorf("events %q, want the failure and a second node booting", evs)
			}
		})
	}
}

// Starts reach the histogram by path and the Cluster's status.
func TestPodStartsReachTheMetricAndTheCluster(t *testing.T) {
	r := newRig(t, Config{}, false, []runtime.Object{testPod("job")}, "old")
	ctx := context.Background()
	r.start(ctx)
	// The fake's clock is the rig's: node "old" registered at t0, no later than the Pod,
	// which was seen waiting then.
	r.clock.advance(4 * time.Second)
	p := startPod("job", "", t0, onNode("old"), running)
	if _, err := r.client.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.settle()
	if _, err := r.d.RunPass(ctx); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(r.d.metrics.podStarts); n != 1 {
		t.Fatalf("%d pod start series, want 1 (idle)", n)
	}
	want := []v1.PodStartPercentiles{{Path: "idle", Count: 1, P50: metav1.Duration{Duration: 4 * time.Second}, P90: metav1.Duration{Duration: 4 * time.Second}}}
	got := r.status.getStarts()
	if len(got) != 1 || !slices.Equal(got[0], want) {
		t.Fatalf("status podStarts %+v, want one report %+v", got, want)
	}
	// Nothing new: not recorded again.
	if _, err := r.d.RunPass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r.status.getStarts(); len(got) != 1 {
		t.Errorf("%d reports after a pass with nothing new, want 1", len(got))
	}
}

// A Pod hears of its node when the provider takes the node on, before Create returns,
// and hears that it failed when the rest of Create fails.
func TestPodsHearBeforeCreateReturns(t *testing.T) {
	r := newRig(t, Config{}, false, []runtime.Object{testPod("job", func(p *corev1.Pod) { p.Namespace = "ci" })})
	r.prov.FailNextAfterAdmit(errors.New("cloning the root disk: no space left on device"))
	ctx := context.Background()
	r.start(ctx)
	if _, err := r.d.RunPass(ctx); err == nil {
		t.Fatal("first pass: no error, want the failed Create's")
	}
	evs := podEvents(t, r, "ci")
	var booting, failed int
	for _, e := range evs {
		switch {
		case strings.HasPrefix(e, "Normal NodeBooting job: booting node liveweb-"):
			booting++
		case strings.HasPrefix(e, "Warning NodeBootFailed job: node liveweb-") && strings.Contains(e, "no space left on device"):
			failed++
		}
	}
	if booting != 1 || failed != 1 {
		t.Fatalf("events %q, want one NodeBooting (told from Admitted, as Create did not return the node) and one NodeBootFailed naming the cause", evs)
	}
}

// A Pod that arrives while a node is booting for another, and fits on it, hears that it
// waits for that node (once), not nothing: no node is booted for it.
func TestPodsHearOfANodeAlreadyBooting(t *testing.T) {
	inCI := func(p *corev1.Pod) { p.Namespace = "ci" }
	r := newRig(t, Config{}, false, []runtime.Object{testPod("first", inCI)})
	ctx := context.Background()
	r.start(ctx)
	if dec, err := r.d.RunPass(ctx); err != nil || dec.Action != scale.Provision {
		t.Fatalf("first pass: %s, %v; want Provision", dec, err)
	}
	name := r.prov.Instances()[0].Name
	// The fake registers the Node at once; without it the machine is booting (and
	// followed from its decision, which the Node's going ended).
	if err := r.client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.settle()
	// The informer's delete handler (which forgets the node) may run after the cache
	// shows the Node gone; wait for it, or it forgets the boot noted next.
	for i := 0; ; i++ {
		if _, ok := r.d.starts.decidedAt(name); !ok {
			break
		}
		if i == 400 {
			t.Fatal("the Node's deletion never reached the start tracker")
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.d.starts.booted(name, t0, t0, nil)
	if _, err := r.client.CoreV1().Pods("ci").Create(ctx, testPod("second", inCI), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.settle()
	for range 2 { // the second pass tells no one again
		r.clock.advance(3 * time.Second)
		if dec, err := r.d.RunPass(ctx); err != nil || dec.Action == scale.Provision {
			t.Fatalf("pass: %s, %v; want no new node", dec, err)
		}
	}
	var first, second []string
	for _, e := range podEvents(t, r, "ci") {
		switch {
		case strings.Contains(e, " first: "):
			first = append(first, e)
		case strings.Contains(e, " second: "):
			second = append(second, e)
		}
	}
	want := "Normal NodeBooting second: node " + name + " (2 vCPU / 2048 MiB), already booting, takes this Pod; it starts in about "
	if len(second) != 1 || !strings.HasPrefix(second[0], want) || !strings.Contains(second[0], "(it began 3s ago)") {
		t.Errorf("the second Pod's events %q, want one starting %q and saying when the boot began", second, want)
	}
	if len(first) != 1 {
		t.Errorf("the first Pod's events %q, want only its own NodeBooting", first)
	}
}
