// Package controlplane runs one Kubernetes control plane in the current
// process: kine over the configured datastore, then kube-apiserver, then (for
// tenant clusters) kube-controller-manager and kube-scheduler. The daemon runs
// each control plane in its own child process, so a crash or a leak stays
// with one tenant.
package controlplane

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/socialweb-computer/socialweb/internal/pki"
)

// Component names.
const (
	APIServer         = "apiserver"
	ControllerManager = "controller-manager"
	Scheduler         = "scheduler"
)

// ConfigFile is the name of the config file in a control plane's directory.
const ConfigFile = "controlplane.json"

// Config is everything a control-plane process needs. The daemon writes it
// (mode 0600: a postgres URL may hold a password) and the child reads it.
type Config struct {
	Name string `json:"name"`
	// Dir holds pki/, the kubeconfigs and this file: the daemon's, which the
	// process only reads.
	Dir string `json:"dir"`
	// RunDir, if set, is where the process writes (WorkDir): the sqlite database,
	// the sockets, the marks, its log. A tenant's is Dir/run, owned by its uid.
	RunDir     string   `json:"runDir,omitempty"`
	Components []string `json:"components"`
	// Datastore is a kine endpoint: sqlite://path or postgres://...
	Datastore string `json:"datastore"`
	Port      int    `json:"port"`
	// AdvertiseAddress is the address nodes reach the apiserver on.
	AdvertiseAddress string `json:"advertiseAddress"`
	// ServerName is the DNS name clients send in their TLS ClientHello (SNI)
	// to reach this control plane, through the front door or on its own
	// port: a sleeping tenant wakes only for a client that names it. The
	// serving certificate is valid for it besides the usual names, and the
	// admin kubeconfig sends it (tls-server-name). "" for none.
	ServerName  string `json:"serverName,omitempty"`
	ServiceCIDR string `json:"serviceCIDR"`
	ClusterCIDR string `json:"clusterCIDR,omitempty"`
	// NodeCIDR is the cluster's node network: with ClusterCIDR, all a tenant's
	// apiserver may dial for its cluster (egress.go).
	NodeCIDR         string `json:"nodeCIDR,omitempty"`
	NodeCIDRMaskSize int    `json:"nodeCIDRMaskSize,omitempty"`
	// Tenant enables what worker nodes need: Node authorization, bootstrap
	// tokens, NodeRestriction.
	Tenant bool `json:"tenant"`
	// SeedDir, if set, holds the datastore seeds shared by control planes of
	// the same binary (see seed.go): a fresh datastore is seeded from there,
	// or its first control plane captures the seed.
	SeedDir string `json:"seedDir,omitempty"`
	// SeedReadOnly: the process seeds from SeedDir but never captures a seed
	// there. A tenant's: its seed would be every later tenant's RBAC.
	SeedReadOnly bool `json:"seedReadOnly,omitempty"`
	// EncryptionConfig, if set, is the apiserver's EncryptionConfiguration file:
	// the management API of a service whose datastore other hosts share keeps its
	// Secrets (tenants' CAs among them) encrypted there.
	EncryptionConfig string `json:"encryptionConfig,omitempty"`
	// ListenFD, if not 0, is an inherited socket already listening on 127.0.0.1:Port:
	// the daemon keeps it open across the cluster's sleeps, so the port never stops
	// accepting. Given on the command line, never stored.
	ListenFD int `json:"-"`
}

// Has reports whether the config runs a component.
func (c Config) Has(component string) bool { return slices.Contains(c.Components, component) }

// RunDirName is a tenant's run dir in its Dir.
const RunDirName = "run"

// WorkDir is the directory the process works in and writes: RunDir, or Dir for
// a config without one (the management API's, a tenant's of an older daemon).
func (c Config) WorkDir() string {
	if c.RunDir != "" {
		return c.RunDir
	}
	return c.Dir
}

// PKI returns the paths of the control plane's certificates.
func (c Config) PKI() pki.Paths { return pki.PathsFor(filepath.Join(c.Dir, "pki")) }

// Kubeconfig returns the path of a client identity's kubeconfig.
func (c Config) Kubeconfig(id pki.Identity) string {
	return filepath.Join(c.Dir, id.Name+".kubeconfig")
}

// SchedulerConfig is the scheduler's KubeSchedulerConfiguration file.
func (c Config) SchedulerConfig() string { return filepath.Join(c.Dir, "scheduler-config.yaml") }

// URL is the apiserver's loopback address.
func (c Config) URL() string { return fmt.Sprintf("https://127.0.0.1:%d", c.Port) }

// Write stores the config in its directory.
func (c Config) Write() error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(c.Dir, ConfigFile)
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return os.Rename(path+".tmp", path)
}

// ReadConfig loads a config written by Write.
func ReadConfig(path string) (Config, error) {
	var c Config
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("reading control-plane config: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("parsing control-plane config %s: %w", path, err)
	}
	if c.Port == 0 || c.Dir == "" || c.Datastore == "" || len(c.Components) == 0 {
		return c, fmt.Errorf("control-plane config %s is incomplete: port, dir, datastore and components are required", path)
	}
	return c, nil
}

// RunFiles are the names of what a control plane writes in its WorkDir, its log
// aside (the daemon names that): a tenant of an older daemon wrote them in Dir,
// whence the daemon moves them into its run dir. Its sockets are made anew.
func RunFiles() (files, sockets []string) {
	// state.db is the sqlite datastore's name (datastore.Store.Ensure).
	files = []string{"state.db", "state.db-wal", "state.db-shm", upMark, seededMark, activityMark, policyBuildFile, egressConfigFile}
	sockets = []string{"kine.sock", privateSocket, egressClusterSocket, egressControlSocket}
	return files, sockets
}
