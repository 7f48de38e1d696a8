package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"
)

// A claimed node's kubelet spends about 4 s of its single TCG vCPU between its start and
// the Node Ready, and its first Pod's sandbox and container another 5 (docs/benchmarks.md),
// most of it in code run for the first time: the kubelet's container manager, cAdvisor
// and pod sync, containerd's CRI sandbox and container paths, the shim, runc. A warm-pool
// VM rehearses it beforehand: the same kubelet, standalone (no API server, no server
// port), in a child process of this binary (KubeletRehearsalCommand), runs one static Pod
// on the host network until its container runs, then the Pod is taken away and removed
// through the CRI. qemu keeps what it translated for the binaries' pages, so the node's
// kubelet in PID 1, containerd and runc start on code already translated. The
// rehearsal's state is in a directory of its own, removed after.

// KubeletRehearsalCommand is the first argument that makes this binary run the
// rehearsal kubelet.
const KubeletRehearsalCommand = "kubelet-rehearsal"

// kubeletRehearsalRoot is the rehearsal's directory: on the guest's /run, so nothing of
// it outlives the boot even if its removal does not happen.
const kubeletRehearsalRoot = "/run/socialweb-prewarm/kubelet-rehearsal"

// kubeletRehearsalFor is how long the rehearsal may take at most: its Pod runs within
// about 10 s on a TCG vCPU.
const kubeletRehearsalFor = 45 * time.Second

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
		MakeIPTablesUtilChains:   &f, // as the node's kubelet
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
// KubeletRehearsalCommand, its Pod's image the sandbox image.
func kubeletRehearsalArgv(self, root, image string, d time.Duration) []string {
	return []string{self, KubeletRehearsalCommand, "--root", root, "--image", image, "--for", d.String()}
}

// KubeletRehearsalMain runs the rehearsal (--root DIR --image REF [--for D]): the kubelet
// runs one Pod until it is up, then stops and removes it, for D at most. It returns the
// process's exit code: 0 if the Pod ran and is gone.
func KubeletRehearsalMain(args []string) int {
	fs := flag.NewFlagSet(KubeletRehearsalCommand, flag.ContinueOnError)
	root := fs.String("root", "", "directory for the rehearsal's configuration and state")
	image := fs.String("image", "", "the rehearsal Pod's image: the sandbox image, imported beforehand (never pulled)")
	d := fs.Duration("for", kubeletRehearsalFor, "how long the rehearsal may take")
	if err := fs.Parse(args); err != nil || *root == "" || *image == "" || *d <= 0 {
		fmt.Fprintln(os.Stderr, "usage: socialweb-node kubelet-rehearsal --root DIR --image REF [--for DURATION]")
		return 2
	}
	if err := rehearseKubelet(*root, *image, *d); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet rehearsal:", err)
		return 1
	}
	return 0
}

// rehearsalNamespace is the rehearsal Pod's namespace: what finds its sandboxes and
// containers in the CRI.
const rehearsalNamespace = "socialweb-prewarm"

// rehearsalPod is the rehearsal's static Pod: one container of image (the sandbox image,
// so /pause), on the host's network (before the claim there is no pod CIDR, so no CNI
// configuration), never pulled.
func rehearsalPod(image string) *corev1.Pod {
	var grace int64
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "rehearsal", Namespace: rehearsalNamespace},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: &grace,
			Containers:                    []corev1.Container{{Name: "pause", Image: image, ImagePullPolicy: corev1.PullNever}},
		},
	}
}

