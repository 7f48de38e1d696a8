package images

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"
)

func TestParseAptPolicy(t *testing.T) {
	out := `golang-go:
  Installed: (none)
  Candidate: 2:1.19~1
  Version table:
     2:1.19~1 500
        500 http://deb.debian.org/debian bookworm/main amd64 Packages
nosuch:
  Installed: (none)
  Candidate: (none)
git:
  Installed: 1:2.39.5-0+deb12u2
  Candidate: 1:2.39.5-0+deb12u2
`
	got := parseAptPolicy(out)
	want := map[string]string{"golang-go": "2:1.19~1", "git": "1:2.39.5-0+deb12u2"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parseAptPolicy = %v, want %v", got, want)
	}
}

func TestDiffPaths(t *testing.T) {
	d := node{mode: fs.ModeDir | 0o755}
	f := func(size int64) node { return node{mode: 0o644, size: size} }
	for _, tc := range []struct {
		name                  string
		prev, cur             map[string]node
		wantChanged, wantGone []string
	}{
		{"first layer: everything", nil, map[string]node{"etc": d, "etc/passwd": f(1)}, []string{"etc", "etc/passwd"}, nil},
		{"nothing changed", map[string]node{"etc": d, "etc/passwd": f(1)}, map[string]node{"etc": d, "etc/passwd": f(1)}, nil, nil},
		{"new file brings its parents", map[string]node{"usr": d, "usr/bin": d}, map[string]node{"usr": d, "usr/bin": d, "usr/bin/go": f(9)},
			[]string{"usr", "usr/bin", "usr/bin/go"}, nil},
		{"changed file", map[string]node{"etc": d, "etc/a": f(1), "etc/b": f(1)}, map[string]node{"etc": d, "etc/a": f(2), "etc/b": f(1)},
			[]string{"etc", "etc/a"}, nil},
		{"removed tree: one whiteout", map[string]node{"var": d, "var/lib": d, "var/lib/x": f(1)}, map[string]node{"var": d},
			[]string{"var"}, []string{"var/lib"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changed, gone := diffPaths(tc.prev, tc.cur)
			if !reflect.DeepEqual(changed, tc.wantChanged) || !reflect.DeepEqual(gone, tc.wantGone) {
				t.Errorf("diffPaths = %v, %v; want %v, %v", changed, gone, tc.wantChanged, tc.wantGone)
			}
		})
	}
}

// TestDiffLayer: a step's layer holds what it added or changed (with real modes and
// non-ASCII names), whiteouts for what it removed, and nothing it left alone.
func TestDiffLayer(t *testing.T) {
	root := t.TempDir()
	write := func(p string, mode os.FileMode, data string) {
		t.Helper()
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(full, mode); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/keep", 0o644, "same")
	write("etc/old", 0o644, "going")
	if err := os.MkdirAll(filepath.Join(root, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	excl := []string{"tmp/*"}
	prev, err := scanTree(root, excl)
	if err != nil {
		t.Fatal(err)
	}
	write("tmp/ignored", 0o644, "x")
	write("usr/bin/tool", 0o755|os.ModeSetuid, "#!/bin/sh\n")
	if err := os.Symlink("Főtanúsítvány.pem", filepath.Join(root, "etc/ca.pem")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, "etc/old")); err != nil {
		t.Fatal(err)
	}
	cur, err := scanTree(root, excl)
	if err != nil {
		t.Fatal(err)
	}
	b, err := diffLayer(root, prev, cur, filepath.Join(t.TempDir(), "layer.tar"))
	if err != nil {
		t.Fatal(err)
	}
	// A later step changing the tree does not change the layer already made.
	write("usr/bin/tool", 0o755|os.ModeSetuid, "changed by a later step\n")
	var buf bytes.Buffer
	if err := b.gen(&buf); err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(buf.Bytes()); "sha256:"+hex.EncodeToString(sum[:]) != b.digest || int64(buf.Len()) != b.size {
		t.Errorf("layer content does not match its digest and size after the tree changed")
	}
	got := map[string]int64{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h.Mode
	}
	names := make([]string, 0, len(got))
	for n := range got {
		names = append(names, n)
	}
	sort.Strings(names)
	// tmp/ itself changed (an entry was added), though its contents are excluded.
	want := []string{"etc/", "etc/.wh.old", "etc/ca.pem", "tmp/", "usr/", "usr/bin/", "usr/bin/tool"}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("layer entries %v, want %v", names, want)
	}
	if got["usr/bin/tool"] != 0o4755 {
		t.Errorf("usr/bin/tool mode %o, want 4755 (setuid kept)", got["usr/bin/tool"])
	}
	if got["tmp/"] != 0o1777 {
		t.Errorf("tmp/ mode %o, want 1777 (sticky kept)", got["tmp/"])
	}
}
