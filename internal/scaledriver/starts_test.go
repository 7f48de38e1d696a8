package scaledriver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/socialweb-computer/socialweb/internal/boottimeline"
	"github.com/socialweb-computer/socialweb/internal/nodes/fake"
)

func TestStartPhases(t *testing.T) {
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	full := startTimes{
		podCreated: at(0), decided: at(0.2), vmm: at(0.5), registered: at(10.5), ready: at(14),
		running: at(25), timeline: boottimeline.Timeline{"start": 1.5, "up": 4}, pull: 3 * time.Second, pulled: true,
	}
	tests := []struct {
		name   string
		change func(*startTimes)
		want   string
	}{
		{name: "every phase", want: "decision=0.2 vmm=0.3 kernel=1.5 agent=2.5 registered=6 ready=3.5 image=3 container=8"},
		{name: "no boot timeline", change: func(t *startTimes) { t.timeline = nil },
			want: "decision=0.2 vmm=0.3 registered=10 ready=3.5 image=3 container=8"},
		{name: "timeline without up", change: func(t *startTimes) { t.timeline = boottimeline.Timeline{"start": 1.5} },
			want: "decision=0.2 vmm=0.3 registered=10 ready=3.5 image=3 container=8"},
		{name: "no Pulled events", change: func(t *startTimes) { t.pull, t.pulled = 0, false },
			want: "decision=0.2 vmm=0.3 kernel=1.5 agent=2.5 registered=6 ready=3.5 container=11"},
		{name: "images already present", change: func(t *startTimes) { t.pull = 0 },
			want: "decision=0.2 vmm=0.3 kernel=1.5 agent=2.5 registered=6 ready=3.5 image=0 container=11"},
		{name: "pod created after the decision", change: func(t *startTimes) { t.podCreated = at(0.4) },
			want: "decision=0 vmm=0.3 kernel=1.5 agent=2.5 registered=6 ready=3.5 image=3 container=8"},
		{name: "guest phases longer than the host saw", change: func(t *startTimes) { t.timeline = boottimeline.Timeline{"start": 5, "up": 12} },
			want: "decision=0.2 vmm=0.3 kernel=5 agent=7 registered=0 ready=3.5 image=3 container=8"},
		{name: "warm start: no kernel, the agent after the claim", change: func(t *startTimes) {
			t.timeline = boottimeline.Timeline{"start": 1.5, "identity-wait": 2, "identity": 600, "up": 601.5}
		}, want: "decision=0.2 vmm=0.3 kernel=0 agent=1.5 registered=8.5 ready=3.5 image=3 container=8"},
		{name: "warm start without up", change: func(t *startTimes) {
			t.timeline = boottimeline.Timeline{"start": 1.5, "identity-wait": 2, "identity": 600}
		}, want: "decision=0.2 vmm=0.3 registered=10 ready=3.5 image=3 container=8"},
		{name: "running seen before ready", change: func(t *startTimes) { t.running, t.pulled = at(13.9), false },
			want: "decision=0.2 vmm=0.3 kernel=1.5 agent=2.5 registered=6 ready=3.5 container=0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := full
			if tt.change != nil {
				tt.change(&st)
			}
			var got []string
			for _, p := range st.phases() {
				got = append(got, fmt.Sprintf("%s=%g", p.name, p.took.Seconds()))
			}
			if g := strings.Join(got, " "); g != tt.want {
				t.Errorf("phases\n got %s\nwant %s", g, tt.want)
			}
		})
	}
}

func startPod(name string, uid types.UID, created time.Time, mods ...func(*corev1.Pod)) *corev1.Pod {
	p := testPod(name, mods...)
	p.UID, p.CreationTimestamp = uid, metav1.NewTime(created)
	return p
}

func onNode(node string) func(*corev1.Pod) { return func(p *corev1.Pod) { p.Spec.NodeName = node } }

func running(p *corev1.Pod) {
	p.Status.Phase = corev1.PodRunning
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
}

func readyNode(name string, ready bool) *corev1.Node {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}}}}
}

