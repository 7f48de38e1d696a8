package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// fiveJobScript is what each of the five Job Pods runs (busybox): serve its own page,
// then reach the next Pod by name (it runs on another node) and acknowledge that, resolve
// and reach a Service, resolve an external name through the host's resolver, and wait
// for the previous Pod's acknowledgement (not just a request: a starved client's wget
// may be cut off after the server logged it, and then the server must not leave). Each
// step prints one line the test checks; the two waits on other Pods say every 30 tries
// what they see, so a stuck Pod's log tells a name that does not resolve from an
// address that does not answer.
const fiveJobScript = `i=$JOB_COMPLETION_INDEX; next=$(( (i+1) % 5 )); prev=$(( (i+4) % 5 )); me=$(hostname)
mkdir -p /www && echo "reached-$me" > /www/peer.html && echo "web-$me" > /www/index.html && echo ok > /www/ack.html
httpd -f -vv -p 8080 -h /www 2>/tmp/access &
n=0
until timeout 30 wget -q -O- "http://five-$next.peers:8080/peer.html" 2>/tmp/wget.err | grep -q "reached-five-$next"; do
  n=$((n+1)); [ $((n % 30)) = 0 ] && echo "waiting for five-$next.peers ($n tries): nslookup $(timeout 30 nslookup five-$next.peers 2>&1 | tail -n 3 | tr '\n' ' ') wget: $(cat /tmp/wget.err)"
  sleep 1
done
echo "step peer: reached five-$next.peers"
for a in 1 2 3 4 5; do timeout 30 wget -q -O /dev/null "http://five-$next.peers:8080/ack.html" && break; sleep 1; done
until timeout 30 nslookup web.default.svc.cluster.local 2>/dev/null | grep -q "^Name:"; do sleep 1; done
until timeout 30 wget -q -O- http://web/ 2>/dev/null | grep -q "web-five-"; do sleep 1; done
echo "step service: resolved and reached web"
until timeout 30 nslookup "$EXTERNAL_NAME" 2>/dev/null | grep -q "^Name:"; do sleep 1; done
echo "step external: resolved $EXTERNAL_NAME"
n=0
until grep -q "url:/ack.html" /tmp/access; do
  n=$((n+1)); [ $((n % 30)) = 0 ] && echo "waiting for five-$prev's acknowledgement ($n s): $(grep -c 'url:' /tmp/access) requests served"
  sleep 1
done
echo "step served: five-$prev fetched my page"
`

