// Package layerstore keeps image layers unpacked on the host, once each, so that node
// VMs can use them read-only (through virtio-fs, see internal/layershare) instead of
// pulling and gunzipping every layer inside a slow guest.
//
// # Layout
//
//	<Dir>/sha256/<hex>/fs/          the layer's filesystem, unpacked as root
//	<Dir>/sha256/<hex>/ready.json   what was unpacked (Ready)
//	<Dir>/.tmp-<hex>-*/             a layer being unpacked
//	<Dir>/xattr-probe/              an empty directory with ProbeXattr=ProbeValue
//
// <hex> is the layer blob's digest as the manifest lists it (the compressed digest).
// fs/ keeps owners, modes, mtimes, xattrs, hardlinks, symlinks and device nodes, and
// holds OCI whiteouts in overlayfs form: ".wh.NAME" is a character device 0:0 named NAME,
// ".wh..wh..opq" is the xattr trusted.overlay.opaque=y on its directory. So a guest can
// stack the fs/ directories as overlayfs lower layers directly. Those xattrs reach a guest
// only through a virtiofsd allowed to pass trusted.* on; xattr-probe lets a guest check
// that before it uses any layer (an opaque directory silently lost would show files a
// layer deleted).
//
// A layer is built under .tmp-*, ready.json written last, and renamed into sha256/ when
// complete: a reader sees a whole layer or none. A layer that fails to unpack (a
// corrupt blob, a diffID that does not match the image config) is simply absent, and
// nodes pull it as they would without this store. Several processes (the daemon, a CLI
// `image push`) may prepare into one Dir: the first rename wins, the others drop theirs.
package layerstore

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"golang.org/x/sys/unix"
)

// Names inside a layer directory.
const (
	DirFS     = "fs"
	FileReady = "ready.json"
	tmpPrefix = ".tmp-"
)

// staleTmp is how old a .tmp-* directory must be before Clean removes it: younger ones
// may belong to another process preparing right now.
const staleTmp = time.Hour

var digestRE = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)

// Layer is one layer of an image as the registry holds it.
type Layer struct {
	Digest    string // of the blob, as the manifest lists it
	DiffID    string // of the uncompressed tar, from the image config's rootfs.diff_ids
	MediaType string
	Size      int64 // of the blob
}

// Validate says what is wrong with l, if anything.
func (l Layer) Validate() error {
	var errs []error
	if !digestRE.MatchString(l.Digest) {
		errs = append(errs, fmt.Errorf("layer digest %q: want sha256:<64 lower-case hex digits>", l.Digest))
	}
	if !digestRE.MatchString(l.DiffID) {
		errs = append(errs, fmt.Errorf("layer %s: diffID %q: want sha256:<64 lower-case hex digits> from the image config's rootfs.diff_ids", l.Digest, l.DiffID))
	}
	if !Unpackable(l.MediaType) {
		errs = append(errs, fmt.Errorf("layer %s: media type %q is not a plain tar layer: want application/vnd.oci.image.layer.v1.tar (+gzip, +zstd) or application/vnd.docker.image.rootfs.diff.tar.gzip", l.Digest, l.MediaType))
	}
	return errors.Join(errs...)
}

// Unpackable reports whether a layer of media type mt can be unpacked here: plain,
// gzip or zstd tar layers (not encrypted ones, not artifacts).
func Unpackable(mt string) bool {
	switch mt {
	case "application/vnd.oci.image.layer.v1.tar",
		"application/vnd.oci.image.layer.v1.tar+gzip",
		"application/vnd.oci.image.layer.v1.tar+zstd",
		"application/vnd.docker.image.rootfs.diff.tar",
		"application/vnd.docker.image.rootfs.diff.tar.gzip",
		"application/vnd.docker.image.rootfs.diff.tar.zstd":
		return true
	}
	return false
}

// Ready is ready.json: what a prepared layer holds.
type Ready struct {
	Digest        string    `json:"digest"`
	DiffID        string    `json:"diffID"`
	MediaType     string    `json:"mediaType"`
	Size          int64     `json:"size"`          // compressed bytes (the blob)
	UnpackedBytes int64     `json:"unpackedBytes"` // the regular files' bytes
	Files         int64     `json:"files"`         // tar entries unpacked, whiteouts included
	PreparedAt    time.Time `json:"preparedAt"`
}

// Store is a layer store directory. Its methods are safe for concurrent use, also by
// several processes sharing Dir.
type Store struct {
	dir string
	now func() time.Time
	// Limits cap what one layer may unpack to (the image is a tenant's or an
	// upstream's; a gzip bomb is a few MiB that unpack to the whole disk).
	Limits Limits
}

// Limits of one unpacked layer; a zero field is its default.
type Limits struct {
	Bytes int64 // regular files' bytes; DefaultMaxBytes
	Files int64 // tar entries; DefaultMaxFiles
}

