// Package layershare is the node's side of the host's layer share: the host
// unpacks each image layer once into a read-only virtio-fs export
// (<root>/sha256/<hex>/fs, with ready.json beside it), and the containerd
// snapshotter here turns a ready layer into a committed snapshot whose
// filesystem is that directory, so containerd's unpacker neither fetches nor
// unpacks it. Everything else is containerd's own overlayfs snapshotter, so a
// layer the share does not have is pulled exactly as without the share.
//
// The snapshotter runs in the agent and is served to containerd as a proxy
// plugin (Serve). CRI passes the layer's compressed digest to the snapshotter
// as the label LabelLayerDigest when its snapshot annotations are on; the
// unpacker names the snapshot it wants committed in snapshots.LabelSnapshotRef.
// When Prepare returns ErrAlreadyExists for such a target, containerd's
// unpacker (core/unpack) skips fetching and applying that layer: the same
// contract stargz-snapshotter's lazy pulls use.
package layershare

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"

	"github.com/containerd/containerd/v2/core/snapshots"
	"golang.org/x/sys/unix"
)

// Labels CRI and the unpacker put on an extraction Prepare.
const (
	// LabelLayerDigest is the layer blob's digest as the manifest lists it.
	LabelLayerDigest = "containerd.io/snapshot/cri.layer-digest"
	// LabelImageRef is the image being pulled.
	LabelImageRef = "containerd.io/snapshot/cri.image-ref"
	// LabelImageLayers lists this layer and the ones above it (comma separated,
	// cut to fit a label).
	LabelImageLayers = "containerd.io/snapshot/cri.image-layers"
)

// Labels this package puts on the committed snapshots it makes from the share.
const (
	// LabelShared is the share layer's digest.
	LabelShared = "socialweb.computer/shared-layer"
	// LabelSharedDir is the snapshot's fs directory the share is bound onto.
	LabelSharedDir = "socialweb.computer/shared-layer-dir"
)

// Ready is <root>/sha256/<hex>/ready.json, which the host writes once a
// layer's fs/ is complete. Fields the node does not use are not decoded, so
// their format may change without breaking nodes.
type Ready struct {
	Digest        string `json:"digest"`
	DiffID        string `json:"diffID"`
	MediaType     string `json:"mediaType"`
	Size          int64  `json:"size"`
	UnpackedBytes int64  `json:"unpackedBytes"`
	Files         int64  `json:"files"`
}

// Layer is one ready layer of the share.
type Layer struct {
	Ready
	// FS is the layer's filesystem: whiteouts and opaque directories in
	// overlayfs form, usable as an overlay lower.
	FS string
}

// The host's xattr probe (layerstore.ProbeDir and its xattr): an empty directory whose
// trusted.overlay.opaque is "y".
const (
	probeDir   = "xattr-probe"
	probeXattr = "trusted.overlay.opaque"
	probeValue = "y"
)

// CheckXattrs reports whether the share at root carries trusted.overlay.* xattrs, by
// reading the host's probe. Without them every opaque directory of every layer would
// silently be lost (a virtiofsd not allowed to pass trusted.* on drops them), so a node
// must not use a share that fails this: it pulls instead.
func CheckXattrs(root string) error {
	p := filepath.Join(root, probeDir)
	buf := make([]byte, 16)
	n, err := unix.Getxattr(p, probeXattr, buf)
	switch {
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("the share has no %s (a host older than its nodes?)", probeDir)
	case err != nil:
		return fmt.Errorf("reading %s of %s: %w (does the host's virtiofsd pass trusted.* xattrs on?)", probeXattr, p, err)
	case string(buf[:n]) != probeValue:
		return fmt.Errorf("%s of %s is %q, want %q", probeXattr, p, buf[:n], probeValue)
	}
	return nil
}

// Share is the mounted layer share; Root "" means the node has none.
type Share struct {
	Root string
}

var sha256Digest = regexp.MustCompile(`^sha256:([0-9a-f]{64})$`)

// errNotInShare is a layer the host has not prepared (yet).
var errNotInShare = errors.New("not in the layer share")

// Lookup returns the ready layer of digest, or an error saying why there is
// none: not a sha256 digest, not (yet) in the share, a ready.json that does
// not parse or names another digest, no fs directory.
func (s Share) Lookup(digest string) (Layer, error) {
	m := sha256Digest.FindStringSubmatch(digest)
	if m == nil {
		return Layer{}, fmt.Errorf("layer digest %q is not sha256:<64 hex>", digest)
	}
	dir := filepath.Join(s.Root, "sha256", m[1])
	data, err := os.ReadFile(filepath.Join(dir, "ready.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return Layer{}, errNotInShare
	}
	if err != nil {
		return Layer{}, fmt.Errorf("reading ready.json: %w", err)
	}
	var r Ready
	if err := json.Unmarshal(data, &r); err != nil {
		return Layer{}, fmt.Errorf("%s/ready.json: %w", dir, err)
	}
	if r.Digest != digest {
		return Layer{}, fmt.Errorf("%s/ready.json names digest %q, want %q", dir, r.Digest, digest)
	}
	l := Layer{Ready: r, FS: filepath.Join(dir, "fs")}
	st, err := os.Stat(l.FS)
	if err != nil {
		return Layer{}, fmt.Errorf("layer filesystem: %w", err)
	}
	if !st.IsDir() {
		return Layer{}, fmt.Errorf("layer filesystem %s is not a directory", l.FS)
	}
	return l, nil
}

// Decision is what the snapshotter does with one Prepare.
type Decision struct {
	// Target is the committed snapshot the unpacker wants (its chain ID); ""
	// when the Prepare is not a layer extraction (a container's rootfs).
	Target string
	// Digest is the layer's compressed digest, when CRI passed it.
	Digest string
	// Shared is true when Layer is the target's filesystem.
	Shared bool
	Layer  Layer
	// Reason says why not, when a layer extraction is not shared.
	Reason string
}

// Decide chooses between the share and a normal pull for a Prepare with
// these labels.
func (s Share) Decide(labels map[string]string) Decision {
	d := Decision{Target: labels[snapshots.LabelSnapshotRef], Digest: labels[LabelLayerDigest]}
	switch {
	case d.Target == "":
		d.Reason = "not a layer extraction"
	case s.Root == "":
		d.Reason = "no layer share"
	case d.Digest == "":
		d.Reason = "no layer digest label (CRI snapshot annotations off, or not a CRI pull)"
	default:
		l, err := s.Lookup(d.Digest)
		if err != nil {
			d.Reason = err.Error()
			break
		}
		// The unpacker names the uncompressed digest it expects; a layer the host
		// unpacked to something else must not stand in for it.
		if want := labels[snapshots.LabelSnapshotDiffID]; want != "" && l.DiffID != want {
			d.Reason = fmt.Sprintf("ready.json diffID %q, the image wants %q", l.DiffID, want)
			break
		}
		d.Shared, d.Layer = true, l
	}
	return d
}
