package daemon

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/socialweb-computer/socialweb/internal/atomicfile"
	"github.com/socialweb-computer/socialweb/internal/bootstrap"
	"github.com/socialweb-computer/socialweb/internal/buildcache"
	"github.com/socialweb-computer/socialweb/internal/datastore"
	"github.com/socialweb-computer/socialweb/internal/hosts"
	"github.com/socialweb-computer/socialweb/internal/pki"
)

// ClusterKeyFile is --cluster-key-file's default under the state dir.
const ClusterKeyFile = "cluster.key"

// MinHostLeaseDuration bounds --host-lease-duration: renewals every third of it
// must fit several API round trips.
const MinHostLeaseDuration = 3 * time.Second

// hostName is --host-name, or this machine's hostname when it is empty.
func hostName(o Options) (string, error) {
	name, flag := o.HostName, "--host-name"
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("reading this machine's hostname: %w; pass --host-name", err)
		}
		name, flag = strings.ToLower(strings.SplitN(h, ".", 2)[0]), "this machine's hostname"
	}
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return "", fmt.Errorf("%s %q is not a host name: %s; pass --host-name with a DNS label such as host-1", flag, name, strings.Join(errs, "; "))
	}
	return name, nil
}

// validateHosts checks the many-hosts flags.
func validateHosts(o Options) error {
	if o.MaxTenants < 0 {
		return fmt.Errorf("--max-tenants %d: want 0 (no cap) or more", o.MaxTenants)
	}
	if o.HostLeaseDuration != 0 && o.HostLeaseDuration < MinHostLeaseDuration {
		return fmt.Errorf("--host-lease-duration %s: want at least %s (0 is %s)", o.HostLeaseDuration, MinHostLeaseDuration, hosts.DefaultLeaseDuration)
	}
	return nil
}

// bootstrapFiles are the management API's PKI files every host must share: the
// CAs that sign each host's serving and client certificates, and the key
// service-account tokens are signed with. Leaves stay per host.
func bootstrapFiles(stateDir string, p pki.Paths) map[string]string {
	return map[string]string{
		"server-ca.crt": p.ServerCA, "server-ca.key": p.ServerCAKey,
		"client-ca.crt": p.ClientCA, "client-ca.key": p.ClientCAKey,
		"sa.key": p.ServiceAccountKey, "sa.pub": p.ServiceAccountPub,
		"buildcache.key": buildCacheKeyPath(stateDir),
	}
}

// clusterKeyPath is --cluster-key-file, or its default in the state dir.
func clusterKeyPath(o Options) string {
	if o.ClusterKeyFile != "" {
		return o.ClusterKeyFile
	}
	return filepath.Join(o.StateDir, ClusterKeyFile)
}

// loadClusterKey reads the cluster key; only the default file is made when
// missing: a key file named on purpose and absent is a mistake to report.
func loadClusterKey(o Options) ([]byte, error) {
	key, err := bootstrap.LoadOrCreateKey(clusterKeyPath(o), o.ClusterKeyFile == "")
	if err != nil {
		return nil, fmt.Errorf("--cluster-key-file: %w", err)
	}
	return key, nil
}

// writeEncryptionConfig writes the management API's EncryptionConfiguration:
// Secrets sealed with secretbox under a key derived from the cluster key, so
// every host reads what any host wrote and the datastore holds no tenant key
// in clear; identity reads Secrets written before.
func writeEncryptionConfig(path string, clusterKey []byte) error {
	m := hmac.New(sha256.New, clusterKey)
	m.Write([]byte("socialweb management API secrets\x00"))
	secret := base64.StdEncoding.EncodeToString(m.Sum(nil))
	cfg := `apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
  - resources: [secrets]
    providers:
      - secretbox:
          keys:
            - name: cluster-key-1
              secret: ` + secret + `
      - identity: {}
`
	return atomicfile.Write(path, []byte(cfg), 0o600)
}

