package controlplane

import (
	"fmt"
	"net"
	"os"

	"github.com/socialweb-computer/socialweb/internal/pki"
)

// clients are the identities a control plane issues certificates for.
func clients() []pki.Identity {
	return []pki.Identity{pki.Admin, pki.ControllerManager, pki.Scheduler, pki.KubeletClient, pki.Daemon}
}

// Prepare lays down everything Run needs in c.Dir: the PKI (kept if present),
// kubeconfigs for the components and the admin, and the config file. It is
// idempotent, so the daemon calls it before every start.
func Prepare(c Config, extraIPs ...net.IP) error {
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return fmt.Errorf("creating control-plane dir: %w", err)
	}
	// Others lose every bit and the group its write; a tenant's group keeps its
	// read (the daemon gives it), so a running tenant never loses its way in.
	fi, err := os.Stat(c.Dir)
	if err != nil {
		return fmt.Errorf("restricting control-plane dir: %w", err)
	}
	if err := os.Chmod(c.Dir, fi.Mode().Perm()&0o750); err != nil {
		return fmt.Errorf("restricting control-plane dir: %w", err)
	}
	ips := []net.IP{net.IPv4(127, 0, 0, 1).To4()}
	if adv := net.ParseIP(c.AdvertiseAddress); adv != nil && !adv.IsLoopback() {
		ips = append(ips, adv.To4())
	}
	ips = append(ips, extraIPs...)
	names := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	if c.ServerName != "" {
		names = append(names, c.ServerName)
	}
	// Before every start: a tenant made before the front-proxy CA existed gets it here.
	p, err := pki.Ensure(c.PKI().Dir, pki.Options{ServingIPs: ips, ServingNames: names, Clients: clients(), FrontProxy: c.Tenant})
	if err != nil {
		return fmt.Errorf("preparing PKI for %s: %w", c.Name, err)
	}
	// The admin's kubeconfig names the cluster, so it wakes a sleeping one.
	// The components' and the daemon's do not: they never reach for a
	// sleeping cluster, and if one did by a race, it must not wake it (the
	// daemon's requests are not the tenant's intent).
	for _, id := range []pki.Identity{pki.Admin, pki.ControllerManager, pki.Scheduler, pki.Daemon} {
		serverName := ""
		if id.Name == pki.Admin.Name {
			serverName = c.ServerName
		}
		if err := pki.WriteKubeconfigVia(c.Kubeconfig(id), p, id, c.Name, c.URL(), serverName); err != nil {
			return fmt.Errorf("writing %s kubeconfig for %s: %w", id.Name, c.Name, err)
		}
	}
	if err := os.WriteFile(c.SchedulerConfig(), schedulerConfig(c), 0o600); err != nil {
		return fmt.Errorf("writing scheduler config for %s: %w", c.Name, err)
	}
	return c.Write()
}

// schedulerConfig is the scheduler's configuration file. Its backoff is shorter than the
// defaults (1 s initial, 10 s max): at zero nodes every Pod fails to schedule until a
// node joins, and with the default a Pod waits up to 10 s after its node is Ready.
func schedulerConfig(c Config) []byte {
	return fmt.Appendf(nil, `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %q
leaderElection:
  leaderElect: false
podInitialBackoffSeconds: 1
podMaxBackoffSeconds: 2
`, c.Kubeconfig(pki.Scheduler))
}
