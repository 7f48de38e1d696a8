package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
)

// grepLines is the lines of s that contain any of words.
func grepLines(s string, words ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

func (d *daemon) cluster(name string) v1.Cluster {
	d.t.Helper()
	var c v1.Cluster
	if err := json.Unmarshal([]byte(d.mustCLI("cluster", "get", name, "-o", "json")), &c); err != nil {
		d.t.Fatalf("decoding cluster %s: %v", name, err)
	}
	return c
}

// waitPhase polls until the cluster reaches phase.
func (d *daemon) waitPhase(name string, phase v1.Phase, timeout time.Duration) v1.Cluster {
	d.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, _, code := d.cli("cluster", "get", name, "-o", "json")
		var c v1.Cluster
		if code == 0 && json.Unmarshal([]byte(out), &c) == nil && c.Status.Phase == phase {
			return c
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("cluster %s not %s after %v; last: %s", name, phase, timeout, out)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// clusterTable fetches Clusters as kubectl does and returns the column
// names and cells, flattened.
func (d *daemon) clusterTable() string {
	d.t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(d.stateDir, "admin.kubeconfig"))
	if err != nil {
		d.t.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		d.t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, cfg.Host+"/apis/socialweb.computer/v1alpha1/clusters", nil)
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := hc.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	var tab metav1.Table
	if err := json.NewDecoder(resp.Body).Decode(&tab); err != nil {
		d.t.Fatal(err)
	}
	var cells []string
	for _, c := range tab.ColumnDefinitions {
		cells = append(cells, c.Name)
	}
	if strings.Join(cells[:4], ",") != "Name,Phase,URL,Nodes" {
		d.t.Errorf("Cluster table columns %v, want Name, Phase, URL, Nodes, Age", cells)
	}
	for _, r := range tab.Rows {
		for _, c := range r.Cells {
			cells = append(cells, fmt.Sprint(c))
		}
	}
	return strings.Join(cells, " ")
}

func putConfigMap(t *testing.T, k kubernetes.Interface, name string) {
	t.Helper()
	_, err := k.CoreV1().ConfigMaps("default").Create(ctxT(t, 30*time.Second), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"from": name},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating ConfigMap %s: %v", name, err)
	}
}

func hasConfigMap(t *testing.T, k kubernetes.Interface, name string) bool {
	t.Helper()
	_, err := k.CoreV1().ConfigMaps("default").Get(ctxT(t, 30*time.Second), name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("getting ConfigMap %s: %v", name, err)
	}
	return err == nil
}

// TestTwoClustersIsolatedAndSurviveRestarts: two real control planes with
// their own objects and CAs; both come back with every object and the same
// URL after the daemon is stopped with SIGTERM and killed with SIGKILL, and
// after one control plane process crashes.
func TestTwoClustersIsolatedAndSurviveRestarts(t *testing.T) {
	d := newDaemon(t, 4)
	d.start()
	// The fresh management API captures the seed just after it is ready.
	livetest.Eventually(t, 30*time.Second, 100*time.Millisecond, "the management API's datastore seed", func() bool {
		m, _ := filepath.Glob(filepath.Join(d.stateDir, "seeds", "seed-*.json"))
		return len(m) == 1
	})
	d.mustCLI("cluster", "create", "alpha", "--wait")
	assertBootstrapLikeManagement(t, d, "alpha")
	d.mustCLI("cluster", "create", "beta", "--wait", "--max-nodes", "3", "--hold", "30s")
	urls := map[string]string{"alpha": d.cluster("alpha").Status.URL, "beta": d.cluster("beta").Status.URL}
	if urls["alpha"] == urls["beta"] || urls["alpha"] == "" {
		t.Fatalf("URLs not distinct: %v", urls)
	}
	if b := d.cluster("beta"); b.Spec.MaxNodes != 3 || b.Spec.Hold.Duration != 30*time.Second {
		t.Errorf("beta spec = %+v, want maxNodes 3 and hold 30s", b.Spec)
	}
	if a := d.cluster("alpha"); a.Spec.MaxNodes != 5 || a.Spec.Datastore != "sqlite" {
		t.Errorf("alpha spec = %+v, want the daemon defaults (maxNodes 5, sqlite)", a.Spec)
	}

	// `kubectl get clusters` shows what `cluster list` shows: the CRD's
	// printer columns, read the way kubectl reads them (as a Table).
	table := d.clusterTable()
	if !strings.Contains(table, "alpha") || !strings.Contains(table, urls["alpha"]) || !strings.Contains(table, "Ready") {
		t.Errorf("the management API's Cluster table lacks alpha: %s", table)
	}
	list := d.mustCLI("cluster", "list")
	if !strings.Contains(list, "alpha") || !strings.Contains(list, urls["beta"]) {
		t.Errorf("cluster list:\n%s", list)
	}

	cfgA, kA := d.tenant("alpha")
	cfgB, kB := d.tenant("beta")
	putConfigMap(t, kA, "from-alpha")
	putConfigMap(t, kB, "from-beta")
	if hasConfigMap(t, kA, "from-beta") || hasConfigMap(t, kB, "from-alpha") {
		t.Fatal("an object of one tenant is visible in the other")
	}

	// alpha's admin certificate, presented to beta's apiserver: 401.
	cross := rest.CopyConfig(cfgB)
	cross.TLSClientConfig.CertData, cross.TLSClientConfig.KeyData = cfgA.TLSClientConfig.CertData, cfgA.TLSClientConfig.KeyData
	_, err := kubernetes.NewForConfigOrDie(cross).CoreV1().Namespaces().List(ctxT(t, 30*time.Second), metav1.ListOptions{})
	if !apierrors.IsUnauthorized(err) {
		t.Fatalf("alpha's admin credential against beta: err = %v, want 401 Unauthorized", err)
	}
	// And beta's own credential still works there.
	if _, err := kB.CoreV1().Namespaces().List(ctxT(t, 30*time.Second), metav1.ListOptions{}); err != nil {
		t.Fatalf("beta's own credential: %v", err)
	}

	// A crashed control plane is restarted, and the Cluster says so. Its phase may stay
	// Ready: the daemon holds the cluster's port, so a request (the daemon's probe too)
	// made while it restarts waits for the new run rather than failing.
	inst, err := os.ReadFile(filepath.Join(d.stateDir, "clusters", "alpha", "instance.json"))
	if err != nil {
		t.Fatalf("no instance record for alpha: %v", err)
	}
	var rec struct{ PID int }
	_ = json.Unmarshal(inst, &rec)
	if err := syscall.Kill(rec.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("killing alpha's control plane (pid %d): %v", rec.PID, err)
	}
	livetest.Eventually(t, 30*time.Second, 250*time.Millisecond, "alpha's Cluster to count the crash", func() bool {
		c := d.cluster("alpha")
		running := meta.FindStatusCondition(c.Status.Conditions, v1.ConditionRunning)
		return c.Status.Restarts >= 1 && running != nil && strings.Contains(running.Message, "killed")
	})
	d.waitPhase("alpha", v1.PhaseReady, 2*time.Minute)
	if !hasConfigMap(t, kA, "from-alpha") {
		t.Error("alpha lost an object in a crash")
	}

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			pids := map[string]int{}
			for name := range urls {
				pids[name] = controlPlaneRunning(filepath.Join(d.stateDir, "clusters", name, "instance.json"))
			}
			d.stop(sig)
			if sig == syscall.SIGTERM {
				// --control-planes-on-exit stop, the default.
				assertNoProcessesLeft(t, d.stateDir)
			} else {
				// A daemon killed leaves its control planes serving.
				for name, pid := range pids {
					if now := controlPlaneRunning(filepath.Join(d.stateDir, "clusters", name, "instance.json")); pid == 0 || now != pid {
						t.Errorf("%s's control plane (pid %d) after the daemon was killed: running as %d; want it to outlive the daemon", name, pid, now)
					}
				}
			}
			d.start()
			for name, url := range urls {
				c := d.waitPhase(name, v1.PhaseReady, 2*time.Minute)
				if c.Status.URL != url {
					t.Errorf("%s URL changed across a restart: %s -> %s", name, url, c.Status.URL)
				}
			}
			_, kA := d.tenant("alpha")
			_, kB := d.tenant("beta")
			// The phase read right after the restart may still be the last daemon's Ready
			// until the first pass: wait for the tenants to answer, as a user would.
			livetest.Eventually(t, 2*time.Minute, 500*time.Millisecond, "both tenants to answer after the restart", func() bool {
				_, errA := kA.Discovery().ServerVersion()
				_, errB := kB.Discovery().ServerVersion()
				return errA == nil && errB == nil
			})
			if !hasConfigMap(t, kA, "from-alpha") || !hasConfigMap(t, kB, "from-beta") {
				t.Errorf("an object was lost across a %s restart", sig)
			}
			if sig == syscall.SIGKILL {
				for name, pid := range pids {
					if now := controlPlaneRunning(filepath.Join(d.stateDir, "clusters", name, "instance.json")); now != pid {
						t.Errorf("%s's control plane is pid %d after the restart; want %d adopted", name, now, pid)
					}
				}
			}
		})
	}
}

