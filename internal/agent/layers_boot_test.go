package agent_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/layerstore"
	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// virtiofsd is Debian's (qemu 7.2's C) virtio-fs daemon.
const virtiofsd = "/usr/lib/qemu/virtiofsd"

// TestAgentUsesTheLayerShare boots a node with a virtio-fs device tagged
// socialweb-layers, served by virtiofsd from a share prepared here, the way
// the host exports its layer store: the agent must mount it, start the
// socialweb snapshotter, and containerd must come up with it as its CRI
// snapshotter (a CRI plugin that cannot find its snapshotter does not load,
// and the kubelet then cannot start).
//
// virtiofsd runs with -o xattr and -o modcaps=+sys_admin: without
// CAP_SYS_ADMIN it cannot read trusted.* xattrs, and the layers' opaque
// directories (trusted.overlay.opaque) silently stop hiding the lower
// layers. cache=auto (virtiofsd's default, 1 s timeouts) rather than always,
// so a node that looked for a layer before the host prepared it sees it once
// it is there. qemu needs shared guest memory and a modern virtio-mmio transport
// (vhost-user refuses legacy devices).
func TestAgentUsesTheLayerShare(t *testing.T) {
	if _, err := os.Stat(virtiofsd); err != nil {
		livetest.Skip(t, virtiofsd+" is not installed (Debian package qemu-system-common)")
	}
	if os.Geteuid() != 0 {
		livetest.Skip(t, "needs root (virtiofsd, the node image)")
	}
	dir := t.TempDir()
	share := filepath.Join(dir, "share")
	// The host's store, for its xattr probe, which the agent checks through the share.
	if _, err := layerstore.Open(share); err != nil {
		t.Fatal(err)
	}
	digest := "sha256:" + strings.Repeat("ab", 32)
	layer := filepath.Join(share, "sha256", strings.TrimPrefix(digest, "sha256:"))
	if err := os.MkdirAll(filepath.Join(layer, "fs", "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	ready, _ := json.Marshal(map[string]any{"digest": digest, "diffID": digest, "size": 1, "unpackedBytes": 1, "files": 1})
	if err := os.WriteFile(filepath.Join(layer, "ready.json"), ready, 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "virtiofsd.sock")
	vfs := exec.Command(virtiofsd, "--socket-path="+sock, "-o", "source="+share, "-o", "xattr",
		"-o", "modcaps=+sys_admin", "-o", "cache=auto")
	vfs.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	vfsLog, err := os.Create(filepath.Join(dir, "virtiofsd.log"))
	if err != nil {
		t.Fatal(err)
	}
	vfs.Stdout, vfs.Stderr = vfsLog, vfsLog
	if err := vfs.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		vfs.Process.Kill()
		vfs.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(vfsLog.Name())
			t.Logf("virtiofsd:\n%s", b)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("virtiofsd made no socket within 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}

	n := bootNodeWith(t, func(id *identity.Identity) {
		id.APIServer = "https://10.0.2.2:1"
		id.CACert = testCAPEM(t)
		id.ClientCACert = id.CACert
	}, func(args []string) []string {
		for i, a := range args {
			if a == "microvm" {
				args[i] = "microvm,memory-backend=mem"
			}
		}
		return append(args,
			"-object", "memory-backend-memfd,id=mem,size=1024M,share=on",
			"-global", "virtio-mmio.force-legacy=false",
			"-chardev", "socket,id=layers,path="+sock,
			"-device", "vhost-user-fs-device,chardev=layers,tag=socialweb-layers")
	})
	n.must("layer share mounted", `msg="layer share" state=mounted tag=socialweb-layers mount=/run/socialweb/layers layers=1`, 120*time.Second)
	n.must("snapshotter serving", `msg=snapshotter name=socialweb socket=/run/socialweb/snapshotter.sock`, 30*time.Second)
	n.must("containerd configured with it", `msg="containerd config" .* snapshotter=socialweb`, 30*time.Second)
	n.must("containerd up", `msg=agent step=containerd-ready uptime=`, 120*time.Second)
	n.must("kubelet started", `msg=agent step=kubelet uptime=`, 120*time.Second)
	n.must("agent up", `msg=agent step=up uptime=`, 30*time.Second)
	if m, ok := n.con.find(regexp.MustCompile(`(failed to load plugin|failed to find snapshotter|agent step failed|panic:|containerd exited|kubelet ended)`)); ok {
		t.Errorf("trouble on the console: %s", m)
	}
	n.powerdown()
	if _, ok := n.con.await(regexp.MustCompile(`msg=snapshotter layersFromShare=0 layersPulled=0`), 5*time.Second); !ok {
		t.Errorf("the snapshotter did not report at shutdown")
	}
}
