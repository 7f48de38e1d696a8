package images

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// BusyboxPackage is the Debian package the busybox image is made from.
const BusyboxPackage = "busybox-static"

type busyboxIn struct {
	Package string `json:"package"`
	Version string `json:"version"`
}

var (
	appletRE   = regexp.MustCompile(`^[a-zA-Z0-9_.\[-]+$`)
	defaultEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
)

func run(ctx context.Context, dir string, name string, args ...string) ([]byte, error) {
	if _, err := exec.LookPath(name); err != nil {
		return nil, fmt.Errorf("images: %w: %v", errNoTool, err)
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("images: %s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// BashPackage is the Debian package BusyboxBash's /bin/sh comes from.
const BashPackage = "bash-static"

type busyboxBashIn struct {
	Busybox busyboxIn `json:"busybox"`
	Bash    busyboxIn `json:"bash"`
}

func busyboxBashInputs(ctx context.Context) (busyboxBashIn, error) {
	bb, err := busyboxInputs(ctx)
	if err != nil {
		return busyboxBashIn{}, err
	}
	v, err := aptCandidate(ctx, BashPackage)
	if err != nil {
		return busyboxBashIn{}, err
	}
	return busyboxBashIn{Busybox: bb, Bash: busyboxIn{Package: BashPackage, Version: v}}, nil
}

// busyboxBashImage is the busybox image with bash-static as /bin/sh. Debian builds
// busybox's ash with a patch (temp-deb-installer-hack) that drops environment variables
// whose names are not shell identifiers ("data-1", "1-x") instead of passing them to
// children, as upstream's ash (and so the busybox image the Kubernetes e2e suite uses)
// does; the conformance tests of envFrom prefixes run `sh -c env` and look for them.
// bash passes them on, also as sh.
func busyboxBashImage(ctx context.Context, work string, in busyboxBashIn, opts Options) (imageSpec, error) {
	files, err := busyboxFiles(ctx, work, in.Busybox, opts)
	if err != nil {
		return imageSpec{}, err
	}
	deb, err := fetchDeb(ctx, in.Bash.Package, in.Bash.Version, opts)
	if err != nil {
		return imageSpec{}, err
	}
	tree := filepath.Join(work, "bash-deb")
	if _, err := run(ctx, "", "dpkg-deb", "-x", deb, tree); err != nil {
		return imageSpec{}, err
	}
	bash, err := os.ReadFile(filepath.Join(tree, "bin", "bash-static"))
	if err != nil {
		return imageSpec{}, fmt.Errorf("images: %s %s has no /bin/bash-static: %w", in.Bash.Package, in.Bash.Version, err)
	}
	replaced := false
	for i := range files {
		if files[i].path == "bin/sh" {
			files[i] = tarFile{path: "bin/sh", mode: 0o755, typ: tar.TypeReg, data: bash}
			replaced = true
		}
	}
	if !replaced {
		return imageSpec{}, fmt.Errorf("images: the busybox layer has no bin/sh to replace")
	}
	files = append(files, tarFile{path: "bin/bash", mode: 0o777, typ: tar.TypeSymlink, link: "sh"})
	layer, err := layerTar(files)
	if err != nil {
		return imageSpec{}, err
	}
	return imageSpec{
		layers: []blob{layer},
		history: []string{fmt.Sprintf("socialweb images: busybox from Debian %s %s, /bin/sh from %s %s",
			in.Busybox.Package, in.Busybox.Version, in.Bash.Package, in.Bash.Version)},
		config: containerConfig{
			Env: defaultEnv,
			Cmd: []string{"sh"},
			Labels: map[string]string{"computer.socialweb.image.source": "debian " + in.Busybox.Package + " " + in.Busybox.Version +
				", /bin/sh: " + in.Bash.Package + " " + in.Bash.Version},
		},
	}, nil
}

// busyboxInputs asks apt which busybox-static version it would fetch (the host's apt lists
// must be current: apt-get update).
func busyboxInputs(ctx context.Context) (busyboxIn, error) {
	v, err := aptCandidate(ctx, BusyboxPackage)
	if err != nil {
		return busyboxIn{}, err
	}
	return busyboxIn{Package: BusyboxPackage, Version: v}, nil
}

// aptCandidate is the version of pkg apt would fetch.
func aptCandidate(ctx context.Context, pkg string) (string, error) {
	out, err := run(ctx, "", "apt-cache", "policy", pkg)
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "Candidate:"); ok {
			v = strings.TrimSpace(v)
			if v == "" || v == "(none)" {
				break
			}
			return v, nil
		}
	}
	return "", fmt.Errorf("images: apt has no candidate version of %s: run apt-get update on the host", pkg)
}

// fetchDeb returns the cached .deb of pkg=version, downloading it with apt-get download
// when it is not cached yet.
func fetchDeb(ctx context.Context, pkg, version string, opts Options) (string, error) {
	dir := filepath.Join(opts.cacheDir(), "debs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("images: %w", err)
	}
	final := filepath.Join(dir, pkg+"_"+strings.ReplaceAll(version, ":", "%3a")+".deb")
	if _, err := os.Stat(final); err == nil {
		out, err := run(ctx, "", "dpkg-deb", "-f", final, "Package", "Version")
		if err == nil && strings.Contains(string(out), "Package: "+pkg+"\n") && strings.Contains(string(out), "Version: "+version+"\n") {
			return final, nil
		}
		os.Remove(final)
	}
	tmp, err := os.MkdirTemp(dir, ".download-")
	if err != nil {
		return "", fmt.Errorf("images: %w", err)
	}
	defer os.RemoveAll(tmp)
	args := []string{"download", "-q"}
	if os.Geteuid() == 0 {
		// apt drops to the _apt user to download, which cannot write into root's cache.
		args = append(args, "-o", "APT::Sandbox::User=root")
	}
	opts.log().Info("downloading package", "package", pkg, "version", version)
	if _, err := run(ctx, tmp, "apt-get", append(args, pkg+"="+version)...); err != nil {
		return "", err
	}
	got, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(got) != 1 {
		return "", fmt.Errorf("images: apt-get download %s=%s left %d .deb files", pkg, version, len(got))
	}
	if err := os.Rename(got[0], final); err != nil {
		return "", fmt.Errorf("images: %w", err)
	}
	return final, nil
}

// busyboxFiles unpacks busybox-static and returns the files of the busybox layer.
func busyboxFiles(ctx context.Context, work string, in busyboxIn, opts Options) ([]tarFile, error) {
	deb, err := fetchDeb(ctx, in.Package, in.Version, opts)
	if err != nil {
		return nil, err
	}
	tree := filepath.Join(work, "deb")
	if _, err := run(ctx, "", "dpkg-deb", "-x", deb, tree); err != nil {
		return nil, err
	}
	bin := filepath.Join(tree, "bin", "busybox")
	bb, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("images: %s %s has no /bin/busybox: %w", in.Package, in.Version, err)
	}
	out, err := run(ctx, "", bin, "--list")
	if err != nil {
		return nil, err
	}
	files := []tarFile{
		{path: "bin/busybox", mode: 0o755, typ: tar.TypeReg, data: bb},
		{path: "etc", mode: 0o755, typ: tar.TypeDir},
		{path: "etc/passwd", mode: 0o644, typ: tar.TypeReg, data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n")},
		{path: "etc/group", mode: 0o644, typ: tar.TypeReg, data: []byte("root:x:0:\nnogroup:x:65534:\n")},
		{path: "home", mode: 0o755, typ: tar.TypeDir},
		{path: "root", mode: 0o700, typ: tar.TypeDir},
		{path: "tmp", mode: 0o1777, typ: tar.TypeDir},
		{path: "usr/bin/env", mode: 0o777, typ: tar.TypeSymlink, link: "/bin/busybox"},
		{path: "var", mode: 0o755, typ: tar.TypeDir},
	}
	var applets []string
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && appletRE.MatchString(a) {
			applets = append(applets, a)
		}
	}
	sort.Strings(applets)
	if !contains(applets, "sh") {
		return nil, fmt.Errorf("images: %s %s: busybox --list has no sh applet", in.Package, in.Version)
	}
	for _, a := range applets {
		files = append(files, tarFile{path: "bin/" + a, mode: 0o777, typ: tar.TypeSymlink, link: "busybox"})
	}
	return files, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func busyboxImage(ctx context.Context, work string, in busyboxIn, opts Options) (imageSpec, error) {
	files, err := busyboxFiles(ctx, work, in, opts)
	if err != nil {
		return imageSpec{}, err
	}
	layer, err := layerTar(files)
	if err != nil {
		return imageSpec{}, err
	}
	return imageSpec{
		layers:  []blob{layer},
		history: []string{fmt.Sprintf("socialweb images: busybox from Debian %s %s", in.Package, in.Version)},
		config: containerConfig{
			Env:    defaultEnv,
			Cmd:    []string{"sh"},
			Labels: map[string]string{"computer.socialweb.image.source": "debian " + in.Package + " " + in.Version},
		},
	}, nil
}
