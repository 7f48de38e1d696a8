package controlplane

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/component-base/version"
	schedulingv1helper "k8s.io/kubernetes/pkg/apis/scheduling/v1"
	"k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac/bootstrappolicy"
)

// A seed is the bootstrap RBAC policy and system PriorityClasses as a fresh
// kube-apiserver of this very binary stored them. kube-apiserver's post-start
// hooks rbac/bootstrap-roles and scheduling/bootstrap-system-priority-classes
// wait a full second (wait.Poll) before their first attempt, and /readyz waits
// for both; on an empty datastore the RBAC hook then spends most of another
// second creating about 130 objects. Written into a new tenant's datastore
// while its apiserver is still starting, the seed leaves the hooks only reads
// to do: they still run, compare, and add whatever the seed lacks.
//
// The first fresh tenant started by a binary captures the seed once it is
// Ready; later fresh tenants of the same binary are seeded from it, each copy
// with its own UIDs and timestamps.

// SeedDirIn is where the control planes of a daemon's state dir keep their
// seeds: the management API and the tenants share them.
func SeedDirIn(stateDir string) string { return filepath.Join(stateDir, "seeds") }

// seedPrefixes are the storage keys a seed holds: what the two hooks write.
func seedPrefixes() []string {
	return []string{
		"/registry/clusterroles/",
		"/registry/clusterrolebindings/",
		"/registry/roles/",
		"/registry/rolebindings/",
		"/registry/priorityclasses/",
	}
}

// seedEntry is one stored object: its key and the apiserver's encoding of it.
type seedEntry struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
}

// seedFile is the on-disk seed.
type seedFile struct {
	// Binary identifies the executable that captured the seed.
	Binary  string      `json:"binary"`
	Entries []seedEntry `json:"entries"`
}

// seedPath is the seed of the running executable in dir: its name changes
// with the Kubernetes version and the executable file, so a rebuilt binary
// never reads a seed its predecessor captured.
func seedPath(dir string) (string, error) {
	key, err := ownBuildKey()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "seed-"+key+".json"), nil
}

func seedName(kubeVersion, exe string, size int64, mtime time.Time) string {
	return "seed-" + buildKey(kubeVersion, exe, size, mtime) + ".json"
}

// buildKey names one build of this program: what the bootstrap hooks write
// can differ between builds, never within one.
func buildKey(kubeVersion, exe string, size int64, mtime time.Time) string {
	h := sha256.Sum256(fmt.Appendf(nil, "%s\x00%s\x00%d\x00%d", kubeVersion, exe, size, mtime.UnixNano()))
	return hex.EncodeToString(h[:8])
}

// ownBuildKey is buildKey of the running executable.
func ownBuildKey() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding own executable: %w", err)
	}
	// Through /proc: the executable's directory may not be searchable by a
	// tenant's uid (it was started through an fd the daemon opened).
	st, err := os.Stat("/proc/self/exe")
	if err != nil {
		return "", fmt.Errorf("reading own executable: %w", err)
	}
	return buildKey(version.Get().GitVersion, exe, st.Size(), st.ModTime()), nil
}

// policyBuildFile, in a control plane's dir, names the build whose bootstrap
// hooks last finished on its datastore. It outlives runs (it is not a mark):
// a later run of the same build finds nothing for the hooks to do, so its
// readiness need not wait the second or more they take, which is most of
// what separates a wake from a fresh, seeded start. Another build (an
// upgrade may add rules) waits for them again.
const policyBuildFile = "policy-build"

// policyCurrent reports whether the hooks of this build finished on the
// datastore of the control plane in cpDir in an earlier run.
func policyCurrent(cpDir string) bool {
	key, err := ownBuildKey()
	if err != nil {
		return false
	}
	b, err := os.ReadFile(filepath.Join(cpDir, policyBuildFile))
	return err == nil && strings.TrimSpace(string(b)) == key
}

// recordPolicyBuild waits for the full /readyz (every bootstrap hook done)
// and then writes policyBuildFile. It gives up quietly when ctx ends: the
// next run then waits for the hooks, as it would have.
func recordPolicyBuild(ctx context.Context, c Config, log *slog.Logger) {
	key, err := ownBuildKey()
	if err != nil {
		log.Warn("not recording the bootstrap policy's build", "err", err)
		return
	}
	client, err := AdminHTTPClient(c)
	if err != nil {
		log.Warn("not recording the bootstrap policy's build", "err", err)
		return
	}
	for {
		if probePath(ctx, client, c, "/readyz") == nil {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
	path := filepath.Join(c.WorkDir(), policyBuildFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(key+"\n"), 0o600); err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		log.Warn("recording the bootstrap policy's build; the next start waits for the hooks", "err", err)
	}
}

// kineClient connects to kine as the apiserver does.
func kineClient(endpoint string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("connecting to kine: %w", err)
	}
	return cli, nil
}

