package agent

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestPrewarmCommands(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"bridge", "host-local", "portmap", "macvlan"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name   string
		onPath []string
		want   []string // base names, in order
	}{
		{"runc, the shim and the sandbox's plugins", []string{"runc", "containerd-shim-runc-v2"},
			[]string{"containerd-shim-runc-v2", "runc", "bridge", "host-local", "portmap"}},
		{"what is missing is left out", nil, []string{"bridge", "host-local", "portmap"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			look := func(name string) (string, error) {
				if slices.Contains(tt.onPath, name) {
					return "/usr/bin/" + name, nil
				}
				return "", errors.New("not found")
			}
			var got []string
			for _, c := range prewarmCommands(dir, "", look) {
				got = append(got, filepath.Base(c.path))
				if filepath.Dir(c.path) == dir && !slices.Equal(c.env, []string{"CNI_COMMAND=VERSION"}) {
					t.Errorf("plugin %s runs with env %v, want CNI_COMMAND=VERSION", c.path, c.env)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("prewarm runs %v, want %v (loopback is not in the dir, macvlan is no sandbox's)", got, tt.want)
			}
		})
	}
}

func TestPrewarmRunsEachAndStopsAtTheClaim(t *testing.T) {
	dir := t.TempDir()
	mark := func(name string) prewarmCommand {
		return prewarmCommand{path: "/bin/sh", args: []string{"-c", "touch " + filepath.Join(dir, name)}}
	}
	fail := prewarmCommand{path: "/bin/sh", args: []string{"-c", "echo no; exit 3"}}
	if n, failed := prewarm(context.Background(), []prewarmCommand{mark("a"), mark("b"), fail, {path: "/nonexistent"}}); n != 3 || len(failed) != 1 {
		t.Errorf("prewarm ran %d to the end with failures %q, want 3 with the one that exited 3", n, failed)
	}
	for _, name := range []string{"a", "b"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("%s did not run: %v", name, err)
		}
	}

	ctx, claim := context.WithCancel(context.Background())
	slow := prewarmCommand{path: "/bin/sh", args: []string{"-c", "sleep 30"}}
	done := make(chan int, 1)
	go func() {
		n, _ := prewarm(ctx, []prewarmCommand{slow, mark("after")})
		done <- n
	}()
	time.Sleep(100 * time.Millisecond)
	t0 := time.Now()
	claim()
	select {
	case n := <-done:
		if n != 0 {
			t.Errorf("prewarm counted %d after the claim, want 0", n)
		}
		if took := time.Since(t0); took > 5*time.Second {
			t.Errorf("prewarm stopped %s after the claim", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("prewarm went on after the claim")
	}
	if _, err := os.Stat(filepath.Join(dir, "after")); err == nil {
		t.Error("a program ran after the claim")
	}
}

func TestPrewarmContainer(t *testing.T) {
	look := func(name string) (string, error) { return "/usr/sbin/" + name, nil }
	cmds := prewarmCommands(t.TempDir(), "/run/b", look)
	var runc [][]string
	for _, c := range cmds {
		if filepath.Base(c.path) == "runc" && !slices.Equal(c.args, []string{"--version"}) {
			runc = append(runc, c.args)
		}
	}
	want := [][]string{
		{"--root", "/run/b/state", "create", "--bundle", "/run/b", prewarmContainer},
		{"--root", "/run/b/state", "start", prewarmContainer},
		{"--root", "/run/b/state", "delete", "--force", prewarmContainer},
	}
	if !slices.EqualFunc(runc, want, slices.Equal[[]string]) {
		t.Errorf("runc steps %q, want %q", runc, want)
	}

	dir := t.TempDir()
	if err := writePrewarmBundle(dir); err != nil {
		t.Fatal(err)
	}
	if err := writePrewarmBundle(dir); err != nil {
		t.Fatalf("writing the bundle again: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Root == nil || spec.Root.Path != "rootfs" || !spec.Root.Readonly || spec.Process == nil || spec.Process.Args[0] != "/usr/bin/true" {
		t.Errorf("spec root %+v, process %+v", spec.Root, spec.Process)
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			t.Error("the throwaway container has a network namespace; it has no CNI to set one up")
		}
	}
	if l, err := os.Readlink(filepath.Join(dir, "rootfs", "lib64")); err != nil || l != "usr/lib64" {
		t.Errorf("rootfs/lib64 -> %q (%v), want usr/lib64", l, err)
	}
}
