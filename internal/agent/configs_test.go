package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"time"

	"github.com/BurntSushi/toml"
	"sigs.k8s.io/yaml"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/socialweb-computer/socialweb/internal/guestbuild"
	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/pki"
)

func sampleIdentity() identity.Identity {
	return identity.Identity{
		Cluster: "ci", NodeName: "ci-abc123", ProviderID: "socialweb://ci/ci-abc123",
		APIServer: "https://10.250.3.1:7500", CACert: testCA, ClientCACert: testCA, BootstrapToken: "abcdef.0123456789abcdef",
		Address: "10.250.3.2/24", Gateway: "10.250.3.1", DNS: "10.250.3.1", ClusterDNS: "10.251.0.10",
		Registry: "http://10.250.3.1:5000", MaxPods: 110, Labels: map[string]string{"socialweb.computer/pool": "default"},
		MAC: "52:54:00:12:34:56",
	}
}

// A throwaway self-signed CA (the kubelet's config loader does not read it;
// the bootstrap kubeconfig only names its path).
const testCA = "-----BEGIN CERTIFICATE-----\nMIIBdzCCAR2gAwIBAgIBATAKBggqhkjOPQQDAjAVMRMwEQYDVQQDEwp0ZXN0LWNh\n-----END CERTIFICATE-----\n"

func TestContainerdConfig(t *testing.T) {
	l := DefaultLayout()
	tests := []struct {
		name    string
		opts    ContainerdOptions
		want    []string
		notWant []string
		wantErr string
	}{
		{
			name: "containerd 2.x: version 3, cri.v1 plugins",
			opts: ContainerdOptions{Major: 2, SandboxImage: "registry.k8s.io/pause:3.10"},
			want: []string{
				"version = 3\n",
				`address = "/run/containerd/containerd.sock"`,
				"[plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = \"registry.k8s.io/pause:3.10\"",
				"[plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = \"/etc/containerd/certs.d\"",
				"SystemdCgroup = false",
				`bin_dirs = ["/usr/lib/cni"]`,
				`conf_dir = "/etc/cni/net.d"`,
				`conf_template = "/etc/containerd/cni.conflist.tmpl"`,
				`level = "warn"`,
				`snapshotter = "overlayfs"`,
			},
			notWant: []string{"io.containerd.grpc.v1.cri", "sandbox_image", "BinaryName"},
		},
		{
			name: "containerd 1.6: version 2, grpc.v1.cri plugin",
			opts: ContainerdOptions{Major: 1, SandboxImage: "registry.k8s.io/pause:3.10", LogLevel: "info"},
			want: []string{
				"version = 2\n",
				`sandbox_image = "registry.k8s.io/pause:3.10"`,
				"[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/certs.d\"",
				`bin_dir = "/usr/lib/cni"`,
				`conf_template = "/etc/containerd/cni.conflist.tmpl"`,
				"SystemdCgroup = false",
				`level = "info"`,
			},
			notWant: []string{"cri.v1", "bin_dirs", "BinaryName"},
		},
		{
			name: "containerd 1.6 driving the image's runc",
			opts: ContainerdOptions{Major: 1, SandboxImage: "p", RuntimeBinary: "/usr/local/sbin/runc"},
			want: []string{"[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  SystemdCgroup = false\n  BinaryName = \"/usr/local/sbin/runc\"\n"},
		},
		{
			name: "containerd 2.x driving the image's runc",
			opts: ContainerdOptions{Major: 2, SandboxImage: "p", RuntimeBinary: "/usr/local/sbin/runc"},
			want: []string{"[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  SystemdCgroup = false\n  BinaryName = \"/usr/local/sbin/runc\"\n"},
		},
		{name: "unknown major", opts: ContainerdOptions{Major: 3, SandboxImage: "x"}, wantErr: "unsupported containerd major version 3"},
		{name: "no sandbox image", opts: ContainerdOptions{Major: 2}, wantErr: "no sandbox image"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ContainerdConfig(l, tt.opts)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(got), w) {
					t.Errorf("config lacks %q:\n%s", w, got)
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(string(got), w) {
					t.Errorf("config has %q:\n%s", w, got)
				}
			}
		})
	}
}