// holdsNoSeed reports whether the datastore holds none of what a seed holds:
// its apiserver has never run the hooks.
func holdsNoSeed(ctx context.Context, cli *clientv3.Client) (bool, error) {
	for _, prefix := range seedPrefixes() {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
		if err != nil {
			return false, fmt.Errorf("listing %s: %w", prefix, err)
		}
		if len(resp.Kvs) > 0 {
			return false, nil
		}
	}
	return true, nil
}

// storageCodec reads and writes objects in the apiserver's storage encoding
// (protobuf, the default for built-in types).
func storageCodec() *protobuf.Serializer {
	return protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
}

// captureSeed reads what the hooks wrote from a fresh, Ready control plane.
// Only objects the hooks made and nobody has changed since are taken: RBAC
// objects with the bootstrap label and the system PriorityClasses, still at
// the revision they were created with.
func captureSeed(ctx context.Context, cli *clientv3.Client) ([]seedEntry, error) {
	codec := storageCodec()
	var out []seedEntry
	for _, prefix := range seedPrefixes() {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", prefix, err)
		}
		for _, kv := range resp.Kvs {
			if kv.ModRevision != kv.CreateRevision {
				continue
			}
			obj, _, err := codec.Decode(kv.Value, nil, nil)
			if err != nil {
				return nil, fmt.Errorf("decoding %s: %w", kv.Key, err)
			}
			m, err := meta.Accessor(obj)
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", kv.Key, err)
			}
			if !bootstrapObject(prefix, m) {
				continue
			}
			out = append(out, seedEntry{Key: string(kv.Key), Value: kv.Value})
		}
	}
	return out, nil
}

// bootstrapObject reports whether an object is one the hooks make.
func bootstrapObject(prefix string, m metav1.Object) bool {
	if prefix == "/registry/priorityclasses/" {
		return slices.ContainsFunc(schedulingv1helper.SystemPriorityClasses(), func(pc *schedulingv1.PriorityClass) bool {
			return pc.Name == m.GetName()
		})
	}
	for k, v := range bootstrappolicy.Label {
		if m.GetLabels()[k] != v {
			return false
		}
	}
	return true
}

// renew gives a stored object a new identity: a UID and creation (and
// managed-fields) times of now, as if it had just been created.
func renew(codec *protobuf.Serializer, value []byte, uid types.UID, now metav1.Time) ([]byte, error) {
	obj, gvk, err := codec.Decode(value, nil, nil)
	if err != nil {
		return nil, err
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, err
	}
	m.SetUID(uid)
	m.SetCreationTimestamp(now)
	mf := m.GetManagedFields()
	for i := range mf {
		if mf[i].Time != nil {
			mf[i].Time = &now
		}
	}
	m.SetManagedFields(mf)
	obj.GetObjectKind().SetGroupVersionKind(*gvk)
	var buf bytes.Buffer
	if err := codec.Encode(obj, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// applySeed creates each seeded object that does not exist yet, the way the
// apiserver creates (a transaction on mod revision 0), so a hook that got
// there first wins and nothing is overwritten. It returns how many it made.
func applySeed(ctx context.Context, cli *clientv3.Client, entries []seedEntry, now time.Time) (int, error) {
	codec := storageCodec()
	ts := metav1.NewTime(now.UTC().Truncate(time.Second))
	made := 0
	for _, e := range entries {
		value, err := renew(codec, e.Value, uuid.NewUUID(), ts)
		if err != nil {
			return made, fmt.Errorf("renewing %s: %w", e.Key, err)
		}
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(e.Key), "=", 0)).
			Then(clientv3.OpPut(e.Key, string(value))).
			Commit()
		if err != nil {
			return made, fmt.Errorf("creating %s: %w", e.Key, err)
		}
		if resp.Succeeded {
			made++
		}
	}
	return made, nil
}

// readSeed loads a seed; a missing file is (nil, nil).
func readSeed(path string) ([]seedEntry, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading seed: %w", err)
	}
	var f seedFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("parsing seed %s: %w", path, err)
	}
	return f.Entries, nil
}