// shareBootstrap makes this host's management PKI the service's: it offers its
// CA files to the management database (the first host's win) and writes back
// what is stored there. It reports whether a file changed: leaves signed by the
// old CAs are then issued again.
func shareBootstrap(ctx context.Context, v validated, key []byte, paths pki.Paths, log *slog.Logger) (changed bool, err error) {
	keyPath := clusterKeyPath(v.Options)
	// The build cache's key too: runner credentials name a cluster's cache
	// access, which must stay valid on whichever host runs it.
	if _, err := buildcache.LoadOrCreateKey(buildCacheKeyPath(v.StateDir)); err != nil {
		return false, fmt.Errorf("the build cache's key: %w", err)
	}
	dsn, err := datastore.AdminURL(v.Datastore, "mgmt")
	if err != nil {
		return false, err
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return false, err
	}
	defer db.Close()
	files := bootstrapFiles(v.StateDir, paths)
	local := map[string][]byte{}
	for name, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			return false, fmt.Errorf("reading the management PKI: %w", err)
		}
		local[name] = b
	}
	shared, err := bootstrap.Store{DB: db}.Share(ctx, key, local)
	if errors.Is(err, bootstrap.ErrWrongKey) {
		return false, fmt.Errorf("%w (this host's key: %s)", err, keyPath)
	}
	if err != nil {
		return false, fmt.Errorf("sharing the management PKI through the datastore: %w", err)
	}
	for name, path := range files {
		b, ok := shared[name]
		if !ok {
			return false, fmt.Errorf("the datastore's bootstrap lacks %s: it was made by another socialweb release; run the same release on every host", name)
		}
		if string(b) == string(local[name]) {
			continue
		}
		mode := os.FileMode(0o600)
		if strings.HasSuffix(name, ".crt") || strings.HasSuffix(name, ".pub") {
			mode = 0o644
		}
		if err := os.WriteFile(path, b, mode); err != nil {
			return false, fmt.Errorf("writing the service's %s: %w", name, err)
		}
		changed = true
	}
	if changed {
		log.Info("joined a service: the management API's CAs are the service's, from its datastore", "clusterKey", keyPath)
	}
	return changed, nil
}

// readResources reads this host's CPUs and memory.
func readResources() (hosts.Resources, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return hosts.Resources{}, err
	}
	r := hosts.Resources{CPUs: runtime.NumCPU()}
	for _, line := range strings.Split(string(b), "\n") {
		var field string
		var kb int64
		if _, err := fmt.Sscanf(line, "%s %d kB", &field, &kb); err != nil {
			continue
		}
		switch field {
		case "MemTotal:":
			r.Memory = kb << 10
		case "MemAvailable:":
			r.FreeMemory = kb << 10
		}
	}
	if r.Memory == 0 {
		return r, errors.New("no MemTotal in /proc/meminfo")
	}
	return r, nil
}

// hostHooks tell the provider (made after the host joins) what membership sees.
type hostHooks struct {
	tenants  func() (owned, awake int)
	hostLost func(host string)
	fenced   func()
}

// joinHosts registers this host and starts renewing its Lease. A host whose
// Lease had lapsed waits one Lease duration before it runs any tenant (Join).
func joinHosts(ctx context.Context, v validated, name, version string, kube kubernetes.Interface, dyn dynamic.Interface,
	hooks hostHooks, log *slog.Logger) (*hosts.Membership, error) {
	d := v.HostLeaseDuration
	if d == 0 {
		d = hosts.DefaultLeaseDuration
	}
	m := hosts.New(hosts.Config{Name: name, Address: v.HostAddress, FrontDoor: v.FrontDoor, Registry: v.registryPeer, Version: version, MaxTenants: v.MaxTenants,
		LeaseDuration: d, RenewEvery: d / 3, Shared: v.store.Kind() == "postgres", Resources: readResources,
		Tenants: hooks.tenants, OnHostLost: hooks.hostLost, OnFenced: hooks.fenced},
		kube, dyn, log.With("component", "hosts"))
	wait, err := m.Join(ctx)
	if err != nil {
		return nil, fmt.Errorf("joining the service as host %s: %w", name, err)
	}
	// Renewing from now on, the wait included: others must not see this host
	// lapse again while it waits.
	go m.Run(ctx)
	if wait > 0 {
		log.Warn("this host's Lease had lapsed: waiting one Lease duration for other hosts' takeovers to land before running any tenant", "host", name, "wait", wait)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
	log.Info("host joined", "host", name, "leaseDuration", d, "shared", v.store.Kind() == "postgres")
	return m, nil
}
