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
	if s.PodCIDR != "" || s.StaticPodPath != "" || s.StaticPodURL != "" {
		t.Errorf("pod CIDR %q, static pods %q %q: the rehearsal runs no Pod and renders no CNI configuration", s.PodCIDR, s.StaticPodPath, s.StaticPodURL)
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
	argv := kubeletRehearsalArgv("/usr/local/bin/socialweb-node", "/run/r", 8*time.Second)
	if want := []string{"/usr/local/bin/socialweb-node", KubeletRehearsalCommand, "--root", "/run/r", "--for", "8s"}; !slices.Equal(argv, want) {
		t.Errorf("argv %q, want %q", argv, want)
	}
	tests := []struct {
		name string
		args []string
	}{
		{"no root", []string{"--for", "1s"}},
		{"zero time", []string{"--root", "/run/r", "--for", "0s"}},
		{"unknown flag", []string{"--root", "/run/r", "--pods", "1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if code := KubeletRehearsalMain(tt.args); code != 2 {
				t.Errorf("exit code %d, want 2 (usage)", code)
			}
		})
	}
}
