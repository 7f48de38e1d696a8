package layershare

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/plugins/snapshots/overlay"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Stats counts layer extractions since the snapshotter started.
type Stats struct {
	FromShare int64 // committed from the share, nothing fetched
	Pulled    int64 // left to containerd: fetched and unpacked in the guest
}

// Snapshotter is containerd's overlayfs snapshotter whose layer extractions
// come from the share when it has the layer.
//
// A shared layer is an ordinary committed overlay snapshot whose (empty) fs
// directory has the share's fs/ bound onto it read-only: every overlay mount
// containerd makes names that directory as a lower, so the layer is read
// through virtio-fs, and the containers' upper directories stay in Root, on
// the node's data disk. Nothing a container writes can reach the share.
type Snapshotter struct {
	inner snapshots.Snapshotter
	root  string
	share Share
	log   *slog.Logger

	// mu serializes the making and removing of shared snapshots (a check,
	// then several inner calls and a mount).
	mu     sync.Mutex
	stats  Stats
	images map[string]*Stats // per image being pulled, until its last layer
}

// Options configure New.
type Options struct {
	// Share is the mounted layer share; a zero Share makes a plain overlayfs
	// snapshotter.
	Share Share
	// MountOptions are added to every overlay mount (containerd's
	// mount_options).
	MountOptions []string
	Log          *slog.Logger
}

// New opens (or creates) the snapshotter in root, containerd's
// <root>/io.containerd.snapshotter.v1.<name>, and binds the share back onto
// the shared snapshots an earlier run made there.
func New(ctx context.Context, root string, o Options) (*Snapshotter, error) {
	var opts []overlay.Opt
	if len(o.MountOptions) > 0 {
		opts = append(opts, overlay.WithMountOptions(o.MountOptions))
	}
	inner, err := overlay.NewSnapshotter(root, opts...)
	if err != nil {
		return nil, fmt.Errorf("overlay snapshotter in %s: %w", root, err)
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Snapshotter{inner: inner, root: root, share: o.Share, log: log, images: map[string]*Stats{}}
	s.restore(ctx)
	return s, nil
}

// Stats returns the counts so far.
func (s *Snapshotter) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// sharedName is the name a shared layer is committed under: one per target
// and parent, because containerd's metadata store finds a target made by the
// backend by its LabelSnapshotRef and parent, and two namespaces may reach
// the same chain ID through differently named parents.
func sharedName(target, parent string) string {
	sum := sha256.Sum256([]byte(parent))
	return "socialweb-shared/" + target + "/" + hex.EncodeToString(sum[:8])
}

// Prepare creates an active snapshot, unless it is the extraction of a
// layer the share has: then it commits the target from the share and
// returns ErrAlreadyExists, which makes the unpacker skip the layer.
func (s *Snapshotter) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	var base snapshots.Info
	for _, o := range opts {
		if err := o(&base); err != nil {
			return nil, err
		}
	}
	d := s.share.Decide(base.Labels)
	if d.Target == "" {
		return s.inner.Prepare(ctx, key, parent, opts...)
	}
	if d.Shared {
		name, err := s.fromShare(ctx, key, parent, d, base.Labels)
		if err == nil {
			s.note(base.Labels, d, true, name)
			return nil, fmt.Errorf("layer %s of %s from the layer share as %s: %w", d.Digest, d.Target, name, errdefs.ErrAlreadyExists)
		}
		d.Reason = err.Error()
		s.log.Warn("layer share: falling back to a pull", "layer", d.Digest, "chainID", d.Target, "err", err)
	}
	s.note(base.Labels, d, false, "")
	return s.inner.Prepare(ctx, key, parent, opts...)
}

// fromShare commits the target from the share: an empty active snapshot is
// committed (its disk usage is that of an empty directory, so the commit
// does not walk the share), and the share's fs/ is bound read-only onto its
// fs directory before the unpacker is told the target exists.
func (s *Snapshotter) fromShare(ctx context.Context, key, parent string, d Decision, labels map[string]string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	name := sharedName(d.Target, parent)
	if _, err := s.inner.Stat(ctx, name); err == nil {
		return name, nil // another namespace, or an earlier pull, made it
	}
	mounts, err := s.inner.Prepare(ctx, key, parent, snapshots.WithLabels(labels))
	if err != nil {
		return "", fmt.Errorf("preparing %s: %w", key, err)
	}
	dir, err := s.upperDir(mounts)
	if err != nil {
		return "", errors.Join(err, s.inner.Remove(ctx, key))
	}
	cl := maps.Clone(labels)
	cl[LabelShared] = d.Layer.Digest
	cl[LabelSharedDir] = dir
	if err := s.inner.Commit(ctx, name, key, snapshots.WithLabels(cl)); err != nil {
		return "", errors.Join(fmt.Errorf("committing %s: %w", name, err), s.inner.Remove(ctx, key))
	}
	if err := bindReadOnly(d.Layer.FS, dir); err != nil {
		return "", errors.Join(err, s.inner.Remove(ctx, name))
	}
	return name, nil
}

// upperDir is the fs directory of the active snapshot these mounts are of:
// a bind of it without parents, the overlay's upperdir with them.
func (s *Snapshotter) upperDir(mounts []mount.Mount) (string, error) {
	var dir string
	if len(mounts) == 1 {
		m := mounts[0]
		switch m.Type {
		case "bind":
			dir = m.Source
		case "overlay":
			for _, o := range m.Options {
				if v, ok := strings.CutPrefix(o, "upperdir="); ok {
					dir = v
				}
			}
		}
	}
	snapDir := filepath.Join(s.root, "snapshots") + string(filepath.Separator)
	if !strings.HasPrefix(dir, snapDir) || filepath.Base(dir) != "fs" {
		return "", fmt.Errorf("cannot tell the snapshot directory from the overlay snapshotter's mounts %+v", mounts)
	}
	return dir, nil
}

