package agent

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	logsapi "k8s.io/component-base/logs/api/v1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/socialweb-computer/socialweb/internal/identity"
)

// This file holds the pure generators of every file the agent writes: each
// takes the identity and the layout and returns bytes, so tests check them
// without a guest.

// Layout names every path the agent reads or writes in the guest.
type Layout struct {
	ContainerdConfig string // config.toml
	ContainerdCerts  string // registry hosts directory (config_path); _default/hosts.toml inside
	ContainerdSocket string
	ContainerdRoot   string
	ContainerdState  string
	CNIBinDir        string
	CNIConfDir       string
	// CNITemplate is the conflist template containerd renders into CNIConfDir
	// once the kubelet passes it the node's pod CIDR (see CNITemplate).
	CNITemplate string
	// SandboxImageArchive is the sandbox image as an OCI layout tar, put in the
	// node image by guestbuild and imported before the kubelet runs.
	SandboxImageArchive string

	// LayerShare is where the host's layer share (virtio-fs) is mounted.
	LayerShare string
	// SnapshotterSocket is the socialweb snapshotter's gRPC socket.
	SnapshotterSocket string
	// SnapshotterRoot is the socialweb snapshotter's directory: where
	// containerd's CRI looks for a snapshotter's image filesystem
	// (<root>/io.containerd.snapshotter.v1.<name>), on the data disk.
	SnapshotterRoot string

	KubeletRoot         string // --root-dir
	KubeletConfig       string // KubeletConfiguration (YAML)
	ProxyConfig         string // KubeProxyConfiguration (YAML)
	KubeletCertDir      string // --cert-dir: the client certificate after bootstrap
	KubeletServingCert  string // tlsCertFile: from the host (Identity.KubeletServingCert), else self-signed (ServingCert)
	KubeletServingKey   string // tlsPrivateKeyFile
	Kubeconfig          string // --kubeconfig, written by the kubelet after TLS bootstrap
	BootstrapKubeconfig string // --bootstrap-kubeconfig
	CACert              string // Identity.CACert, for the bootstrap kubeconfig
	ClientCACert        string // Identity.ClientCACert, the kubelet's client CA

	ResolvConf string
	Hosts      string
	Hostname   string
	MachineID  string
}

// DefaultLayout is the layout of a node.
func DefaultLayout() Layout {
	return Layout{
		ContainerdConfig: "/etc/containerd/config.toml",
		ContainerdCerts:  "/etc/containerd/certs.d",
		ContainerdSocket: "/run/containerd/containerd.sock",
		ContainerdRoot:   "/var/lib/containerd",
		ContainerdState:  "/run/containerd",
		CNIBinDir:        "/usr/lib/cni",
		CNIConfDir:       "/etc/cni/net.d",
		CNITemplate:      "/etc/containerd/cni.conflist.tmpl",

		SandboxImageArchive: "/usr/local/share/socialweb/sandbox-image.oci.tar",

		LayerShare:        "/run/socialweb/layers",
		SnapshotterSocket: "/run/socialweb/snapshotter.sock",
		SnapshotterRoot:   "/var/lib/containerd/io.containerd.snapshotter.v1." + SharedSnapshotter,

		KubeletRoot:         "/var/lib/kubelet",
		KubeletConfig:       "/var/lib/kubelet/config.yaml",
		ProxyConfig:         "/var/lib/kube-proxy/config.yaml",
		KubeletCertDir:      "/var/lib/kubelet/pki",
		KubeletServingCert:  "/var/lib/kubelet/pki/kubelet.crt",
		KubeletServingKey:   "/var/lib/kubelet/pki/kubelet.key",
		Kubeconfig:          "/etc/kubernetes/kubelet.conf",
		BootstrapKubeconfig: "/etc/kubernetes/bootstrap-kubelet.conf",
		CACert:              "/etc/kubernetes/pki/ca.crt",
		ClientCACert:        "/etc/kubernetes/pki/client-ca.crt",

		ResolvConf: "/etc/resolv.conf",
		Hosts:      "/etc/hosts",
		Hostname:   "/etc/hostname",
		MachineID:  "/etc/machine-id",
	}
}

// Under returns the layout with every path moved below root (for tests and
// for rendering a node's files on the host).
func (l Layout) Under(root string) Layout {
	for _, p := range l.fields() {
		*p = filepath.Join(root, *p)
	}
	return l
}

