package integration

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// TestFullDataDiskEvicts: a Pod that fills its node's data disk is evicted by the
// kubelet (DiskPressure), and the node stays Ready with its other Pod and that Pod's data
// untouched: a full disk evicts cleanly instead of wedging the node. The node is the only
// one (max 1), on a 3 GiB data disk, so both Pods share it. The filler stops at the disk's
// reserve, which is left to containerd and the kubelet (once, with no reserve, the
// kubelet's eviction manager stopped after "attempting to reclaim" and evicted nothing
// for 10 minutes).
//
// The other Pod requests the ephemeral storage it uses: the kubelet evicts Pods whose use
// exceeds their request first, and its measure of the filler's emptyDir lags the writes
// (seen here: "using 44Ki" at the eviction), so a Pod without a request may go first.
func TestFullDataDiskEvicts(t *testing.T) {
	img := nodeImage(t)
	d := newDaemon(t, 1, "--node-image", img)
	d.start()
	d.mustCLI("cluster", "create", "full", "--wait", "--hold", "10s", "--max-nodes", "1", "--node-disk", "3Gi")
	cfg, k := d.tenant("full")
	ctx := ctxT(t, 20*time.Minute)
	// At a failure: the tenant as the API sees it, and the node's own account of its
	// eviction manager and runtime calls (a CI summary keeps only the end).
	atFailure := ""
	d.lastWords = func() string { return atFailure }
	defer func() {
		if t.Failed() {
			atFailure = describeTenant(ctx, k, 15) + consoleLines(d.stateDir, evictionTrail, 40)
		}
	}()
	grace := int64(1)
	pod := func(name, script string, request string) *corev1.Pod {
		var res corev1.ResourceRequirements
		if request != "" {
			res.Requests = corev1.ResourceList{corev1.ResourceEphemeralStorage: resource.MustParse(request)}
		}
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.PodSpec{
				RestartPolicy:                 corev1.RestartPolicyNever,
				TerminationGracePeriodSeconds: &grace,
				Containers: []corev1.Container{{
					Name: "main", Image: "busybox:stable", Command: []string{"sh", "-c", script}, Resources: res,
					VolumeMounts: []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}},
				}},
				Volumes: []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			},
		}
	}
	if _, err := k.CoreV1().Pods("default").Create(ctx, pod("bystander", "echo kept-data > /scratch/mine; exec sleep 3600", "100Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	livetest.Eventually(t, 10*time.Minute, time.Second, "the bystander Pod to run", func() bool {
		p, err := k.CoreV1().Pods("default").Get(ctx, "bystander", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning
	})
	// The disk keeps a reserve a Pod cannot write into (5% of 3 GiB, 153 MiB), left to
	// containerd and the kubelet once a Pod has filled the rest: blocks free, but not
	// available to the Pod's root.
	left, err := execIn(ctx, cfg, k, "default", "bystander", "stat", "-f", "-c", "free=%f avail=%a bsize=%S", "/scratch")
	var free, avail, bsize int64
	if _, serr := fmt.Sscanf(left, "free=%d avail=%d bsize=%d", &free, &avail, &bsize); err != nil || serr != nil {
		t.Errorf("the data disk as a Pod sees it: %q, %v, %v; want free=N avail=N bsize=N", left, err, serr)
	} else if reserved := (free - avail) * bsize; reserved < 120<<20 {
		t.Errorf("the data disk as a Pod sees it: %s: %d MiB free but not to it; want the reserve, >= 120 MiB", strings.TrimSpace(left), reserved>>20)
	} else {
		t.Logf("a Pod cannot write the last %d MiB of its node's data disk (%s)", reserved>>20, strings.TrimSpace(left))
	}

	// Writes until the disk is full (dd stops at ENOSPC), then waits to be evicted.
	if _, err := k.CoreV1().Pods("default").Create(ctx, pod("filler",
		"dd if=/dev/zero of=/scratch/fill bs=1M 2>&1 | tail -1; echo filled; exec sleep 3600", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	livetest.Eventually(t, 10*time.Minute, 2*time.Second, "the filler Pod to be evicted", func() bool {
		p, err := k.CoreV1().Pods("default").Get(ctx, "filler", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodFailed && p.Status.Reason == "Evicted"
	})
	p, _ := k.CoreV1().Pods("default").Get(ctx, "filler", metav1.GetOptions{})
	t.Logf("filler: %s: %s", p.Status.Reason, p.Status.Message)
	if !strings.Contains(p.Status.Message, "ephemeral-storage") && !strings.Contains(p.Status.Message, "DiskPressure") {
		t.Errorf("filler evicted for %q; want the node's disk", p.Status.Message)
	}

	b, err := k.CoreV1().Pods("default").Get(ctx, "bystander", metav1.GetOptions{})
	if err != nil || b.Status.Phase != corev1.PodRunning {
		t.Fatalf("bystander after the eviction: %v %v; want still Running", b.Status.Phase, err)
	}
	out, err := execIn(ctx, cfg, k, "default", "bystander", "cat", "/scratch/mine")
	if err != nil || strings.TrimSpace(out) != "kept-data" {
		t.Errorf("bystander's data after the eviction: %q, %v", out, err)
	}
	livetest.Eventually(t, 3*time.Minute, 2*time.Second, "the node to be Ready", func() bool {
		nl, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil || len(nl.Items) != 1 {
			return false
		}
		for _, c := range nl.Items[0].Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue
			}
		}
		return false
	})
	for _, n := range []string{"filler", "bystander"} {
		if err := k.CoreV1().Pods("default").Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	}
	livetest.Eventually(t, 3*time.Minute, 2*time.Second, "the cluster back at zero nodes", func() bool {
		nl, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		return err == nil && len(nl.Items) == 0 && len(qemusOf(d.stateDir)) == 0
	})
}

// evictionTrail matches the node console lines that tell how an eviction went: the
// kubelet's eviction manager and garbage collectors, its runtime errors and timeouts,
// and containerd's errors and warnings.
var evictionTrail = regexp.MustCompile(`eviction_manager|image_gc_manager|container_gc|kuberuntime.*(?i:error|failed)|(?i:deadline exceeded|no space left)|^E\d{4} |level=(error|warning)`)
