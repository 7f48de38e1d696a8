package controlplane

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/k3s-io/kine/pkg/endpoint"
	clientv3 "go.etcd.io/etcd/client/v3"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

func bootstrapLabel() map[string]string {
	return map[string]string{"kubernetes.io/bootstrapping": "rbac-defaults"}
}

func encode(t *testing.T, obj runtime.Object) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := storageCodec().Encode(obj, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func clusterRole(name string, labels map[string]string) *rbacv1.ClusterRole {
	return &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, UID: "old-uid", CreationTimestamp: metav1.NewTime(time.Unix(1000, 0))},
		Rules:      []rbacv1.PolicyRule{{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"pods"}}},
	}
}

func priorityClass(name string) *schedulingv1.PriorityClass {
	return &schedulingv1.PriorityClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: "scheduling.k8s.io/v1", Kind: "PriorityClass"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Value:      1000,
	}
}

func TestBootstrapObject(t *testing.T) {
	for _, tc := range []struct {
		name   string
		prefix string
		obj    metav1.Object
		want   bool
	}{
		{"bootstrap ClusterRole", "/registry/clusterroles/", clusterRole("view", bootstrapLabel()), true},
		{"user ClusterRole", "/registry/clusterroles/", clusterRole("mine", nil), false},
		{"other bootstrapping label", "/registry/clusterroles/", clusterRole("x", map[string]string{"kubernetes.io/bootstrapping": "other"}), false},
		{"system PriorityClass", "/registry/priorityclasses/", priorityClass("system-node-critical"), true},
		{"user PriorityClass", "/registry/priorityclasses/", priorityClass("high"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := bootstrapObject(tc.prefix, tc.obj); got != tc.want {
				t.Errorf("bootstrapObject = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestRenewGivesANewIdentityOnly(t *testing.T) {
	in := clusterRole("view", bootstrapLabel())
	old := metav1.NewTime(time.Unix(1000, 0))
	in.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kube-apiserver", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "rbac.authorization.k8s.io/v1", Time: &old}}
	now := metav1.NewTime(time.Unix(2000, 0))
	out, err := renew(storageCodec(), encode(t, in), types.UID("new-uid"), now)
	if err != nil {
		t.Fatal(err)
	}
	obj, _, err := storageCodec().Decode(out, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := obj.(*rbacv1.ClusterRole)
	if got.UID != "new-uid" || !got.CreationTimestamp.Equal(&now) || !got.ManagedFields[0].Time.Equal(&now) {
		t.Errorf("identity not renewed: uid %s, created %s, managed %s", got.UID, got.CreationTimestamp, got.ManagedFields[0].Time)
	}
	if got.Name != in.Name || !reflect.DeepEqual(got.Labels, in.Labels) || !reflect.DeepEqual(got.Rules, in.Rules) || got.ManagedFields[0].Manager != "kube-apiserver" {
		t.Errorf("renew changed more than the identity: %+v", got)
	}
}

func TestSeedName(t *testing.T) {
	mtime := time.Unix(1700000000, 0)
	base := seedName("v1.37.2", "/usr/bin/socialweb", 100, mtime)
	for _, tc := range []struct {
		name  string
		other string
	}{
		{"another Kubernetes version", seedName("v1.37.3", "/usr/bin/socialweb", 100, mtime)},
		{"another path", seedName("v1.37.2", "/tmp/socialweb", 100, mtime)},
		{"another size", seedName("v1.37.2", "/usr/bin/socialweb", 101, mtime)},
		{"rebuilt", seedName("v1.37.2", "/usr/bin/socialweb", 100, mtime.Add(time.Second))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.other == base {
				t.Errorf("same seed name %s", base)
			}
		})
	}
	if again := seedName("v1.37.2", "/usr/bin/socialweb", 100, mtime); again != base {
		t.Errorf("seed name not stable: %s, then %s", base, again)
	}
	if filepath.Base(base) != base {
		t.Errorf("seed name %q is not a plain file name", base)
	}
}

// startKine runs kine over a new sqlite file and returns a client of it.
func startKine(t *testing.T) (string, *clientv3.Client) {
	t.Helper()
	dir := t.TempDir()
	ep := "unix://" + filepath.Join(dir, "kine.sock")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cfg := kineConfig(Config{Datastore: "sqlite://" + filepath.Join(dir, "state.db") + "?_journal_mode=WAL"})
	cfg.Listener = ep
	if _, err := endpoint.Listen(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	cli, err := kineClient(ep)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return ep, cli
}

func create(t *testing.T, cli *clientv3.Client, key string, value []byte) {
	t.Helper()
	resp, err := cli.Txn(context.Background()).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).Then(clientv3.OpPut(key, string(value))).Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("creating %s: %v (succeeded %v)", key, err, resp != nil && resp.Succeeded)
	}
}

func TestSeedCaptureAndApply(t *testing.T) {
	ctx := context.Background()
	_, src := startKine(t)
	if empty, err := holdsNoSeed(ctx, src); err != nil || !empty {
		t.Fatalf("new datastore: holdsNoSeed = %v, %v", empty, err)
	}
	create(t, src, "/registry/clusterroles/view", encode(t, clusterRole("view", bootstrapLabel())))
	create(t, src, "/registry/clusterroles/mine", encode(t, clusterRole("mine", nil)))
	create(t, src, "/registry/priorityclasses/system-node-critical", encode(t, priorityClass("system-node-critical")))
	// A bootstrap object changed since it was made is not taken.
	create(t, src, "/registry/clusterroles/edit", encode(t, clusterRole("edit", bootstrapLabel())))
	if _, err := src.Put(ctx, "/registry/clusterroles/edit", string(encode(t, clusterRole("edit", bootstrapLabel())))); err != nil {
		t.Fatal(err)
	}
	entries, err := captureSeed(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, e := range entries {
		keys = append(keys, e.Key)
	}
	want := []string{"/registry/clusterroles/view", "/registry/priorityclasses/system-node-critical"}
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("captured %v, want %v", keys, want)
	}

	path := filepath.Join(t.TempDir(), "seeds", seedName("v1", "/x", 1, time.Unix(1, 0)))
	stale := filepath.Join(filepath.Dir(path), "seed-stale.json")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stale, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := writeSeed(path, entries); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the seed of another binary was kept: %v", err)
	}
	read, err := readSeed(path)
	if err != nil || !reflect.DeepEqual(read, entries) {
		t.Fatalf("readSeed = %d entries, %v; want the %d written", len(read), err, len(entries))
	}

	_, dst := startKine(t)
	// One object is there already, as if the hook had been first.
	create(t, dst, "/registry/clusterroles/view", encode(t, clusterRole("view", bootstrapLabel())))
	made, err := applySeed(ctx, dst, read, time.Now())
	if err != nil || made != 1 {
		t.Fatalf("applySeed = %d, %v; want 1 object made", made, err)
	}
	if empty, err := holdsNoSeed(ctx, dst); err != nil || empty {
		t.Errorf("seeded datastore: holdsNoSeed = %v, %v", empty, err)
	}
	resp, err := dst.Get(ctx, "/registry/priorityclasses/system-node-critical")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("seeded PriorityClass: %v", err)
	}
	obj, _, err := storageCodec().Decode(resp.Kvs[0].Value, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	pc := obj.(*schedulingv1.PriorityClass)
	if pc.UID == "" || pc.Value != 1000 {
		t.Errorf("seeded PriorityClass: uid %q, value %d", pc.UID, pc.Value)
	}
	if made, err := applySeed(ctx, dst, read, time.Now()); err != nil || made != 0 {
		t.Errorf("second applySeed = %d, %v; want nothing made", made, err)
	}
}

func TestStartSeedingLeavesAUsedDatastoreAlone(t *testing.T) {
	ctx := context.Background()
	ep, cli := startKine(t)
	create(t, cli, "/registry/clusterroles/view", encode(t, clusterRole("view", bootstrapLabel())))
	if s := startSeeding(ctx, ep, t.TempDir(), t.TempDir(), true, slog.New(slog.DiscardHandler)); s != nil {
		s.close()
		t.Error("a datastore holding the bootstrap policy was going to be seeded")
	}
}

func TestSeedingMarksReadiness(t *testing.T) {
	ctx := context.Background()
	_, src := startKine(t)
	create(t, src, "/registry/clusterroles/view", encode(t, clusterRole("view", bootstrapLabel())))
	entries, err := captureSeed(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	seedDir, cpDir := t.TempDir(), t.TempDir()
	path, err := seedPath(seedDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeSeed(path, entries); err != nil {
		t.Fatal(err)
	}
	if got := ReadyzPath(cpDir); got != "/readyz" {
		t.Fatalf("before seeding: ReadyzPath = %q, want /readyz", got)
	}

	ep, _ := startKine(t)
	s := startSeeding(ctx, ep, seedDir, cpDir, true, slog.New(slog.DiscardHandler))
	if s == nil {
		t.Fatal("an empty datastore with a seed at hand was not seeded")
	}
	<-s.done
	s.close()
	want := "/readyz?exclude=poststarthook%2Frbac%2Fbootstrap-roles&exclude=poststarthook%2Fscheduling%2Fbootstrap-system-priority-classes"
	if got := ReadyzPath(cpDir); got != want {
		t.Errorf("after seeding: ReadyzPath = %q, want %q", got, want)
	}
	// The next run of the control plane starts unmarked.
	if err := clearMark(cpDir, seededMark); err != nil {
		t.Fatal(err)
	}
	if got := ReadyzPath(cpDir); got != "/readyz" {
		t.Errorf("after unmarking: ReadyzPath = %q, want /readyz", got)
	}
	if err := clearMark(cpDir, seededMark); err != nil {
		t.Errorf("unmarking an unmarked dir: %v", err)
	}
}

// A restart of a used datastore skips the hooks' readiness checks only when
// this same build finished the hooks on it before.
func TestStartSeedingTrustsThePolicyOfItsOwnBuild(t *testing.T) {
	key, err := ownBuildKey()
	if err != nil {
		t.Fatal(err)
	}
	excluded := "/readyz?exclude=poststarthook%2Frbac%2Fbootstrap-roles&exclude=poststarthook%2Fscheduling%2Fbootstrap-system-priority-classes"
	tests := []struct {
		name   string
		policy bool   // the datastore holds the bootstrap policy
		file   string // policyBuildFile's content; "" for none
		want   string
	}{
		{"hooks of this build finished before", true, key + "\n", excluded},
		{"hooks of another build", true, "0123456789abcdef\n", "/readyz"},
		{"never recorded", true, "", "/readyz"},
		{"recorded, but the datastore is empty", false, key + "\n", "/readyz"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep, cli := startKine(t)
			if tt.policy {
				create(t, cli, "/registry/clusterroles/view", encode(t, clusterRole("view", bootstrapLabel())))
			}
			cpDir := t.TempDir()
			if tt.file != "" {
				if err := os.WriteFile(filepath.Join(cpDir, policyBuildFile), []byte(tt.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			// No seed in the seed dir: an empty datastore is not seeded either.
			if s := startSeeding(context.Background(), ep, t.TempDir(), cpDir, true, slog.New(slog.DiscardHandler)); s != nil {
				<-s.done
				s.close()
			}
			if got := ReadyzPath(cpDir); got != tt.want {
				t.Errorf("ReadyzPath = %q, want %q", got, tt.want)
			}
		})
	}
}