// TestStartsFollowsOnlyItsNodesFirstPod drives the tracker by hand: which nodes and which
// Pod it follows, and when it forgets.
func TestStartsFollowsOnlyItsNodesFirstPod(t *testing.T) {
	daemonPod := func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds", UID: "ds"}}
	}
	tests := []struct {
		name string
		// run feeds s; the clock is at t0+10s.
		run     func(s *starts)
		wantPod string // the first Pod recorded for node "n", "" for no record
		created time.Time
	}{
		{
			name: "a node it booted, its first Pod seen as created",
			run: func(s *starts) {
				s.booted("n", t0, t0, readyNode("n", true))
				s.pod(startPod("a", "a", t0.Add(9700*time.Millisecond)))
				s.pod(startPod("a", "a", t0.Add(9700*time.Millisecond), onNode("n"), running))
			},
			wantPod: "a", created: t0.Add(10 * time.Second), // first seen, finer than the timestamp
		},
		{
			name: "a Pod first seen long after its creation keeps its timestamp",
			run: func(s *starts) {
				s.booted("n", t0, t0, readyNode("n", true))
				s.pod(startPod("a", "a", t0.Add(5*time.Second)))
				s.pod(startPod("a", "a", t0.Add(5*time.Second), onNode("n"), running))
			},
			wantPod: "a", created: t0.Add(5 * time.Second),
		},
		{
			name: "an adopted node is not followed",
			run: func(s *starts) {
				s.node(readyNode("n", true))
				s.pod(startPod("a", "a", t0, onNode("n"), running))
			},
		},
		{
			name: "a DaemonSet's Pod is not the node's first",
			run: func(s *starts) {
				s.booted("n", t0, t0, nil)
				s.pod(startPod("ds", "ds", t0, onNode("n"), daemonPod, running))
				s.pod(startPod("b", "b", t0, onNode("n"), running))
			},
			wantPod: "b", created: t0,
		},
		{
			name: "a first Pod deleted before it ran gives way to the next",
			run: func(s *starts) {
				s.booted("n", t0, t0, nil)
				a := startPod("a", "a", t0, onNode("n"))
				s.pod(a)
				s.podGone(a)
				s.pod(startPod("b", "b", t0, onNode("n"), running))
			},
			wantPod: "b", created: t0,
		},
		{
			name: "a node deleted is forgotten",
			run: func(s *starts) {
				s.booted("n", t0, t0, nil)
				s.forget("n")
				s.pod(startPod("a", "a", t0, onNode("n"), running))
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &clock{t: t0.Add(10 * time.Second)}
			s := newStarts(c.now)
			tt.run(s)
			if got := s.due(c.now(), startSettle); len(got) > 0 {
				t.Errorf("recorded before settling: %+v", got)
			}
			c.advance(startSettle)
			got := s.due(c.now(), startSettle)
			if tt.wantPod == "" {
				if len(got) > 0 {
					t.Errorf("recorded %+v, want nothing", got)
				}
				return
			}
			if len(got) != 1 || got[0].node != "n" || got[0].pod.name != tt.wantPod || !got[0].times.podCreated.Equal(tt.created) {
				t.Fatalf("recorded %+v, want node n, pod %s created %s", got, tt.wantPod, tt.created)
			}
			if len(s.nodes) != 0 || len(s.unbound) != 0 {
				t.Errorf("kept %v and %v after recording", s.nodes, s.unbound)
			}
		})
	}
}

