package layerstore

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// needRoot skips (or, with SOCIALWEB_REQUIRE_LIVE=1, fails) a test that chowns, makes
// device nodes or sets trusted.* xattrs.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		livetest.Skip(t, "unpacking a layer as it is (owners, device nodes, trusted.* xattrs) needs root")
	}
}

// entry is one tar member of a test layer.
type entry struct {
	name, link string
	typ        byte
	body       string
	mode       int64
	uid, gid   int
	major      int64
	xattrs     map[string]string
}

var mtime = time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)

func makeTar(t *testing.T, es []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			ModTime: mtime, Devmajor: e.major, Format: tar.FormatPAX}
		if h.Mode == 0 {
			h.Mode = 0o644
			if e.typ == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			io.WriteString(tw, e.body)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func compress(t *testing.T, kind string, raw []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	switch kind {
	case "gzip":
		zw := gzip.NewWriter(&buf)
		zw.Write(raw)
		zw.Close()
	case "zstd":
		zw, err := zstd.NewWriter(&buf)
		if err != nil {
			t.Fatal(err)
		}
		zw.Write(raw)
		zw.Close()
	default:
		return raw
	}
	return buf.Bytes()
}

func mediaType(kind string) string {
	switch kind {
	case "gzip":
		return "application/vnd.oci.image.layer.v1.tar+gzip"
	case "zstd":
		return "application/vnd.oci.image.layer.v1.tar+zstd"
	}
	return "application/vnd.oci.image.layer.v1.tar"
}

// layerOf is a layer whose digest and diffID match blob and raw.
func layerOf(kind string, raw, blob []byte) Layer {
	return Layer{Digest: sum(blob), DiffID: sum(raw), MediaType: mediaType(kind), Size: int64(len(blob))}
}

func lstat(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatalf("lstat %s: %v", p, err)
	}
	return &st
}

func xattr(p, name string) string {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

// noLeftovers fails unless the store holds no layer directory and no temp directory.
func noLeftovers(t *testing.T, s *Store) {
	t.Helper()
	for _, d := range []string{s.Dir(), filepath.Join(s.Dir(), "sha256")} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if e.Name() != "sha256" && (d != s.Dir() || e.Name() != ProbeDir) {
				t.Errorf("left behind: %s", filepath.Join(d, e.Name()))
			}
		}
	}
}

