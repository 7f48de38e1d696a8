package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
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
			for _, c := range prewarmCommands(dir, look) {
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
	if n := prewarm(context.Background(), []prewarmCommand{mark("a"), mark("b"), {path: "/nonexistent"}}); n != 2 {
		t.Errorf("prewarm ran %d to the end, want 2", n)
	}
	for _, name := range []string{"a", "b"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("%s did not run: %v", name, err)
		}
	}

	ctx, claim := context.WithCancel(context.Background())
	slow := prewarmCommand{path: "/bin/sh", args: []string{"-c", "sleep 30"}}
	done := make(chan int, 1)
	go func() { done <- prewarm(ctx, []prewarmCommand{slow, mark("after")}) }()
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
