package agent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

func TestRehearsalKubelet(t *testing.T) {
	root := t.TempDir()
	kc := RehearsalKubeletConfiguration(DefaultLayout(), KubeletOptions{AllowCgroupV1: true}) // this host may have v1
	b, err := yaml.Marshal(kc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(root, "config.yaml")
	if err := os.WriteFile(cfg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	// The kubelet's own loading and validation accept it, standalone.
	s, err := LoadKubeletServer(context.Background(), cfg, rehearsalKubeletFlags(root))
	if err != nil {
		t.Fatalf("the kubelet refuses the rehearsal's configuration: %v", err)
	}
	if s.KubeConfig != "" || s.BootstrapKubeconfig != "" {
		t.Errorf("kubeconfig %q, bootstrap %q: the rehearsal must not reach a cluster", s.KubeConfig, s.BootstrapKubeconfig)
	}
	if s.EnableServer || s.HealthzPort != 0 || s.ReadOnlyPort != 0 {
		t.Errorf("server %v, healthz port %d, read-only port %d: the rehearsal must listen on nothing", s.EnableServer, s.HealthzPort, s.ReadOnlyPort)
	}
	if s.PodCIDR != "" || s.StaticPodURL != "" {
		t.Errorf("pod CIDR %q, static Pod URL %q: the rehearsal renders no CNI configuration and fetches nothing", s.PodCIDR, s.StaticPodURL)
	}
	// The node's runtime and cgroup settings, so the same code runs.
	node := DefaultLayout()
	if s.ContainerRuntimeEndpoint != "unix://"+node.ContainerdSocket || s.CgroupDriver != "cgroupfs" || !s.CgroupsPerQOS {
		t.Errorf("runtime %q, cgroup driver %q, per-QoS %v", s.ContainerRuntimeEndpoint, s.CgroupDriver, s.CgroupsPerQOS)
	}
	for _, dir := range []string{s.RootDirectory, s.CertDirectory} {
		if !strings.HasPrefix(dir, root+"/") {
			t.Errorf("the rehearsal writes to %q, outside its directory %q", dir, root)
		}
	}
	if !strings.HasPrefix(kubeletRehearsalRoot, "/run/") {
		t.Errorf("rehearsal directory %q: want it on /run, gone at the next boot", kubeletRehearsalRoot)
	}
}

func TestKubeletRehearsalArgs(t *testing.T) {
	argv := kubeletRehearsalArgv("/usr/local/bin/socialweb-node", "/run/r", "registry.k8s.io/pause:3.10", 8*time.Second)
	if want := []string{"/usr/local/bin/socialweb-node", KubeletRehearsalCommand, "--root", "/run/r", "--image", "registry.k8s.io/pause:3.10", "--for", "8s"}; !slices.Equal(argv, want) {
		t.Errorf("argv %q, want %q", argv, want)
	}
	tests := []struct {
		name string
		args []string
	}{
		{"no root", []string{"--image", "p", "--for", "1s"}},
		{"no image", []string{"--root", "/run/r"}},
		{"zero time", []string{"--root", "/run/r", "--image", "p", "--for", "0s"}},
		{"unknown flag", []string{"--root", "/run/r", "--image", "p", "--pods", "1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if code := KubeletRehearsalMain(tt.args); code != 2 {
				t.Errorf("exit code %d, want 2 (usage)", code)
			}
		})
	}
}

func TestRehearsalPod(t *testing.T) {
	p := rehearsalPod("registry.k8s.io/pause:3.10")
	b, err := yaml.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	// Before the claim there is no pod CIDR (no CNI configuration) and no registry to
	// pull from: the host's network, the imported sandbox image, never pulled.
	if !p.Spec.HostNetwork || len(p.Spec.Containers) != 1 || p.Spec.Containers[0].ImagePullPolicy != "Never" ||
		p.Spec.Containers[0].Image != "registry.k8s.io/pause:3.10" || p.Namespace != rehearsalNamespace {
		t.Errorf("rehearsal Pod:\n%s", b)
	}
	if !strings.Contains(string(b), "kind: Pod") || !strings.Contains(string(b), "apiVersion: v1") {
		t.Errorf("the static Pod file lacks its kind or apiVersion:\n%s", b)
	}
}