func TestPrepare(t *testing.T) {
	needRoot(t)
	layer := []entry{
		{name: "etc/", typ: tar.TypeDir},
		{name: "etc/passwd", typ: tar.TypeReg, body: "root:x:0:0\n", mode: 0o640, uid: 0, gid: 42},
		{name: "etc/app.conf", typ: tar.TypeReg, body: "a=1", uid: 1000, gid: 1000, xattrs: map[string]string{"user.note": "hi"}},
		{name: "etc/hard", typ: tar.TypeLink, link: "etc/passwd", mode: 0o640, gid: 42}, // a hardlink's header carries its file's metadata
		{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"},
		{name: "abs", typ: tar.TypeSymlink, link: "/etc/passwd"},
		{name: "dev/", typ: tar.TypeDir},
		{name: "dev/null", typ: tar.TypeChar, major: 1, mode: 0o666},
		{name: "sbin/suid", typ: tar.TypeReg, body: "x", mode: 0o4755},
		{name: "var/.wh.cache", typ: tar.TypeReg},
		{name: "opt/", typ: tar.TypeDir},
		{name: "opt/.wh..wh..opq", typ: tar.TypeReg},
		{name: "opt/new", typ: tar.TypeReg, body: "n"},
		{name: "sneaky", typ: tar.TypeReg, body: "s", xattrs: map[string]string{"trusted.overlay.redirect": "/etc"}},
	}
	for _, kind := range []string{"gzip", "zstd", "none"} {
		t.Run(kind, func(t *testing.T) {
			s, err := Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			raw := makeTar(t, layer)
			blob := compress(t, kind, raw)
			l := layerOf(kind, raw, blob)
			r, err := s.Prepare(context.Background(), l, bytes.NewReader(blob))
			if err != nil {
				t.Fatal(err)
			}
			root := filepath.Join(s.Path(l.Digest), DirFS)
			checks := []struct {
				what string
				ok   func() bool
			}{
				{"regular file content, mode and owner", func() bool {
					b, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
					st := lstat(t, filepath.Join(root, "etc/passwd"))
					return string(b) == "root:x:0:0\n" && st.Mode&0o7777 == 0o640 && st.Uid == 0 && st.Gid == 42
				}},
				{"owner 1000 and user xattr", func() bool {
					st := lstat(t, filepath.Join(root, "etc/app.conf"))
					return st.Uid == 1000 && st.Gid == 1000 && xattr(filepath.Join(root, "etc/app.conf"), "user.note") == "hi"
				}},
				{"mtime kept", func() bool {
					st := lstat(t, filepath.Join(root, "etc/app.conf"))
					return time.Unix(st.Mtim.Unix()).Equal(mtime)
				}},
				{"hardlink is the same inode", func() bool {
					return lstat(t, filepath.Join(root, "etc/hard")).Ino == lstat(t, filepath.Join(root, "etc/passwd")).Ino
				}},
				{"relative and absolute symlinks kept as written", func() bool {
					a, _ := os.Readlink(filepath.Join(root, "bin"))
					b, _ := os.Readlink(filepath.Join(root, "abs"))
					return a == "usr/bin" && b == "/etc/passwd"
				}},
				{"device node kept", func() bool {
					st := lstat(t, filepath.Join(root, "dev/null"))
					return st.Mode&unix.S_IFMT == unix.S_IFCHR && unix.Major(st.Rdev) == 1
				}},
				{"setuid bit kept", func() bool { return lstat(t, filepath.Join(root, "sbin/suid")).Mode&0o7777 == 0o4755 }},
				{"whiteout is a 0:0 char device named after the file", func() bool {
					st := lstat(t, filepath.Join(root, "var/cache"))
					_, err := os.Lstat(filepath.Join(root, "var/.wh.cache"))
					return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 && errors.Is(err, os.ErrNotExist)
				}},
				{"opaque dir has trusted.overlay.opaque=y and no marker file", func() bool {
					_, err := os.Lstat(filepath.Join(root, "opt/.wh..wh..opq"))
					return xattr(filepath.Join(root, "opt"), "trusted.overlay.opaque") == "y" && errors.Is(err, os.ErrNotExist)
				}},
				{"file in the opaque dir kept", func() bool {
					b, _ := os.ReadFile(filepath.Join(root, "opt/new"))
					return string(b) == "n"
				}},
				{"an image's own trusted.overlay.* xattr is dropped", func() bool {
					return xattr(filepath.Join(root, "sneaky"), "trusted.overlay.redirect") == ""
				}},
				{"ready.json says what was unpacked", func() bool {
					got, err := s.Get(l.Digest)
					return err == nil && got.Digest == l.Digest && got.DiffID == l.DiffID && got.Size == int64(len(blob)) &&
						got.MediaType == l.MediaType && got.Files == int64(len(layer)) && got.UnpackedBytes == 17 &&
						!got.PreparedAt.IsZero() && got == r
				}},
			}
			for _, c := range checks {
				if !c.ok() {
					t.Errorf("%s: not so", c.what)
				}
			}
			ents, _ := os.ReadDir(s.Dir())
			if len(ents) != 2 {
				t.Errorf("store root holds %d entries, want only sha256/ and %s/ (a temp dir left?)", len(ents), ProbeDir)
			}
		})
	}
}

func TestPrepareRefuses(t *testing.T) {
	needRoot(t)
	good := makeTar(t, []entry{{name: "a", typ: tar.TypeReg, body: "a"}})
	tests := []struct {
		name    string
		layer   func(raw, blob []byte) Layer
		entries []entry
		wantErr string
	}{
		{"diffID mismatch", func(raw, blob []byte) Layer {
			l := layerOf("gzip", raw, blob)
			l.DiffID = sum(good)
			return l
		}, []entry{{name: "b", typ: tar.TypeReg, body: "b"}}, "diffID"},
		{"blob digest mismatch", func(raw, blob []byte) Layer {
			l := layerOf("gzip", raw, blob)
			l.Digest = sum([]byte("other"))
			return l
		}, []entry{{name: "b", typ: tar.TypeReg, body: "b"}}, "digest"},
		{"encrypted media type", func(raw, blob []byte) Layer {
			l := layerOf("gzip", raw, blob)
			l.MediaType = "application/vnd.oci.image.layer.v1.tar+gzip+encrypted"
			return l
		}, []entry{{name: "b", typ: tar.TypeReg, body: "b"}}, "media type"},
		{"no diffID", func(raw, blob []byte) Layer {
			l := layerOf("gzip", raw, blob)
			l.DiffID = ""
			return l
		}, []entry{{name: "b", typ: tar.TypeReg, body: "b"}}, "rootfs.diff_ids"},
		{"hardlink to a directory", func(raw, blob []byte) Layer { return layerOf("gzip", raw, blob) },
			[]entry{{name: "d/", typ: tar.TypeDir}, {name: "h", typ: tar.TypeLink, link: "d"}}, "link"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			raw := makeTar(t, tt.entries)
			blob := compress(t, "gzip", raw)
			l := tt.layer(raw, blob)
			_, err = s.Prepare(context.Background(), l, bytes.NewReader(blob))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Prepare: %v, want an error about %q", err, tt.wantErr)
			}
			if s.Has(l.Digest) {
				t.Error("the layer is present after a failed Prepare")
			}
			noLeftovers(t, s)
		})
	}
}