// TestContainerdConfigSharedLayers decodes the config as containerd does
// (TOML) and checks where the snapshotter settings land: the proxy plugin at
// the top level, the CRI plugin pointed at it with its snapshot annotations
// on, and without SharedLayers exactly today's overlayfs config.
func TestContainerdConfigSharedLayers(t *testing.T) {
	l := DefaultLayout()
	type cri = map[string]any
	tests := []struct {
		name        string
		opts        ContainerdOptions
		criSection  func(m map[string]any) cri
		wantCRI     map[string]any
		wantProxy   bool
		wantVersion int64
	}{
		{
			name: "containerd 2.x with the share",
			opts: ContainerdOptions{Major: 2, SandboxImage: "p", SharedLayers: true},
			criSection: func(m map[string]any) cri {
				return dig(m, "plugins", "io.containerd.cri.v1.images")
			},
			wantCRI:     map[string]any{"snapshotter": "socialweb", "disable_snapshot_annotations": false, "use_local_image_pull": true},
			wantProxy:   true,
			wantVersion: 3,
		},
		{
			name: "containerd 1.6 with the share",
			opts: ContainerdOptions{Major: 1, SandboxImage: "p", SharedLayers: true},
			criSection: func(m map[string]any) cri {
				return dig(m, "plugins", "io.containerd.grpc.v1.cri", "containerd")
			},
			wantCRI:     map[string]any{"snapshotter": "socialweb", "disable_snapshot_annotations": false, "default_runtime_name": "runc"},
			wantProxy:   true,
			wantVersion: 2,
		},
		{
			name: "containerd 2.x without the share",
			opts: ContainerdOptions{Major: 2, SandboxImage: "p"},
			criSection: func(m map[string]any) cri {
				return dig(m, "plugins", "io.containerd.cri.v1.images")
			},
			wantCRI:     map[string]any{"snapshotter": "overlayfs"},
			wantVersion: 3,
		},
		{
			name: "containerd 1.6 without the share",
			opts: ContainerdOptions{Major: 1, SandboxImage: "p"},
			criSection: func(m map[string]any) cri {
				return dig(m, "plugins", "io.containerd.grpc.v1.cri", "containerd")
			},
			wantCRI:     map[string]any{"snapshotter": "overlayfs"},
			wantVersion: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ContainerdConfig(l, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if _, err := toml.Decode(string(got), &m); err != nil {
				t.Fatalf("not TOML: %v\n%s", err, got)
			}
			if m["version"] != tt.wantVersion || m["root"] != l.ContainerdRoot {
				t.Errorf("version %v root %v at the top level, want %d and %s:\n%s", m["version"], m["root"], tt.wantVersion, l.ContainerdRoot, got)
			}
			sec := tt.criSection(m)
			for k, v := range tt.wantCRI {
				if sec[k] != v {
					t.Errorf("CRI %s = %v, want %v:\n%s", k, sec[k], v, got)
				}
			}
			if !tt.opts.SharedLayers {
				if _, ok := sec["disable_snapshot_annotations"]; ok {
					t.Errorf("annotations set without the share:\n%s", got)
				}
			}
			proxy := dig(m, "proxy_plugins", "socialweb")
			if !tt.wantProxy {
				if _, ok := m["proxy_plugins"]; ok {
					t.Errorf("proxy plugin without the share:\n%s", got)
				}
				return
			}
			if proxy["type"] != "snapshot" || proxy["address"] != l.SnapshotterSocket {
				t.Errorf("proxy_plugins.socialweb = %v:\n%s", proxy, got)
			}
		})
	}
	if want := filepath.Join(l.ContainerdRoot, "io.containerd.snapshotter.v1."+SharedSnapshotter); l.SnapshotterRoot != want {
		t.Errorf("SnapshotterRoot %s, want %s: CRI reports the image filesystem there", l.SnapshotterRoot, want)
	}
}

// dig walks nested TOML tables; a missing one is an empty map.
func dig(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		next, _ := m[k].(map[string]any)
		if next == nil {
			return map[string]any{}
		}
		m = next
	}
	return m
}

