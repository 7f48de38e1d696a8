package guestbuild

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"

	"github.com/socialweb-computer/socialweb/internal/filelock"
	"github.com/socialweb-computer/socialweb/internal/images"
	"github.com/socialweb-computer/socialweb/internal/nodeimage"
)

// AgentSpecDefaults are the nodeimage.json values of a socialweb node image where the
// file is silent: the agent is the guest's init.
func AgentSpecDefaults() nodeimage.Spec {
	return nodeimage.Spec{Init: GuestAgent}
}

// NodeImage builds the guest programs (the agent from this source tree, containerd
// containerdVersion, runc runcVersion) and the sandbox image, and then the node image that carries them, through
// nodeimage.Ensure with opts. The programs are part of the image's fingerprint, so a
// change to the agent's source makes a new image. Builds are cached under
// <cache>/guestbuild, where <cache> is opts.CacheDir or nodeimage.DefaultCacheDir().
func (b Builder) NodeImage(ctx context.Context, spec nodeimage.Spec, opts nodeimage.Options, containerdVersion, runcVersion string) (nodeimage.Result, error) {
	cache := opts.CacheDir
	if cache == "" {
		cache = nodeimage.DefaultCacheDir()
	}
	dir := filepath.Join(cache, "guestbuild")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nodeimage.Result{}, err
	}
	// One agent build at a time: they write the same file.
	unlock, err := filelock.Wait(ctx, filepath.Join(dir, ".agent.lock"))
	if err != nil {
		return nodeimage.Result{}, err
	}
	defer unlock()
	agent := filepath.Join(dir, "agent", "socialweb-node")
	if err := b.Agent(ctx, agent); err != nil {
		return nodeimage.Result{}, fmt.Errorf("building the node agent: %w", err)
	}
	ctrd, err := b.Containerd(ctx, dir, containerdVersion)
	if err != nil {
		return nodeimage.Result{}, fmt.Errorf("building containerd %s: %w", containerdVersion, err)
	}
	runc, err := b.Runc(ctx, dir, runcVersion)
	if err != nil {
		return nodeimage.Result{}, fmt.Errorf("building runc %s: %w", runcVersion, err)
	}
	// The same build of the pause image as the host registry serves: a node that has
	// it need not pull it for its first sandbox.
	pause, _, err := images.Build(ctx, images.Pause, images.Options{Go: b.Go})
	if err != nil {
		return nodeimage.Result{}, fmt.Errorf("building the sandbox image: %w", err)
	}
	extra := maps.Clone(opts.ExtraFiles)
	if extra == nil {
		extra = map[string]string{}
	}
	maps.Copy(extra, ctrd.ExtraFiles())
	extra[GuestAgent] = agent
	extra[GuestRunc] = runc
	extra[GuestSandboxImage] = pause
	opts.ExtraFiles = extra
	return nodeimage.Ensure(ctx, spec, opts)
}