// TestPrepareConfined: no member of a layer, however named or linked, writes outside fs/.
func TestPrepareConfined(t *testing.T) {
	needRoot(t)
	tests := []struct {
		name    string
		entries func(outside string) []entry
	}{
		{"write through a symlink to an absolute dir", func(outside string) []entry {
			return []entry{{name: "evil", typ: tar.TypeSymlink, link: outside}, {name: "evil/pwned", typ: tar.TypeReg, body: "x"}}
		}},
		{"write through a symlink climbing out", func(outside string) []entry {
			return []entry{{name: "evil", typ: tar.TypeSymlink, link: "../../../../../../../../" + outside}, {name: "evil/pwned", typ: tar.TypeReg, body: "x"}}
		}},
		{"dot-dot in the member name", func(outside string) []entry {
			return []entry{{name: "../../../../../../../../" + outside + "/pwned", typ: tar.TypeReg, body: "x"}}
		}},
		{"hardlink to a file outside", func(outside string) []entry {
			return []entry{{name: "pwned", typ: tar.TypeLink, link: "../../../../../../../../" + outside + "/secret"}}
		}},
		{"whiteout through a symlink", func(outside string) []entry {
			return []entry{{name: "evil", typ: tar.TypeSymlink, link: outside}, {name: "evil/.wh.secret", typ: tar.TypeReg}}
		}},
		{"opaque marker through a symlink", func(outside string) []entry {
			return []entry{{name: "evil", typ: tar.TypeSymlink, link: outside}, {name: "evil/.wh..wh..opq", typ: tar.TypeReg}}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			outside := t.TempDir()
			secret := filepath.Join(outside, "secret")
			if err := os.WriteFile(secret, []byte("keep"), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			raw := makeTar(t, tt.entries(outside))
			blob := compress(t, "gzip", raw)
			l := layerOf("gzip", raw, blob)
			_, err = s.Prepare(context.Background(), l, bytes.NewReader(blob))
			t.Logf("Prepare: %v (either refused or confined to fs/ is right)", err)
			ents, _ := os.ReadDir(outside)
			if len(ents) != 1 {
				t.Errorf("the outside dir holds %d entries, want only its secret", len(ents))
			}
			if b, err := os.ReadFile(secret); err != nil || string(b) != "keep" {
				t.Errorf("the outside secret changed: %q, %v", b, err)
			}
			if xattr(outside, "trusted.overlay.opaque") != "" {
				t.Error("the outside dir got an opaque xattr")
			}
		})
	}
}

// blockingReader serves data up to half, then waits for release.
type blockingReader struct {
	data     []byte
	off      int
	halfway  chan struct{}
	release  chan struct{}
	signaled bool
}

func (b *blockingReader) Read(p []byte) (int, error) {
	if b.off >= len(b.data)/2 && !b.signaled {
		b.signaled = true
		close(b.halfway)
		<-b.release
	}
	if b.off >= len(b.data) {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), 512)], b.data[b.off:])
	b.off += n
	return n, nil
}

