package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/platforms"
)

// The node image carries the sandbox ("pause") image as an OCI layout tar
// (Layout.SandboxImageArchive; guestbuild puts it there). The agent imports it into
// containerd before the kubelet runs, so a Pod's first sandbox neither resolves nor
// pulls it: about 2 s of a first Pod's start under TCG. A warm-pool VM imports it while
// it waits to be claimed. Without the file, or when the import fails, the CRI pulls the
// image from the registry as before.

// criNamespace is the containerd namespace of the CRI plugin.
const criNamespace = "k8s.io"

// criImageLabels are the labels the CRI plugin puts on a sandbox image it pulls: the
// image is the CRI's, and pinned (the kubelet's image GC never removes it).
func criImageLabels() map[string]string {
	return map[string]string{"io.cri-containerd.image": "managed", "io.cri-containerd.pinned": "pinned"}
}

// importImageArchive imports the OCI layout tar archive into containerd at socket
// (namespace k8s.io, this machine's platform, CRI's labels) and unpacks each image for
// snapshotter. It returns the names of the images imported.
func importImageArchive(ctx context.Context, socket, archive, snapshotter string) ([]string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c, err := client.New(socket, client.WithDefaultNamespace(criNamespace), client.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("connecting to containerd at %s: %w", socket, err)
	}
	defer c.Close()
	imgs, err := c.Import(ctx, f, client.WithImportPlatform(platforms.Default()), client.WithImageLabels(criImageLabels()))
	if err != nil {
		return nil, fmt.Errorf("importing %s: %w", archive, err)
	}
	if len(imgs) == 0 {
		return nil, fmt.Errorf("importing %s: the archive names no image (index.json needs an io.containerd.image.name annotation)", archive)
	}
	var names []string
	for _, img := range imgs {
		if err := client.NewImageWithPlatform(c, img, platforms.Default()).Unpack(ctx, snapshotter); err != nil {
			return nil, fmt.Errorf("unpacking %s for the %s snapshotter: %w", img.Name, snapshotter, err)
		}
		names = append(names, img.Name)
	}
	return names, nil
}

// importSandboxImage imports Layout.SandboxImageArchive once containerd answers, unless
// it already did on this boot. A failure is logged, not returned: the CRI then pulls the
// image. It returns early when ctx ends (a claim during a warm-pool VM's import); the
// next call imports again.
func (a *Agent) importSandboxImage(ctx context.Context) {
	a.mu.Lock()
	done, end := a.sandboxImported, a.containerdEnd
	a.mu.Unlock()
	archive := a.Layout.SandboxImageArchive
	if done || archive == "" {
		return
	}
	if _, err := os.Stat(archive); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			a.Log.Info("sandbox image: the node image has none; a first Pod pulls it", "archive", archive)
			a.mu.Lock()
			a.sandboxImported = true // nothing to do on a later call either
			a.mu.Unlock()
			return
		}
		a.Log.Warn("sandbox image: a first Pod pulls it", "err", err)
		return
	}
	if err := waitSocket(ctx, a.Layout.ContainerdSocket, 2*time.Minute, end); err != nil {
		if ctx.Err() == nil {
			a.Log.Warn("sandbox image: containerd does not answer; a first Pod pulls it", "err", err)
		}
		return
	}
	snapshotter := "overlayfs"
	if a.snapshotter != nil {
		snapshotter = SharedSnapshotter
	}
	t0 := time.Now()
	names, err := importImageArchive(ctx, a.Layout.ContainerdSocket, archive, snapshotter)
	switch {
	case ctx.Err() != nil:
		return
	case err != nil:
		a.Log.Warn("sandbox image: import failed; a first Pod pulls it", "err", err)
		return
	}
	a.mu.Lock()
	a.sandboxImported, a.sandboxImportedAt = true, a.Uptime()
	a.mu.Unlock()
	a.Log.Info("sandbox image imported", "images", names, "snapshotter", snapshotter,
		"took", time.Since(t0).Round(time.Millisecond), "uptime", fmt.Sprintf("%.2fs", a.Uptime().Seconds()))
}
