// Package registrytest runs a private containerd whose only registry configuration is a
// certs.d/_default/hosts.toml naming a test registry, the way a socialweb node is set up,
// for end-to-end pull tests.
package registrytest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// Containerd is a running private containerd.
type Containerd struct {
	Ctr       string // ctr binary
	Sock      string // containerd's socket
	HostsDir  string // the certs.d directory to pass as --hosts-dir
	Namespace string
	log       bytes.Buffer
}

// bins finds containerd and ctr in $SOCIALWEB_CONTAINERD_DIR (for example the usr/bin of
// an unpacked node rootfs) or on PATH. ok is false when they are not there: containerd is
// not a host prerequisite of socialweb (it runs in the nodes), only of these tests, so
// callers skip unless SOCIALWEB_REQUIRE_LIVE=1.
func bins() (containerd, ctr string, ok bool) {
	if d := os.Getenv("SOCIALWEB_CONTAINERD_DIR"); d != "" {
		containerd, ctr = filepath.Join(d, "containerd"), filepath.Join(d, "ctr")
		_, e1 := os.Stat(containerd)
		_, e2 := os.Stat(ctr)
		return containerd, ctr, e1 == nil && e2 == nil
	}
	containerd, e1 := exec.LookPath("containerd")
	ctr, e2 := exec.LookPath("ctr")
	return containerd, ctr, e1 == nil && e2 == nil
}

// Start runs containerd (root, state and socket in a test directory, no CRI plugin) with
// registryAddr (host:port, plain HTTP) as the mirror of every registry. It skips t when
// containerd and ctr are not installed or the test is not root, and stops containerd when
// t ends.
func Start(t testing.TB, registryAddr string) *Containerd {
	t.Helper()
	containerd, ctr, ok := bins()
	if !ok {
		livetest.Skip(t, "containerd and ctr are not installed (hack/deps installs Debian's; or set SOCIALWEB_CONTAINERD_DIR to a directory holding them, e.g. a node rootfs's usr/bin)")
	}
	if os.Geteuid() != 0 {
		livetest.Skip(t, "running containerd needs root")
	}
	// A short directory: the socket path must fit in 108 bytes.
	dir, err := os.MkdirTemp("", "swctrd-")
	if err != nil {
		t.Fatal(err)
	}
	c := &Containerd{Ctr: ctr, Sock: filepath.Join(dir, "c.sock"), HostsDir: filepath.Join(dir, "certs.d"), Namespace: "socialweb-test"}
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(c.HostsDir, "_default"), 0o755))
	must(os.WriteFile(filepath.Join(c.HostsDir, "_default", "hosts.toml"),
		[]byte(fmt.Sprintf("[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", registryAddr)), 0o644))
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = %q
[ttrpc]
  address = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.Sock, c.Sock+".ttrpc")
	must(os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o644))
	cmd := exec.Command(containerd, "--config", filepath.Join(dir, "config.toml"))
	// The shims and runc are found on PATH: next to containerd, and ../sbin of it.
	bin := filepath.Dir(containerd)
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+filepath.Join(bin, "..", "sbin")+":"+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = &c.log, &c.log
	must(cmd.Start())
	t.Cleanup(func() {
		// Tasks first, so no shim outlives the test.
		out, _ := c.Run("tasks", "ls", "-q")
		for _, id := range strings.Fields(out) {
			c.Run("tasks", "kill", "-s", "SIGKILL", id)
			c.Run("tasks", "delete", "-f", id)
		}
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("containerd log:\n%s", c.log.String())
		}
		os.RemoveAll(dir)
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := c.Run("version"); err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd did not come up:\n%s", c.log.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Run runs ctr against c and returns its combined output.
func (c *Containerd) Run(args ...string) (string, error) {
	out, err := exec.Command(c.Ctr, append([]string{"--address", c.Sock, "--namespace", c.Namespace}, args...)...).CombinedOutput()
	return string(out), err
}

// Pull pulls ref through the registry (native snapshotter: no mounts needed to unpack).
func (c *Containerd) Pull(t testing.TB, ref string) {
	t.Helper()
	start := time.Now()
	if out, err := c.Run("images", "pull", "--hosts-dir", c.HostsDir, "--snapshotter", "native", ref); err != nil {
		t.Fatalf("ctr images pull %s: %v\n%s", ref, err, out)
	}
	t.Logf("containerd pulled %s in %v", ref, time.Since(start).Round(time.Millisecond))
}
