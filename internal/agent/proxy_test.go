package agent

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestWaitForStart(t *testing.T) {
	for _, tc := range []struct {
		in      string
		wantErr bool
	}{
		{"start\n", false},
		{"\n", false},
		{"", true},      // the agent closed stdin: no go-ahead
		{"start", true}, // no whole line
		{"start\nmore", false},
	} {
		if err := waitForStart(strings.NewReader(tc.in)); (err != nil) != tc.wantErr {
			t.Errorf("waitForStart(%q) = %v, want error %v", tc.in, err, tc.wantErr)
		}
	}
}

// A process started ahead runs only once released, with kube-proxy's arguments and
// --wait-start; one that died before is reported, not waited for.
func TestProxyPrestart(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	self := filepath.Join(dir, "self")
	script := "#!/bin/sh\nread line || exit 9\necho \"$line $*\" > " + out + "\nexit 3\n"
	if err := os.WriteFile(self, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := startProxyPrestart(self, "/p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("the process ran before it was released: %v", err)
	}
	var exit *exec.ExitError
	if err := p.run(); !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("run = %v, want the process's exit status 3", err)
	}
	if b, _ := os.ReadFile(out); string(b) != "start kube-proxy --config /p.yaml --wait-start\n" {
		t.Errorf("the process saw %q", b)
	}

	// Died before its release: run says so.
	if err := os.WriteFile(self, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err = startProxyPrestart(self, "/p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := p.run(); err == nil || !strings.Contains(err.Error(), "releasing") {
		t.Errorf("run of a process that had exited = %v, want a release error", err)
	}
}

// kube-proxy's PATH finds nft and nothing else: not iptables, ip6tables or modprobe,
// which its start-up clean-up would run. A restart makes it again; no nft is an error
// that names the package, and makes no directory.
func TestNftOnlyPath(t *testing.T) {
	sbin := t.TempDir()
	for _, name := range []string{"nft", "iptables", "ip6tables", "modprobe"} {
		if err := os.WriteFile(filepath.Join(sbin, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	found := func(f string) (string, error) { return filepath.Join(sbin, f), nil }
	missing := func(f string) (string, error) { return "", exec.ErrNotFound }
	for _, tc := range []struct {
		name     string
		lookPath func(string) (string, error)
		runs     int
		wantErr  string
	}{
		{"nft", found, 1, ""},
		{"again after a restart", found, 2, ""},
		{"no nft", missing, 1, "nftables package"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "bin")
			var path string
			var err error
			for range tc.runs {
				path, err = nftOnlyPath(dir, tc.lookPath)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("nftOnlyPath = %q, %v; want an error saying %q", path, err, tc.wantErr)
				}
				if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s made without nft: %v", dir, err)
				}
				return
			}
			if err != nil || path != dir {
				t.Fatalf("nftOnlyPath = %q, %v; want %q", path, err, dir)
			}
			t.Setenv("PATH", path)
			if got, err := exec.LookPath("nft"); err != nil || got != filepath.Join(dir, "nft") {
				t.Errorf("LookPath(nft) on kube-proxy's PATH = %q, %v", got, err)
			}
			if target, err := os.Readlink(filepath.Join(dir, "nft")); err != nil || target != filepath.Join(sbin, "nft") {
				t.Errorf("nft links to %q (%v), want the node's nft", target, err)
			}
			for _, name := range []string{"iptables", "ip6tables", "modprobe"} {
				if got, err := exec.LookPath(name); err == nil {
					t.Errorf("kube-proxy's PATH finds %s at %s", name, got)
				}
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 1 {
				t.Errorf("kube-proxy's PATH holds %d entries, want nft alone", len(ents))
			}
		})
	}
}