// TestDeleteReleasesPortAndFiles uses a one-port range: a second cluster is
// refused while the first holds the port, and fits once it is deleted.
func TestDeleteReleasesPortAndFiles(t *testing.T) {
	metrics := fmt.Sprintf("127.0.0.1:%d", livetest.FreePort(t))
	d := newDaemon(t, 1, "--metrics-address", metrics)
	// A node network no lease holds (its cluster's state was lost) is
	// removed when the daemon starts.
	orphan, _ := nodenet.ForIndex(149)
	nets := nodenet.NewManager(nil, nil)
	if err := nets.Ensure(ctxT(t, time.Minute), "orphan", orphan, nodenet.Served{APIServer: 7599}, nodenet.Narrowing{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nets.Remove(context.Background(), "orphan", orphan) })
	d.start()
	livetest.Eventually(t, 30*time.Second, 200*time.Millisecond, "the orphaned bridge swb149 to be removed", func() bool {
		return exec.Command("ip", "link", "show", "swb149").Run() != nil
	})
	d.mustCLI("cluster", "create", "solo", "--wait")
	url := d.cluster("solo").Status.URL
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatalf("scraping the daemon's metrics: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `socialweb_clusters{phase="Ready"} 1`) {
		t.Errorf("metrics do not count the Ready cluster:\n%s", grepLines(string(body), "socialweb_"))
	}
	dir := filepath.Join(d.stateDir, "clusters", "solo")
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("cluster dir: %v", err)
	}

	_, errOut, code := d.cli("cluster", "create", "second")
	if code == 0 || !strings.Contains(errOut, "no free apiserver port") || !strings.Contains(errOut, "--port-range") {
		t.Fatalf("create in an exhausted range: exit %d, stderr %q; want a non-zero exit naming --port-range", code, errOut)
	}
	if _, _, code := d.cli("cluster", "get", "second"); code == 0 {
		t.Fatal("a refused create left a Cluster object behind")
	}
	if _, err := os.Stat(filepath.Join(d.stateDir, "clusters", "second")); !os.IsNotExist(err) {
		t.Fatalf("a refused create left files: %v", err)
	}

	gw := net.ParseIP(d.cluster("solo").Status.Gateway).To4()
	bridge := fmt.Sprintf("swb%d", gw[2])
	if err := exec.Command("ip", "link", "show", bridge).Run(); err != nil {
		t.Errorf("cluster bridge %s missing while the cluster exists: %v", bridge, err)
	}
	d.mustCLI("cluster", "delete", "solo", "--wait")
	if err := exec.Command("ip", "link", "show", bridge).Run(); err == nil {
		t.Errorf("cluster bridge %s left after delete", bridge)
	}
	if out, _ := exec.Command("nft", "list", "tables").Output(); strings.Contains(string(out), fmt.Sprintf("socialweb-%d\n", gw[2])) {
		t.Errorf("nftables table socialweb-%d left after delete", gw[2])
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("cluster dir left after delete: %v", err)
	}
	if _, errOut, code := d.cli("cluster", "kubeconfig", "solo"); code == 0 || !strings.Contains(errOut, "not found") {
		t.Errorf("kubeconfig of a deleted cluster: exit %d %q", code, errOut)
	}
	d.mustCLI("cluster", "create", "second", "--wait")
	if got := d.cluster("second").Status.URL; got != url {
		t.Errorf("the released port was not reused: %s, want %s", got, url)
	}
}

