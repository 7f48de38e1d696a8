package guestbuild

import (
	"context"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/agent"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/nodeimage"
)

func TestVersionLDFlags(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr bool
	}{
		{"v1.37.2", []string{
			"-X k8s.io/component-base/version.gitVersion=v1.37.2",
			"-X k8s.io/component-base/version.gitMajor=1",
			"-X k8s.io/component-base/version.gitMinor=37",
			"-X k8s.io/client-go/pkg/version.gitVersion=v1.37.2",
			"-X k8s.io/client-go/pkg/version.gitTreeState=clean",
		}, false},
		{"v1.38.0-alpha.1", []string{"gitMinor=38 ", "gitVersion=v1.38.0-alpha.1"}, false},
		{"1.37.2", nil, true},
		{"v1", nil, true},
		{"", nil, true},
	}
	for _, tt := range tests {
		got, err := VersionLDFlags(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("VersionLDFlags(%q) err = %v", tt.in, err)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(got+" ", w) {
				t.Errorf("VersionLDFlags(%q) = %q lacks %q", tt.in, got, w)
			}
		}
	}
}

func TestCheckStatic(t *testing.T) {
	dir := t.TempDir()
	notELF := filepath.Join(dir, "script")
	os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755)
	if err := CheckStatic(notELF); err == nil {
		t.Error("a shell script passed as static")
	}
	// A dynamically linked host program has PT_INTERP.
	for _, p := range []string{"/bin/ls", "/usr/bin/env"} {
		if hasInterp(t, p) {
			if err := CheckStatic(p); err == nil || !strings.Contains(err.Error(), "PT_INTERP") {
				t.Errorf("CheckStatic(%s) = %v, want a PT_INTERP error", p, err)
			}
			break
		}
	}
}

func hasInterp(t *testing.T, file string) bool {
	t.Helper()
	f, err := elf.Open(file)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}

// TestAgentIsStatic builds cmd/socialweb-node as a node image would carry it
// and checks it is a static executable that reports the Kubernetes version.
// Cold, this compiles the kubelet (10-15 minutes on two cores).
func TestAgentIsStatic(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the agent build")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	out := filepath.Join(t.TempDir(), "socialweb-node")
	t0 := time.Now()
	if err := (Builder{Progress: func(m string) { t.Log(m) }}).Agent(ctx, out); err != nil {
		t.Fatal(err)
	}
	t.Logf("agent built in %s", time.Since(t0).Round(time.Second))
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("%s has PT_INTERP: it needs a dynamic loader", out)
		}
	}
	if st, _ := os.Stat(out); st != nil {
		t.Logf("agent is %d MiB", st.Size()>>20)
	}
	v, err := exec.Command(out, "-version").CombinedOutput()
	if err != nil {
		t.Fatalf("-version: %v: %s", err, v)
	}
	if !strings.Contains(string(v), "v1.37.") {
		t.Errorf("-version = %q, want the Kubernetes version stamped in", v)
	}
	// Not PID 1: it refuses to run as the agent.
	if out, err := exec.Command(out).CombinedOutput(); err == nil || !strings.Contains(string(out), "not PID 1") {
		t.Errorf("running outside a VM: %v: %s", err, out)
	}
}

// CacheDir is where tests keep containerd builds between runs.
func testCacheDir() string { return filepath.Join(nodeimage.DefaultCacheDir(), "guestbuild") }

