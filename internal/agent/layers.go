package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/socialweb-computer/socialweb/internal/agent/layershare"
)

// LayerShareTag is the virtio-fs mount tag of the host's layer share.
const LayerShareTag = "socialweb-layers"

// virtioFSDeviceID is the virtio device ID of a virtio-fs device
// (/sys/bus/virtio/devices/*/device).
const virtioFSDeviceID = 0x1a

// hasVirtioDevice reports whether a virtio device of this ID is present under
// sysBus (/sys/bus/virtio/devices). Without udev nothing loads a driver for
// it, so the agent looks before it loads virtiofs: the module costs about
// 0.3 s under TCG, for nothing on a node without a share.
func hasVirtioDevice(sysBus string, id int) bool {
	ents, _ := os.ReadDir(sysBus)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(sysBus, e.Name(), "device"))
		if err != nil {
			continue
		}
		var got int
		if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "0x%x", &got); err == nil && got == id {
			return true
		}
	}
	return false
}

// stepLayerShare mounts the host's layer share read-only at
// Layout.LayerShare when the VM has a virtio-fs device. A node without one
// (the host's share is off, or an older host) pulls every layer itself, as
// does a node whose virtio-fs device has another tag: neither is an error.
func stepLayerShare(ctx context.Context, a *Agent) error {
	if a.Config.NoLayerShare {
		a.Log.Info("layer share", "state", "off (agent config)")
		return nil
	}
	if !hasVirtioDevice("/sys/bus/virtio/devices", virtioFSDeviceID) {
		a.Log.Info("layer share", "state", "absent: no virtio-fs device, layers are pulled")
		return nil
	}
	if _, err := a.run(ctx, "", "modprobe", "virtiofs"); err != nil {
		a.Log.Warn("layer share", "state", "absent: virtiofs does not load, layers are pulled", "err", err)
		return nil
	}
	dir := a.Layout.LayerShare
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// Read-only here too, though the host enforces it: nothing in the guest
	// may write a layer that other nodes read.
	if err := syscall.Mount(LayerShareTag, dir, "virtiofs", syscall.MS_RDONLY, ""); err != nil {
		a.Log.Warn("layer share", "state", "absent: mount failed, layers are pulled", "tag", LayerShareTag, "err", err)
		return nil
	}
	if err := layershare.CheckXattrs(dir); err != nil {
		a.Log.Warn("layer share", "state", "not used: opaque directories would be lost, layers are pulled", "err", err)
		if err := syscall.Unmount(dir, 0); err != nil {
			a.Log.Warn("layer share: unmounting", "mount", dir, "err", err)
		}
		return nil
	}
	a.LayerShare = dir
	n := 0
	if ents, err := os.ReadDir(filepath.Join(dir, "sha256")); err == nil {
		n = len(ents)
	}
	a.Log.Info("layer share", "state", "mounted", "tag", LayerShareTag, "mount", dir, "layers", n)
	return nil
}

// stepSnapshotter starts the socialweb snapshotter (layershare) on
// Layout.SnapshotterSocket when the layer share is mounted, before
// containerd, which reaches it as a proxy plugin. Without the share
// containerd keeps its own overlayfs snapshotter.
func stepSnapshotter(ctx context.Context, a *Agent) error {
	if a.LayerShare == "" {
		return nil
	}
	sn, err := layershare.New(ctx, a.Layout.SnapshotterRoot, layershare.Options{
		Share: layershare.Share{Root: a.LayerShare},
		Log:   a.Log.With("component", "snapshotter"),
	})
	if err != nil {
		return fmt.Errorf("socialweb snapshotter: %w", err)
	}
	srv, err := layershare.Serve(sn, a.Layout.SnapshotterSocket)
	if err != nil {
		return errors.Join(fmt.Errorf("serving the socialweb snapshotter: %w", err), sn.Close())
	}
	a.mu.Lock()
	a.snapshotter, a.snapshotterServer = sn, srv
	a.mu.Unlock()
	a.Log.Info("snapshotter", "name", SharedSnapshotter, "socket", a.Layout.SnapshotterSocket, "root", a.Layout.SnapshotterRoot)
	return nil
}

// stepStopSnapshotter stops the snapshotter after containerd and logs what
// it did.
func stepStopSnapshotter(ctx context.Context, a *Agent) error {
	a.mu.Lock()
	sn, srv := a.snapshotter, a.snapshotterServer
	a.mu.Unlock()
	if sn == nil {
		return nil
	}
	st := sn.Stats()
	a.Log.Info("snapshotter", "layersFromShare", st.FromShare, "layersPulled", st.Pulled)
	return errors.Join(srv.Stop(5*time.Second), sn.Close())
}