// TestFiveNodeProof is issue 5's proof under TCG: five Job Pods that must not share a
// node boot five microVMs in parallel from zero; each Pod reaches the next one by name
// on another node, resolves and reaches a Service, and resolves an external name (DNS
// answered by its own node); the Pods finish and after the hold the cluster is back at
// zero nodes and zero VMs. The control plane is Ready throughout.
func TestFiveNodeProof(t *testing.T) {
	// Failures are repeated at the very end of the output, after the tenant's state.
	ft := &failureLog{TB: t}
	img := nodeImage(t)
	external := os.Getenv("SOCIALWEB_TEST_EXTERNAL_NAME")
	if external == "" {
		external = "deb.debian.org"
	}
	if _, err := net.LookupHost(external); err != nil {
		ft.Fatalf("the host cannot resolve %s (%v): the test needs one name the host's resolver answers; set SOCIALWEB_TEST_EXTERNAL_NAME", external, err)
	}
	d := newDaemon(t, 1, "--node-image", img)
	d.start()
	d.mustCLI("cluster", "create", "five", "--wait", "--hold", "30s", "--max-nodes", "5",
		// 3 GiB data disks: the host's disk check counts each node's whole disk as taken
		// (it may fill it), and five 10 GiB defaults need ~59 GiB free (seen in CI: the
		// fifth node waited for host capacity).
		"--node-cpus", "1", "--node-memory", "512Mi", "--node-disk", "3Gi")
	_, k := d.tenant("five")
	ctx := ctxT(t, 45*time.Minute)

	// The control plane stays Ready from here to the end.
	var (
		mu       sync.Mutex
		notReady []string
		stop     = make(chan struct{})
		watched  sync.WaitGroup
	)
	watched.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Second):
			}
			out, _, code := d.cli("cluster", "get", "five", "-o", "json")
			var c v1.Cluster
			if code != 0 || json.Unmarshal([]byte(out), &c) != nil || c.Status.Phase != v1.PhaseReady {
				mu.Lock()
				notReady = append(notReady, fmt.Sprintf("%s: exit %d phase %q conditions %+v", time.Now().Format(time.TimeOnly), code, c.Status.Phase, c.Status.Conditions))
				mu.Unlock()
			}
		}
	})
	defer func() {
		close(stop)
		watched.Wait()
		if len(notReady) > 0 {
			ft.Errorf("the control plane was not Ready %d times:\n%s", len(notReady), strings.Join(notReady, "\n"))
		}
	}()

	if nl, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil || len(nl.Items) != 0 {
		ft.Fatalf("step 1: want zero nodes, got %v, %v", nl, err)
	}
	jobLabels := map[string]string{"batch.kubernetes.io/job-name": "five"}
	for _, s := range []*corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Name: "peers"}, Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone,
			Selector: jobLabels, Ports: []corev1.ServicePort{{Port: 8080}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.ServiceSpec{
			Selector: jobLabels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}},
	} {
		if _, err := k.CoreV1().Services("default").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	five, zero, backoff := int32(5), int64(0), int32(0)
	indexed := batchv1.IndexedCompletion
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "five", Namespace: "default"},
		Spec: batchv1.JobSpec{
			Completions: &five, Parallelism: &five, CompletionMode: &indexed, BackoffLimit: &backoff,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: jobLabels},
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &zero,
					Subdomain: "peers",
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
							LabelSelector: &metav1.LabelSelector{MatchLabels: jobLabels},
							TopologyKey:   corev1.LabelHostname,
						}},
					}},
					Containers: []corev1.Container{{
						Name: "main", Image: "busybox:stable", Command: []string{"sh", "-c", fiveJobScript},
						Env: []corev1.EnvVar{{Name: "EXTERNAL_NAME", Value: external}},
					}},
				},
			},
		},
	}
	t0 := time.Now()
	if _, err := k.BatchV1().Jobs("default").Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	podsOf := func() []corev1.Pod {
		pl, err := k.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=five"})
		if err != nil {
			ft.Fatalf("listing the Job's Pods: %v", err)
		}
		return pl.Items
	}
	// Each Pod's log is read as soon as it has finished, from the first wait on: its node
	// goes after the hold, possibly while other Pods have not even started (TCG is slow
	// and uneven), and the log goes with it.
	logs := map[string]string{}
	podLog := func(name string) (string, error) {
		b, err := k.CoreV1().Pods("default").GetLogs(name, &corev1.PodLogOptions{}).Do(ctx).Raw()
		return string(b), err
	}
	readLogs := func(pods []corev1.Pod) {
		for _, p := range pods {
			if _, done := logs[p.Name]; done || (p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed) {
				continue
			}
			l, err := podLog(p.Name)
			if err != nil {
				t.Logf("logs of %s: %v (trying again)", p.Name, err)
				continue
			}
			logs[p.Name] = l
		}
	}

	// 2-3. Five Pods, each running (or done) on its own freshly booted microVM. A node
	// whose Pod finished early may be gone by the time the last Pod starts, so the VMs
	// are counted as they are seen, not at the end.
	nodeOf := map[string]string{}
	vmSeen := map[string]bool{}
	var atFailure string
	d.lastWords = func() string { return atFailure + ft.summary() }
	defer func() {
		if t.Failed() {
			atFailure = describeTenant(ctx, k, 15)
		}
	}()
	livetest.Eventually(ft, 25*time.Minute, time.Second, "five Pods to run (or finish) on five nodes", func() bool {
		for _, name := range vmNamesOf(d.stateDir) {
			vmSeen[name] = true
		}
		pods := podsOf()
		for _, p := range pods {
			if p.Spec.NodeName != "" && p.Status.Phase != corev1.PodPending {
				nodeOf[p.Name] = p.Spec.NodeName
			}
		}
		readLogs(pods)
		return len(nodeOf) >= 5
	})
	t.Logf("five Pods scheduled and started %.1fs after the Job was created", time.Since(t0).Seconds())
	distinct := map[string]bool{}
	var notVMs []string
	for _, n := range nodeOf {
		distinct[n] = true
		if !vmSeen[n] {
			notVMs = append(notVMs, n)
		}
	}
	if len(distinct) != 5 || len(notVMs) > 0 {
		ft.Fatalf("step 3: Pods on nodes %v (%d distinct, want 5); nodes never seen as a qemu process of this daemon: %v (VMs seen: %v)", nodeOf, len(distinct), notVMs, vmSeen)
	}

	// 4-5. Every Pod does its network steps and finishes.
	var finished *batchv1.Job
	for end := time.Now().Add(15 * time.Minute); time.Now().Before(end); time.Sleep(2 * time.Second) {
		readLogs(podsOf())
		j, err := k.BatchV1().Jobs("default").Get(ctx, "five", metav1.GetOptions{})
		if err == nil {
			finished = j
			if j.Status.Succeeded == 5 || j.Status.Failed > 0 {
				break
			}
		}
	}
	readLogs(podsOf())
	if len(logs) != 5 {
		ft.Errorf("read the logs of %d finished Pods, want 5", len(logs))
		// The unfinished ones' logs so far say which step they are stuck at.
		for _, p := range podsOf() {
			if _, done := logs[p.Name]; done {
				continue
			}
			l, err := podLog(p.Name)
			t.Logf("%s on %s, %s, log so far (err %v):\n%s", p.Name, p.Spec.NodeName, p.Status.Phase, err, strings.TrimSpace(l))
		}
	}
	names := make([]string, 0, len(logs))
	for n := range logs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t.Logf("%s on %s:\n%s", n, nodeOf[n], strings.TrimSpace(logs[n]))
		for _, step := range []string{"step peer:", "step service:", "step external:", "step served:"} {
			if !strings.Contains(logs[n], step) {
				ft.Errorf("%s on %s did not get to %q", n, nodeOf[n], step)
			}
		}
	}
	if finished == nil || finished.Status.Succeeded != 5 {
		var status any
		if finished != nil {
			status = finished.Status
		}
		ft.Fatalf("step 5: the Job did not finish with 5 successes: %+v", status)
	}
	t.Logf("the Job finished %.1fs after it was created", time.Since(t0).Seconds())

	// After the hold: zero nodes, zero VMs.
	livetest.Eventually(ft, 4*time.Minute, time.Second, "the cluster to fall back to zero nodes and VMs", func() bool {
		nl, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		return err == nil && len(nl.Items) == 0 && len(qemusOf(d.stateDir)) == 0
	})
	t.Logf("back at zero nodes %.1fs after the Job was created", time.Since(t0).Seconds())
}

