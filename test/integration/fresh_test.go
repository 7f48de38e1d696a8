package integration

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// TestFreshNodePerJob is one job per VM, never reused (cluster create
// --fresh-node-per-job): two CI job Pods in a row (GitLab Runner's label) run on
// different nodes, the second cannot see a file the first left in the node's hostPath,
// and the first node is gone within seconds of its job ending although the hold is long.
// The starts land in socialweb_pod_start_seconds{path="cold"} and the Cluster's
// status.podStarts, which `cluster get` prints.
func TestFreshNodePerJob(t *testing.T) {
	img := nodeImage(t)
	metrics := fmt.Sprintf("127.0.0.1:%d", livetest.FreePort(t))
	d := newDaemon(t, 1, "--node-image", img, "--metrics-address", metrics)
	d.start()
	d.mustCLI("cluster", "create", "fresh", "--wait", "--fresh-node-per-job", "--hold", "10m", "--max-nodes", "2", "--node-disk", "3Gi")
	if c := d.cluster("fresh"); !c.Spec.FreshNodePerJob {
		t.Fatalf("the Cluster's spec lacks freshNodePerJob: %+v", c.Spec)
	}
	_, k := d.tenant("fresh")
	ctx := ctxT(t, 15*time.Minute)

	grace := int64(1)
	job := func(name, script string) *corev1.Pod {
		hostPath := corev1.HostPathDirectoryOrCreate
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"job.runner.gitlab.com/pod": name}},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &grace,
				Containers: []corev1.Container{{Name: "build", Image: "busybox:stable", Command: []string{"sh", "-c", script},
					VolumeMounts: []corev1.VolumeMount{{Name: "host", MountPath: "/host"}}}},
				Volumes: []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/tmp/ci", Type: &hostPath}}}},
			},
		}
	}
	// runJob runs one job until its script printed "done", reads its log, then, as the
	// runner does at a job's end, deletes its Pod. (The script then sleeps: with a fresh
	// node per job, a node goes as soon as its job Pod ends, its logs with it.)
	runJob := func(p *corev1.Pod) (node, log string) {
		t.Helper()
		if _, err := k.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		livetest.Eventually(t, 8*time.Minute, time.Second, "job "+p.Name+" to print done", func() bool {
			got, err := k.CoreV1().Pods("default").Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("job %s: %v", p.Name, err)
			}
			node = got.Spec.NodeName
			if got.Status.Phase == corev1.PodFailed || got.Status.Phase == corev1.PodSucceeded {
				t.Fatalf("job %s ended before it printed done: %s %+v", p.Name, got.Status.Phase, got.Status.ContainerStatuses)
			}
			if got.Status.Phase != corev1.PodRunning {
				return false
			}
			b, err := k.CoreV1().Pods("default").GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
			log = string(b)
			return err == nil && strings.Contains(log, "done")
		})
		if err := k.CoreV1().Pods("default").Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return node, log
	}

	first, _ := runJob(job("job-1", "echo secret-of-job-1 > /host/left-behind; echo done; exec sleep 3600"))
	tEnd := time.Now()
	t.Logf("job 1 ran on %s", first)
	livetest.Eventually(t, 60*time.Second, 500*time.Millisecond, "job 1's node to be gone", func() bool {
		_, err := k.CoreV1().Nodes().Get(ctx, first, metav1.GetOptions{})
		return apierrors.IsNotFound(err) && len(qemusOf(d.stateDir)) == 0
	})
	gone := time.Since(tEnd)
	t.Logf("job 1's node %s and its VM gone %s after the job ended (hold 10m)", first, gone.Round(100*time.Millisecond))
	if gone > 30*time.Second {
		t.Errorf("job 1's node went %s after its job, want within seconds (no hold)", gone.Round(time.Second))
	}

	second, log := runJob(job("job-2", "if [ -e /host/left-behind ]; then echo SAW; cat /host/left-behind; else echo clean; fi; echo done; exec sleep 3600"))
	t.Logf("job 2 ran on %s: %q", second, strings.TrimSpace(log))
	if second == first || second == "" {
		t.Errorf("job 2 ran on %q, job 1 on %q; want two different nodes", second, first)
	}
	if strings.Contains(log, "SAW") || strings.Contains(log, "secret-of-job-1") {
		t.Errorf("job 2 saw what job 1 left on its node: %q", log)
	}
	if !strings.Contains(log, "clean") {
		t.Errorf("job 2's log %q, want it to say clean", log)
	}

	// Both starts were cold boots: the histogram and the Cluster have them.
	livetest.Eventually(t, time.Minute, time.Second, "status.podStarts to count two cold starts", func() bool {
		for _, s := range d.cluster("fresh").Status.PodStarts {
			if s.Path == "cold" && s.Count == 2 && s.P50.Duration > 0 && s.P90.Duration >= s.P50.Duration {
				return true
			}
		}
		return false
	})
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `socialweb_pod_start_seconds_count{cluster="fresh",path="cold"} 2`; !strings.Contains(string(body), want) {
		t.Errorf("metrics lack %s:\n%s", want, grepLines(string(body), "socialweb_pod_start"))
	}
	if out := d.mustCLI("cluster", "get", "fresh"); !strings.Contains(out, "cold") {
		t.Errorf("cluster get does not show the cold starts:\n%s", out)
	}
}
