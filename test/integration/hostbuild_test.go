package integration

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// unpackImage extracts an OCI layout tar's (single) image into dst, applying each
// layer's whiteouts, as containerd's overlay snapshots would present it. It returns the
// image config's Env.
func unpackImage(t *testing.T, ctx context.Context, layoutTar, dst string) []string {
	t.Helper()
	layout := t.TempDir()
	if out, err := exec.CommandContext(ctx, "tar", "-xf", layoutTar, "-C", layout).CombinedOutput(); err != nil {
		t.Fatalf("extracting %s: %v: %s", layoutTar, err, out)
	}
	blob := func(digest string, v any) string {
		p := filepath.Join(layout, "blobs", strings.Replace(digest, ":", "/", 1))
		if v != nil {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, v); err != nil {
				t.Fatalf("%s: %v", digest, err)
			}
		}
		return p
	}
	var index struct {
		Manifests []struct{ Digest string } `json:"manifests"`
	}
	b, err := os.ReadFile(filepath.Join(layout, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v (%d manifests, want 1)", err, len(index.Manifests))
	}
	var m struct {
		Config struct{ Digest string } `json:"config"`
		Layers []struct {
			Digest, MediaType string
		} `json:"layers"`
	}
	blob(index.Manifests[0].Digest, &m)
	var cfg struct {
		Config struct{ Env []string } `json:"config"`
	}
	blob(m.Config.Digest, &cfg)
	for _, l := range m.Layers {
		if strings.Contains(l.MediaType, "gzip") || strings.Contains(l.MediaType, "zstd") {
			t.Fatalf("layer %s is %s; only uncompressed layers are unpacked here", l.Digest, l.MediaType)
		}
		if err := applyLayer(blob(l.Digest, nil), dst); err != nil {
			t.Fatalf("layer %s: %v", l.Digest, err)
		}
	}
	return cfg.Config.Env
}

// applyLayer extracts one uncompressed layer tar over dst: ".wh.<name>" removes name,
// ".wh..wh..opq" empties its directory (OCI image spec, layer changesets).
func applyLayer(file, dst string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + h.Name)[1:]
		if name == "" {
			continue
		}
		target := filepath.Join(dst, name)
		dir, base := filepath.Split(target)
		if base == ".wh..wh..opq" {
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
					return err
				}
			}
			continue
		}
		if w, ok := strings.CutPrefix(base, ".wh."); ok {
			if err := os.RemoveAll(filepath.Join(dir, w)); err != nil {
				return err
			}
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if h.Typeflag != tar.TypeDir {
			_ = os.RemoveAll(target)
		}
		mode := os.FileMode(h.Mode).Perm() | os.FileMode(h.Mode)&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, mode); err != nil {
				return err
			}
		case tar.TypeReg:
			out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, target); err != nil {
				return err
			}
		case tar.TypeLink:
			if err := os.Link(filepath.Join(dst, path.Clean("/" + h.Linkname)[1:]), target); err != nil {
				return err
			}
		default:
			continue // devices and fifos: not needed to run a build
		}
		if h.Typeflag != tar.TypeSymlink {
			if err := os.Lchown(target, h.Uid, h.Gid); err != nil {
				return err
			}
			if err := os.Chmod(target, mode); err != nil {
				return err
			}
		}
	}
}

// runInRootfs runs a bash script in root as a chroot with its own /proc and the host's
// /dev, in a private mount namespace so nothing stays mounted, with env only. It returns
// the combined output.
func runInRootfs(ctx context.Context, root string, env []string, script string) (string, error) {
	wrapper := fmt.Sprintf(`set -e
mkdir -p %[1]s/proc %[1]s/dev %[1]s/tmp
mount -t proc proc %[1]s/proc
mount --rbind /dev %[1]s/dev
exec chroot %[1]s /bin/bash -c "$SOCIALWEB_JOB_SCRIPT"`, root)
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "--fork", "/bin/bash", "-c", wrapper)
	cmd.Env = append(append([]string{}, env...), "SOCIALWEB_JOB_SCRIPT="+script)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
