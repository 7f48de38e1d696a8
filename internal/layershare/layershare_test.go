package layershare

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// TestMain makes the test binary the wrapper when started as one, as the socialweb
// binary is in production.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == WrapperCommand {
		err := Main(os.Args[2:])
		fmt.Fprintln(os.Stderr, err)
		os.Exit(111)
	}
	os.Exit(m.Run())
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		livetest.Skip(t, "a mount namespace and a read-only bind mount need root")
	}
}

// hostMounts reports whether the host's mount table mentions dir.
func hostMounts(t *testing.T, dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Contains(b, []byte(" "+dir+" "))
}

// TestReadOnly runs shell commands through the wrapper, as root, in place of virtiofsd:
// every write to the exported tree fails with EROFS, reads work, and nothing of the
// wrapper's mount is left on the host.
func TestReadOnly(t *testing.T) {
	needRoot(t)
	tests := []struct {
		name   string
		script string // $D is the exported dir; it holds file f and dir d
		ok     bool
	}{
		{"read a file", `cat "$D/f"`, true},
		{"list a dir", `ls "$D/d"`, true},
		{"create a file", `touch "$D/new"`, false},
		{"create in a subdir", `touch "$D/d/new"`, false},
		{"append to a file", `echo more >>"$D/f"`, false},
		{"remove a file", `rm -f "$D/f"`, false},
		{"make a dir", `mkdir "$D/m"`, false},
		{"chmod", `chmod 777 "$D/f"`, false},
		{"chown", `chown 1:1 "$D/f"`, false},
		{"make a device node", `mknod "$D/dev" c 1 3`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "f"), []byte("content\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
				t.Fatal(err)
			}
			cmd := wrapped(os.Args[0], dir, "/nowhere", []string{"sh", "-c", tt.script})
			cmd.Env = append(cmd.Env, "D="+dir)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			if tt.ok != (err == nil) {
				t.Fatalf("%s: %v, want ok=%v; output: %s", tt.script, err, tt.ok, out.String())
			}
			if !tt.ok && !strings.Contains(out.String(), "Read-only file system") {
				t.Errorf("the write failed, but not with EROFS: %s", out.String())
			}
			if b, _ := os.ReadFile(filepath.Join(dir, "f")); string(b) != "content\n" {
				t.Errorf("the file changed: %q", b)
			}
			ents, _ := os.ReadDir(dir)
			if len(ents) != 2 {
				t.Errorf("the dir holds %d entries, want its 2", len(ents))
			}
			if hostMounts(t, dir) {
				t.Error("the read-only bind is visible on the host")
			}
			if err := os.WriteFile(filepath.Join(dir, "host"), nil, 0o644); err != nil {
				t.Errorf("the host cannot write the dir any more: %v", err)
			}
		})
	}
}

func TestMainRefuses(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"no source", []string{"--", "sh"}},
		{"relative source", []string{"--source", "rel", "--", "sh"}},
		{"no program", []string{"--source", "/tmp", "--"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := Main(tt.args); err == nil || !strings.Contains(err.Error(), "--source") {
				t.Errorf("Main(%q): %v, want an error saying what the arguments should be", tt.args, err)
			}
		})
	}
}

// TestVirtiofsd starts the real virtiofsd through the wrapper: it listens on its socket,
// its view of the store is read-only, Owner names its node, and once it is killed no
// mount is left.
func TestVirtiofsd(t *testing.T) {
	needRoot(t)
	if _, err := os.Stat(DefaultVirtiofsd); err != nil {
		livetest.Skip(t, "no "+DefaultVirtiofsd+": apt-get install qemu-system-common")
	}
	dir, node := t.TempDir(), t.TempDir()
	c := Config{Dir: dir, Executable: os.Args[0]}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	cmd := c.Command(node, "virtiofs.sock")
	cmd.Dir = node
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	sock := filepath.Join(node, "virtiofs.sock")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if st, err := os.Stat(sock); err == nil && st.Mode()&os.ModeSocket != 0 {
			break
		}
		select {
		case <-done:
			t.Fatalf("virtiofsd exited before listening: %v: %s", waitErr, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no socket after 10s: %s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	pid := cmd.Process.Pid
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if exe != DefaultVirtiofsd {
		t.Errorf("pid %d runs %s, want virtiofsd itself (the wrapper execs it)", pid, exe)
	}
	if got := Owner(pid); got != node {
		t.Errorf("Owner(%d) = %q, want %q", pid, got, node)
	}
	mi, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	var line string
	for _, l := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(l); len(f) > 5 && f[4] == dir {
			line = l
		}
	}
	if line == "" || !strings.HasPrefix(strings.Fields(line)[5], "ro,") {
		t.Errorf("virtiofsd's mount of %s is not read-only: %q", dir, line)
	}
	if hostMounts(t, dir) {
		t.Error("the bind is visible on the host while virtiofsd runs")
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("virtiofsd did not exit on SIGTERM")
	}
	if hostMounts(t, dir) {
		t.Error("a mount of the store is left on the host")
	}
	if err := os.WriteFile(filepath.Join(dir, "x"), nil, 0o644); err != nil && !errors.Is(err, os.ErrExist) {
		t.Errorf("the host cannot write the store: %v", err)
	}
}

// TestVirtiofsdsSideBySide starts two virtiofsd for two nodes at once, each with the
// same socket name in its own dir (as the provider does): both must listen (each locks
// its pid file in a tmpfs of its own), and no pid file is left on the host's /run.
func TestVirtiofsdsSideBySide(t *testing.T) {
	needRoot(t)
	if _, err := os.Stat(DefaultVirtiofsd); err != nil {
		livetest.Skip(t, "no "+DefaultVirtiofsd+": apt-get install qemu-system-common")
	}
	dir := t.TempDir()
	c := Config{Dir: dir, Executable: os.Args[0]}
	before, _ := os.ReadDir(pidDir)
	for i := range 2 {
		node := t.TempDir()
		cmd := c.Command(node, "virtiofs.sock")
		cmd.Dir = node
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
		sock := filepath.Join(node, "virtiofs.sock")
		livetest.Eventually(t, 10*time.Second, 10*time.Millisecond, fmt.Sprintf("virtiofsd %d to listen", i), func() bool {
			select {
			case <-done:
				t.Fatalf("virtiofsd %d exited before listening: %s", i, out.String())
			default:
			}
			st, err := os.Stat(sock)
			return err == nil && st.Mode()&os.ModeSocket != 0
		})
	}
	after, _ := os.ReadDir(pidDir)
	if len(after) > len(before) {
		t.Errorf("pid files left on the host's %s: %d before, %d after", pidDir, len(before), len(after))
	}
}