// TestContainerdBuildsStatic builds containerd 2.x from the module proxy
// (cached between runs) and checks the agent's generated configuration is
// what that containerd reads: the dumped effective configuration carries
// the sandbox image, registry hosts directory and CNI template.
func TestContainerdBuildsStatic(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the containerd build")
	}
	if _, err := exec.LookPath("go"); err != nil {
		livetest.Skip(t, "no go command")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	bins, err := (Builder{Progress: func(m string) { t.Log(m) }}).Containerd(ctx, testCacheDir(), DefaultContainerdVersion)
	if err != nil {
		t.Fatal(err)
	}
	for g, h := range bins.ExtraFiles() {
		if err := CheckStatic(h); err != nil {
			t.Errorf("%s: %v", g, err)
		}
	}
	v, err := exec.Command(bins.Containerd, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(v), DefaultContainerdVersion) {
		t.Fatalf("containerd --version: %v: %s", err, v)
	}
	if major, err := agent.ContainerdMajor(string(v)); err != nil || major != 2 {
		t.Errorf("the agent reads major %d (%v) from %q", major, err, v)
	}
	if major, err := agent.ContainerdMajorOf(bins.Containerd); err != nil || major != 2 {
		t.Errorf("the agent reads major %d (%v) from the build info of %s", major, err, bins.Containerd)
	}
	// Debian's 1.6, as the debootstrap layer has it, when there is one.
	debian, _ := filepath.Glob(filepath.Join(nodeimage.DefaultCacheDir(), "layers/debootstrap/*/tree/usr/bin/containerd"))
	for _, d := range debian {
		if major, err := agent.ContainerdMajorOf(d); err != nil || major != 1 {
			t.Errorf("the agent reads major %d (%v) from the build info of %s", major, err, d)
		}
	}

	l := agent.DefaultLayout()
	cfg, err := agent.ContainerdConfig(l, agent.ContainerdOptions{Major: 2, SandboxImage: "registry.k8s.io/pause:3.10", RuntimeBinary: GuestRunc})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(file, cfg, 0o644)
	dump, err := exec.Command(bins.Containerd, "--config", file, "config", "dump").Output()
	if err != nil {
		t.Fatalf("containerd config dump: %v", err)
	}
	for _, want := range []string{
		"sandbox = 'registry.k8s.io/pause:3.10'",
		"config_path = '" + l.ContainerdCerts + "'",
		"conf_template = '" + l.CNITemplate + "'",
		"bin_dirs = ['" + l.CNIBinDir + "']",
		"conf_dir = '" + l.CNIConfDir + "'",
		"address = '" + l.ContainerdSocket + "'",
		"SystemdCgroup = false",
		"BinaryName = '" + GuestRunc + "'",
	} {
		if !strings.Contains(string(dump), want) {
			t.Errorf("containerd's effective config lacks %q:\n%s", want, dump)
		}
	}
	// Cached: the second call builds nothing.
	t0 := time.Now()
	again, err := (Builder{}).Containerd(ctx, testCacheDir(), DefaultContainerdVersion)
	if err != nil || again != bins || time.Since(t0) > 30*time.Second {
		t.Errorf("second Containerd: %+v, %v in %s; want the cached build", again, err, time.Since(t0))
	}
}

// TestRuncBuildsStatic builds the guests' runc (cached between runs): static, not
// position independent, the release asked for, with seccomp.
func TestRuncBuildsStatic(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the runc build")
	}
	if _, err := exec.LookPath("go"); err != nil {
		livetest.Skip(t, "no go command")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	runc, err := (Builder{Progress: func(m string) { t.Log(m) }}).Runc(ctx, testCacheDir(), DefaultRuncVersion)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckStatic(runc); err != nil {
		t.Error(err)
	}
	if f, err := elf.Open(runc); err != nil || f.Type != elf.ET_EXEC {
		t.Errorf("%s: %v, %v; want a fixed-address executable (ET_EXEC)", runc, f, err)
	}
	v, err := exec.Command(runc, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(v), "runc version "+strings.TrimPrefix(DefaultRuncVersion, "v")) {
		t.Fatalf("runc --version: %v: %s", err, v)
	}
	feat, err := exec.Command(runc, "features").Output()
	if err != nil {
		t.Fatalf("runc features: %v", err)
	}
	var fs struct {
		Linux struct {
			Seccomp struct {
				Enabled *bool `json:"enabled"`
			} `json:"seccomp"`
		} `json:"linux"`
	}
	if err := json.Unmarshal(feat, &fs); err != nil || fs.Linux.Seccomp.Enabled == nil || !*fs.Linux.Seccomp.Enabled {
		t.Errorf("runc features: seccomp not enabled (%v):\n%s", err, feat)
	}
	t0 := time.Now()
	again, err := (Builder{}).Runc(ctx, testCacheDir(), DefaultRuncVersion)
	if err != nil || again != runc || time.Since(t0) > 30*time.Second {
		t.Errorf("second Runc: %s, %v in %s; want the cached build", again, err, time.Since(t0))
	}
	if _, err := (Builder{}).Runc(ctx, testCacheDir(), "v2.0.0"); err == nil || !strings.Contains(err.Error(), "want a 1.x release") {
		t.Errorf("Runc v2.0.0: %v", err)
	}
}
