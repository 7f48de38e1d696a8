package qemu

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/layershare"
	"github.com/socialweb-computer/socialweb/internal/layerstore"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
)

// layersIndex is the network index of the shared-layers live test (TestLive uses 197).
const layersIndex = 196

// layersInit is the init of the shared-layers live test. It mounts the share, tries to
// write it (as root, also after remounting it rw), stacks the two test layers as
// overlayfs lower layers (upper above lower) and reports what the merged tree shows, then
// waits for a layer the host adds after the mount.
const layersInit = `#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
say() { echo "SWQT $*"; }
say "START uptime=$(cut -d' ' -f1 /proc/uptime)"
mount -t proc proc /proc 2>/dev/null
mount -t sysfs sys /sys 2>/dev/null
for d in /sys/bus/virtio/devices/*; do say "VIRTIO $(basename "$d") device=$(cat "$d/device")"; done
modprobe virtiofs 2>&1 | head -n 2 | while read -r l; do say "MODPROBE $l"; done
mkdir -p /tmp/layers /tmp/merged
if mount -t virtiofs -o ro socialweb-layers /tmp/layers 2>/tmp/err; then say "MOUNT-OK"; else say "MOUNT-FAIL $(cat /tmp/err)"; fi
for l in /tmp/layers/sha256/*; do
	[ -e "$l/fs/upper-marker" ] && up=$l
	[ -e "$l/fs/lower-marker" ] && lo=$l
done
say "LAYERS $(ls /tmp/layers/sha256 | wc -l) up=${up##*/} lo=${lo##*/}"
touch /tmp/layers/x 2>/tmp/err && say "WRITE-ROOT-OK" || say "WRITE-ROOT-FAIL $(cat /tmp/err)"
mount -o remount,rw /tmp/layers 2>/tmp/err || say "REMOUNT-FAIL $(cat /tmp/err)"
touch /tmp/layers/x 2>/tmp/err && say "WRITE-RW-OK" || say "WRITE-RW-FAIL $(cat /tmp/err)"
echo more 2>/tmp/err >>"$lo/fs/a/keep" && say "APPEND-OK" || say "APPEND-FAIL $(cat /tmp/err)"
say "WHITEOUT $(stat -c '%F %t:%T' "$up/fs/a/gone")"
if mount -t overlay overlay -o "lowerdir=$up/fs:$lo/fs" /tmp/merged 2>/tmp/err; then
	m=/tmp/merged
	st() { [ -e "$m/$1" ] && echo yes || echo no; }
	say "MERGED keep=$(st a/keep) gone=$(st a/gone) old=$(st o/old) new=$(st o/new) marker=$(st lower-marker)"
else
	say "OVERLAY-FAIL $(cat /tmp/err)"
fi
ls /tmp/layers/sha256/late >/dev/null 2>&1 && say "LATE-EARLY"
say "WAIT-LATE"
i=0
while [ "$i" -lt 100 ]; do
	if [ -e /tmp/layers/sha256/late/ready.json ]; then say "LATE-SEEN after $i"; break; fi
	i=$((i + 1))
	sleep 0.2
done
[ "$i" -lt 100 ] || say "LATE-MISSING"
say "DONE"
while :; do sleep 3600; done
`

func tarOf(t *testing.T, files map[string]string, whiteouts ...string) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range append(names, whiteouts...) {
		body := files[n]
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg, ModTime: time.Unix(1700000000, 0)}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	tw.Close()
	s := sha256.Sum256(buf.Bytes())
	return buf.Bytes(), "sha256:" + hex.EncodeToString(s[:])
}