func (l *Layout) fields() []*string {
	return []*string{&l.ContainerdConfig, &l.ContainerdCerts, &l.ContainerdSocket, &l.ContainerdRoot,
		&l.ContainerdState, &l.CNIBinDir, &l.CNIConfDir, &l.CNITemplate, &l.SandboxImageArchive, &l.LayerShare, &l.SnapshotterSocket, &l.SnapshotterRoot, &l.KubeletRoot, &l.KubeletConfig, &l.ProxyConfig,
		&l.KubeletCertDir, &l.KubeletServingCert, &l.KubeletServingKey, &l.Kubeconfig, &l.BootstrapKubeconfig, &l.CACert, &l.ClientCACert, &l.ResolvConf, &l.Hosts,
		&l.Hostname, &l.MachineID}
}

// NodeIP is the node's address without its prefix length.
func NodeIP(id identity.Identity) (net.IP, error) {
	ip, _, err := net.ParseCIDR(id.Address)
	if err != nil {
		return nil, fmt.Errorf("identity address %q: %w", id.Address, err)
	}
	return ip, nil
}

// ResolvConf is the node's own resolver configuration: the gateway's
// forwarder. Pods with dnsPolicy Default inherit it; ClusterFirst Pods get
// the cluster DNS Service (KubeletConfiguration.clusterDNS) instead.
func ResolvConf(id identity.Identity) []byte {
	return []byte("# written by socialweb-node from the identity disk\nnameserver " + id.DNS + "\n")
}

// Hosts is /etc/hosts: loopback names and the node's name on its address.
func Hosts(id identity.Identity) []byte {
	var b strings.Builder
	b.WriteString("# written by socialweb-node from the identity disk\n")
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	if ip, err := NodeIP(id); err == nil {
		fmt.Fprintf(&b, "%s\t%s\n", ip, id.NodeName)
	}
	return []byte(b.String())
}

// ContainerdOptions are the knobs of the generated containerd configuration.
type ContainerdOptions struct {
	// Major is containerd's major version: 1 writes a version 2 config
	// (Debian's 1.6), 2 a version 3 config (containerd 2.x).
	Major        int
	SandboxImage string
	LogLevel     string
	// SharedLayers points the CRI plugin at the socialweb snapshotter
	// (SharedSnapshotter, a proxy plugin on Layout.SnapshotterSocket) with the
	// snapshot annotations on, so it sees each layer's digest and can take
	// the layer from the host's share. Off, CRI uses overlayfs.
	SharedLayers bool
	// RuntimeBinary is the OCI runtime the runc shim drives (its BinaryName);
	// empty leaves the shim's default, runc on PATH.
	RuntimeBinary string
}

// SharedSnapshotter is the name containerd knows the socialweb snapshotter by.
const SharedSnapshotter = "socialweb"

// ContainerdConfig is config.toml: the CRI plugin with runc (cgroupfs, which
// is what the kubelet is told too), the overlayfs snapshotter (or, with
// SharedLayers, the socialweb one as a proxy plugin), the registry
// hosts directory (see HostsTOML), the sandbox image and the CNI
// directories with the conflist template containerd fills in with the pod
// CIDR the kubelet reports (see CNITemplate).
func ContainerdConfig(l Layout, o ContainerdOptions) ([]byte, error) {
	if o.SandboxImage == "" {
		return nil, fmt.Errorf("containerd config: no sandbox image")
	}
	if o.LogLevel == "" {
		o.LogLevel = "warn"
	}
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) } // TOML basic strings accept JSON escapes
	var b strings.Builder
	fmt.Fprintf(&b, "# written by socialweb-node\n")
	snap := "  snapshotter = \"overlayfs\"\n"
	if o.SharedLayers {
		// CRI passes the layer digests only with the annotations on. With
		// them, containerd 2.x pulls through the client's unpacker, not the
		// transfer service; use_local_image_pull says so instead of leaving it
		// to its fallback.
		snap = "  snapshotter = " + q(SharedSnapshotter) + "\n  disable_snapshot_annotations = false\n"
		if o.Major == 2 {
			snap += "  use_local_image_pull = true\n"
		}
	}
	runtimeOpts := "  SystemdCgroup = false\n"
	if o.RuntimeBinary != "" {
		runtimeOpts += "  BinaryName = " + q(o.RuntimeBinary) + "\n"
	}
	switch o.Major {
	case 2:
		fmt.Fprintf(&b, `version = 3
root = %[1]s
state = %[2]s

[grpc]
  address = %[3]s

[debug]
  level = %[4]s

[plugins.'io.containerd.cri.v1.images']
%[10]s
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = %[5]s

[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = %[6]s

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
%[11]s
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = [%[7]s]
  conf_dir = %[8]s
  conf_template = %[9]s
`, q(l.ContainerdRoot), q(l.ContainerdState), q(l.ContainerdSocket), q(o.LogLevel), q(o.SandboxImage),
			q(l.ContainerdCerts), q(l.CNIBinDir), q(l.CNIConfDir), q(l.CNITemplate), snap, runtimeOpts)
	case 1:
		fmt.Fprintf(&b, `version = 2
root = %[1]s
state = %[2]s

[grpc]
  address = %[3]s

[debug]
  level = %[4]s

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]s

[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = %[6]s

[plugins."io.containerd.grpc.v1.cri".containerd]
%[10]s  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
%[11]s
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = %[7]s
  conf_dir = %[8]s
  conf_template = %[9]s
`, q(l.ContainerdRoot), q(l.ContainerdState), q(l.ContainerdSocket), q(o.LogLevel), q(o.SandboxImage),
			q(l.ContainerdCerts), q(l.CNIBinDir), q(l.CNIConfDir), q(l.CNITemplate), snap, runtimeOpts)
	default:
		return nil, fmt.Errorf("containerd config: unsupported containerd major version %d (want 1 or 2)", o.Major)
	}
	if o.SharedLayers {
		fmt.Fprintf(&b, "\n[proxy_plugins.%s]\n  type = \"snapshot\"\n  address = %s\n", q(SharedSnapshotter), q(l.SnapshotterSocket))
	}
	return []byte(b.String()), nil
}