// note counts a layer extraction and logs it; the last layer of an image
// (LabelImageLayers names only itself) logs the image's totals.
func (s *Snapshotter) note(labels map[string]string, d Decision, shared bool, name string) {
	image := labels[LabelImageRef]
	s.mu.Lock()
	st := s.images[image]
	if st == nil {
		st = &Stats{}
		s.images[image] = st
	}
	if shared {
		s.stats.FromShare++
		st.FromShare++
	} else {
		s.stats.Pulled++
		st.Pulled++
	}
	last := image != "" && labels[LabelImageLayers] == d.Digest && d.Digest != ""
	per, total := *st, s.stats
	if last || image == "" {
		delete(s.images, image)
	}
	s.mu.Unlock()
	if shared {
		s.log.Info("layer from the share", "image", image, "layer", d.Digest, "chainID", d.Target, "snapshot", name,
			"unpackedBytes", d.Layer.UnpackedBytes, "files", d.Layer.Files)
	} else {
		s.log.Info("layer pulled", "image", image, "layer", d.Digest, "chainID", d.Target, "reason", d.Reason)
	}
	if last {
		s.log.Info("image layers", "image", image, "fromShare", per.FromShare, "pulled", per.Pulled,
			"nodeFromShare", total.FromShare, "nodePulled", total.Pulled)
	}
}

// Remove removes a snapshot; a shared one is unbound first, so removing its
// directory never reaches into the share.
func (s *Snapshotter) Remove(ctx context.Context, key string) error {
	info, err := s.inner.Stat(ctx, key)
	if err != nil || info.Labels[LabelShared] == "" {
		return s.inner.Remove(ctx, key)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dir := info.Labels[LabelSharedDir]
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unbinding the layer share from %s: %w", dir, err)
	}
	if err := s.inner.Remove(ctx, key); err != nil {
		// Still there (a child holds it): bind it again.
		if l, lerr := s.share.Lookup(info.Labels[LabelShared]); lerr == nil {
			err = errors.Join(err, bindReadOnly(l.FS, dir))
		}
		return err
	}
	return nil
}

// restore binds the share onto the shared snapshots of an earlier run (a
// data disk that outlived its node, or a restarted agent).
func (s *Snapshotter) restore(ctx context.Context) {
	mounted := mountPoints()
	err := s.inner.Walk(ctx, func(ctx context.Context, info snapshots.Info) error {
		digest, dir := info.Labels[LabelShared], info.Labels[LabelSharedDir]
		if digest == "" || dir == "" || mounted[dir] {
			return nil
		}
		l, err := s.share.Lookup(digest)
		if err == nil {
			err = bindReadOnly(l.FS, dir)
		}
		if err != nil {
			// Its directory is empty: an image on it is broken until removed and
			// pulled again.
			s.log.Error("layer share: cannot restore a shared snapshot", "snapshot", info.Name, "layer", digest, "err", err)
		}
		return nil
	})
	// A new root has no snapshots bucket yet: nothing to restore.
	if err != nil && !errdefs.IsNotFound(err) {
		s.log.Warn("layer share: walking snapshots", "err", err)
	}
}

// bindReadOnly binds src onto dst read-only.
func bindReadOnly(src, dst string) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", src, dst, err)
	}
	if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		return errors.Join(fmt.Errorf("remount %s read-only: %w", dst, err), unix.Unmount(dst, unix.MNT_DETACH))
	}
	return nil
}

// mountPoints lists the mount points of this mount namespace.
func mountPoints() map[string]bool {
	m := map[string]bool{}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return m
	}
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) >= 5 {
			m[strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(f[4])] = true
		}
	}
	return m
}

// The rest is the overlay snapshotter's.

func (s *Snapshotter) Stat(ctx context.Context, key string) (snapshots.Info, error) {
	return s.inner.Stat(ctx, key)
}

func (s *Snapshotter) Update(ctx context.Context, info snapshots.Info, fieldpaths ...string) (snapshots.Info, error) {
	return s.inner.Update(ctx, info, fieldpaths...)
}

func (s *Snapshotter) Usage(ctx context.Context, key string) (snapshots.Usage, error) {
	return s.inner.Usage(ctx, key)
}

func (s *Snapshotter) Mounts(ctx context.Context, key string) ([]mount.Mount, error) {
	return s.inner.Mounts(ctx, key)
}

func (s *Snapshotter) View(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	return s.inner.View(ctx, key, parent, opts...)
}

func (s *Snapshotter) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) error {
	return s.inner.Commit(ctx, name, key, opts...)
}

func (s *Snapshotter) Walk(ctx context.Context, fn snapshots.WalkFunc, filters ...string) error {
	return s.inner.Walk(ctx, fn, filters...)
}

// Cleanup removes the directories of removed snapshots (containerd's
// garbage collector calls it).
func (s *Snapshotter) Cleanup(ctx context.Context) error {
	if c, ok := s.inner.(snapshots.Cleaner); ok {
		return c.Cleanup(ctx)
	}
	return nil
}

func (s *Snapshotter) Close() error { return s.inner.Close() }

var (
	_ snapshots.Snapshotter = (*Snapshotter)(nil)
	_ snapshots.Cleaner     = (*Snapshotter)(nil)
)
