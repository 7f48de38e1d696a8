package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	swdaemon "github.com/socialweb-computer/socialweb/internal/daemon"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/nodes/fake"
	"github.com/socialweb-computer/socialweb/internal/provider"
	"github.com/socialweb-computer/socialweb/internal/scale"
	"github.com/socialweb-computer/socialweb/internal/scaledriver"
)

// TestScaleDriverAgainstARealControlPlane: the real scheduler and the scale
// driver, with the fake provider registering Nodes the way kubelets would.
// Zero nodes; five anti-affine Pods make five nodes, one Pod each; when they
// finish the cluster falls back to zero after the hold. The control plane
// stays Ready throughout, and the Cluster status records the decisions.
func TestScaleDriverAgainstARealControlPlane(t *testing.T) {
	d := newDaemon(t, 1)
	d.start()
	d.mustCLI("cluster", "create", "scaler", "--wait")
	_, k := d.tenant("scaler")
	mgmtCfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(d.stateDir, swdaemon.AdminKubeconfig))
	if err != nil {
		t.Fatal(err)
	}
	mgmt := dynamic.NewForConfigOrDie(mgmtCfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// Watch the phase for the whole test: it must never leave Ready.
	var phaseMu sync.Mutex
	var badPhases []string
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for ctx.Err() == nil {
			u, err := mgmt.Resource(v1.ClusterResource).Get(ctx, "scaler", metav1.GetOptions{})
			if err == nil {
				c, _ := v1.FromUnstructured(u)
				if c.Status.Phase != v1.PhaseReady {
					phaseMu.Lock()
					badPhases = append(badPhases, string(c.Status.Phase))
					phaseMu.Unlock()
				}
			}
			time.Sleep(500 * time.Millisecond)
		}
	}()

	prov := fake.New(fake.WithTenant(k))
	drv, err := scaledriver.New(scaledriver.Config{
		Cluster:  "scaler",
		NodeSize: scale.NodeSize{CPUs: 1, MemoryMiB: 1024, MaxPods: 110},
		MaxNodes: 5,
		Hold:     3 * time.Second,
		Resync:   time.Second,
	}, scaledriver.Deps{
		Tenant: k, Provider: prov, Metrics: prometheus.NewRegistry(),
		Status: provider.ScaleStatus{Client: mgmt},
	})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	runCtx, stopDriver := context.WithCancel(ctx)
	go func() { runDone <- drv.Run(runCtx) }()
	defer func() { stopDriver(); <-runDone }()

	countNodes := func() int {
		l, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return len(l.Items)
	}
	time.Sleep(3 * time.Second)
	if n := countNodes(); n != 0 || prov.Count(fake.OpCreate) != 0 {
		t.Fatalf("with no intent: %d nodes, %d creates; want 0", n, prov.Count(fake.OpCreate))
	}

	for i := range 5 {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("job-%d", i), Labels: map[string]string{"app": "ci-job"}},
			Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "c", Image: "busybox", Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
				}}},
				Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
					RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
						TopologyKey:   corev1.LabelHostname,
						LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "ci-job"}},
					}},
				}},
			},
		}
		if _, err := k.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	placement := map[string]string{}
	livetest.Eventually(t, 2*time.Minute, 250*time.Millisecond, "5 pods bound to 5 distinct nodes", func() bool {
		pods, err := k.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		placement = map[string]string{}
		nodesUsed := map[string]bool{}
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" {
				placement[p.Name] = p.Spec.NodeName
				nodesUsed[p.Spec.NodeName] = true
			}
		}
		return len(placement) == 5 && len(nodesUsed) == 5
	})
	t.Logf("placement: %v", placement)
	if n := countNodes(); n != 5 {
		t.Errorf("%d nodes registered, want 5", n)
	}
	nodeList, _ := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	for _, n := range nodeList.Items {
		if want := "socialweb://scaler/" + n.Name; n.Spec.ProviderID != want {
			t.Errorf("node %s providerID %q, want %q", n.Name, n.Spec.ProviderID, want)
		}
	}
	if c := d.cluster("scaler"); c.Status.LastScaleDecision == nil || c.Status.LastScaleDecision.Action != string(scale.Provision) {
		t.Errorf("cluster status lastScaleDecision = %+v, want Provision", c.Status.LastScaleDecision)
	}

	for _, node := range placement {
		if _, err := prov.CompletePods(ctx, node); err != nil {
			t.Fatal(err)
		}
	}
	livetest.Eventually(t, 2*time.Minute, 250*time.Millisecond, "the cluster back at zero nodes", func() bool {
		return countNodes() == 0 && len(prov.Instances()) == 0
	})
	// The status is written after the nodes are gone; give it a moment.
	var c v1.Cluster
	livetest.Eventually(t, 30*time.Second, 250*time.Millisecond, "the Cluster status to record the fall to zero", func() bool {
		c = d.cluster("scaler")
		last := c.Status.LastScaleDecision
		return c.Status.Nodes == 0 && last != nil && last.Target == 0 &&
			(last.Action == string(scale.Teardown) || last.Action == string(scale.ScaleDown))
	})
	t.Logf("last decision: %s: %s", c.Status.LastScaleDecision.Action, c.Status.LastScaleDecision.Reason)
	events, err := k.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
	if err != nil || len(events.Items) == 0 {
		t.Errorf("no scale Events recorded on the tenant (%v)", err)
	}
	cancel()
	<-watchDone
	if len(badPhases) > 0 {
		t.Errorf("the control plane left Ready during scaling: %v", badPhases)
	}
}