// waitStart waits until the driver's informer handlers have stamped what ok looks for.
func (r *rig) waitStart(node string, ok func(nodeStart) bool) {
	r.t.Helper()
	for range 1000 {
		r.d.starts.mu.Lock()
		ns := r.d.starts.nodes[node]
		done := ns != nil && ok(*ns)
		r.d.starts.mu.Unlock()
		if done {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.t.Fatalf("node %s: the start tracker did not see the change", node)
}

// TestStartBreakdownMetrics boots a node through the driver and takes it through each
// phase on the fake clock, then checks the histogram: one observation per phase, once.
func TestStartBreakdownMetrics(t *testing.T) {
	tests := []struct {
		name     string
		timeline string
		warm     bool
		// the guest phases: kernel, agent, registered (together the 10s from the VMM to
		// the Node registered)
		kernel, agent, registered string
	}{
		{name: "cold", timeline: `{"start":1.5,"mounts":1.6,"up":4}`, kernel: "1.5", agent: "2.5", registered: "6"},
		{name: "warm", timeline: `{"start":1.5,"identity-wait":2,"identity":300,"up":301}`, warm: true, kernel: "0", agent: "1", registered: "9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { testStartBreakdown(t, tt.timeline, tt.warm, tt.kernel, tt.agent, tt.registered) })
	}
}

func testStartBreakdown(t *testing.T, timeline string, warm bool, kernel, agent, registered string) {
	ctx := context.Background()
	pod := startPod("job-1", "job-1-uid", t0)
	r := newRig(t, Config{Resync: time.Hour}, false, []runtime.Object{pod})
	// A provider that does not register Nodes (the test does, when it likes), and whose
	// Create takes 2s.
	r.prov = fake.New(fake.WithClock(r.clock.now), fake.WithOnCall(func(c fake.Call) {
		if c.Op == fake.OpCreate {
			r.clock.advance(2 * time.Second)
		}
	}))
	r.d.provider = r.prov
	var logs bytes.Buffer
	r.d.log = slog.New(slog.NewJSONHandler(&logs, nil))
	r.clock.advance(300 * time.Millisecond) // the informer sees the Pod 0.3s after its creation
	r.start(ctx)
	r.clock.advance(700 * time.Millisecond)
	if dec, err := r.d.RunPass(ctx); err != nil || dec.Target != 1 {
		t.Fatalf("first pass: %v, %v", dec, err)
	}
	insts, err := r.prov.List(ctx)
	if err != nil || len(insts) != 1 {
		t.Fatalf("machines %v, %v", insts, err)
	}
	name := insts[0].Name

	r.clock.advance(10 * time.Second)
	n := readyNode(name, false)
	n.Annotations = map[string]string{boottimeline.Annotation: timeline}
	if _, err := r.client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitStart(name, func(ns nodeStart) bool { return !ns.registered.IsZero() && ns.timeline != nil })

	r.clock.advance(5 * time.Second)
	n.Status.Conditions[0].Status = corev1.ConditionTrue
	if _, err := r.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitStart(name, func(ns nodeStart) bool { return !ns.ready.IsZero() })

	r.clock.advance(time.Second)
	pod.Spec.NodeName = name
	if pod, err = r.client.CoreV1().Pods("default").Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitStart(name, func(ns nodeStart) bool { return ns.pod.uid == pod.UID })
	for i, e := range []struct {
		uid types.UID
		msg string
	}{
		{pod.UID, `Successfully pulled image "busybox" in 2.5s (3s including waiting). Image size: 1 bytes.`},
		{pod.UID, `Container image "pause" already present on machine`},
		{"another-pod", `Successfully pulled image "big" in 100s (100s including waiting). Image size: 1 bytes.`},
	} {
		ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pulled-%d", i), Namespace: "default"},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "default", UID: e.uid}, Reason: "Pulled", Message: e.msg}
		if _, err := r.client.CoreV1().Events("default").Create(ctx, ev, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	r.clock.advance(6 * time.Second)
	running(pod)
	if _, err := r.client.CoreV1().Pods("default").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitStart(name, func(ns nodeStart) bool { return !ns.running.IsZero() })

	if _, err := r.d.RunPass(ctx); err != nil {
		t.Fatal(err)
	}
	if c := testutil.CollectAndCount(r.d.metrics.starts); c != 0 {
		t.Fatalf("%d series before the Pulled events had time to arrive", c)
	}
	r.clock.advance(startSettle)
	for range 2 { // recorded once
		if _, err := r.d.RunPass(ctx); err != nil {
			t.Fatal(err)
		}
	}
	out, err := testutil.CollectAndFormat(r.d.metrics.starts, expfmt.TypeTextPlain, "socialweb_node_start_phase_seconds")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(l, `socialweb_node_start_phase_seconds_sum{cluster="liveweb",phase="`); ok {
			phase, v, _ := strings.Cut(rest, `"} `)
			got[phase] = v
		}
		if strings.HasPrefix(l, "socialweb_node_start_phase_seconds_count") && !strings.HasSuffix(l, " 1") {
			t.Errorf("not one observation: %s", l)
		}
	}
	// Pod created at t0, seen at t0+0.3s (the finer time, so its creation), decided t0+1s, VMM t0+3s, registered t0+13s,
	// Ready t0+18s, containers running t0+25s.
	want := map[string]string{"decision": "0.7", "vmm": "2", "kernel": kernel, "agent": agent, "registered": registered,
		"ready": "5", "image": "3", "container": "4"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("phase sums %v, want %v\n%s", got, want, out)
	}
	// The log line bench/nodeboot reads.
	bt, err := json.Marshal(timeline)
	if err != nil {
		t.Fatal(err)
	}
	wantLog := fmt.Sprintf(`"msg":"node start","node":"%s","pod":"default/job-1","warm":%t,"seconds":{"decision":0.7,"vmm":2,"kernel":%s,"agent":%s,`+
		`"registered":%s,"ready":5,"image":3,"container":4,"total":24.7},"bootTimeline":%s}`, name, warm, kernel, agent, registered, bt)
	if c := strings.Count(logs.String(), `"msg":"node start"`); c != 1 || !strings.Contains(logs.String(), wantLog) {
		t.Errorf("log has %d node start lines, want 1:\n%s\nwant\n%s", c, logs.String(), wantLog)
	}
	kind, other := "cold", "warm"
	if warm {
		kind, other = other, kind
	}
	if got := testutil.ToFloat64(r.d.metrics.kinds.WithLabelValues("liveweb", kind)); got != 1 {
		t.Errorf("socialweb_node_starts_total{start=%q} = %g, want 1", kind, got)
	}
	if c := testutil.CollectAndCount(r.d.metrics.kinds); c != 1 {
		t.Errorf("%d series of socialweb_node_starts_total, want only start=%q (none %q)", c, kind, other)
	}
	if len(r.d.starts.nodes) != 0 {
		t.Errorf("the node is still followed after it was recorded")
	}
}
