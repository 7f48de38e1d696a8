package integration

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/datastore"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/tenantuid"
)

// ownNetworks is serve's extra args with node networks of these tests' own: another
// engineer's or job's daemon on the host may hold the harness's 1-150.
func ownNetworks(extra ...string) []string {
	return append([]string{"--network-range", "161-170"}, extra...)
}

// tenantState is what a tenant held when it was backed up, and the credentials
// made for it before.
type tenantState struct {
	configMaps map[string]string // name -> data["n"]
	secret     map[string][]byte
	admin      []byte // the admin kubeconfig
	runner     string // the runner credential's kubeconfig file
}

// fillTenant gives cluster name objects, a Secret and a runner credential, and keeps
// its admin kubeconfig as it was.
func fillTenant(t *testing.T, ctx context.Context, d *daemon, name string) tenantState {
	t.Helper()
	_, k := d.tenant(name)
	st := tenantState{configMaps: map[string]string{}, secret: map[string][]byte{"password": []byte("hunter2-" + name)}}
	if _, err := k.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		n := fmt.Sprintf("cm-%02d", i)
		st.configMaps[n] = fmt.Sprint(i * i)
		if _, err := k.CoreV1().ConfigMaps("app").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: n}, Data: map[string]string{"n": st.configMaps[n]}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := k.CoreV1().Secrets("app").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds"}, Data: st.secret}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "runner")
	d.mustCLI("cluster", "runner-credential", name, "--ttl", "2h", "--out", dir)
	st.runner = filepath.Join(dir, "kubeconfig")
	st.admin = []byte(d.mustCLI("cluster", "kubeconfig", name))
	return st
}

// retarget points a client made before the backup at the restored cluster: the new
// address, and the new TLS server name when the cluster was renamed. Its CA,
// certificate and token stay as they were.
func retarget(old, now *rest.Config) *rest.Config {
	c := rest.CopyConfig(old)
	c.Host, c.TLSClientConfig.ServerName = now.Host, now.TLSClientConfig.ServerName
	return c
}

// checkRestored checks the restored cluster name against what st says it held:
// objects and Secret, the old admin kubeconfig and runner token, 0600 keys, no Node of
// the old host (oldNode), and a Pod that runs on a node booted for it.
func checkRestored(t *testing.T, ctx context.Context, d *daemon, name string, st tenantState, oldNode string) {
	t.Helper()
	restoredAt := time.Now()
	now, k := d.tenant(name)
	cms, err := k.CoreV1().ConfigMaps("app").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, cm := range cms.Items {
		if cm.Name != "kube-root-ca.crt" {
			got[cm.Name] = cm.Data["n"]
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(st.configMaps) {
		t.Errorf("restored ConfigMaps %v, want %v", got, st.configMaps)
	}
	if s, err := k.CoreV1().Secrets("app").Get(ctx, "creds", metav1.GetOptions{}); err != nil || string(s.Data["password"]) != string(st.secret["password"]) {
		t.Errorf("restored Secret: %v, %v", s, err)
	}

	// The credentials made before the backup: only the address (and name) change.
	oldAdmin, err := clientcmd.RESTConfigFromKubeConfig(st.admin)
	if err != nil {
		t.Fatal(err)
	}
	if string(oldAdmin.CAData) != string(now.CAData) {
		t.Errorf("the restored cluster's server CA differs from the backup's")
	}
	admin := kubernetes.NewForConfigOrDie(retarget(oldAdmin, now))
	if _, err := admin.CoreV1().Secrets("app").Get(ctx, "creds", metav1.GetOptions{}); err != nil {
		t.Errorf("the admin kubeconfig made before the backup: %v", err)
	}
	runnerCfg, err := clientcmd.BuildConfigFromFlags("", st.runner)
	if err != nil {
		t.Fatal(err)
	}
	runner := kubernetes.NewForConfigOrDie(retarget(runnerCfg, now))
	if _, err := runner.CoreV1().ConfigMaps("gitlab-runner").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "job-"}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("the runner token minted before the backup: %v", err)
	}

	keys, _ := filepath.Glob(filepath.Join(d.stateDir, "clusters", name, "pki", "*.key"))
	if len(keys) < 4 {
		t.Errorf("restored PKI holds keys %v", keys)
	}
	// Root's, readable by the restored control plane's gid alone (tenantuid).
	gid := tenantuid.DefaultBase + int(d.cluster(name).Status.Port)
	for _, p := range keys {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil || st.Mode&0o777 != 0o640 || st.Uid != 0 || int(st.Gid) != gid {
			t.Errorf("%s: mode %o uid %d gid %d (%v), want 0640, root's, group %d", p, st.Mode&0o777, st.Uid, st.Gid, err, gid)
		}
	}
	// A restored sqlite datastore was moved into the run dir and given to the uid.
	var db syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(d.stateDir, "clusters", name, "run", "state.db"), &db); err == nil && int(db.Uid) != gid {
		t.Errorf("the restored run/state.db is uid %d's, want %d's", db.Uid, gid)
	}
	nodes, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 0 {
		t.Errorf("right after the restore: nodes %v (%v), want none (the backup's node %q is not here)", nodes, err, oldNode)
	}

	grace := int64(1)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "after", Namespace: "default"}, Spec: corev1.PodSpec{
		TerminationGracePeriodSeconds: &grace,
		Containers:                    []corev1.Container{{Name: "main", Image: "busybox:stable", Command: []string{"sleep", "3600"}}},
	}}
	if _, err := k.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node := runningOn(t, ctx, k, "after")
	n, err := k.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil || node == oldNode || n.CreationTimestamp.Time.Before(restoredAt.Add(-time.Second)) {
		t.Errorf("Pod after runs on node %s (made %v, %v), want a node booted after the restore, not %q", node, n.CreationTimestamp, err, oldNode)
	}
	_ = k.CoreV1().Pods("default").Delete(ctx, "after", metav1.DeleteOptions{})
}

