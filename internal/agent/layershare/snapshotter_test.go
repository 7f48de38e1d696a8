package layershare

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// tarEntry is one file of a test layer: a directory when body is "/", else
// a regular file.
type tarEntry struct{ name, body string }

func layerTar(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), Typeflag: tar.TypeReg, ModTime: time.Unix(1, 0)}
		if e.body == "/" {
			h = &tar.Header{Name: e.name + "/", Mode: 0o755, Typeflag: tar.TypeDir, ModTime: time.Unix(1, 0)}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestLayers are the layers of the share tests: the second deletes a file
// of the first (whiteout) and replaces a directory (opaque).
func testLayers(t *testing.T) [][]byte {
	return [][]byte{
		layerTar(t, tarEntry{"a", "/"}, tarEntry{"a/keep", "keep"}, tarEntry{"a/gone", "gone"},
			tarEntry{"d", "/"}, tarEntry{"d/old", "old"}),
		layerTar(t, tarEntry{"a", "/"}, tarEntry{"a/.wh.gone", ""},
			tarEntry{"d", "/"}, tarEntry{"d/.wh..wh..opq", ""}, tarEntry{"d/new", "new"}),
		layerTar(t, tarEntry{"top", "top"}),
	}
}

// PrepareShare unpacks layer tars into a share at root the way the host
// does (OCI whiteouts in overlayfs form) and returns the layers' digests
// (of the tar, standing in for the compressed blob) and diffIDs. The
// ready.json of layer i is written only where ready[i].
func prepareShare(t *testing.T, root string, layers [][]byte, ready []bool) (digests, diffIDs []string) {
	t.Helper()
	for i, l := range layers {
		sum := sha256.Sum256(l)
		d := "sha256:" + hex.EncodeToString(sum[:])
		digests, diffIDs = append(digests, d), append(diffIDs, d)
		if !ready[i] {
			continue
		}
		dir := filepath.Join(root, "sha256", hex.EncodeToString(sum[:]))
		if err := os.MkdirAll(filepath.Join(dir, "fs"), 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := archive.Apply(context.Background(), filepath.Join(dir, "fs"), bytes.NewReader(l),
			archive.WithConvertWhiteout(archive.OverlayConvertWhiteout)); err != nil {
			t.Fatalf("unpacking layer %d: %v", i, err)
		}
		writeLayer(t, root, d, readyJSON(t, d, d), false)
	}
	return digests, diffIDs
}

func chainIDs(diffIDs []string) []string {
	out := []string{diffIDs[0]}
	for _, d := range diffIDs[1:] {
		sum := sha256.Sum256([]byte(out[len(out)-1] + " " + d))
		out = append(out, "sha256:"+hex.EncodeToString(sum[:]))
	}
	return out
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		livetest.Skip(t, "needs root (bind and overlay mounts)")
	}
	if _, err := os.Stat("/sys/module/overlay"); err != nil {
		livetest.Skip(t, "no overlayfs in this kernel")
	}
}

// TestSnapshotterTakesLayersFromShare runs the snapshotter behind its gRPC
// server and containerd's own proxy client and metadata store, and makes the
// calls containerd's unpacker makes for an image of three layers, two of
// which the share has: those two are committed from the share (Prepare says
// AlreadyExists and the metadata store finds the target, which is what makes
// the unpacker skip the fetch), the third is prepared as usual. A container
// on top sees the whiteout and the opaque directory applied, writes land in
// its upper directory, and removing everything unbinds the share and leaves
// it as it was.
func TestSnapshotterTakesLayersFromShare(t *testing.T) {
	needRoot(t)
	ctx := namespaces.WithNamespace(context.Background(), "k8s.io")
	dir := t.TempDir()
	share := filepath.Join(dir, "share")
	layers := testLayers(t)
	digests, diffIDs := prepareShare(t, share, layers, []bool{true, true, false})
	chains := chainIDs(diffIDs)
	shareBefore := treeListing(t, share)
	// The agent mounts the share read-only; so does this test.
	if err := os.MkdirAll(share, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(share, share, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(share, unix.MNT_DETACH) })
	if err := unix.Mount("", share, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}

	root := filepath.Join(dir, "io.containerd.snapshotter.v1.socialweb")
	sn, err := New(ctx, root, Options{Share: Share{share}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cleanupMounts(root) })
	sock := filepath.Join(dir, "snap.sock")
	srv, err := Serve(sn, sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop(time.Second); sn.Close() })
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "socialweb")

	// containerd's metadata store over the proxy, as in containerd
	bdb, err := bolt.Open(filepath.Join(dir, "meta.db"), 0o644, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	cs, err := local.NewStore(filepath.Join(dir, "content"))
	if err != nil {
		t.Fatal(err)
	}
	mdb := metadata.NewDB(bdb, cs, map[string]snapshots.Snapshotter{"socialweb": client})
	if err := mdb.Init(ctx); err != nil {
		t.Fatal(err)
	}
	msn := mdb.Snapshotter("socialweb")

	// the unpacker's calls (core/unpack: topHalf)
	for i := range layers {
		labels := map[string]string{
			snapshots.LabelSnapshotRef:    chains[i],
			snapshots.LabelSnapshotDiffID: diffIDs[i],
			LabelLayerDigest:              digests[i],
			LabelImageRef:                 "docker.io/library/test:1",
			LabelImageLayers:              strings.Join(digests[i:], ","),
		}
		parent := ""
		if i > 0 {
			parent = chains[i-1]
		}
		key := fmt.Sprintf("extract-%d %s", i, chains[i])
		mounts, err := msn.Prepare(ctx, key, parent, snapshots.WithLabels(labels))
		if i < 2 {
			if !errdefs.IsAlreadyExists(err) {
				t.Fatalf("layer %d (in the share): Prepare = %v, %v; want AlreadyExists", i, mounts, err)
			}
			info, err := msn.Stat(ctx, chains[i])
			if err != nil {
				t.Fatalf("layer %d: the unpacker's Stat of the target: %v", i, err)
			}
			if info.Kind != snapshots.KindCommitted || info.Parent != parent {
				t.Errorf("layer %d: target %+v, want committed with parent %q", i, info, parent)
			}
			continue
		}
		if err != nil {
			t.Fatalf("layer %d (not in the share): Prepare: %v", i, err)
		}
		// the unpacker applies the layer into the mounts and commits it
		applyLayer(t, mounts, layers[i])
		if err := msn.Commit(ctx, chains[i], key); err != nil {
			t.Fatalf("layer %d: Commit: %v", i, err)
		}
	}
	if st := sn.Stats(); st.FromShare != 2 || st.Pulled != 1 {
		t.Errorf("stats = %+v, want 2 from the share, 1 pulled", st)
	}
	// The same chain again (another image with these layers): containerd finds
	// the targets itself.
	if _, err := msn.Prepare(ctx, "extract-again", "", snapshots.WithLabels(map[string]string{
		snapshots.LabelSnapshotRef: chains[0], LabelLayerDigest: digests[0]})); !errdefs.IsAlreadyExists(err) {
		t.Errorf("second pull of layer 0: %v, want AlreadyExists", err)
	}
	// Another namespace reaches the share's snapshot through the backend.
	ctx2 := namespaces.WithNamespace(ctx, "default")
	if _, err := msn.Prepare(ctx2, "extract-ns2", "", snapshots.WithLabels(map[string]string{
		snapshots.LabelSnapshotRef: chains[0], LabelLayerDigest: digests[0]})); !errdefs.IsAlreadyExists(err) {
		t.Errorf("layer 0 in another namespace: %v, want AlreadyExists", err)
	}
	if _, err := msn.Stat(ctx2, chains[0]); err != nil {
		t.Errorf("layer 0 in another namespace: %v", err)
	}

	// a container on the image
	mounts, err := msn.Prepare(ctx, "container-1", chains[2])
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dir, "rootfs")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := mount.All(mounts, target); err != nil {
		t.Fatalf("mounting the container's rootfs %+v: %v", mounts, err)
	}
	got := treeListing(t, target)
	want := []string{"a/", "a/keep=keep", "d/", "d/new=new", "top=top"}
	if !slices.Equal(got, want) {
		t.Errorf("container rootfs = %v, want %v (a/gone whited out, d/old hidden by the opaque d)", got, want)
	}
	if err := os.WriteFile(filepath.Join(target, "a", "written"), []byte("pod"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(target, "a", "keep")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "d", "new"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := mount.UnmountAll(target, 0); err != nil {
		t.Fatal(err)
	}
	upper := ""
	for _, o := range mounts[0].Options {
		if v, ok := strings.CutPrefix(o, "upperdir="); ok {
			upper = v
		}
	}
	if !strings.HasPrefix(upper, root) {
		t.Errorf("container upper dir %q is not in the snapshotter's root %s", upper, root)
	}
	if b, err := os.ReadFile(filepath.Join(upper, "a", "written")); err != nil || string(b) != "pod" {
		t.Errorf("the container's write is not in its upper dir: %q, %v", b, err)
	}
	if after := treeListing(t, share); !slices.Equal(after, shareBefore) {
		t.Errorf("the share changed:\nbefore %v\nafter  %v", shareBefore, after)
	}

	// removal, leaves first (as containerd's garbage collector does)
	for _, key := range []string{"container-1", chains[2], chains[1]} {
		if err := msn.Remove(ctx, key); err != nil {
			t.Fatalf("Remove %s: %v", key, err)
		}
	}
	for _, c := range []context.Context{ctx, ctx2} {
		if err := msn.Remove(c, chains[0]); err != nil {
			t.Fatalf("Remove %s: %v", chains[0], err)
		}
	}
	if _, err := mdb.GarbageCollect(ctx); err != nil {
		t.Fatal(err)
	}
	var left []string
	if err := sn.Walk(ctx, func(_ context.Context, i snapshots.Info) error { left = append(left, i.Name); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("snapshots left after removing all: %v", left)
	}
	for m := range mountPoints() {
		if strings.HasPrefix(m, root) {
			t.Errorf("still mounted: %s", m)
		}
	}
	if after := treeListing(t, share); !slices.Equal(after, shareBefore) {
		t.Errorf("the share changed on removal:\nbefore %v\nafter  %v", shareBefore, after)
	}
}

// TestSnapshotterFallsBackToAPull: with a share whose ready.json does not
// match, or without a share, an extraction is an ordinary overlay Prepare.
func TestSnapshotterFallsBackToAPull(t *testing.T) {
	needRoot(t)
	ctx := namespaces.WithNamespace(context.Background(), "k8s.io")
	dir := t.TempDir()
	share := filepath.Join(dir, "share")
	layers := testLayers(t)[:1]
	digests, diffIDs := prepareShare(t, share, layers, []bool{true})
	other := "sha256:" + strings.Repeat("0", 64)
	tests := []struct {
		name   string
		share  Share
		digest string
		diffID string
	}{
		{"no share", Share{}, digests[0], diffIDs[0]},
		{"digest not in the share", Share{share}, other, diffIDs[0]},
		{"diffID mismatch", Share{share}, digests[0], other},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := filepath.Join(dir, fmt.Sprintf("root%d", i))
			sn, err := New(ctx, root, Options{Share: tt.share})
			if err != nil {
				t.Fatal(err)
			}
			defer sn.Close()
			mounts, err := sn.Prepare(ctx, "extract", "", snapshots.WithLabels(map[string]string{
				snapshots.LabelSnapshotRef: "chain", LabelLayerDigest: tt.digest, snapshots.LabelSnapshotDiffID: tt.diffID}))
			if err != nil {
				t.Fatalf("Prepare: %v, want an ordinary active snapshot", err)
			}
			if len(mounts) != 1 || mounts[0].Type != "bind" || !strings.HasPrefix(mounts[0].Source, root) {
				t.Errorf("mounts %+v", mounts)
			}
			if st := sn.Stats(); st.Pulled != 1 || st.FromShare != 0 {
				t.Errorf("stats %+v", st)
			}
			for m := range mountPoints() {
				if strings.HasPrefix(m, root) {
					t.Errorf("mounted: %s", m)
				}
			}
		})
	}
}

// applyLayer does what containerd's applier does with an overlay mount.
func applyLayer(t *testing.T, mounts []mount.Mount, layer []byte) {
	t.Helper()
	tmp := t.TempDir()
	if err := mount.All(mounts, tmp); err != nil {
		t.Fatalf("mounting %+v: %v", mounts, err)
	}
	defer mount.UnmountAll(tmp, 0)
	if _, err := archive.Apply(context.Background(), tmp, bytes.NewReader(layer)); err != nil {
		t.Fatal(err)
	}
}

// treeListing lists a tree as "dir/" and "file=content", sorted.
func treeListing(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case fi.IsDir():
			out = append(out, rel+"/")
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out = append(out, rel+"="+string(b))
		default:
			out = append(out, rel+" "+fi.Mode().String())
		}
		return nil
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// cleanupMounts detaches whatever a failed test left mounted under root.
func cleanupMounts(root string) {
	for m := range mountPoints() {
		if strings.HasPrefix(m, root+"/") {
			unix.Unmount(m, unix.MNT_DETACH)
		}
	}
}