// assertBootstrapLikeManagement checks a tenant that was seeded (its readiness
// skips the bootstrap hooks' checks) against the management API, whose own
// hooks made its bootstrap policy: at Ready, the tenant holds the same RBAC
// bootstrap objects and system PriorityClasses.
func assertBootstrapLikeManagement(t *testing.T, d *daemon, tenant string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(d.stateDir, "clusters", tenant, "run", "seeded")); err != nil {
		t.Errorf("%s was not seeded from the management API's seed: %v", tenant, err)
	}
	mcfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(d.stateDir, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	_, tk := d.tenant(tenant)
	names := func(k kubernetes.Interface) []string {
		ctx, bootstrap := ctxT(t, 30*time.Second), metav1.ListOptions{LabelSelector: "kubernetes.io/bootstrapping=rbac-defaults"}
		var out []string
		add := func(kind string, err error, items ...string) {
			if err != nil {
				t.Fatalf("listing %s: %v", kind, err)
			}
			for _, n := range items {
				out = append(out, kind+"/"+n)
			}
		}
		crs, err := k.RbacV1().ClusterRoles().List(ctx, bootstrap)
		add("clusterroles", err, objectNames(crs.Items, func(o rbacv1.ClusterRole) string { return o.Name + " " + fmt.Sprint(len(o.Rules)) })...)
		crbs, err := k.RbacV1().ClusterRoleBindings().List(ctx, bootstrap)
		add("clusterrolebindings", err, objectNames(crbs.Items, func(o rbacv1.ClusterRoleBinding) string { return o.Name })...)
		rs, err := k.RbacV1().Roles("").List(ctx, bootstrap)
		add("roles", err, objectNames(rs.Items, func(o rbacv1.Role) string { return o.Namespace + "/" + o.Name })...)
		rbs, err := k.RbacV1().RoleBindings("").List(ctx, bootstrap)
		add("rolebindings", err, objectNames(rbs.Items, func(o rbacv1.RoleBinding) string { return o.Namespace + "/" + o.Name })...)
		pcs, err := k.SchedulingV1().PriorityClasses().List(ctx, metav1.ListOptions{})
		add("priorityclasses", err, objectNames(pcs.Items, func(o schedulingv1.PriorityClass) string { return o.Name })...)
		sort.Strings(out)
		return out
	}
	want, got := names(kubernetes.NewForConfigOrDie(mcfg)), names(tk)
	if len(want) < 100 || !slices.Equal(got, want) {
		t.Errorf("bootstrap objects of %s at Ready (%d) differ from the management API's (%d):\nonly %s: %v\nonly management: %v",
			tenant, len(got), len(want), tenant, difference(got, want), difference(want, got))
	}
}

func objectNames[T any](items []T, name func(T) string) []string {
	out := make([]string, 0, len(items))
	for _, o := range items {
		out = append(out, name(o))
	}
	return out
}

// difference is what a holds and b does not.
func difference(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}
