package nodeimage

import (
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func baseInputs() (Spec, Resolved) {
	s := Spec{VCPU: 1, MemMiB: 1024, HeadroomMiB: 1024, KernelPackage: DefaultKernelPackage,
		Suite: "bookworm", Mirror: DefaultMirror, Cmdline: DefaultCmdline, Init: DefaultInit}
	r := Resolved{
		KernelMeta:    PackageRef{"linux-image-cloud-amd64", "6.1.192-3"},
		KernelImage:   PackageRef{"linux-image-6.1.0-57-cloud-amd64", "6.1.192-3"},
		Busybox:       PackageRef{"busybox-static", "1:1.35.0-4+deb12u1+b1"},
		Include:       map[string]string{"containerd": "1.6.20~ds1-1+deb12u3", "runc": "1.1.5+ds1-1+deb12u1"},
		ReleaseSHA256: strings.Repeat("a", 64),
		Tools:         map[string]string{"debootstrap": "1.0.128+nmu2+deb12u2", "mkfs.ext4": "1.47.0"},
		ExtraFiles:    []FileDigest{{Guest: "/usr/local/bin/agent", Mode: 0o755, Size: 10, SHA256: strings.Repeat("b", 64)}},
	}
	return s, r
}

func cloneResolved(r Resolved) Resolved {
	r.Include = maps.Clone(r.Include)
	r.Tools = maps.Clone(r.Tools)
	r.ExtraFiles = append([]FileDigest(nil), r.ExtraFiles...)
	return r
}

func TestFingerprintChangesWithEveryInput(t *testing.T) {
	s0, r0 := baseInputs()
	base := Fingerprint(s0, r0)
	if again := Fingerprint(s0, cloneResolved(r0)); again != base {
		t.Fatalf("fingerprint is not deterministic: %s vs %s", base, again)
	}
	if len(base) != 64 {
		t.Fatalf("fingerprint %q is not a sha256 hex", base)
	}
	layer0 := LayerKey(s0, r0)

	tests := []struct {
		name        string
		mutate      func(*Spec, *Resolved)
		layerChange bool // whether the debootstrap layer must be rebuilt too
	}{
		{"vcpu", func(s *Spec, r *Resolved) { s.VCPU = 2 }, false},
		{"memMiB", func(s *Spec, r *Resolved) { s.MemMiB = 2048 }, false},
		{"diskMiB", func(s *Spec, r *Resolved) { s.DiskMiB = 4096 }, false},
		{"headroomMiB", func(s *Spec, r *Resolved) { s.HeadroomMiB = 512 }, false},
		{"kernel package", func(s *Spec, r *Resolved) { s.KernelPackage = "linux-image-amd64" }, false},
		{"suite", func(s *Spec, r *Resolved) { s.Suite = "trixie" }, true},
		{"mirror", func(s *Spec, r *Resolved) { s.Mirror = "http://m.example.test/debian" }, true},
		{"extra package", func(s *Spec, r *Resolved) { s.Packages = []string{"socat"} }, true},
		{"cmdline", func(s *Spec, r *Resolved) { s.Cmdline += " quiet" }, false},
		{"init", func(s *Spec, r *Resolved) { s.Init = "/usr/local/bin/agent" }, false},
		{"kernel metapackage version", func(s *Spec, r *Resolved) { r.KernelMeta.Version = "6.1.193-1" }, false},
		{"kernel image package", func(s *Spec, r *Resolved) { r.KernelImage.Name = "linux-image-6.1.0-58-cloud-amd64" }, false},
		{"kernel image version", func(s *Spec, r *Resolved) { r.KernelImage.Version = "6.1.192-4" }, false},
		{"busybox version", func(s *Spec, r *Resolved) { r.Busybox.Version = "1:1.36.1-1" }, false},
		{"included package version", func(s *Spec, r *Resolved) { r.Include["containerd"] = "1.6.20~ds1-1+deb12u4" }, true},
		{"included package added", func(s *Spec, r *Resolved) { r.Include["socat"] = "1.7.4.4-2" }, true},
		{"suite release", func(s *Spec, r *Resolved) { r.ReleaseSHA256 = strings.Repeat("c", 64) }, true},
		{"debootstrap version", func(s *Spec, r *Resolved) { r.Tools["debootstrap"] = "1.0.134" }, true},
		{"mke2fs version", func(s *Spec, r *Resolved) { r.Tools["mkfs.ext4"] = "1.47.3" }, false},
		{"extra file content", func(s *Spec, r *Resolved) { r.ExtraFiles[0].SHA256 = strings.Repeat("d", 64) }, false},
		{"extra file mode", func(s *Spec, r *Resolved) { r.ExtraFiles[0].Mode = 0o700 }, false},
		{"extra file guest path", func(s *Spec, r *Resolved) { r.ExtraFiles[0].Guest = "/sbin/agent" }, false},
		{"extra file added", func(s *Spec, r *Resolved) {
			r.ExtraFiles = append(r.ExtraFiles, FileDigest{Guest: "/etc/x", Mode: 0o644, SHA256: strings.Repeat("e", 64)})
		}, false},
		{"extra file removed", func(s *Spec, r *Resolved) { r.ExtraFiles = nil }, false},
	}
	seen := map[string]string{base: "base"}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, r := s0, cloneResolved(r0)
			tc.mutate(&s, &r)
			fp := Fingerprint(s, r)
			if fp == base {
				t.Errorf("changing %s did not change the fingerprint", tc.name)
			}
			if other, dup := seen[fp]; dup {
				t.Errorf("changing %s gives the same fingerprint as %s", tc.name, other)
			}
			seen[fp] = tc.name
			if got := LayerKey(s, r) != layer0; got != tc.layerChange {
				t.Errorf("changing %s: debootstrap layer key changed = %v, want %v", tc.name, got, tc.layerChange)
			}
		})
	}
}