// describeTenant lists a tenant's Nodes (with their conditions), Pods and its last
// events, for a failing test's log.
func describeTenant(ctx context.Context, k kubernetes.Interface, events int) string {
	var b strings.Builder
	if nl, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil {
		for _, n := range nl.Items {
			fmt.Fprintf(&b, "node %s:", n.Name)
			for _, c := range n.Status.Conditions {
				fmt.Fprintf(&b, " %s=%s(%s)", c.Type, c.Status, c.Reason)
			}
			b.WriteString("\n")
		}
	}
	if pl, err := k.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{}); err == nil {
		for _, p := range pl.Items {
			fmt.Fprintf(&b, "pod %s/%s: %s on %q", p.Namespace, p.Name, p.Status.Phase, p.Spec.NodeName)
			if p.Status.Reason != "" {
				fmt.Fprintf(&b, " (%s: %s)", p.Status.Reason, p.Status.Message)
			}
			for _, cs := range p.Status.ContainerStatuses {
				if term := cs.State.Terminated; term != nil {
					fmt.Fprintf(&b, " %s exited %d (%s)", cs.Name, term.ExitCode, term.Reason)
				}
			}
			for _, c := range p.Status.Conditions {
				if c.Status != corev1.ConditionTrue {
					fmt.Fprintf(&b, " %s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message)
				}
			}
			b.WriteString("\n")
		}
	}
	if el, err := k.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{}); err == nil {
		at := func(e corev1.Event) time.Time {
			if !e.LastTimestamp.IsZero() {
				return e.LastTimestamp.Time
			}
			return e.EventTime.Time
		}
		sort.SliceStable(el.Items, func(i, j int) bool { return at(el.Items[i]).Before(at(el.Items[j])) })
		// Every Warning but the (frequent) network ones, then the last events.
		last := max(0, len(el.Items)-events)
		for i, e := range el.Items {
			if i >= last || e.Type == corev1.EventTypeWarning && e.Reason != "NodeNetworkProblem" {
				fmt.Fprintf(&b, "event %s %s %s %s: %s\n", at(e).Format(time.TimeOnly), e.Type, e.Reason, e.InvolvedObject.Name, e.Message)
			}
		}
	}
	return b.String()
}
