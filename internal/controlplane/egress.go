package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/socialweb-computer/socialweb/internal/egressproxy"
)

// The apiserver's egress (internal/egressproxy): its sockets, relative to the control
// plane's directory (the process's working directory: a unix socket path is short).
const (
	egressConfigFile       = "egress-selector.yaml"
	egressClusterSocket    = "egress-cluster.sock"
	egressControlSocket    = "egress-controlplane.sock"
	egressSelectorTemplate = `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %s
- name: controlplane
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %s
`
)

// egressWalled reports whether c's apiserver sends its egress through the proxies: a
// tenant whose config names its node network.
func (c Config) egressWalled() bool { return c.Tenant && c.NodeCIDR != "" && c.ClusterCIDR != "" }

// egressPolicies are what a tenant's apiserver may dial: for the cluster, its nodes
// and Pods, never the gateway (the host); for the control plane (URL webhooks, audit),
// those or public addresses.
func (c Config) egressPolicies() (cluster, controlplane egressproxy.Policy, err error) {
	nodes, err := netip.ParsePrefix(c.NodeCIDR)
	if err != nil {
		return cluster, controlplane, fmt.Errorf("node CIDR %q: %w", c.NodeCIDR, err)
	}
	pods, err := netip.ParsePrefix(c.ClusterCIDR)
	if err != nil {
		return cluster, controlplane, fmt.Errorf("cluster CIDR %q: %w", c.ClusterCIDR, err)
	}
	var deny []netip.Addr
	if gw, err := netip.ParseAddr(c.AdvertiseAddress); err == nil {
		deny = append(deny, gw)
	}
	cluster = egressproxy.Policy{Allow: []netip.Prefix{nodes, pods}, Deny: deny}
	controlplane = egressproxy.Policy{Allow: []netip.Prefix{nodes, pods}, Deny: deny, Public: true}
	return cluster, controlplane, nil
}

// startEgress writes the egress selector config and serves its two proxies until ctx
// ends. It returns the apiserver flag that uses them.
func startEgress(ctx context.Context, c Config, log *slog.Logger) (string, error) {
	cluster, control, err := c.egressPolicies()
	if err != nil {
		return "", err
	}
	cfg := filepath.Join(c.WorkDir(), egressConfigFile)
	if err := os.WriteFile(cfg, fmt.Appendf(nil, egressSelectorTemplate, egressClusterSocket, egressControlSocket), 0o600); err != nil {
		return "", fmt.Errorf("writing the apiserver's egress config: %w", err)
	}
	for _, p := range []struct {
		socket string
		proxy  *egressproxy.Proxy
	}{
		{egressClusterSocket, &egressproxy.Proxy{Name: "cluster", Policy: cluster, Log: log}},
		{egressControlSocket, &egressproxy.Proxy{Name: "controlplane", Policy: control, Log: log}},
	} {
		// The working directory is c.WorkDir() (Run): the relative name is the config's.
		if err := os.Remove(p.socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("removing an old egress socket: %w", err)
		}
		ln, err := net.Listen("unix", p.socket)
		if err != nil {
			return "", fmt.Errorf("egress proxy %s: %w", p.proxy.Name, err)
		}
		os.Chmod(p.socket, 0o600)
		go func() {
			if err := p.proxy.Serve(ctx, ln); err != nil {
				log.Error("egress proxy stopped", "selection", p.proxy.Name, "err", err)
			}
		}()
	}
	return "--egress-selector-config-file=" + cfg, nil
}