// Every Spec field must reach the fingerprint, including fields added later.
func TestFingerprintCoversEverySpecField(t *testing.T) {
	s0, r0 := baseInputs()
	base := Fingerprint(s0, r0)
	st := reflect.TypeOf(s0)
	for i := 0; i < st.NumField(); i++ {
		s := s0
		f := reflect.ValueOf(&s).Elem().Field(i)
		switch f.Kind() {
		case reflect.Int:
			f.SetInt(f.Int() + 7)
		case reflect.String:
			f.SetString(f.String() + "x")
		case reflect.Slice:
			f.Set(reflect.Append(f, reflect.ValueOf("x")))
		default:
			t.Fatalf("field %s: kind %s not handled by this test", st.Field(i).Name, f.Kind())
		}
		if Fingerprint(s, r0) == base {
			t.Errorf("Spec.%s does not reach the fingerprint", st.Field(i).Name)
		}
	}
}

func TestDigestExtraFiles(t *testing.T) {
	dir := t.TempDir()
	agent := filepath.Join(dir, "agent")
	write := func(content string, mode os.FileMode) []FileDigest {
		t.Helper()
		if err := os.WriteFile(agent, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(agent, mode); err != nil {
			t.Fatal(err)
		}
		d, err := digestExtraFiles(map[string]string{"/usr/local/bin/agent": agent})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	s, r := baseInputs()
	fp := func(d []FileDigest) string { r.ExtraFiles = d; return Fingerprint(s, r) }
	a := fp(write("agent v1", 0o755))
	if b := fp(write("agent v1", 0o755)); b != a {
		t.Errorf("same file gave different fingerprints")
	}
	if b := fp(write("agent v2", 0o755)); b == a {
		t.Errorf("changed content did not change the fingerprint")
	}
	if b := fp(write("agent v1", 0o700)); b == a {
		t.Errorf("changed mode did not change the fingerprint")
	}

	bad := []struct {
		guest, host, want string
	}{
		{"usr/bin/x", agent, "clean absolute file path"},
		{"/usr/../bin/x", agent, "clean absolute file path"},
		{"/", agent, "clean absolute file path"},
		{"/x", filepath.Join(dir, "missing"), "no such file"},
		{"/x", dir, "not a regular file"},
	}
	for _, tc := range bad {
		_, err := digestExtraFiles(map[string]string{tc.guest: tc.host})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("digestExtraFiles(%s -> %s) = %v, want error containing %q", tc.guest, tc.host, err, tc.want)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	out := []byte(`containerd:
  Installed: (none)
  Candidate: 1.6.20~ds1-1+deb12u3
  Version table:
     1.6.20~ds1-1+deb12u3 500
        500 http://deb.debian.org/debian-security bookworm-security/main amd64 Packages
     1.6.20~ds1-1+deb12u2 500
        500 http://deb.debian.org/debian/ bookworm/main amd64 Packages
        500 http://other.example.test/debian bookworm/main amd64 Packages
kmod:
  Installed: 30+20221128-1
  Candidate: 30+20221128-1
  Version table:
 *** 30+20221128-1 500
        500 http://deb.debian.org/debian bookworm/main amd64 Packages
        100 /var/lib/dpkg/status
nosuch:
  Installed: (none)
  Candidate: (none)
  Version table:
`)
	pol := parsePolicy(out)
	tests := []struct{ pkg, mirror, suite, want string }{
		{"containerd", "http://deb.debian.org/debian", "bookworm", "1.6.20~ds1-1+deb12u2"},
		{"containerd", "http://deb.debian.org/debian-security", "bookworm-security", "1.6.20~ds1-1+deb12u3"},
		{"containerd", "http://other.example.test/debian", "bookworm", "1.6.20~ds1-1+deb12u2"},
		{"containerd", "http://deb.debian.org/debian", "trixie", ""},
		{"kmod", "http://deb.debian.org/debian", "bookworm", "30+20221128-1"},
		{"nosuch", "http://deb.debian.org/debian", "bookworm", ""},
	}
	for _, tc := range tests {
		if got := pol[tc.pkg].versionIn(tc.mirror, tc.suite); got != tc.want {
			t.Errorf("%s in %s %s = %q, want %q", tc.pkg, tc.mirror, tc.suite, got, tc.want)
		}
	}
	if c := pol["containerd"].Candidate; c != "1.6.20~ds1-1+deb12u3" {
		t.Errorf("containerd candidate = %q", c)
	}
	if c := pol["nosuch"].Candidate; c != "(none)" {
		t.Errorf("nosuch candidate = %q", c)
	}
}

func TestAptListName(t *testing.T) {
	tests := map[string]string{
		"http://deb.debian.org/debian":          "deb.debian.org_debian",
		"https://deb.debian.org/debian/":        "deb.debian.org_debian",
		"http://user:pw@mirror.test/debian":     "mirror.test_debian",
		"http://mirror.test/some_path/debian":   "mirror.test_some%5fpath_debian",
		"http://mirror.test:8080/~user/debian/": "mirror.test:8080_%7euser_debian",
	}
	for in, want := range tests {
		if got := aptListName(in); got != want {
			t.Errorf("aptListName(%s) = %q, want %q", in, got, want)
		}
	}
}