// runningOn waits until Pod default/name runs and returns its node.
func runningOn(t *testing.T, ctx context.Context, k kubernetes.Interface, name string) string {
	t.Helper()
	var node string
	livetest.Eventually(t, 8*time.Minute, time.Second, "Pod "+name+" to run", func() bool {
		p, err := k.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		node = p.Spec.NodeName
		return p.Status.Phase == corev1.PodRunning
	})
	return node
}

// TestBackupDeleteRestore: a tenant with objects, a Secret, a runner credential and a
// Pod on a node is backed up while it serves, deleted and restored on the same daemon.
// Bad input and a restore over an existing name (this tenant's, or another's) are
// refused and change nothing.
func TestBackupDeleteRestore(t *testing.T) {
	img := nodeImage(t)
	d := newDaemon(t, 3, ownNetworks("--node-image", img)...)
	d.start()
	ctx := ctxT(t, 25*time.Minute)
	d.mustCLI("cluster", "create", "keep", "--wait", "--max-nodes", "2", "--hold", "10m")
	d.mustCLI("cluster", "create", "other")
	st := fillTenant(t, ctx, d, "keep")
	_, k := d.tenant("keep")
	grace := int64(1)
	before := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "before", Namespace: "default"}, Spec: corev1.PodSpec{
		TerminationGracePeriodSeconds: &grace,
		Containers:                    []corev1.Container{{Name: "main", Image: "busybox:stable", Command: []string{"sleep", "3600"}}},
	}}
	if _, err := k.CoreV1().Pods("default").Create(ctx, before, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	oldNode := runningOn(t, ctx, k, "before")

	file := filepath.Join(t.TempDir(), "keep.swbackup")
	_, errOut, code := d.cli("cluster", "backup", "keep", "--out", file)
	if code != 0 {
		t.Fatalf("cluster backup: exit %d: %s", code, errOut)
	}
	t.Logf("backup: %s", strings.TrimSpace(errOut))
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("backup file: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}

	b, _ := os.ReadFile(file)
	truncated := filepath.Join(t.TempDir(), "truncated")
	notBackup := filepath.Join(t.TempDir(), "notes.txt")
	_ = os.WriteFile(truncated, b[:len(b)*2/3], 0o600)
	_ = os.WriteFile(notBackup, []byte("not a backup\n"), 0o600)
	uids := map[string]string{"keep": string(d.cluster("keep").UID), "other": string(d.cluster("other").UID)}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"restore", file}, "cluster keep exists"},
		{[]string{"restore", file, "--name", "other"}, "cluster other exists"},
		{[]string{"restore", truncated, "--name", "fresh"}, "truncated"},
		{[]string{"restore", notBackup, "--name", "fresh"}, "not a socialweb backup"},
		{[]string{"restore", file, "--name", "Not_A_Name"}, "--name"},
		{[]string{"backup", "keep", "--out", file}, "--overwrite"},
		{[]string{"backup", "nosuch", "--out", file + ".2"}, `cluster "nosuch" not found`},
	} {
		_, errOut, code := d.cli(append([]string{"cluster"}, tc.args...)...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("cluster %v: exit %d, stderr %q; want non-zero and %q", tc.args, code, errOut, tc.want)
		}
	}
	for name, uid := range uids {
		if got := d.cluster(name); string(got.UID) != uid || got.DeletionTimestamp != nil {
			t.Errorf("a refused restore touched cluster %s (uid %s, was %s)", name, got.UID, uid)
		}
	}
	if out := d.mustCLI("cluster", "list"); strings.Contains(out, "fresh") {
		t.Errorf("a refused restore left a cluster:\n%s", out)
	}
	for _, p := range []string{filepath.Join(d.stateDir, "clusters", "fresh"), file + ".2"} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("a refused command left %s", p)
		}
	}
	if left, _ := os.ReadDir(filepath.Join(d.stateDir, "restore")); len(left) != 0 {
		t.Errorf("refused restores left staged copies: %v", left)
	}

	d.mustCLI("cluster", "delete", "keep", "--wait")
	t0 := time.Now()
	_, errOut, code = d.cli("cluster", "restore", file)
	if code != 0 {
		t.Fatalf("cluster restore: exit %d: %s", code, errOut)
	}
	t.Logf("restore (%.1fs): %s", time.Since(t0).Seconds(), strings.TrimSpace(errOut))
	if !strings.Contains(errOut, "deleted the backup's nodes "+oldNode) {
		t.Errorf("the restore did not say it deleted the backup's node %s", oldNode)
	}
	checkRestored(t, ctx, d, "keep", st, oldNode)
}