// writeSeed stores a seed atomically and removes the seeds of other
// binaries from its directory.
func writeSeed(path string, entries []seedEntry) error {
	b, err := json.Marshal(seedFile{Binary: filepath.Base(path), Entries: entries})
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	// Readable by every tenant's uid, writable by root alone: a seed holds the
	// bootstrap policy, nothing secret.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating seed dir: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".seed-*")
	if err != nil {
		return fmt.Errorf("writing seed: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("writing seed: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("writing seed: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing seed: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing seed: %w", err)
	}
	old, _ := filepath.Glob(filepath.Join(dir, "seed-*.json"))
	for _, o := range old {
		if o != path {
			_ = os.Remove(o)
		}
	}
	return nil
}

// seeder seeds a fresh datastore at start and, when there was no seed to
// use, captures one once the control plane is Ready.
type seeder struct {
	log     *slog.Logger
	path    string
	cli     *clientv3.Client
	entries []seedEntry
	capture bool
	cancel  context.CancelFunc
	done    chan struct{}
}

// startSeeding opens the datastore and, if it holds none of a seed and a seed
// exists, starts writing the seed in the background. It returns nil when the
// datastore was seeded or bootstrapped before, or cannot be read (logged);
// the control plane then starts as it would have.
//
// Once the seed is written, a mark in cpDir tells readiness probes that the
// two hooks have nothing left to create (see ReadyzPath).
//
// capture false never writes a seed (a tenant's: see Config.SeedReadOnly).
func startSeeding(ctx context.Context, endpoint, dir, cpDir string, capture bool, log *slog.Logger) *seeder {
	path, err := seedPath(dir)
	if err != nil {
		log.Warn("not seeding the datastore", "err", err)
		return nil
	}
	cli, err := kineClient(endpoint)
	if err != nil {
		log.Warn("not seeding the datastore", "err", err)
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &seeder{log: log, path: path, cli: cli, cancel: cancel, done: make(chan struct{}), capture: capture}
	if fresh, err := holdsNoSeed(ctx, cli); err != nil || !fresh {
		if err != nil {
			log.Warn("not seeding the datastore", "err", err)
		} else {
			log.Debug("the datastore holds the bootstrap policy already: not seeding it")
			if policyCurrent(cpDir) {
				// This build's hooks finished on it before: as good as a seed.
				if err := setMark(cpDir, seededMark); err != nil {
					log.Warn("marking the bootstrap policy current; readiness waits for the hooks", "err", err)
				}
			}
		}
		cancel()
		cli.Close()
		return nil
	}
	if s.entries, err = readSeed(path); err != nil {
		log.Warn("not seeding the datastore", "err", err)
	}
	if len(s.entries) == 0 {
		close(s.done)
		return s
	}
	go func() {
		defer close(s.done)
		start := time.Now()
		made, err := applySeed(ctx, cli, s.entries, start)
		if err != nil && ctx.Err() == nil {
			log.Warn("seeding the datastore", "err", err, "created", made)
			return
		}
		if err := setMark(cpDir, seededMark); err != nil {
			log.Warn("marking the datastore seeded; readiness waits for the bootstrap hooks", "err", err)
		}
		log.Info("datastore seeded with the bootstrap policy", "objects", made, "elapsed", time.Since(start).Round(time.Millisecond))
	}()
	return s
}

// ready is called once the control plane is Ready: with no seed to use at
// start, this is when one is captured for the next fresh control plane.
func (s *seeder) ready(ctx context.Context) {
	if s == nil {
		return
	}
	<-s.done
	if len(s.entries) > 0 || !s.capture {
		return
	}
	start := time.Now()
	entries, err := captureSeed(ctx, s.cli)
	if err == nil {
		err = writeSeed(s.path, entries)
	}
	if err != nil {
		s.log.Warn("capturing a datastore seed", "err", err)
		return
	}
	s.log.Info("captured a datastore seed for the next clusters", "objects", len(entries), "path", s.path, "elapsed", time.Since(start).Round(time.Millisecond))
}

// close stops the seeding and disconnects.
func (s *seeder) close() {
	if s == nil {
		return
	}
	s.cancel()
	<-s.done
	s.cli.Close()
}

// seedHookChecks are the /readyz checks of the post-start hooks whose whole
// work a seed has done: each still waits 1 s before its first look.
func seedHookChecks() []string {
	return []string{
		"poststarthook/rbac/bootstrap-roles",
		"poststarthook/scheduling/bootstrap-system-priority-classes",
	}
}

// ReadyzPath is the readiness path to probe for the control plane in cpDir:
// /readyz, less the checks of the bootstrap hooks once its datastore is known
// to hold everything they would create (seededMark).
func ReadyzPath(cpDir string) string {
	if !hasMark(cpDir, seededMark) {
		return "/readyz"
	}
	q := url.Values{"exclude": seedHookChecks()}
	return "/readyz?" + q.Encode()
}