// HostsTOML is <config_path>/_default/hosts.toml: containerd uses the
// _default directory for every registry name that has no directory of its
// own (all of them here), so docker.io, registry.k8s.io, quay.io, ... are
// all fetched from the host-side registry over plain http, and nothing
// falls back to the (unreachable) internet: `server` replaces the upstream.
// containerd adds ?ns=<original registry> to each request, which is how
// the host registry tells docker.io/library/x from registry.k8s.io/x.
func HostsTOML(registry string) ([]byte, error) {
	u, err := url.Parse(registry)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("registry %q is not an http(s)://host[:port] URL", registry)
	}
	s := u.Scheme + "://" + u.Host
	return []byte(fmt.Sprintf(`# written by socialweb-node: every registry is served by the host's registry
server = %[1]q

[host.%[1]q]
  capabilities = ["pull", "resolve"]
`, s)), nil
}

// CNIOptions are the knobs of the pod network.
type CNIOptions struct {
	// Bridge is the Linux bridge the pods of this node hang off.
	Bridge string
	// Masquerade makes the bridge plugin SNAT pod traffic leaving the pod
	// CIDR to the node's address. Off by default: the host routes every
	// node's pod CIDR and masquerades egress itself (nodenet), so pod
	// addresses survive node-to-node traffic.
	Masquerade bool
}