// Defaults of Limits: far above any real image layer (the builder image's largest
// layer is 0.8 GiB and 40k files), far below a disk.
const (
	DefaultMaxBytes = 32 << 30
	DefaultMaxFiles = 2_000_000
)

// ErrTooLarge is wrapped by Prepare's error when a layer unpacks past Limits.
var ErrTooLarge = errors.New("layer unpacks past this host's limit")

func (l Limits) orDefaults() Limits {
	if l.Bytes <= 0 {
		l.Bytes = DefaultMaxBytes
	}
	if l.Files <= 0 {
		l.Files = DefaultMaxFiles
	}
	return l
}

// The xattr probe: a guest reads ProbeXattr of <share>/ProbeDir and uses the share only
// if it reads ProbeValue (see internal/agent/layershare).
const (
	ProbeDir   = "xattr-probe"
	ProbeXattr = "trusted.overlay.opaque"
	ProbeValue = "y"
)

// Open makes (if missing) and returns the store at dir, which must be on a filesystem
// that keeps owners, device nodes and trusted.* xattrs (ext4, xfs, btrfs; not a
// filesystem mounted nodev). It writes the xattr probe, and fails when the filesystem
// (or the caller, without CAP_SYS_ADMIN) cannot keep it.
func Open(dir string) (*Store, error) {
	if dir == "" {
		return nil, errors.New("layer store: no directory configured")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("layer store %s: %w", dir, err)
	}
	if err := os.MkdirAll(filepath.Join(abs, "sha256"), 0o755); err != nil {
		return nil, fmt.Errorf("layer store: %w", err)
	}
	// The store is read by root (virtiofsd); below these two the layers keep their
	// own modes (0755). The two are not listable by others: the state dir above is
	// 0711 when tenants' control planes have uids of their own, and a tenant's must
	// not find the digests of other tenants' private layers.
	for _, d := range []string{abs, filepath.Join(abs, "sha256")} {
		if err := os.Chmod(d, 0o711); err != nil {
			return nil, fmt.Errorf("layer store: %w", err)
		}
	}
	probe := filepath.Join(abs, ProbeDir)
	if err := os.MkdirAll(probe, 0o755); err != nil {
		return nil, fmt.Errorf("layer store: %w", err)
	}
	if err := unix.Setxattr(probe, ProbeXattr, []byte(ProbeValue), 0); err != nil {
		return nil, fmt.Errorf("layer store %s: setting %s on %s: %w: the store needs a filesystem that keeps trusted.* xattrs (ext4, xfs, btrfs) and root; put the state dir on one, or run serve with --shared-layers=false", abs, ProbeXattr, probe, err)
	}
	return &Store{dir: abs, now: time.Now}, nil
}

// Dir is the store's absolute directory (what nodes are given).
func (s *Store) Dir() string { return s.dir }

// Path is the directory of layer digest (which may not exist).
func (s *Store) Path(digest string) string {
	return filepath.Join(s.dir, "sha256", strings.TrimPrefix(digest, "sha256:"))
}

// Get returns the ready.json of layer digest; an error satisfying
// errors.Is(err, fs.ErrNotExist) when it is not prepared.
func (s *Store) Get(digest string) (Ready, error) {
	var r Ready
	b, err := os.ReadFile(filepath.Join(s.Path(digest), FileReady))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("layer %s: %s: %w", digest, FileReady, err)
	}
	return r, nil
}

// Has reports whether layer digest is prepared.
func (s *Store) Has(digest string) bool {
	_, err := os.Stat(filepath.Join(s.Path(digest), FileReady))
	return err == nil
}

// List returns every prepared layer.
func (s *Store) List() ([]Ready, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, "sha256"))
	if err != nil {
		return nil, fmt.Errorf("listing the layer store: %w", err)
	}
	var out []Ready
	for _, e := range ents {
		if r, err := s.Get("sha256:" + e.Name()); err == nil {
			out = append(out, r)
		}
	}
	return out, nil
}

// Clean removes .tmp-* directories older than an hour: what a process that died while
// unpacking left behind.
func (s *Store) Clean() ([]string, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("cleaning the layer store: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), tmpPrefix) {
			continue
		}
		info, err := e.Info()
		if err != nil || s.now().Sub(info.ModTime()) < staleTmp {
			continue
		}
		p := filepath.Join(s.dir, e.Name())
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", p, err))
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
}

// ErrMismatch is wrapped by Prepare's error when the blob is not what the layer says:
// its digest or its uncompressed tar's diffID differ.
var ErrMismatch = errors.New("content does not match")