func TestContainerdConfigQuotesPaths(t *testing.T) {
	l := DefaultLayout().Under(`/tmp/a "quoted" dir`)
	got, err := ContainerdConfig(l, ContainerdOptions{Major: 2, SandboxImage: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(got), `root = "/tmp/a \"quoted\" dir/var/lib/containerd"`) {
		t.Errorf("paths are not escaped:\n%s", got)
	}
}

func TestHostsTOML(t *testing.T) {
	tests := []struct {
		registry string
		want     string
		wantErr  bool
	}{
		{"http://10.250.3.1:5000", "server = \"http://10.250.3.1:5000\"\n\n[host.\"http://10.250.3.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n", false},
		{"http://10.250.3.1:5000/", "server = \"http://10.250.3.1:5000\"", false},
		{"https://registry.local", "server = \"https://registry.local\"", false},
		{"10.250.3.1:5000", "", true},
		{"http://10.250.3.1:5000/v2/prefix", "", true},
		{"ftp://x", "", true},
		{"", "", true},
	}
	for _, tt := range tests {
		got, err := HostsTOML(tt.registry)
		if tt.wantErr {
			if err == nil {
				t.Errorf("HostsTOML(%q) accepted: %s", tt.registry, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("HostsTOML(%q): %v", tt.registry, err)
			continue
		}
		if !strings.Contains(string(got), tt.want) {
			t.Errorf("HostsTOML(%q) =\n%s\nwant it to contain\n%s", tt.registry, got, tt.want)
		}
		if strings.Contains(string(got), "skip_verify") {
			t.Errorf("HostsTOML(%q) skips TLS verification", tt.registry)
		}
	}
}

func TestContainerdAndRegistryFiles(t *testing.T) {
	l := DefaultLayout()
	files, err := ContainerdFiles(l, ContainerdOptions{Major: 2, SandboxImage: "p"}, CNIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range files {
		paths = append(paths, f.Path)
	}
	if want := []string{"/etc/containerd/config.toml", "/etc/containerd/cni.conflist.tmpl"}; !reflect.DeepEqual(paths, want) {
		t.Errorf("containerd files %v, want %v", paths, want)
	}
	tests := []struct {
		registry string
		wantPath string
		wantErr  bool
	}{
		{"http://10.250.3.1:5000", "/etc/containerd/certs.d/_default/hosts.toml", false},
		{"", "", false},
		{"10.250.3.1:5000", "", true},
	}
	for _, tt := range tests {
		id := sampleIdentity()
		id.Registry = tt.registry
		f, err := RegistryFile(id, l)
		if (err != nil) != tt.wantErr {
			t.Errorf("RegistryFile(%q): %v", tt.registry, err)
			continue
		}
		got := ""
		if f != nil {
			got = f.Path
		}
		if got != tt.wantPath {
			t.Errorf("RegistryFile(%q) path %q, want %q", tt.registry, got, tt.wantPath)
		}
	}
}

type conflist struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
	Plugins    []struct {
		Type         string          `json:"type"`
		Bridge       string          `json:"bridge"`
		IsGateway    bool            `json:"isGateway"`
		IPMasq       bool            `json:"ipMasq"`
		Capabilities map[string]bool `json:"capabilities"`
		IPAM         struct {
			Type   string                `json:"type"`
			Ranges [][]map[string]string `json:"ranges"`
			Routes []map[string]string   `json:"routes"`
		} `json:"ipam"`
	} `json:"plugins"`
}

func TestCNITemplate(t *testing.T) {
	tests := []struct {
		name       string
		opts       CNIOptions
		cidrs      []string
		wantRanges []string
		wantRoutes []string
	}{
		{"one IPv4 pod CIDR", CNIOptions{}, []string{"10.3.1.0/24"}, []string{"10.3.1.0/24"}, []string{"0.0.0.0/0"}},
		{"masquerade", CNIOptions{Masquerade: true, Bridge: "pods"}, []string{"10.3.2.0/24"}, []string{"10.3.2.0/24"}, []string{"0.0.0.0/0"}},
		{"dual stack", CNIOptions{}, []string{"10.3.1.0/24", "fd00:3:1::/64"}, []string{"10.3.1.0/24", "fd00:3:1::/64"}, []string{"0.0.0.0/0", "::/0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := RenderCNITemplate(CNITemplate(tt.opts), tt.cidrs...)
			if err != nil {
				t.Fatal(err)
			}
			var c conflist
			if err := json.Unmarshal(out, &c); err != nil {
				t.Fatalf("rendered conflist is not JSON: %v\n%s", err, out)
			}
			if len(c.Plugins) != 2 || c.Plugins[0].Type != "bridge" || c.Plugins[1].Type != "portmap" {
				t.Fatalf("plugins = %+v, want bridge, portmap", c.Plugins)
			}
			br := c.Plugins[0]
			wantBridge := tt.opts.Bridge
			if wantBridge == "" {
				wantBridge = "cni0"
			}
			if br.Bridge != wantBridge || !br.IsGateway || br.IPMasq != tt.opts.Masquerade || br.IPAM.Type != "host-local" {
				t.Errorf("bridge plugin = %+v", br)
			}
			var ranges, routes []string
			for _, r := range br.IPAM.Ranges {
				ranges = append(ranges, r[0]["subnet"])
			}
			for _, r := range br.IPAM.Routes {
				routes = append(routes, r["dst"])
			}
			if !reflect.DeepEqual(ranges, tt.wantRanges) || !reflect.DeepEqual(routes, tt.wantRoutes) {
				t.Errorf("ranges %v routes %v, want %v %v", ranges, routes, tt.wantRanges, tt.wantRoutes)
			}
			if !c.Plugins[1].Capabilities["portMappings"] {
				t.Errorf("portmap lacks the portMappings capability")
			}
		})
	}
}

func TestBootstrapKubeconfig(t *testing.T) {
	l := DefaultLayout()
	b, err := BootstrapKubeconfig(sampleIdentity(), l)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.Load(b)
	if err != nil {
		t.Fatal(err)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil {
		t.Fatalf("no current context: %s", b)
	}
	cl, ai := cfg.Clusters[ctx.Cluster], cfg.AuthInfos[ctx.AuthInfo]
	if cl.Server != "https://10.250.3.1:7500" || cl.CertificateAuthority != l.CACert || ai.Token != "abcdef.0123456789abcdef" {
		t.Errorf("bootstrap kubeconfig: cluster %+v user %+v", cl, ai)
	}
}

func TestResolvConfAndHosts(t *testing.T) {
	tests := []struct {
		name      string
		got, want string
	}{
		{"resolv.conf", string(ResolvConf(sampleIdentity())), "\nnameserver 10.250.3.1\n"},
		{"hosts: node name", string(Hosts(sampleIdentity())), "\n10.250.3.2\tci-abc123\n"},
		{"hosts: localhost", string(Hosts(sampleIdentity())), "\n127.0.0.1\tlocalhost\n"},
	}
	for _, tt := range tests {
		if !strings.Contains(tt.got, tt.want) {
			t.Errorf("%s = %q, want it to contain %q", tt.name, tt.got, tt.want)
		}
	}
	if n := strings.Count(string(ResolvConf(sampleIdentity())), "nameserver"); n != 1 {
		t.Errorf("resolv.conf has %d nameservers, want 1", n)
	}
}

// TestKubeletConfigLoads writes the generated configuration and flags and
// loads them with the kubelet's own loader, defaulting and validation, as
// the node does.
func TestKubeletConfigLoads(t *testing.T) {
	var earlier []byte // a serving certificate an earlier boot made
	tests := []struct {
		name   string
		mutate func(*identity.Identity)
		// disk, when set, leaves on the disk what an earlier boot of it did.
		disk    func(t *testing.T, id identity.Identity, l Layout)
		check   func(t *testing.T, id identity.Identity, a *Agent)
		wantErr string
	}{
		{name: "node", mutate: func(*identity.Identity) {}},
		{name: "no cluster DNS", mutate: func(id *identity.Identity) { id.ClusterDNS = "" },
			check: func(t *testing.T, id identity.Identity, a *Agent) {
				if len(a.KubeletServer.ClusterDNS) != 0 {
					t.Errorf("clusterDNS = %v, want none", a.KubeletServer.ClusterDNS)
				}
			}},
		{name: "several labels", mutate: func(id *identity.Identity) {
			id.Labels = map[string]string{"b": "2", "a": "1", "node.kubernetes.io/pool": ""}
		}, check: func(t *testing.T, id identity.Identity, a *Agent) {
			if want := "--node-labels=a=1,b=2,node.kubernetes.io/pool="; a.KubeletFlags[len(a.KubeletFlags)-1] != want {
				t.Errorf("last flag %q, want %q", a.KubeletFlags[len(a.KubeletFlags)-1], want)
			}
		}},
		{name: "label the kubelet may not set", mutate: func(id *identity.Identity) {
			id.Labels = map[string]string{"kubernetes.io/forbidden": "x"}
		}, wantErr: "kubernetes.io/forbidden"},
		{name: "label with a comma", mutate: func(id *identity.Identity) { id.Labels = map[string]string{"a": "1,2"} }, wantErr: "contains ','"},
		{name: "bad cluster DNS", mutate: func(id *identity.Identity) { id.ClusterDNS = "dns" }, wantErr: "clusterDNS"},
		{name: "few pods", mutate: func(id *identity.Identity) { id.MaxPods = 8 }},
		{name: "client certificate from the host", mutate: func(id *identity.Identity) {
			id.KubeletClientCert, id.KubeletClientKey = hostIssuedClientCert(t, id.NodeName)
		}, check: func(t *testing.T, id identity.Identity, a *Agent) {
			current := KubeletClientCurrent(a.Layout)
			for _, f := range []string{current, a.Layout.Kubeconfig} {
				if st, err := os.Stat(f); err != nil || st.Mode().Perm() != 0o600 {
					t.Errorf("%s: %v, %v; want mode 0600", f, st, err)
				}
			}
			// What the kubelet and this agent's clients load: the kubeconfig, its CA file
			// and the certificate and key in one file.
			cfg, err := clientcmd.BuildConfigFromFlags("", a.Layout.Kubeconfig)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Host != id.APIServer || cfg.TLSClientConfig.CAFile != a.Layout.CACert {
				t.Errorf("kubeconfig: host %q CA %q, want %q %q", cfg.Host, cfg.TLSClientConfig.CAFile, id.APIServer, a.Layout.CACert)
			}
			if _, err := tls.LoadX509KeyPair(cfg.TLSClientConfig.CertFile, cfg.TLSClientConfig.KeyFile); err != nil {
				t.Errorf("the kubeconfig's certificate and key: %v", err)
			}
		}},
		{name: "serving certificate from the host", mutate: func(id *identity.Identity) {
			id.KubeletServingCert, id.KubeletServingKey = hostIssuedServingCert(t, *id, time.Now())
		}, check: checkHostServingCert},
		{name: "serving certificate from the host replaces a self-signed one", mutate: func(id *identity.Identity) {
			id.KubeletServingCert, id.KubeletServingKey = hostIssuedServingCert(t, *id, time.Now())
		}, disk: func(t *testing.T, id identity.Identity, l Layout) {
			// Valid for this node, so it would be kept without one from the host.
			selfSigned(t, id, l)
		}, check: checkHostServingCert},
		{name: "serving certificate from the host near its end is used all the same", mutate: func(id *identity.Identity) {
			// The agent would replace a certificate of its own this close to its end, but
			// one it makes itself the apiserver refuses.
			id.KubeletServingCert, id.KubeletServingKey = hostIssuedServingCert(t, *id, time.Now().Add(-pki.NodeCertValidity+time.Hour))
		}, check: checkHostServingCert},
		{name: "no serving certificate from the host: a self-signed one is kept", mutate: func(*identity.Identity) {},
			disk: func(t *testing.T, id identity.Identity, l Layout) {
				selfSigned(t, id, l)
				earlier = readServingCert(t, l)
			}, check: func(t *testing.T, id identity.Identity, a *Agent) {
				if !bytes.Equal(readServingCert(t, a.Layout), earlier) {
					t.Error("the self-signed serving certificate an earlier boot made was replaced")
				}
			}},
		{name: "no client certificate: the kubelet bootstraps", mutate: func(*identity.Identity) {},
			check: func(t *testing.T, id identity.Identity, a *Agent) {
				for _, f := range []string{KubeletClientCurrent(a.Layout), a.Layout.Kubeconfig} {
					if _, err := os.Stat(f); !os.IsNotExist(err) {
						t.Errorf("%s: %v, want none before the TLS bootstrap", f, err)
					}
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := sampleIdentity()
			tt.mutate(&id)
			l := DefaultLayout().Under(t.TempDir())
			// The guest has cgroup v2; the kubelet's validation looks at this host.
			_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
			a := New(Config{Layout: l, Kubelet: KubeletOptions{AllowCgroupV1: err != nil}})
			a.Identity = id
			if tt.disk != nil {
				tt.disk(t, id, l)
			}
			err = stepKubeletConfig(context.Background(), a)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			s := a.KubeletServer
			checks := []struct {
				what     string
				got, exp any
			}{
				{"hostname-override", s.HostnameOverride, id.NodeName},
				{"node-ip", s.NodeIP, "10.250.3.2"},
				{"cloud-provider", s.CloudProvider, "external"},
				{"kubeconfig", s.KubeConfig, l.Kubeconfig},
				{"bootstrap-kubeconfig", s.BootstrapKubeconfig, l.BootstrapKubeconfig},
				{"cert-dir", s.CertDirectory, l.KubeletCertDir},
				{"root-dir", s.RootDirectory, l.KubeletRoot},
				{"node labels", s.NodeLabels, id.Labels},
				{"providerID", s.ProviderID, id.ProviderID},
				{"maxPods", s.MaxPods, int32(id.MaxPods)},
				{"cgroupDriver", s.CgroupDriver, "cgroupfs"},
				{"cgroupsPerQOS", s.CgroupsPerQOS, true},
				{"clusterDomain", s.ClusterDomain, "cluster.local"},
				{"failSwapOn", s.FailSwapOn, false},
				{"resolvConf", s.ResolverConfig, l.ResolvConf},
				{"rotateCertificates", s.RotateCertificates, true},
				{"serverTLSBootstrap", s.ServerTLSBootstrap, false},
				{"registerNode", s.RegisterNode, true},
				{"makeIPTablesUtilChains (a dozen iptables runs before the sync loop)", s.MakeIPTablesUtilChains, false},
				{"runtime endpoint", s.ContainerRuntimeEndpoint, "unix://" + l.ContainerdSocket},
				{"port", s.Port, int32(10250)},
				{"read-only port", s.ReadOnlyPort, int32(0)},
				{"client CA", s.Authentication.X509.ClientCAFile, l.ClientCACert},
				{"anonymous", s.Authentication.Anonymous.Enabled, false},
				{"webhook authn", s.Authentication.Webhook.Enabled, true},
				{"authz mode", string(s.Authorization.Mode), "Webhook"},
				{"pod CIDR (from the Node object)", s.PodCIDR, ""},
				{"serving cert", s.TLSCertFile, l.KubeletServingCert},
				{"serving key", s.TLSPrivateKeyFile, l.KubeletServingKey},
			}
			if id.ClusterDNS != "" {
				checks = append(checks, struct {
					what     string
					got, exp any
				}{"clusterDNS", s.ClusterDNS, []string{id.ClusterDNS}})
			}
			for _, c := range checks {
				if !reflect.DeepEqual(c.got, c.exp) {
					t.Errorf("%s = %#v, want %#v", c.what, c.got, c.exp)
				}
			}
			if st, err := os.Stat(l.BootstrapKubeconfig); err != nil || st.Mode().Perm() != 0o600 {
				t.Errorf("bootstrap kubeconfig: %v, %v; want mode 0600", st, err)
			}
			if b, err := os.ReadFile(l.CACert); err != nil || string(b) != id.CACert {
				t.Errorf("CA file: %q, %v", b, err)
			}
			// The host's is checked by checkHostServingCert.
			if id.KubeletServingCert == "" && !servingCertValid(l, id) {
				t.Errorf("no valid serving certificate for %s at %s", id.NodeName, l.KubeletServingCert)
			}
			if tt.check != nil {
				tt.check(t, id, a)
			}
		})
	}
}

func TestKubeletFlags(t *testing.T) {
	l := DefaultLayout()
	got, err := KubeletFlags(sampleIdentity(), l)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"--kubeconfig=/etc/kubernetes/kubelet.conf",
		"--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
		"--cert-dir=/var/lib/kubelet/pki",
		"--root-dir=/var/lib/kubelet",
		"--hostname-override=ci-abc123",
		"--node-ip=10.250.3.2",
		"--cloud-provider=external",
		"--node-labels=socialweb.computer/pool=default",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("flags =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	id := sampleIdentity()
	id.Address = "10.250.3.2"
	if _, err := KubeletFlags(id, l); err == nil {
		t.Error("an address without a prefix was accepted")
	}
}

func TestLayoutUnder(t *testing.T) {
	l := DefaultLayout().Under("/x")
	for _, p := range l.fields() {
		if !strings.HasPrefix(*p, "/x/") {
			t.Errorf("%s is not under /x", *p)
		}
	}
	if filepath.Clean(l.ContainerdConfig) != "/x/etc/containerd/config.toml" {
		t.Errorf("ContainerdConfig = %s", l.ContainerdConfig)
	}
}

func TestServingCert(t *testing.T) {
	id := sampleIdentity()
	crt, key, err := ServingCert(id, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(crt, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ci-abc123", "10.250.3.2"} {
		if err := c.VerifyHostname(name); err != nil {
			t.Errorf("serving cert not valid for %s: %v", name, err)
		}
	}
	if c.VerifyHostname("10.250.3.3") == nil {
		t.Error("serving cert valid for another address")
	}
	if len(c.ExtKeyUsage) != 1 || c.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
		t.Errorf("ext key usage %v", c.ExtKeyUsage)
	}
	// Kept across boots for the same node, replaced for another.
	l := DefaultLayout().Under(t.TempDir())
	writeFiles([]File{{l.KubeletServingCert, crt, 0o644}, {l.KubeletServingKey, key, 0o600}})
	if !servingCertValid(l, id) {
		t.Error("the certificate just written is not valid for its node")
	}
	other := id
	other.NodeName = "ci-other"
	if servingCertValid(l, other) {
		t.Error("a certificate for another node is accepted")
	}
}

// The kube-proxy configuration decodes as KubeProxyConfiguration and carries the node's
// name, its kubeconfig, iptables mode and the cluster's pod range.
func TestProxyConfig(t *testing.T) {
	id := sampleIdentity()
	id.PodCIDR = "10.3.0.0/16"
	l := DefaultLayout()
	var cfg struct {
		APIVersion       string `json:"apiVersion"`
		Kind             string `json:"kind"`
		Mode             string `json:"mode"`
		HostnameOverride string `json:"hostnameOverride"`
		ClusterCIDR      string `json:"clusterCIDR"`
		ClientConnection struct {
			Kubeconfig string `json:"kubeconfig"`
		} `json:"clientConnection"`
		MetricsBindAddress string `json:"metricsBindAddress"`
		HealthzBindAddress string `json:"healthzBindAddress"`
		Conntrack          struct {
			MaxPerCore int `json:"maxPerCore"`
		} `json:"conntrack"`
	}
	if err := yaml.UnmarshalStrict(ProxyConfig(id, l), &cfg); err != nil {
		t.Fatalf("%v\n%s", err, ProxyConfig(id, l))
	}
	if cfg.Kind != "KubeProxyConfiguration" || cfg.Mode != "nftables" || cfg.HostnameOverride != id.NodeName ||
		cfg.ClusterCIDR != "10.3.0.0/16" || cfg.ClientConnection.Kubeconfig != l.Kubeconfig || cfg.MetricsBindAddress != "127.0.0.1:10249" {
		t.Errorf("kube-proxy config %+v", cfg)
	}
	// kube-proxy's own loader and validation accept it.
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, ProxyConfig(id, l), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := proxyOptions(file); err != nil {
		t.Errorf("kube-proxy refuses the config: %v", err)
	}
	id.PodCIDR = ""
	if b := ProxyConfig(id, l); strings.Contains(string(b), "clusterCIDR") {
		t.Errorf("clusterCIDR without a pod range:\n%s", b)
	}
}

// hostIssuedClientCert is a client certificate for system:node:<name> from a throwaway CA,
// as the host issues one.
func hostIssuedClientCert(t *testing.T, name string) (certPEM, keyPEM string) {
	t.Helper()
	p, err := pki.Ensure(t.TempDir(), pki.Options{Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := pki.LoadNodeSigner(p)
	if err != nil {
		t.Fatal(err)
	}
	c, k, err := s.NodeClientCert(name, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return string(c), string(k)
}

// hostIssuedServingCert is a serving certificate for id's node name and address from a
// throwaway server CA, as the host issues one at now.
func hostIssuedServingCert(t *testing.T, id identity.Identity, now time.Time) (certPEM, keyPEM string) {
	t.Helper()
	p, err := pki.Ensure(t.TempDir(), pki.Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	s, err := pki.LoadNodeSigner(p)
	if err != nil {
		t.Fatal(err)
	}
	ip, err := NodeIP(id)
	if err != nil {
		t.Fatal(err)
	}
	c, k, err := s.NodeServingCert(id.NodeName, ip, now)
	if err != nil {
		t.Fatal(err)
	}
	return string(c), string(k)
}

// selfSigned leaves a self-signed serving certificate for id's node on the disk, as an
// earlier boot without one from the host did.
func selfSigned(t *testing.T, id identity.Identity, l Layout) {
	t.Helper()
	crt, key, err := ServingCert(id, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFiles([]File{{l.KubeletServingKey, key, 0o600}, {l.KubeletServingCert, crt, 0o644}}); err != nil {
		t.Fatal(err)
	}
}

func readServingCert(t *testing.T, l Layout) []byte {
	t.Helper()
	b, err := os.ReadFile(l.KubeletServingCert)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// servingCertOnDisk is the kubelet's serving certificate, checked to pair with its key.
func servingCertOnDisk(t *testing.T, l Layout) *x509.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(l.KubeletServingCert, l.KubeletServingKey)
	if err != nil {
		t.Fatalf("the kubelet's serving certificate and key: %v", err)
	}
	c, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// checkHostServingCert: the kubelet serves with the identity's certificate and key, the
// key readable by root alone.
func checkHostServingCert(t *testing.T, id identity.Identity, a *Agent) {
	for _, f := range []struct {
		path, want string
		mode       os.FileMode
	}{
		{a.Layout.KubeletServingCert, id.KubeletServingCert, 0o644},
		{a.Layout.KubeletServingKey, id.KubeletServingKey, 0o600},
	} {
		b, err := os.ReadFile(f.path)
		if err != nil || string(b) != f.want {
			t.Errorf("%s: %v; does not hold the identity's", f.path, err)
		}
		if st, err := os.Stat(f.path); err != nil || st.Mode().Perm() != f.mode {
			t.Errorf("%s: %v, %v; want mode %v", f.path, st, err, f.mode)
		}
	}
	if c := servingCertOnDisk(t, a.Layout); c.Subject.CommonName != "system:node:"+id.NodeName {
		t.Errorf("serving certificate for %q, want the host's for system:node:%s", c.Subject.CommonName, id.NodeName)
	}
}

func TestOCIRuntime(t *testing.T) {
	tests := []struct {
		name   string
		onPath []string
		want   string
	}{
		{"the image's runc before Debian's", []string{"runc", guestbuild.GuestRunc}, guestbuild.GuestRunc},
		{"Debian's runc alone", []string{"runc"}, "/usr/bin/runc"},
		{"neither", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			look := func(name string) (string, error) {
				switch {
				case !slices.Contains(tt.onPath, name):
					return "", errors.New("not found")
				case strings.HasPrefix(name, "/"):
					return name, nil
				}
				return "/usr/bin/" + name, nil
			}
			if got := ociRuntime(DefaultConfig().OCIRuntimes, look); got != tt.want {
				t.Errorf("ociRuntime = %q, want %q", got, tt.want)
			}
		})
	}
}
