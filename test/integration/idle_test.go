package integration

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// TestIdleNodesOnASchedule: with --idle-nodes 1 in a window that is open now, a node
// boots with nothing to run, a Pod then starts on it without a boot (the idle path), the
// Cluster counts that node claimed, and another idle node boots in its place. A second
// cluster, applied as kubectl would with a zone no tz database knows, runs its scale
// driver with no idle node and says why (BadIdleSchedule). What happens when the window
// closes (the nodes go after the hold, the cluster may sleep, it wakes ahead of the next
// window) is TestIdleNodes', TestIdleNodesInTheirWindow's and sleep's TestDecide's:
// waiting for a window to close here cost CI six minutes.
func TestIdleNodesOnASchedule(t *testing.T) {
	img := nodeImage(t)
	d := newDaemon(t, 2, "--node-image", img) // warm, and badzone below
	d.start()
	// Every day, all day: open now, whatever the time (parsed as a window all the same).
	schedule := "Mon-Sun 00:00-24:00 UTC"
	d.mustCLI("cluster", "create", "warm", "--wait", "--idle-nodes", "1", "--idle-schedule", schedule,
		"--hold", "10s", "--max-nodes", "2", "--node-disk", "3Gi")
	_, k := d.tenant("warm")
	ctx := ctxT(t, 15*time.Minute)

	// An idle node comes with nothing asking for it.
	var idle string
	livetest.Eventually(t, 4*time.Minute, time.Second, "an idle node to be Ready", func() bool {
		nl, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil || len(nl.Items) != 1 {
			return false
		}
		idle = nl.Items[0].Name
		for _, c := range nl.Items[0].Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue
			}
		}
		return false
	})
	if st := d.cluster("warm").Status.IdleNodes; st == nil || st.Wanted != 1 || st.Spare != 1 {
		t.Errorf("status.idleNodes %+v, want wanted 1, spare 1", st)
	}

	// A Pod starts on it, with no boot.
	grace := int64(1)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "quick", Namespace: "default"}, Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &grace,
		Containers: []corev1.Container{{Name: "c", Image: "busybox:stable", Command: []string{"sleep", "20"}}},
	}}
	tPod := time.Now()
	if _, err := k.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	livetest.Eventually(t, 2*time.Minute, 250*time.Millisecond, "the Pod to run", func() bool {
		p, err := k.CoreV1().Pods("default").Get(ctx, "quick", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning
	})
	p, _ := k.CoreV1().Pods("default").Get(ctx, "quick", metav1.GetOptions{})
	t.Logf("the Pod ran on %s %s after it was created", p.Spec.NodeName, time.Since(tPod).Round(100*time.Millisecond))
	if p.Spec.NodeName != idle {
		t.Errorf("the Pod ran on %s, want the idle node %s", p.Spec.NodeName, idle)
	}
	// While the Pod's 20 s last: its node is claimed, no longer spare.
	livetest.Eventually(t, 10*time.Second, 250*time.Millisecond, "status.idleNodes to count the taken node claimed", func() bool {
		st := d.cluster("warm").Status.IdleNodes
		return st != nil && st.Claimed == 1
	})
	livetest.Eventually(t, time.Minute, time.Second, "status.podStarts to count an idle start", func() bool {
		for _, s := range d.cluster("warm").Status.PodStarts {
			if s.Path == v1.PodStartIdle && s.Count == 1 {
				return true
			}
		}
		return false
	})
	// Another idle node boots for the next Pod.
	livetest.Eventually(t, time.Minute, time.Second, "a second node to refill the idle one", func() bool {
		nl, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		return (err == nil && len(nl.Items) == 2) || len(qemusOf(d.stateDir)) == 2
	})

	if out := d.mustCLI("cluster", "get", "warm", "-o", "yaml"); !strings.Contains(out, "idleSchedule: "+schedule) {
		t.Errorf("cluster get does not show the schedule %q:\n%s", schedule, out)
	}

	// A zone no tz database knows passes the CRD (a pattern cannot know zones): the
	// cluster's scale driver runs all the same, keeps no idle node, and the Cluster says why.
	bad := &v1.Cluster{TypeMeta: metav1.TypeMeta{APIVersion: v1.Group + "/" + v1.Version, Kind: v1.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: "badzone"},
		Spec:       v1.ClusterSpec{IdleNodes: 1, IdleSchedule: "Mon-Sun 00:00-24:00 Mars/Olympus", MaxNodes: 1}}
	u, err := bad.ToUnstructured()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.management().Resource(v1.ClusterResource).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating a Cluster whose idleSchedule has an unknown zone, as kubectl would: %v", err)
	}
	d.waitPhase("badzone", v1.PhaseReady, 3*time.Minute)
	livetest.Eventually(t, time.Minute, time.Second, "the IdleSchedule condition to say BadIdleSchedule", func() bool {
		c := meta.FindStatusCondition(d.cluster("badzone").Status.Conditions, v1.ConditionIdleSchedule)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1.ReasonBadIdleSchedule &&
			strings.Contains(c.Message, `zone "Mars/Olympus"`)
	})
	if st := d.cluster("badzone").Status.IdleNodes; st == nil || st.Wanted != 0 {
		t.Errorf("badzone status.idleNodes %+v, want wanted 0", st)
	}
	if out := d.mustCLI("cluster", "get", "badzone"); !strings.Contains(out, v1.ReasonBadIdleSchedule) {
		t.Errorf("cluster get badzone does not show BadIdleSchedule:\n%s", out)
	}
	for _, name := range vmNamesOf(d.stateDir) {
		if strings.HasPrefix(name, "badzone-") {
			t.Errorf("node %s booted for badzone with nothing to run: its bad schedule was read as always", name)
		}
	}
}