// CNITemplate is the conflist template containerd's CRI plugin renders
// (conf_template) when the kubelet calls UpdateRuntimeConfig with the pod
// CIDR it read from its Node object's spec.podCIDR (assigned by the
// controller-manager's node IPAM). Until then there is no CNI config and the
// node is NotReady ("cni plugin not initialized"), which is what keeps Pods
// off it. loopback is added by containerd itself (go-cni's WithLoNetwork).
func CNITemplate(o CNIOptions) []byte {
	if o.Bridge == "" {
		o.Bridge = "cni0"
	}
	return []byte(fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "socialweb",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": %t,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [{{range $i, $r := .PodCIDRRanges}}{{if $i}}, {{end}}[{"subnet": "{{$r}}"}]{{end}}],
        "routes": [{{range $i, $r := .Routes}}{{if $i}}, {{end}}{"dst": "{{$r}}"}{{end}}]
      }
    },
    {
      "type": "portmap",
      "capabilities": {"portMappings": true}
    }
  ]
}
`, o.Bridge, o.Masquerade))
}

// RenderCNITemplate renders a conflist template the way containerd does
// (text/template over PodCIDR, PodCIDRRanges and Routes), for tests and for
// checking a template before a node boots with it.
func RenderCNITemplate(tmpl []byte, podCIDRs ...string) ([]byte, error) {
	t, err := template.New("cni").Parse(string(tmpl))
	if err != nil {
		return nil, err
	}
	data := struct {
		PodCIDR       string
		PodCIDRRanges []string
		Routes        []string
	}{PodCIDRRanges: podCIDRs}
	if len(podCIDRs) > 0 {
		data.PodCIDR = podCIDRs[0]
	}
	seen := map[string]bool{}
	for _, c := range podCIDRs {
		ip, _, err := net.ParseCIDR(c)
		if err != nil {
			return nil, err
		}
		r := "0.0.0.0/0"
		if ip.To4() == nil {
			r = "::/0"
		}
		if !seen[r] {
			seen[r] = true
			data.Routes = append(data.Routes, r)
		}
	}
	var out bytes.Buffer
	if err := t.Execute(&out, data); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// BootstrapKubeconfig is the kubeconfig the kubelet's TLS bootstrap uses:
// the tenant apiserver, its CA (as a file, so the kubeconfig the kubelet
// writes after bootstrap points at the same file) and the bootstrap token.
func BootstrapKubeconfig(id identity.Identity, l Layout) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["tenant"] = &clientcmdapi.Cluster{Server: id.APIServer, CertificateAuthority: l.CACert}
	cfg.AuthInfos["kubelet-bootstrap"] = &clientcmdapi.AuthInfo{Token: id.BootstrapToken}
	cfg.Contexts["bootstrap"] = &clientcmdapi.Context{Cluster: "tenant", AuthInfo: "kubelet-bootstrap"}
	cfg.CurrentContext = "bootstrap"
	return clientcmd.Write(*cfg)
}

// KubeletKubeconfig is the kubeconfig the kubelet writes after its TLS bootstrap: the
// tenant apiserver, its CA file, and the client certificate and key in one file.
func KubeletKubeconfig(id identity.Identity, l Layout, certAndKey string) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["tenant"] = &clientcmdapi.Cluster{Server: id.APIServer, CertificateAuthority: l.CACert}
	cfg.AuthInfos["kubelet"] = &clientcmdapi.AuthInfo{ClientCertificate: certAndKey, ClientKey: certAndKey}
	cfg.Contexts["kubelet"] = &clientcmdapi.Context{Cluster: "tenant", AuthInfo: "kubelet"}
	cfg.CurrentContext = "kubelet"
	return clientcmd.Write(*cfg)
}

// KubeletOptions are the knobs of the kubelet configuration that do not come
// from the identity.
type KubeletOptions struct {
	Verbosity     int
	ClusterDomain string // default cluster.local
	// AllowCgroupV1 sets failCgroupV1: false. The guest always has cgroup
	// v2; this is for loading the configuration on a cgroup v1 host.
	AllowCgroupV1 bool
}

// KubeletConfiguration is the kubelet's configuration file
// (kubelet.config.k8s.io/v1beta1).
//
// Authentication and serving: the kubelet serves :10250 with the certificate
// the host issued from the cluster's server CA (Identity.KubeletServingCert),
// which the tenant apiserver verifies (--kubelet-certificate-authority) when
// it proxies logs, exec and port-forward. An identity without one gets a
// self-signed certificate the agent makes (ServingCert; ECDSA, because the
// kubelet's own fallback generates two RSA keys, which takes seconds under
// TCG), which only an apiserver without that flag accepts. No
// serverTLSBootstrap: nothing in the tenant control plane approves
// kubelet-serving CSRs. Requests are authenticated by client
// certificate against Identity.ClientCACert (the apiserver's kubelet client
// certificate chains to it: see the package comment)
// and by bearer token through TokenReview, and authorized through
// SubjectAccessReview; anonymous requests are refused.
func KubeletConfiguration(id identity.Identity, l Layout, o KubeletOptions) (*kubeletv1beta1.KubeletConfiguration, error) {
	if o.ClusterDomain == "" {
		o.ClusterDomain = "cluster.local"
	}
	t, f := true, false
	maxPods := int32(id.MaxPods)
	resolv := l.ResolvConf
	kc := &kubeletv1beta1.KubeletConfiguration{
		Authentication: kubeletv1beta1.KubeletAuthentication{
			X509:      kubeletv1beta1.KubeletX509Authentication{ClientCAFile: l.ClientCACert},
			Webhook:   kubeletv1beta1.KubeletWebhookAuthentication{Enabled: &t},
			Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: &f},
		},
		Authorization:            kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeWebhook},
		RotateCertificates:       true,
		ServerTLSBootstrap:       false,
		CgroupDriver:             "cgroupfs",
		CgroupsPerQOS:            &t,
		ClusterDomain:            o.ClusterDomain,
		ContainerRuntimeEndpoint: "unix://" + l.ContainerdSocket,
		FailSwapOn:               &f,
		ResolverConfig:           &resolv,
		MaxPods:                  maxPods,
		ProviderID:               id.ProviderID,
		RegisterNode:             &t,
		// The same startup taint the agent registers the Node with, for when the kubelet
		// registers first.
		RegisterWithTaints: []corev1.Taint{StorageTaint()},
		ReadOnlyPort:       0,
		TLSCertFile:        l.KubeletServingCert,
		TLSPrivateKeyFile:  l.KubeletServingKey,
		// A pod sandbox is created within twice this. The default 2m is too short for a
		// TCG node sharing a host core with others: creation was cancelled at 4 min and
		// started over, so Pods never ran.
		RuntimeRequestTimeout: metav1.Duration{Duration: 10 * time.Minute},
		// Written out, not left to defaults, because a full data disk must evict Pods
		// (freeing their emptyDirs and layers) before containerd and the kubelet cannot
		// write: nodefs and imagefs are the node's data disk (see DataDirs).
		EvictionHard: EvictionHard(),
		// No KUBE-IPTABLES-HINT or KUBE-FIREWALL chains: the kubelet makes them with a
		// dozen iptables and ip6tables runs before its sync loop starts (0.75 s of a TCG
		// vCPU on a start's critical path) and checks them every minute. Nothing on a node
		// reads the hint (kube-proxy here runs in nftables mode), and the localnet rule
		// guards route_localnet, which only kube-proxy's iptables mode turns on.
		MakeIPTablesUtilChains: &f,
	}
	kc.APIVersion = kubeletv1beta1.SchemeGroupVersion.String()
	kc.Kind = "KubeletConfiguration"
	if id.ClusterDNS != "" {
		if net.ParseIP(id.ClusterDNS) == nil {
			return nil, fmt.Errorf("clusterDNS %q is not an IP", id.ClusterDNS)
		}
		kc.ClusterDNS = []string{id.ClusterDNS}
	}
	kc.Logging.Verbosity = logsapi.VerbosityLevel(o.Verbosity)
	if o.AllowCgroupV1 {
		kc.FailCgroupV1 = &f
	}
	return kc, nil
}

// EvictionHard is the kubelet's hard eviction thresholds.
func EvictionHard() map[string]string {
	return map[string]string{
		"memory.available":   "100Mi",
		"nodefs.available":   "10%",
		"nodefs.inodesFree":  "5%",
		"imagefs.available":  "15%",
		"imagefs.inodesFree": "5%",
	}
}

// KubeletConfigurationYAML is KubeletConfiguration as the file the kubelet loads.
func KubeletConfigurationYAML(id identity.Identity, l Layout, o KubeletOptions) ([]byte, error) {
	kc, err := KubeletConfiguration(id, l, o)
	if err != nil {
		return nil, err
	}
	return yaml.Marshal(kc)
}

// KubeletFlags are the kubelet's command-line flags: the per-node settings
// that are not part of KubeletConfiguration. The config file itself is not
// among them; RunKubelet loads it.
func KubeletFlags(id identity.Identity, l Layout) ([]string, error) {
	ip, err := NodeIP(id)
	if err != nil {
		return nil, err
	}
	flags := []string{
		"--kubeconfig=" + l.Kubeconfig,
		"--bootstrap-kubeconfig=" + l.BootstrapKubeconfig,
		"--cert-dir=" + l.KubeletCertDir,
		"--root-dir=" + l.KubeletRoot,
		"--hostname-override=" + id.NodeName,
		"--node-ip=" + ip.String(),
		// The host's cloud controller initializes the Node (addresses, providerID check)
		// and removes the uninitialized taint the kubelet sets with this.
		"--cloud-provider=external",
	}
	if len(id.Labels) > 0 {
		keys := make([]string, 0, len(id.Labels))
		for k := range id.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var kv []string
		for _, k := range keys {
			if strings.ContainsAny(k+id.Labels[k], ",=") {
				return nil, fmt.Errorf("node label %q=%q contains ',' or '='", k, id.Labels[k])
			}
			kv = append(kv, k+"="+id.Labels[k])
		}
		flags = append(flags, "--node-labels="+strings.Join(kv, ","))
	}
	return flags, nil
}

// ServingCert makes the kubelet's self-signed serving certificate and key
// (PEM): ECDSA P-256, for the node name and address, valid for a year. Only
// for an identity without one from the host.
func ServingCert(id identity.Identity, now time.Time) (certPEM, keyPEM []byte, err error) {
	ip, err := NodeIP(id)
	if err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: id.NodeName + "@" + strconv.FormatInt(now.Unix(), 10)},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              []string{id.NodeName},
		IPAddresses:           []net.IP{ip},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}