// TestLiveLayerShare boots one VM with the shared layer store: the guest sees a virtio-fs
// device tagged socialweb-layers, cannot write it even as root, sees the whiteouts as
// 0:0 character devices and the opaque xattr (overlayfs merges the layers as a container
// would), and sees a layer the host adds after it mounted the share. Deleting the node
// leaves no virtiofsd, socket or mount. Before that, its virtiofsd is killed: the node is
// then Terminated, and Exited names virtiofsd.
func TestLiveLayerShare(t *testing.T) {
	requireLive(t)
	if _, err := os.Stat(layershare.DefaultVirtiofsd); err != nil {
		t.Skip("no " + layershare.DefaultVirtiofsd + ": apt-get install qemu-system-common")
	}
	tmp := t.TempDir()
	image := liveImageWithInit(t, tmp, layersInit)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()

	store, err := layerstore.Open(filepath.Join(tmp, "layers"))
	if err != nil {
		t.Fatal(err)
	}
	lower, lowerID := tarOf(t, map[string]string{"lower-marker": "", "a/keep": "k", "a/gone": "g", "o/old": "o"})
	upper, upperID := tarOf(t, map[string]string{"upper-marker": "", "o/new": "n"}, "a/.wh.gone", "o/.wh..wh..opq")
	for _, l := range []struct {
		raw []byte
		id  string
	}{{lower, lowerID}, {upper, upperID}} {
		t0 := time.Now()
		r, err := store.Prepare(ctx, layerstore.Layer{Digest: l.id, DiffID: l.id, MediaType: "application/vnd.oci.image.layer.v1.tar", Size: int64(len(l.raw))}, bytes.NewReader(l.raw))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("prepared %s: %d files in %s", r.Digest[:19], r.Files, time.Since(t0).Round(time.Millisecond))
	}

	mgr, plan := liveNetwork(ctx, t, layersIndex, 1) // the joiner's apiserver below
	stateDir := filepath.Join(tmp, "state")
	t.Cleanup(func() { killLeftovers(t, stateDir) })
	cfg := Config{StateDir: stateDir, ImageDir: image, StopGrace: 2 * time.Second, Accel: AccelTCG, TCGCacheMiB: 128,
		Layers: &layershare.Config{Dir: store.Dir(), Executable: os.Args[0]}}
	deps := Deps{Networks: mgr, Joiner: liveJoiner{api: "https://" + plan.Gateway.String() + ":1"},
		Plan: func(string) (nodenet.Plan, error) { return plan, nil }, Log: testLogger(t)}
	p, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() }) // after the node's Delete (cleanups run last first)
	if _, err := p.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	name, _ := nodes.NewNodeName(liveCluster)
	t0 := time.Now()
	if _, err := p.Create(ctx, nodes.NodeRequest{Cluster: liveCluster, Name: name, CPUs: 1, MemoryMiB: 512, MaxPods: 8}); err != nil {
		t.Fatal(err)
	}
	info, _ := p.Info(name)
	t.Cleanup(func() { p.Delete(context.Background(), name) })
	p.mu.Lock()
	rec := p.insts[name].rec
	p.mu.Unlock()
	if rec.Virtiofsd == nil || rec.LayersDir != store.Dir() {
		t.Fatalf("record: virtiofsd %v, layersDir %q: want both recorded", rec.Virtiofsd, rec.LayersDir)
	}
	vpid := rec.Virtiofsd.PID
	con := waitConsole(t, p, name, "SWQT WAIT-LATE", 4*time.Minute)
	t.Logf("guest reached WAIT-LATE %s after Create", time.Since(t0).Round(time.Millisecond))
	late := filepath.Join(store.Dir(), "sha256", "late")
	if err := os.MkdirAll(late, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(late, "ready.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	con = waitConsole(t, p, name, "SWQT DONE", time.Minute)
	var lines []string
	for _, l := range strings.Split(con, "\n") {
		if i := strings.Index(l, "SWQT "); i >= 0 {
			lines = append(lines, l[i:])
		}
	}
	t.Logf("guest said:\n%s", strings.Join(lines, "\n"))
	rss := func(pid int) int64 { return vmRSSMiB(pid) }
	child := 0
	if ents, err := os.ReadDir("/proc"); err == nil {
		for _, e := range ents {
			var pid int
			if _, err := fmt.Sscan(e.Name(), &pid); err == nil && parentPID(pid) == vpid {
				child = pid
			}
		}
	}
	t.Logf("RSS: qemu %d MiB, virtiofsd %d MiB + its sandboxed child (pid %d) %d MiB", rss(info.PID), rss(vpid), child, rss(child))
	// The child serves the guest with the two capabilities a read-only share needs
	// (layershare.Modcaps): CAP_DAC_READ_SEARCH (2) and CAP_SYS_ADMIN (21).
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", child)); err != nil || !strings.Contains(string(st), "\nCapEff:\t0000000000200004\n") {
		t.Errorf("virtiofsd's sandboxed child %d: want CapEff 0000000000200004 (dac_read_search, sys_admin) (%v):\n%s", child, err, st)
	}
	for _, want := range []string{
		"SWQT MOUNT-OK",
		"SWQT LAYERS 2 ",
		"SWQT WRITE-ROOT-FAIL",
		"SWQT WRITE-RW-FAIL",
		"SWQT APPEND-FAIL",
		"SWQT WHITEOUT character special file 0:0",
		"SWQT MERGED keep=yes gone=no old=no new=yes marker=yes",
		"SWQT LATE-SEEN",
	} {
		if !strings.Contains(con, want) {
			t.Errorf("the guest did not say %q", want)
		}
	}
	for _, bad := range []string{"WRITE-ROOT-OK", "WRITE-RW-OK", "APPEND-OK"} {
		if strings.Contains(con, "SWQT "+bad) {
			t.Errorf("the guest wrote the shared store: %s", bad)
		}
	}
	if _, err := os.Stat(filepath.Join(store.Dir(), "x")); !errors.Is(err, os.ErrNotExist) {
		t.Error("a file the guest wrote is in the store")
	}

	// virtiofsd dies under the running VM: the node is failed, and says why.
	if err := syscall.Kill(vpid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for listedState(t, p, name) != nodes.StateTerminated && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if st := listedState(t, p, name); st != nodes.StateTerminated {
		t.Errorf("30 s after its virtiofsd was killed the node is %s, want Terminated", st)
	}
	gone, why := p.Exited(name)
	t.Logf("after virtiofsd was killed: qemu alive %v; Exited: %s", p.aliveLocked(p.insts[name]), why)
	if !gone || !strings.Contains(why, "virtiofsd serving its shared image layers") {
		t.Errorf("Exited = %v, %q: want it to name virtiofsd", gone, why)
	}

	if err := p.Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
	if (supervisor.Identity{PID: vpid, StartTime: rec.Virtiofsd.StartTime, Cmdline: rec.Virtiofsd.Cmdline}).Alive() {
		t.Errorf("virtiofsd (pid %d) outlived its VM", vpid)
	}
	if child != 0 {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", child)); err == nil && parentPID(child) == vpid {
			t.Errorf("virtiofsd's child (pid %d) outlived its VM", child)
		}
	}
	if _, err := os.Stat(info.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("node dir (and its socket) left: %v", err)
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); bytes.Contains(b, []byte(store.Dir())) {
		t.Error("a mount of the layer store is left on the host")
	}
}

// listedState is name's state in p.List, "" when it is not listed.
func listedState(t *testing.T, p *Provider, name string) nodes.State {
	t.Helper()
	l, err := p.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range l {
		if in.Name == name {
			return in.State
		}
	}
	return ""
}
