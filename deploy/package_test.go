package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// What the package is made of (hack/package); the tests read them where they are.
const (
	packageScript = "../hack/package"
	unitFile      = "systemd/socialweb.service"
	debianDir     = "debian"
	sampleConfig  = "config.yaml"
)

// unitEntry is one key=value line of a unit file.
type unitEntry struct {
	section, key, value string
	line                int
}

// parseUnit reads a systemd unit file: comments (# or ;), blank lines, [Section]
// headers and key=value lines, a trailing backslash continuing a value. Anything
// else, or a key before any section, is an error.
func parseUnit(text string) ([]unitEntry, error) {
	var (
		entries []unitEntry
		section string
		pending *unitEntry
	)
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if pending != nil {
			pending.value += " " + strings.TrimSuffix(line, `\`)
			if !strings.HasSuffix(line, `\`) {
				entries, pending = append(entries, *pending), nil
			}
			continue
		}
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
		default:
			key, value, ok := strings.Cut(line, "=")
			key, value = strings.TrimSpace(key), strings.TrimSpace(value)
			if !ok || !regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`).MatchString(key) {
				return nil, fmt.Errorf("line %d: %q is no key=value line", n, line)
			}
			if section == "" {
				return nil, fmt.Errorf("line %d: %s before any [Section]", n, key)
			}
			e := unitEntry{section: section, key: key, value: strings.TrimSuffix(value, `\`), line: n}
			if strings.HasSuffix(value, `\`) {
				pending = &e
				continue
			}
			entries = append(entries, e)
		}
	}
	if pending != nil {
		return nil, fmt.Errorf("line %d: the file ends inside a continued value", pending.line)
	}
	return entries, sc.Err()
}

func TestParseUnit(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []unitEntry
		err        string
	}{
		{name: "sections, comments, blank lines", text: "# c\n[Unit]\n; c\nDescription = x y\n\n[Service]\nType=notify\n",
			want: []unitEntry{{"Unit", "Description", "x y", 4}, {"Service", "Type", "notify", 7}}},
		{name: "a continued value", text: "[Service]\nExecStart=/usr/bin/a \\\n  --b\n",
			want: []unitEntry{{"Service", "ExecStart", "/usr/bin/a  --b", 2}}},
		{name: "a key before any section", text: "Type=notify\n", err: "before any [Section]"},
		{name: "no equals sign", text: "[Service]\nType notify\n", err: "no key=value line"},
		{name: "a lower-case key", text: "[Service]\ntype=notify\n", err: "no key=value line"},
		{name: "an unfinished continuation", text: "[Service]\nExecStart=/a \\\n", err: "continued value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseUnit(tc.text)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// runPackage runs hack/package with args and returns its stdout.
func runPackage(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("bash", append([]string{packageScript}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/package %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// packageFiles is what `hack/package --dry-run` lists.
func packageFiles(t *testing.T, args ...string) []string {
	t.Helper()
	return strings.Fields(runPackage(t, append([]string{"--dry-run"}, args...)...))
}

// inPackage reports whether path (absolute, as a unit names it) is one of files.
func inPackage(files []string, path string) bool {
	for _, f := range files {
		if ok, _ := filepath.Match(f, strings.TrimPrefix(path, "/")); ok {
			return true
		}
	}
	return false
}

func TestUnit(t *testing.T) {
	b, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := parseUnit(string(b))
	if err != nil {
		t.Fatal(err)
	}
	// The keys this unit may use, by section: a typo is not silently ignored (as
	// systemd would, with a warning in the journal).
	known := map[string][]string{
		"Unit": {"Description", "Documentation", "Wants", "After", "Requires", "Before"},
		"Service": {"Type", "ExecStart", "ExecStartPre", "TimeoutStartSec", "TimeoutStopSec", "Restart", "RestartSec",
			"RestartPreventExitStatus", "KillMode", "Environment", "CacheDirectory", "LimitNOFILE", "TasksMax",
			"NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp"},
		"Install": {"WantedBy"},
	}
	got := map[string][]string{} // "Section.Key" -> values
	for _, e := range entries {
		keys, ok := known[e.section]
		if !ok {
			t.Errorf("line %d: section [%s]: want one of Unit, Service, Install", e.line, e.section)
			continue
		}
		if !slices.Contains(keys, e.key) {
			t.Errorf("line %d: %s= in [%s] is not a key this unit is known to use", e.line, e.key, e.section)
		}
		got[e.section+"."+e.key] = append(got[e.section+"."+e.key], e.value)
	}
	files := packageFiles(t)
	for _, tc := range []struct {
		key, want string
		why       string
	}{
		{"Service.Type", "notify", "serve says READY=1 (internal/sdnotify)"},
		{"Service.KillMode", "process", "node VMs and their virtiofsd outlive a restart"},
		{"Service.Environment", "XDG_CACHE_HOME=/var/cache", "the cache under /var/cache/socialweb"},
		{"Service.CacheDirectory", "socialweb", "systemd makes /var/cache/socialweb"},
		{"Service.RestartPreventExitStatus", "2", "a bad config is not retried"},
		{"Service.TasksMax", "infinity", "control planes and VMs have caps of their own"},
		{"Install.WantedBy", "multi-user.target", "started at boot once enabled"},
	} {
		if v := got[tc.key]; len(v) != 1 || v[0] != tc.want {
			t.Errorf("%s = %q, want %q (%s)", tc.key, v, tc.want, tc.why)
		}
	}
	for _, k := range []string{"Service.Delegate", "Service.ProtectControlGroups", "Service.ProtectKernelTunables",
		"Service.PrivateDevices", "Service.MemoryDenyWriteExecute", "Service.ProtectClock", "Service.DeviceAllow"} {
		if _, ok := got[k]; ok {
			t.Errorf("%s is set: the daemon needs what it takes away (see the unit's comments)", k)
		}
	}
	execs := append(append([]string{}, got["Service.ExecStart"]...), got["Service.ExecStartPre"]...)
	if len(got["Service.ExecStart"]) != 1 {
		t.Fatalf("ExecStart = %q, want one command", got["Service.ExecStart"])
	}
	for _, cmd := range execs {
		bin := strings.TrimLeft(strings.Fields(cmd)[0], "-@:+!")
		if !filepath.IsAbs(bin) || !inPackage(files, bin) {
			t.Errorf("%q runs %s, which the package does not ship (hack/package --dry-run: %q)", cmd, bin, files)
		}
	}
	if f := strings.Fields(got["Service.ExecStart"][0]); len(f) < 2 || f[1] != "serve" {
		t.Errorf("ExecStart = %q, want socialweb serve", got["Service.ExecStart"][0])
	}
}

// TestUnitVerify has systemd itself read the unit, in a root that holds the unit,
// the targets it names and a stand-in for the binary: an unknown key or a bad
// value is a warning there, which fails the test.
func TestUnitVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("no systemd-analyze on this host (Debian's systemd package has it)")
	}
	root := t.TempDir()
	units := filepath.Join(root, "lib/systemd/system")
	for _, d := range []string{units, filepath.Join(root, "usr/bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "usr/bin/socialweb"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile := func(src, dst string) {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(unitFile, filepath.Join(units, "socialweb.service"))
	for _, target := range []string{"sysinit.target", "basic.target", "network-online.target", "multi-user.target",
		"shutdown.target", "sockets.target", "paths.target", "slices.target", "timers.target", "local-fs.target", "swap.target"} {
		src := filepath.Join("/lib/systemd/system", target)
		if _, err := os.Stat(src); err != nil {
			t.Skipf("this host's systemd has no %s to verify against: %v", target, err)
		}
		copyFile(src, filepath.Join(units, target))
	}
	out, err := exec.Command(analyze, "verify", "--man=no", "--generators=no", "--root="+root, "socialweb.service").CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

func TestMaintainerScripts(t *testing.T) {
	files := packageFiles(t)
	for _, name := range []string{"postinst", "prerm", "postrm"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(debianDir, name)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(b), "#!/bin/sh\n") || !strings.Contains(string(b), "\nset -e\n") {
				t.Errorf("%s: want #!/bin/sh and set -e (Debian policy 10.4, 6.1)", path)
			}
			if st, err := os.Stat(path); err != nil || st.Mode()&0o111 == 0 {
				t.Errorf("%s is not executable", path)
			}
			// bash -n and, where there is one, dash (what /bin/sh is on Debian) -n.
			for _, sh := range []string{"bash", "dash"} {
				if _, err := exec.LookPath(sh); err != nil {
					continue
				}
				if out, err := exec.Command(sh, "-n", path).CombinedOutput(); err != nil {
					t.Errorf("%s -n %s: %v\n%s", sh, path, err, out)
				}
			}
			if !slices.Contains(files, "DEBIAN/"+name) {
				t.Errorf("hack/package --dry-run does not list DEBIAN/%s", name)
			}
		})
	}
	// Purge keeps the state dir: no script removes it.
	for _, name := range []string{"postinst", "prerm", "postrm"} {
		b, _ := os.ReadFile(filepath.Join(debianDir, name))
		if regexp.MustCompile(`rm\s+-[a-z]*\s+[^\n]*(/var/lib/socialweb|state)`).Match(b) {
			t.Errorf("%s removes the state dir; purge must keep it", name)
		}
	}
}

func TestDryRunListsEveryFile(t *testing.T) {
	base := []string{
		"DEBIAN/control", "DEBIAN/conffiles", "DEBIAN/md5sums", "DEBIAN/postinst", "DEBIAN/prerm", "DEBIAN/postrm",
		"etc/socialweb/config.yaml", "lib/systemd/system/socialweb.service", "usr/bin/socialweb",
		"usr/lib/socialweb/images/pause.tar", "usr/lib/socialweb/images/busybox.tar",
		"usr/share/doc/socialweb/changelog.gz", "usr/share/doc/socialweb/copyright",
		"usr/share/man/man1/socialweb.1.gz", "usr/share/man/man1/socialweb-*.1.gz",
	}
	image := []string{"usr/lib/socialweb/node-image/manifest.json", "usr/lib/socialweb/node-image/vmlinuz",
		"usr/lib/socialweb/node-image/initramfs.cpio.gz", "usr/lib/socialweb/node-image/rootfs.ext4"}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"no node image", nil, base},
		{"a node image", []string{"--node-image", t.TempDir()}, append(slices.Clone(base), image...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := packageFiles(t, tc.args...)
			if !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(tc.want))) {
				t.Fatalf("hack/package --dry-run %q lists\n%s\nwant\n%s", tc.args, strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// TestDebianVersion checks the mapping from git describe to a Debian version, and
// that the versions sort as the commits do (dpkg --compare-versions).
func TestDebianVersion(t *testing.T) {
	const epoch = "1764945000" // 2025-12-05 14:30:00 UTC
	ordered := []struct{ describe, want string }{
		{"abc1234", "0~git20251205143000.abc1234"},
		{"abc1234-dirty", "0~git20251205143000.abc1234+dirty"},
		{"v1.2.3-rc.1", "1.2.3~rc.1"},
		{"v1.2.3-rc.1-2-gabc1234", "1.2.3~rc.1+2.gabc1234"},
		{"v1.2.3", "1.2.3"},
		{"v1.2.3-4-gabc1234", "1.2.3+4.gabc1234"},
		{"v1.2.3-12-gdef5678", "1.2.3+12.gdef5678"},
		{"v1.2.4", "1.2.4"},
	}
	for _, tc := range ordered {
		if got := strings.TrimSpace(runPackage(t, "--debian-version", tc.describe, epoch)); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.describe, got, tc.want)
		}
	}
	for _, bad := range []string{"release-1", "v-x"} {
		if err := exec.Command("bash", packageScript, "--debian-version", bad, epoch).Run(); err == nil {
			t.Errorf("%s: accepted, want refused (not a version tag)", bad)
		}
	}
	if _, err := exec.LookPath("dpkg"); err != nil {
		t.Skip("no dpkg to compare versions with")
	}
	for i := 1; i < len(ordered); i++ {
		a, b := ordered[i-1].want, ordered[i].want
		if err := exec.Command("dpkg", "--compare-versions", a, "lt", b).Run(); err != nil {
			t.Errorf("dpkg says %s is not older than %s", a, b)
		}
	}
}

// TestPackageConfig checks the conffile: every setting of the sample, commented out
// at its default, and only what the package sets left as a key.
func TestPackageConfig(t *testing.T) {
	sample, err := os.ReadFile(sampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	var settings []string
	for _, l := range strings.Split(string(sample), "\n") {
		if regexp.MustCompile(`^[a-z][a-z0-9-]*:( |$)`).MatchString(l) {
			settings = append(settings, l)
		}
	}
	if len(settings) < 40 {
		t.Fatalf("found %d settings in %s; the sample has more", len(settings), sampleConfig)
	}
	for _, tc := range []struct {
		name string
		args []string
		want map[string]any
	}{
		{"no node image", nil, map[string]any{"state-dir": "/var/lib/socialweb", "control-planes-on-exit": "keep",
			"builtin-images": "/usr/lib/socialweb/images"}},
		{"a node image", []string{"--node-image", "/x"},
			map[string]any{"state-dir": "/var/lib/socialweb", "control-planes-on-exit": "keep",
				"builtin-images": "/usr/lib/socialweb/images", "node-image": "/usr/lib/socialweb/node-image"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text := runPackage(t, append([]string{"--show", "etc/socialweb/config.yaml"}, tc.args...)...)
			var got map[string]any
			if err := yaml.Unmarshal([]byte(text), &got); err != nil {
				t.Fatalf("not YAML: %v\n%s", err, text)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("settings %v, want %v", got, tc.want)
			}
			lines := strings.Split(text, "\n")
			for _, s := range settings {
				if !slices.Contains(lines, "# "+s) {
					t.Errorf("the conffile lacks %q, commented out", s)
				}
			}
		})
	}
}

func TestPackageControl(t *testing.T) {
	text := runPackage(t, "--show", "DEBIAN/control")
	fields := map[string]string{}
	for _, l := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(l, ": "); ok && !strings.HasPrefix(l, " ") {
			fields[k] = v
		}
	}
	for _, k := range []string{"Package", "Version", "Architecture", "Maintainer", "Depends", "Section", "Priority", "Description"} {
		if fields[k] == "" {
			t.Errorf("control has no %s field", k)
		}
	}
	if fields["Package"] != "socialweb" || fields["Architecture"] != "amd64" {
		t.Errorf("Package %q, Architecture %q", fields["Package"], fields["Architecture"])
	}
	var deps []string
	for _, d := range strings.Split(fields["Depends"], ",") {
		deps = append(deps, strings.Fields(d)[0])
	}
	// What serve execs (internal/nodenet, internal/nodes/qemu, internal/layershare).
	for _, want := range []string{"qemu-system-x86", "qemu-system-common", "iproute2", "nftables", "procps", "e2fsprogs", "ca-certificates"} {
		if !slices.Contains(deps, want) {
			t.Errorf("Depends %q lacks %s", fields["Depends"], want)
		}
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "golang") {
			t.Errorf("Depends has %s: the package must need no Go toolchain", d)
		}
	}
}
