package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	proxyapp "k8s.io/kubernetes/cmd/kube-proxy/app"

	"github.com/socialweb-computer/socialweb/internal/clusterdns"
	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/nodehealth"
)

// ProxyConfig is the kube-proxy configuration file (KubeProxyConfiguration YAML): iptables
// mode, the kubelet's kubeconfig (the node's own identity; the control plane binds
// system:node-proxier to system:nodes), the node's name, and the cluster's pod range so
// Service traffic from outside it is masqueraded. Metrics and health listen on loopback.
func ProxyConfig(id identity.Identity, l Layout) []byte {
	cidr := ""
	if id.PodCIDR != "" {
		cidr = fmt.Sprintf("clusterCIDR: %q\n", id.PodCIDR)
	}
	return fmt.Appendf(nil, `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %q
hostnameOverride: %q
mode: iptables
%smetricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack:
  maxPerCore: 0
`, l.Kubeconfig, id.NodeName, cidr)
}

// stepProxy starts kube-proxy in this process once the kubelet has finished its TLS
// bootstrap (kube-proxy uses the kubeconfig that writes). It does not wait for that:
// the boot chain goes on, and a kube-proxy that fails stops the node like a kubelet that
// fails, so a node never runs without Services.
func stepProxy(ctx context.Context, a *Agent) error {
	if a.Identity.NodeName == "" {
		return errors.New("the identity step must run before proxy")
	}
	cfgFile := a.Layout.ProxyConfig
	if err := os.MkdirAll(filepath.Dir(cfgFile), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(cfgFile, ProxyConfig(a.Identity, a.Layout), 0o644); err != nil {
		return err
	}
	go func() {
		a.waitKubeletCredentials()
		err := runProxy(context.Background(), cfgFile)
		a.Log.Error("kube-proxy ended", "err", err)
		a.Stop("kube-proxy ended")
	}()
	return nil
}

// waitKubeletCredentials returns once the kubelet's TLS bootstrap has written its
// kubeconfig and the client certificate it names (the kubeconfig comes first).
func (a *Agent) waitKubeletCredentials() {
	clientCert := filepath.Join(a.Layout.KubeletCertDir, "kubelet-client-current.pem")
	for {
		_, err1 := os.Stat(a.Layout.Kubeconfig)
		_, err2 := os.Stat(clientCert)
		if err1 == nil && err2 == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stepDNS starts the node's cluster DNS server on the kubelet's clusterDNS address (the
// node's own address), answering cluster.local from the tenant API with the kubelet's
// credentials and forwarding other names to the gateway's resolver. The server restarts
// its listener if serving fails (clusterdns.Run), and is started again here if it ends.
func stepDNS(ctx context.Context, a *Agent) error {
	id := a.Identity
	if id.ClusterDNS == "" {
		a.Log.Info("no clusterDNS on the identity disk: no cluster DNS on this node")
		return nil
	}
	go func() {
		a.waitKubeletCredentials()
		log := a.Log.With("component", "dns")
		for {
			cfg, err := clientcmd.BuildConfigFromFlags("", a.Layout.Kubeconfig)
			if err == nil {
				var client kubernetes.Interface
				if client, err = kubernetes.NewForConfig(cfg); err == nil {
					err = clusterdns.Run(context.Background(), client, clusterDomain,
						net.JoinHostPort(id.ClusterDNS, "53"), net.JoinHostPort(id.DNS, "53"), log)
				}
			}
			log.Error("cluster DNS ended; starting it again in 1s", "err", err)
			time.Sleep(time.Second)
		}
	}()
	return nil
}

// clusterDomain is the kubelet's clusterDomain and the zone the node's DNS answers.
const clusterDomain = "cluster.local"

// stepHealth keeps the node's network health on its Node object: whether it reaches the
// gateway (the tenant apiserver's address there) and whether its cluster DNS answers
// for the kubernetes Service (nodehealth conditions, True = problem).
func stepHealth(ctx context.Context, a *Agent) error {
	id := a.Identity
	u, err := url.Parse(id.APIServer)
	if err != nil || u.Host == "" {
		return fmt.Errorf("apiServer %q on the identity disk is not a URL: %v", id.APIServer, err)
	}
	p := nodehealth.Prober{Gateway: u.Host, ClusterDNS: net.JoinHostPort(id.ClusterDNS, "53"),
		Name: "kubernetes.default.svc." + clusterDomain}
	go func() {
		a.waitKubeletCredentials()
		cfg, err := clientcmd.BuildConfigFromFlags("", a.Layout.Kubeconfig)
		var client kubernetes.Interface
		if err == nil {
			client, err = kubernetes.NewForConfig(cfg)
		}
		if err != nil {
			a.Log.Error("node health: no client; node conditions are not reported", "err", err)
			return
		}
		nodehealth.Run(context.Background(), client, id.NodeName, p, 10*time.Second, time.Minute, a.Log.With("component", "health"))
	}()
	return nil
}

// runProxy runs kube-proxy as its command does, without cobra and without
// re-initialising logging, which the kubelet in the same process owns.
func runProxy(ctx context.Context, configFile string) error {
	opts, err := proxyOptions(configFile)
	if err != nil {
		return err
	}
	return opts.Run(ctx)
}

// proxyOptions are kube-proxy's options from its flags and configFile, completed and
// validated by kube-proxy's own code.
func proxyOptions(configFile string) (*proxyapp.Options, error) {
	opts := proxyapp.NewOptions()
	fs := pflag.NewFlagSet("kube-proxy", pflag.ContinueOnError)
	opts.AddFlags(fs)
	if err := fs.Parse([]string{"--config=" + configFile}); err != nil {
		return nil, fmt.Errorf("kube-proxy flags: %w", err)
	}
	if err := opts.Complete(fs); err != nil {
		return nil, fmt.Errorf("kube-proxy options: %w", err)
	}
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("kube-proxy options: %w", err)
	}
	return opts, nil
}
