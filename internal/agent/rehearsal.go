package agent

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"
)

// A claimed node's kubelet spends about 4 s of its single TCG vCPU between its start and
// the Node Ready (docs/benchmarks.md), most of it in code it runs for the first time:
// container manager, cAdvisor, the CRI calls, the sync loop. A warm-pool VM runs the same
// kubelet once beforehand, standalone (no API server, no server port, no Pods), in a
// child process of this binary for a few seconds (KubeletRehearsalCommand). qemu keeps
// what it translated for the binary's pages, so the real kubelet, in PID 1, starts on
// code already translated. The rehearsal's own state is in a directory of its own,
// removed after.

// KubeletRehearsalCommand is the first argument that makes this binary run the
// rehearsal kubelet.
const KubeletRehearsalCommand = "kubelet-rehearsal"

// kubeletRehearsalRoot is the rehearsal's directory: on the guest's /run, so nothing of
// it outlives the boot even if its removal does not happen.
const kubeletRehearsalRoot = "/run/socialweb-prewarm/kubelet-rehearsal"

// kubeletRehearsalFor is how long the rehearsal kubelet runs: past its sync loop's
// start and first relists on a TCG vCPU.
const kubeletRehearsalFor = 8 * time.Second

// RehearsalKubeletConfiguration is the rehearsal kubelet's configuration: the node's
// runtime, cgroup and eviction settings (KubeletConfiguration) without what needs a
// cluster: no server (so no certificate), no webhook authentication, no healthz port,
// no pod CIDR (containerd renders no CNI configuration). Of o it takes AllowCgroupV1.
func RehearsalKubeletConfiguration(l Layout, o KubeletOptions) *kubeletv1beta1.KubeletConfiguration {
	t, f := true, false
	var zero int32
	kc := &kubeletv1beta1.KubeletConfiguration{
		Authentication: kubeletv1beta1.KubeletAuthentication{
			Webhook:   kubeletv1beta1.KubeletWebhookAuthentication{Enabled: &f},
			Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: &f},
		},
		Authorization:            kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeAlwaysAllow},
		EnableServer:             &f,
		HealthzPort:              &zero,
		ReadOnlyPort:             0,
		RotateCertificates:       false,
		CgroupDriver:             "cgroupfs",
		CgroupsPerQOS:            &t,
		ContainerRuntimeEndpoint: "unix://" + l.ContainerdSocket,
		FailSwapOn:               &f,
		RuntimeRequestTimeout:    metav1.Duration{Duration: 10 * time.Minute},
		EvictionHard:             EvictionHard(),
	}
	kc.APIVersion = kubeletv1beta1.SchemeGroupVersion.String()
	kc.Kind = "KubeletConfiguration"
	if o.AllowCgroupV1 {
		kc.FailCgroupV1 = &f
	}
	return kc
}

// rehearsalKubeletFlags are the rehearsal kubelet's flags: no --kubeconfig (standalone),
// everything it writes under root.
func rehearsalKubeletFlags(root string) []string {
	return []string{
		"--root-dir=" + filepath.Join(root, "kubelet"),
		"--cert-dir=" + filepath.Join(root, "pki"),
		"--hostname-override=" + prewarmContainer,
		"--cloud-provider=external",
	}
}

// kubeletRehearsalArgv is the rehearsal's command line: this binary (self) as
// KubeletRehearsalCommand.
func kubeletRehearsalArgv(self, root string, d time.Duration) []string {
	return []string{self, KubeletRehearsalCommand, "--root", root, "--for", d.String()}
}

// KubeletRehearsalMain runs the rehearsal kubelet with args (--root DIR --for D) for D,
// then returns the process's exit code: 0 if the kubelet ran until then.
func KubeletRehearsalMain(args []string) int {
	fs := flag.NewFlagSet(KubeletRehearsalCommand, flag.ContinueOnError)
	root := fs.String("root", "", "directory for the rehearsal's configuration and state")
	d := fs.Duration("for", kubeletRehearsalFor, "how long the kubelet runs")
	if err := fs.Parse(args); err != nil || *root == "" || *d <= 0 {
		fmt.Fprintln(os.Stderr, "usage: socialweb-node kubelet-rehearsal --root DIR [--for DURATION]")
		return 2
	}
	if err := rehearseKubelet(*root, *d); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet rehearsal:", err)
		return 1
	}
	return 0
}

// rehearseKubelet writes the configuration under root and runs the kubelet for d.
func rehearseKubelet(root string, d time.Duration) error {
	b, err := yaml.Marshal(RehearsalKubeletConfiguration(DefaultLayout(), KubeletOptions{}))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	cfg := filepath.Join(root, "config.yaml")
	if err := os.WriteFile(cfg, b, 0o600); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	s, err := LoadKubeletServer(ctx, cfg, rehearsalKubeletFlags(root))
	if err != nil {
		return err
	}
	// Its end is the deadline: what it returns then is the cancellation.
	if err := RunKubelet(ctx, s); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}