// rehearseKubelet runs the kubelet with the rehearsal Pod in its static Pod directory
// under root until the Pod's container runs, takes the Pod away and waits for its
// sandbox to stop, stops the kubelet, and removes through the CRI whatever of the Pod is
// left, all within d.
func rehearseKubelet(root, image string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	manifests := filepath.Join(root, "manifests")
	if err := os.MkdirAll(manifests, 0o700); err != nil {
		return err
	}
	kc := RehearsalKubeletConfiguration(DefaultLayout(), KubeletOptions{})
	kc.StaticPodPath = manifests
	b, err := yaml.Marshal(kc)
	if err != nil {
		return err
	}
	cfg := filepath.Join(root, "config.yaml")
	if err := os.WriteFile(cfg, b, 0o600); err != nil {
		return err
	}
	pod, err := yaml.Marshal(rehearsalPod(image))
	if err != nil {
		return err
	}
	manifest := filepath.Join(manifests, "rehearsal.yaml")
	if err := os.WriteFile(manifest, pod, 0o600); err != nil {
		return err
	}
	s, err := LoadKubeletServer(ctx, cfg, rehearsalKubeletFlags(root))
	if err != nil {
		return err
	}
	cri, closeCRI, err := criClient(DefaultLayout().ContainerdSocket)
	if err != nil {
		return err
	}
	defer closeCRI()

	kctx, stopKubelet := context.WithCancel(ctx)
	defer stopKubelet()
	kubeletDone := make(chan error, 1)
	go func() { kubeletDone <- RunKubelet(kctx, s) }()
	ran := waitRehearsal(ctx, kubeletDone, func(ctx context.Context) bool {
		return len(rehearsalContainers(ctx, cri, runtimeapi.ContainerState_CONTAINER_RUNNING)) > 0
	})
	_ = os.Remove(manifest)
	if ran == nil {
		// The kubelet stops the Pod it no longer has; a sandbox left ready is removed below.
		_ = waitRehearsal(ctx, kubeletDone, func(ctx context.Context) bool {
			return len(rehearsalSandboxes(ctx, cri, true)) == 0
		})
	}
	stopKubelet()
	select {
	case <-kubeletDone:
	case <-time.After(10 * time.Second):
	}
	if err := removeRehearsalPod(cri); err != nil && ran == nil {
		ran = err
	}
	return ran
}

// removeRehearsalPod stops and removes, through the CRI, every sandbox of the rehearsal
// Pod (and with it its containers) and the Pod's log directory: after a rehearsal, and
// after a claim that killed one midway.
func removeRehearsalPod(cri runtimeapi.RuntimeServiceClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var failed error
	for _, id := range rehearsalSandboxes(ctx, cri, false) {
		_, _ = cri.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
		if _, err := cri.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
			failed = errors.Join(failed, fmt.Errorf("removing the rehearsal Pod's sandbox %s: %w", id, err))
		}
	}
	logs, _ := filepath.Glob(filepath.Join("/var/log/pods", rehearsalNamespace+"_*"))
	for _, l := range logs {
		_ = os.RemoveAll(l)
	}
	return failed
}

// criClient connects to the CRI at socket; the connection is made at the first call.
func criClient(socket string) (runtimeapi.RuntimeServiceClient, func(), error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, fmt.Errorf("the CRI at %s: %w", socket, err)
	}
	return runtimeapi.NewRuntimeServiceClient(conn), func() { conn.Close() }, nil
}

// waitRehearsal polls done every 200 ms until it holds (nil), the kubelet has ended, or
// ctx ends.
func waitRehearsal(ctx context.Context, kubeletDone <-chan error, done func(context.Context) bool) error {
	for {
		if done(ctx) {
			return nil
		}
		select {
		case err := <-kubeletDone:
			if err == nil {
				err = errors.New("it returned")
			}
			return fmt.Errorf("the kubelet ended before the rehearsal Pod ran: %w", err)
		case <-ctx.Done():
			return fmt.Errorf("the rehearsal Pod did not run: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// rehearsalSandboxes is the ids of the rehearsal Pod's sandboxes, only the ready ones if
// ready.
func rehearsalSandboxes(ctx context.Context, cri runtimeapi.RuntimeServiceClient, ready bool) []string {
	f := &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"io.kubernetes.pod.namespace": rehearsalNamespace}}
	if ready {
		f.State = &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}
	}
	r, err := cri.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: f})
	if err != nil {
		return nil
	}
	var ids []string
	for _, sb := range r.Items {
		ids = append(ids, sb.Id)
	}
	return ids
}

// rehearsalContainers is the ids of the rehearsal Pod's containers in state.
func rehearsalContainers(ctx context.Context, cri runtimeapi.RuntimeServiceClient, state runtimeapi.ContainerState) []string {
	r, err := cri.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State:         &runtimeapi.ContainerStateValue{State: state},
		LabelSelector: map[string]string{"io.kubernetes.pod.namespace": rehearsalNamespace},
	}})
	if err != nil {
		return nil
	}
	var ids []string
	for _, c := range r.Containers {
		ids = append(ids, c.Id)
	}
	return ids
}