// Prepare unpacks blob, layer l's content, into the store and returns its ready.json.
// A layer already present is left alone (same digest, same content). On error nothing
// is left behind.
func (s *Store) Prepare(ctx context.Context, l Layer, blob io.Reader) (Ready, error) {
	if err := l.Validate(); err != nil {
		return Ready{}, err
	}
	if r, err := s.Get(l.Digest); err == nil {
		return r, nil
	}
	hexd := strings.TrimPrefix(l.Digest, "sha256:")
	tmp, err := os.MkdirTemp(s.dir, tmpPrefix+hexd[:12]+"-*")
	if err != nil {
		return Ready{}, fmt.Errorf("layer %s: %w", l.Digest, err)
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Ready{}, fmt.Errorf("layer %s: %w", l.Digest, err)
	}
	root := filepath.Join(tmp, DirFS)
	if err := os.Mkdir(root, 0o755); err != nil {
		return Ready{}, fmt.Errorf("layer %s: %w", l.Digest, err)
	}
	r, err := unpack(ctx, l, blob, root, s.Limits.orDefaults())
	if err != nil {
		return Ready{}, fmt.Errorf("layer %s: %w", l.Digest, err)
	}
	r.PreparedAt = s.now().UTC().Truncate(time.Second)
	b, _ := json.MarshalIndent(r, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, FileReady), append(b, '\n'), 0o644); err != nil {
		return Ready{}, fmt.Errorf("layer %s: writing %s: %w", l.Digest, FileReady, err)
	}
	// One syncfs for the whole tree, so that a host crash after the rename cannot leave
	// a ready.json over files that never reached the disk.
	if err := syncFS(tmp); err != nil {
		return Ready{}, fmt.Errorf("layer %s: syncing: %w", l.Digest, err)
	}
	if err := os.Rename(tmp, s.Path(l.Digest)); err != nil {
		if errors.Is(err, fs.ErrExist) || errors.Is(err, unix.ENOTEMPTY) {
			// Another process prepared it meanwhile: theirs is as good as ours.
			if got, gerr := s.Get(l.Digest); gerr == nil {
				return got, nil
			}
		}
		return Ready{}, fmt.Errorf("layer %s: moving it into place: %w", l.Digest, err)
	}
	done = true
	_ = syncDir(filepath.Join(s.dir, "sha256"))
	return r, nil
}

// unpack applies blob's tar to root, checking the blob's digest and the tar's diffID.
func unpack(ctx context.Context, l Layer, blob io.Reader, root string, lim Limits) (Ready, error) {
	blobHash := sha256.New()
	blobCount := &countingWriter{}
	teed := io.TeeReader(blob, io.MultiWriter(blobHash, blobCount))
	dec, err := compression.DecompressStream(teed)
	if err != nil {
		return Ready{}, fmt.Errorf("reading the blob: %w", err)
	}
	defer dec.Close()
	tarHash := sha256.New()
	tarStream := io.TeeReader(dec, tarHash)

	r := Ready{Digest: l.Digest, DiffID: l.DiffID, MediaType: l.MediaType}
	filter := func(h *tar.Header) (bool, error) {
		// trusted.overlay.* is overlayfs's own metadata (opaque dirs, redirects,
		// metacopy): only the whiteout conversion below may write it, never the image.
		for k := range h.PAXRecords {
			if strings.HasPrefix(k, "SCHILY.xattr.trusted.overlay.") {
				delete(h.PAXRecords, k)
			}
		}
		r.Files++
		if h.Typeflag == tar.TypeReg || h.Typeflag == tar.TypeRegA { //nolint:staticcheck // old tars still carry TypeRegA
			r.UnpackedBytes += h.Size
		}
		// Checked from the header, before the entry's bytes are written.
		if r.UnpackedBytes > lim.Bytes {
			return false, fmt.Errorf("%w: more than %d bytes of files (at %s)", ErrTooLarge, lim.Bytes, h.Name)
		}
		if r.Files > lim.Files {
			return false, fmt.Errorf("%w: more than %d files", ErrTooLarge, lim.Files)
		}
		return true, nil
	}
	if _, err := archive.Apply(ctx, root, tarStream,
		archive.WithFilter(filter),
		archive.WithConvertWhiteout(archive.OverlayConvertWhiteout)); err != nil {
		return Ready{}, fmt.Errorf("unpacking: %w", err)
	}
	// The tar's end-of-archive blocks and padding count towards the diffID, and the
	// compressed tail towards the digest: read both to the end.
	if _, err := io.Copy(io.Discard, tarStream); err != nil {
		return Ready{}, fmt.Errorf("reading the blob's end: %w", err)
	}
	if _, err := io.Copy(io.Discard, teed); err != nil {
		return Ready{}, fmt.Errorf("reading the blob's end: %w", err)
	}
	if got := "sha256:" + hex.EncodeToString(tarHash.Sum(nil)); got != l.DiffID {
		return Ready{}, fmt.Errorf("the uncompressed tar has diffID %s, the image config says %s: %w", got, l.DiffID, ErrMismatch)
	}
	if got := "sha256:" + hex.EncodeToString(blobHash.Sum(nil)); got != l.Digest {
		return Ready{}, fmt.Errorf("the blob has digest %s: %w", got, ErrMismatch)
	}
	r.Size = blobCount.n
	return r, nil
}

type countingWriter struct{ n int64 }

func (c *countingWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
