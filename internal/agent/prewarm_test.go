package agent

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
		name    string
		onPath  []string
		runtime string
		want    []string // base names, in order
	}{
		{"the runtime, the shim and the sandbox's plugins", []string{"containerd-shim-runc-v2"}, "/usr/local/sbin/runc",
			[]string{"containerd-shim-runc-v2", "runc", "bridge", "host-local", "portmap"}},
		{"what is missing is left out", nil, "", []string{"bridge", "host-local", "portmap"}},
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
			for _, c := range prewarmCommands(dir, "", tt.runtime, look) {
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
	cmds := prewarmCommands(t.TempDir(), "/run/b", "/usr/local/sbin/runc", look)
	var runc [][]string
	for _, c := range cmds {
		if c.path == "/usr/local/sbin/runc" && !slices.Equal(c.args, []string{"--version"}) {
			runc = append(runc, c.args)
		}
	}
	want := [][]string{
		{"--root", "/run/b/state", "create", "--bundle", "/run/b", prewarmContainer},
		{"--root", "/run/b/state", "start", prewarmContainer},
		{"--root", "/run/b/state", "delete", "--force", prewarmContainer},
	}
	if !slices.EqualFunc(runc, want, slices.Equal[[]string]) {
		t.Errorf("runtime steps %q, want %q", runc, want)
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

func TestPrewarmNetwork(t *testing.T) {
	full := t.TempDir()
	for _, name := range []string{"loopback", "bridge", "host-local"} {
		if err := os.WriteFile(filepath.Join(full, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	noBridge := t.TempDir()
	if err := os.WriteFile(filepath.Join(noBridge, "loopback"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	withIP := func(name string) (string, error) {
		if name == "ip" {
			return "/usr/sbin/ip", nil
		}
		return "", errors.New("not found")
	}
	noIP := func(string) (string, error) { return "", errors.New("not found") }
	// step is what one command does, as "prog CNI_COMMAND ifname" or "prog args".
	step := func(c prewarmCommand) string {
		s := filepath.Base(c.path)
		for _, e := range c.env {
			if v, ok := strings.CutPrefix(e, "CNI_COMMAND="); ok {
				s += " " + v
			}
			if v, ok := strings.CutPrefix(e, "CNI_IFNAME="); ok {
				s += " " + v
			}
		}
		return strings.Join(append([]string{s}, c.args...), " ")
	}
	tests := []struct {
		name string
		dir  string
		look func(string) (string, error)
		want []string
	}{
		{"a sandbox's network up and down, then nothing left", full, withIP, []string{
			"ip netns add " + prewarmNetns, "loopback ADD lo", "bridge ADD eth0", "loopback DEL lo",
			"bridge DEL eth0", "ip link delete " + prewarmBridge, "ip netns delete " + prewarmNetns,
		}},
		{"no ip to make a namespace with", full, noIP, nil},
		{"no bridge plugin", noBridge, withIP, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, c := range prewarmNetworkCommands(tt.dir, tt.look) {
				got = append(got, step(c))
				if strings.Contains(step(c), " ADD") || strings.Contains(step(c), " DEL") {
					if !slices.Contains(c.env, "CNI_NETNS=/run/netns/"+prewarmNetns) || !slices.Contains(c.env, "CNI_PATH="+tt.dir) {
						t.Errorf("%s: env %v, want the throwaway namespace and CNI_PATH=%s", step(c), c.env, tt.dir)
					}
					var conf map[string]any
					if err := json.Unmarshal([]byte(c.stdin), &conf); err != nil {
						t.Errorf("%s: stdin is not a CNI configuration: %v: %s", step(c), err, c.stdin)
					}
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("steps\n%q\nwant\n%q", got, tt.want)
			}
		})
	}

	// The bridge is never the node's, and the leases stay off the node's CNI state.
	var conf struct {
		Bridge string `json:"bridge"`
		IPMasq bool   `json:"ipMasq"`
		IPAM   struct {
			Type    string                `json:"type"`
			DataDir string                `json:"dataDir"`
			Ranges  [][]map[string]string `json:"ranges"`
		} `json:"ipam"`
	}
	if err := json.Unmarshal([]byte(prewarmBridgeConf()), &conf); err != nil {
		t.Fatal(err)
	}
	if conf.Bridge == "cni0" || conf.Bridge == "" || !conf.IPMasq || conf.IPAM.Type != "host-local" ||
		!strings.HasPrefix(conf.IPAM.DataDir, "/run/") || conf.IPAM.Ranges[0][0]["subnet"] != prewarmSubnet {
		t.Errorf("throwaway bridge configuration %+v", conf)
	}
}

func TestPrewarmFeedsStdin(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "got")
	n, failed := prewarm(context.Background(), []prewarmCommand{{path: "/bin/sh", args: []string{"-c", "cat > " + out}, stdin: `{"type":"bridge"}`}})
	if b, err := os.ReadFile(out); n != 1 || len(failed) != 0 || err != nil || string(b) != `{"type":"bridge"}` {
		t.Errorf("ran %d, failed %q; the command read %q (%v), want the configuration", n, failed, b, err)
	}
}
