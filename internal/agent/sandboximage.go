package agent

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace/noop"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	remote "k8s.io/cri-client/pkg"
)

// sandboxImagePullTimeout bounds the background pull of the sandbox image; a node whose
// pull fails or times out still pulls it at its first Pod, as without this step.
const sandboxImagePullTimeout = 5 * time.Minute

// imagePuller is the part of the CRI image service the sandbox-image step uses.
type imagePuller interface {
	ImageStatus(ctx context.Context, image *runtimeapi.ImageSpec, verbose bool) (*runtimeapi.ImageStatusResponse, error)
	PullImage(ctx context.Context, image *runtimeapi.ImageSpec, auth *runtimeapi.AuthConfig, podSandboxConfig *runtimeapi.PodSandboxConfig) (string, error)
}

// ensureImage pulls ref through the CRI unless the runtime has it. pulled says whether it
// pulled.
func ensureImage(ctx context.Context, images imagePuller, ref string) (pulled bool, err error) {
	spec := &runtimeapi.ImageSpec{Image: ref}
	st, err := images.ImageStatus(ctx, spec, false)
	if err != nil {
		return false, fmt.Errorf("image status of %s: %w", ref, err)
	}
	if st.GetImage() != nil {
		return false, nil
	}
	if _, err := images.PullImage(ctx, spec, nil, nil); err != nil {
		return false, fmt.Errorf("pulling %s: %w", ref, err)
	}
	return true, nil
}

// stepSandboxImage pulls the Pod sandbox (pause) image through containerd's CRI in the
// background, once the registry mirror is written and containerd answers. Why: RunPodSandbox
// of a node's first Pod would otherwise pull it then, after the node is Ready and the Pod
// bound; here the pull overlaps the kubelet's start, TLS bootstrap and registration.
// It does not wait, and a failure only logs: the first Pod then pulls as before.
func stepSandboxImage(ctx context.Context, a *Agent) error {
	if a.Config.SandboxImage == "" {
		return nil
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), sandboxImagePullTimeout)
		defer cancel()
		t0 := time.Now()
		images, err := remote.NewRemoteImageService(ctx, "unix://"+a.Layout.ContainerdSocket, 10*time.Second, noop.NewTracerProvider(), false)
		pulled := false
		if err == nil {
			pulled, err = ensureImage(ctx, images, a.Config.SandboxImage)
		}
		if err != nil {
			a.Log.Warn("sandbox image: not pulled ahead; the first Pod pulls it", "image", a.Config.SandboxImage, "err", err)
			return
		}
		a.Log.Info("sandbox image ready", "image", a.Config.SandboxImage, "pulled", pulled,
			"took", time.Since(t0).Round(time.Millisecond), "uptime", fmt.Sprintf("%.2fs", a.Uptime().Seconds()))
	}()
	return nil
}