// TestRestoreOnASecondDaemon moves a tenant: backed up asleep on one daemon, deleted there, and
// restored under a new name on another daemon with a state dir of its own (another
// host, as far as the tenant can tell); then restored again over itself with --replace.
func TestRestoreOnASecondDaemon(t *testing.T) {
	img := nodeImage(t)
	ctx := ctxT(t, 20*time.Minute)
	src := newDaemon(t, 1, ownNetworks()...)
	src.start()
	src.mustCLI("cluster", "create", "origin", "--wait", "--sleep-after", "30s")
	st := fillTenant(t, ctx, src, "origin")
	// Backed up asleep: its datastore at rest is copied, and it is not woken.
	src.waitPhase("origin", v1.PhaseAsleep, 3*time.Minute)
	file := filepath.Join(t.TempDir(), "origin.swbackup")
	src.mustCLI("cluster", "backup", "origin", "--out", file)
	if c := src.cluster("origin"); c.Status.Phase != v1.PhaseAsleep {
		t.Errorf("backing up a sleeping cluster left it %s", c.Status.Phase)
	}
	src.mustCLI("cluster", "delete", "origin", "--wait")
	src.stop(syscall.SIGTERM)

	dst := newDaemon(t, 1, ownNetworks("--node-image", img)...)
	dst.start()
	_, errOut, code := dst.cli("cluster", "restore", file, "--name", "moved")
	if code != 0 {
		t.Fatalf("cluster restore on the second daemon: exit %d: %s", code, errOut)
	}
	t.Logf("restore: %s", strings.TrimSpace(errOut))
	if !strings.Contains(errOut, "tls-server-name origin.") {
		t.Errorf("the restore under a new name did not say to change tls-server-name: %s", errOut)
	}
	// --replace: the restored tenant changes, and restoring over it brings the backup back.
	_, k := dst.tenant("moved")
	if err := k.CoreV1().ConfigMaps("app").Delete(ctx, "cm-00", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, _, code := dst.cli("cluster", "restore", file, "--name", "moved"); code == 0 {
		t.Fatal("a restore over an existing cluster without --replace succeeded")
	}
	dst.mustCLI("cluster", "restore", file, "--name", "moved", "--replace")
	checkRestored(t, ctx, dst, "moved", st, "")
}

// TestBackupRestorePostgres is TestBackupDeleteRestore's round trip on a daemon whose
// tenants live in postgres: the kine table goes into the file's sqlite form and back into
// a new database, and nothing of the sqlite file stays in the cluster dir.
func TestBackupRestorePostgres(t *testing.T) {
	admin := livetest.Postgres(t)
	img := nodeImage(t)
	db, err := sql.Open("pgx", admin)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// Databases are per host; start from a clean slate for these names.
	for _, n := range []string{datastore.DatabaseName("mgmt"), datastore.DatabaseName("pgkeep")} {
		_, _ = db.Exec(`DROP DATABASE IF EXISTS "` + n + `" WITH (FORCE)`)
	}
	t.Cleanup(func() { _, _ = db.Exec(`DROP DATABASE IF EXISTS "socialweb_mgmt" WITH (FORCE)`) })
	d := newDaemon(t, 1, ownNetworks("--datastore", admin, "--node-image", img)...)
	d.start()
	ctx := ctxT(t, 20*time.Minute)
	d.mustCLI("cluster", "create", "pgkeep", "--wait")
	st := fillTenant(t, ctx, d, "pgkeep")
	file := filepath.Join(t.TempDir(), "pgkeep.swbackup")
	_, errOut, code := d.cli("cluster", "backup", "pgkeep", "--out", file)
	if code != 0 {
		t.Fatalf("cluster backup of a postgres tenant: exit %d: %s", code, errOut)
	}
	t.Logf("backup: %s", strings.TrimSpace(errOut))
	d.mustCLI("cluster", "delete", "pgkeep", "--wait")
	_, errOut, code = d.cli("cluster", "restore", file)
	if code != 0 {
		t.Fatalf("cluster restore into postgres: exit %d: %s", code, errOut)
	}
	t.Logf("restore: %s", strings.TrimSpace(errOut))
	if got := d.cluster("pgkeep").Spec.Datastore; got != "postgres" {
		t.Errorf("restored spec.datastore = %q, want postgres", got)
	}
	for _, p := range []string{"state.db", "run/state.db"} {
		if _, err := os.Stat(filepath.Join(d.stateDir, "clusters", "pgkeep", p)); err == nil {
			t.Errorf("the backup's sqlite file stayed in the cluster dir (%s) after it was loaded into postgres", p)
		}
	}
	checkRestored(t, ctx, d, "pgkeep", st, "")
}
