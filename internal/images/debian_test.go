package images

import (
	"archive/tar"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

func TestDebianSpecCheck(t *testing.T) {
	ok := DebianSpec{Name: "e2e-agnhost", Refs: []string{"example.test/a:1"}, Files: []File{{Path: "a", Data: []byte("x")}, {Path: "b/c", Dir: true}}}
	if err := ok.check(); err != nil {
		t.Fatalf("valid spec refused: %v", err)
	}
	for name, s := range map[string]DebianSpec{
		"bad name":       {Name: "Agn host", Refs: ok.Refs},
		"no refs":        {Name: "a"},
		"absolute path":  {Name: "a", Refs: ok.Refs, Files: []File{{Path: "/etc/x", Data: []byte{}}}},
		"escaping path":  {Name: "a", Refs: ok.Refs, Files: []File{{Path: "../x", Data: []byte{}}}},
		"unclean path":   {Name: "a", Refs: ok.Refs, Files: []File{{Path: "a//b", Data: []byte{}}}},
		"two kinds":      {Name: "a", Refs: ok.Refs, Files: []File{{Path: "a", Data: []byte{}, Link: "b"}}},
		"no kind at all": {Name: "a", Refs: ok.Refs, Files: []File{{Path: "a"}}},
	} {
		if err := s.check(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestDebianInputs: every input is in the fingerprint (a file's content, a package
// list, the config), and a file that changes after the fingerprint was taken is refused
// rather than cached under the old one.
func TestDebianInputs(t *testing.T) {
	if _, err := exec.LookPath("debootstrap"); err != nil {
		livetest.Skip(t, "Debian images need debootstrap")
	}
	ctx := context.Background()
	bin := filepath.Join(t.TempDir(), "tool")
	if err := os.WriteFile(bin, []byte("one"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := DebianSpec{Name: "t", Refs: []string{"example.test/t:1"},
		Files:      []File{{Path: "tool", HostPath: bin, Mode: 0o755}, {Path: "tool-2", Link: "tool"}, {Path: "uploads", Dir: true}},
		Entrypoint: []string{"/tool"}, Cmd: []string{"pause"}}
	in1, err := debianInputs(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if in1.Suite != BuilderSuite || in1.Mirror == "" || in1.Debootstap == "" || !reflect.DeepEqual(in1.Config.Entrypoint, []string{"/tool"}) {
		t.Fatalf("inputs: %+v", in1)
	}
	files, err := spec.tarFiles(in1)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]byte{"tool": tar.TypeReg, "tool-2": tar.TypeSymlink, "uploads": tar.TypeDir}
	for _, f := range files {
		if want[f.path] != f.typ {
			t.Errorf("%s: type %c, want %c", f.path, f.typ, want[f.path])
		}
		if f.path == "tool" && (string(f.data) != "one" || f.mode != 0o755) {
			t.Errorf("tool: %q mode %o", f.data, f.mode)
		}
	}

	if err := os.WriteFile(bin, []byte("two"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := spec.tarFiles(in1); err == nil || !strings.Contains(err.Error(), "changed") {
		t.Errorf("a file changed after fingerprinting was not refused: %v", err)
	}
	in2, err := debianInputs(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if reflect.DeepEqual(in1.Files, in2.Files) {
		t.Error("a file's content is not in the inputs")
	}
	spec.Cmd = []string{"other"}
	if in3, err := debianInputs(ctx, spec); err != nil || reflect.DeepEqual(in2.Config, in3.Config) {
		t.Errorf("the config is not in the inputs (%v)", err)
	}
	if _, err := exec.LookPath("apt-cache"); err != nil {
		return
	}
	spec.Layers = []PackageLayer{{Name: "tools", Packages: []string{"bash"}}}
	in4, err := debianInputs(ctx, spec)
	if err != nil {
		livetest.Skip(t, err.Error())
	}
	if in4.Versions["bash"] == "" || len(in4.Layers) != 1 || in4.Layers[0].Packages[0] != "bash" {
		t.Errorf("packages and their versions are not in the inputs: %+v", in4)
	}
}

// TestDebianScratch builds a scratch image end to end (no debootstrap): the layout
// imports into the registry and pulls back with its files (a setuid program, a symlink,
// a directory), config and both references; a second build is the cached one.
func TestDebianScratch(t *testing.T) {
	prog := filepath.Join(t.TempDir(), "nnp")
	if err := os.WriteFile(prog, []byte("#!program"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := DebianSpec{Name: "scratch-test", Scratch: true, Refs: []string{"example.test/nnp:1", "example.test/nnp:2"},
		Files: []File{{Path: "usr/local/bin/nnp", HostPath: prog, Mode: 0o4755}, {Path: "nnp", Link: "usr/local/bin/nnp"}, {Path: "tmp", Dir: true, Mode: 0o1777}},
		Cmd:   []string{"nnp"}}
	opts := Options{CacheDir: t.TempDir()}
	tarPath, digest, err := Debian(context.Background(), spec, opts)
	if err != nil {
		t.Fatal(err)
	}
	img := importAndPull(t, tarPath, "example.test/nnp:2")
	if img.digest != digest || len(img.layers) != 1 || !reflect.DeepEqual(img.config.Config.Cmd, []string{"nnp"}) {
		t.Fatalf("pulled %s with %d layers and config %+v; built %s", img.digest, len(img.layers), img.config.Config, digest)
	}
	_, files := readLayer(t, img.layers[0])
	if e := files["usr/local/bin/nnp"]; e.hdr == nil || e.hdr.Mode != 0o4755 || string(e.data) != "#!program" {
		t.Errorf("usr/local/bin/nnp: %+v", e.hdr)
	}
	if e := files["nnp"]; e.hdr == nil || e.hdr.Typeflag != tar.TypeSymlink || e.hdr.Linkname != "usr/local/bin/nnp" {
		t.Errorf("nnp: %+v", e.hdr)
	}
	if e := files["tmp"]; e.hdr == nil || e.hdr.Typeflag != tar.TypeDir || e.hdr.Mode != 0o1777 {
		t.Errorf("tmp: %+v", e.hdr)
	}
	if again, d2, err := Debian(context.Background(), spec, opts); err != nil || again != tarPath || d2 != digest {
		t.Errorf("second build: %s %s %v; want the cached %s %s", again, d2, err, tarPath, digest)
	}
	if err := (DebianSpec{Name: "x", Scratch: true, Refs: spec.Refs, Layers: []PackageLayer{{Name: "p", Packages: []string{"bash"}}}, Files: spec.Files}).check(); err == nil {
		t.Error("a scratch image with package layers was accepted")
	}
}