// TestPrepareAtomic: while a layer is unpacking, readers see no layer directory at all;
// afterwards they see the whole of it, ready.json included.
func TestPrepareAtomic(t *testing.T) {
	needRoot(t)
	var es []entry
	for i := range 200 {
		es = append(es, entry{name: "f" + strings.Repeat("x", i%50) + string(rune('a'+i%26)) + hex.EncodeToString([]byte{byte(i)}), typ: tar.TypeReg, body: strings.Repeat("y", 1000)})
	}
	raw := makeTar(t, es)
	blob := compress(t, "none", raw)
	l := layerOf("none", raw, blob)
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	br := &blockingReader{data: blob, halfway: make(chan struct{}), release: make(chan struct{})}
	errc := make(chan error, 1)
	go func() {
		_, err := s.Prepare(context.Background(), l, br)
		errc <- err
	}()
	<-br.halfway
	if _, err := os.Lstat(s.Path(l.Digest)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("halfway through, the layer dir exists (%v): a reader would see part of it", err)
	}
	if s.Has(l.Digest) {
		t.Error("halfway through, Has says ready")
	}
	tmps, _ := filepath.Glob(filepath.Join(s.Dir(), tmpPrefix+"*"))
	if len(tmps) != 1 {
		t.Errorf("halfway through: %d temp dirs, want 1", len(tmps))
	}
	close(br.release)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !s.Has(l.Digest) {
		t.Fatal("after Prepare the layer is not ready")
	}
	got, _ := os.ReadDir(filepath.Join(s.Path(l.Digest), DirFS))
	if len(got) != len(es) {
		t.Errorf("fs/ holds %d files, want %d", len(got), len(es))
	}
	if tmps, _ := filepath.Glob(filepath.Join(s.Dir(), tmpPrefix+"*")); len(tmps) != 0 {
		t.Errorf("temp dirs left: %v", tmps)
	}
}

func TestClean(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(s.Dir(), tmpPrefix+"old")
	young := filepath.Join(s.Dir(), tmpPrefix+"young")
	for _, d := range []string{old, young} {
		if err := os.MkdirAll(filepath.Join(d, DirFS), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	long := time.Now().Add(-2 * staleTmp)
	os.Chtimes(old, long, long)
	removed, err := s.Clean()
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != filepath.Base(old) {
		t.Errorf("Clean removed %v, want only the stale one", removed)
	}
	if _, err := os.Stat(young); err != nil {
		t.Errorf("a young temp dir (maybe another process's) was removed: %v", err)
	}
}

// TestOpenWritesTheXattrProbe: Open leaves the probe a guest checks before it uses the
// share, also on a store that exists already.
func TestOpenWritesTheXattrProbe(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	for i := range 2 {
		s, err := Open(dir)
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		buf := make([]byte, 16)
		n, err := unix.Getxattr(filepath.Join(s.Dir(), ProbeDir), ProbeXattr, buf)
		if err != nil || string(buf[:n]) != ProbeValue {
			t.Errorf("open %d: probe xattr %q, %v; want %q", i, buf[:max(n, 0)], err, ProbeValue)
		}
		if ls, err := s.List(); err != nil || len(ls) != 0 {
			t.Errorf("open %d: List = %v, %v; the probe is no layer", i, ls, err)
		}
	}
}

// A gzip bomb (a few KiB that unpack to 64 MiB of zeros) and a file-count bomb are
// refused at the header past the limit: nothing is left, and the bytes never hit the
// disk.
func TestPrepareRefusesBombs(t *testing.T) {
	needRoot(t)
	var bomb bytes.Buffer
	tw := tar.NewWriter(&bomb)
	const big = 64 << 20
	tw.WriteHeader(&tar.Header{Name: "zeros", Typeflag: tar.TypeReg, Mode: 0o644, Size: big, ModTime: mtime})
	tw.Write(make([]byte, big))
	tw.Close()
	var many []entry
	for i := range 200 {
		many = append(many, entry{name: "f" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + "-" + hex.EncodeToString([]byte{byte(i)}), typ: tar.TypeReg, body: "x"})
	}
	for _, tc := range []struct {
		name   string
		raw    []byte
		limits Limits
		want   string
	}{
		{"gzip bomb", bomb.Bytes(), Limits{Bytes: 8 << 20}, "more than 8388608 bytes"},
		{"many files", makeTar(t, many), Limits{Files: 100}, "more than 100 files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			s.Limits = tc.limits
			blob := compress(t, "gzip", tc.raw)
			if len(blob) > 1<<20 && tc.name == "gzip bomb" {
				t.Fatalf("the bomb is %d bytes compressed; want a small one", len(blob))
			}
			l := layerOf("gzip", tc.raw, blob)
			_, err = s.Prepare(context.Background(), l, bytes.NewReader(blob))
			if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Prepare: %v, want ErrTooLarge saying %q", err, tc.want)
			}
			if s.Has(l.Digest) {
				t.Error("the layer is present after a refused Prepare")
			}
			noLeftovers(t, s)
		})
	}
}
