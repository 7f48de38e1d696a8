package qemu

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
)

// Files of a node directory.
const (
	fileRecord   = "instance.json"
	fileRootfs   = "rootfs.ext4"
	fileIdentity = "identity.img"
	fileData     = "data.ext4" // the container-storage disk (NodeRequest.DiskMiB), sparse
	fileConsole  = "console.log"
	fileQemuLog  = "qemu.log"
	// fileVirtiofsLog and sockVirtiofs are the shared layer store's virtiofsd's output and
	// vhost-user socket (relative to the node dir, like the QMP socket).
	fileVirtiofsLog = "virtiofsd.log"
	sockVirtiofs    = "virtiofs.sock"

	// dirConsoles, under the state dir, keeps deleted nodes' console logs.
	dirConsoles = "consoles"
)

// recordVersion is the record's format. The warm pool's fields (Pool, PoolTap, Claimed)
// are optional and were added without a new version: records from before them load as
// they are, and a node booted cold still writes a record older daemons read.
const recordVersion = 1

// record is instance.json. It is written before anything outside the node directory is
// made (with the tap it is about to add) and again once qemu runs (with the process
// identity), so that a daemon that dies at any point of Create leaves a record from
// which Recover can undo everything.
type record struct {
	Version  int               `json:"version"`
	Request  nodes.NodeRequest `json:"request"`
	Address  string            `json:"address"` // with prefix, e.g. 10.250.3.2/24
	Tap      string            `json:"tap"`
	Bridge   string            `json:"bridge"`
	MAC      string            `json:"mac"`
	ImageDir string            `json:"imageDir"`
	Accel    Accel             `json:"accel"`
	// TCGCacheMiB is the TCG translation cache qemu was given (tb-size); 0 is qemu's
	// default. Host memory accounting counts it.
	TCGCacheMiB int64 `json:"tcgCacheMiB,omitempty"`
	// TCGFixedMaps: the guest was booted with norandmaps (TCG only; see kernelCmdline).
	TCGFixedMaps bool      `json:"tcgFixedMaps,omitempty"`
	Created      time.Time `json:"created"`
	// Process is qemu's identity (pid + start time + cmdline); nil until qemu started.
	Process *supervisor.Identity `json:"process,omitempty"`
	// LayersDir is the layer store shared with the VM through virtio-fs; "" for none.
	LayersDir string `json:"layersDir,omitempty"`
	// Virtiofsd is the identity of the virtiofsd serving LayersDir to this VM; nil until
	// it started. It lives and dies with qemu.
	Virtiofsd *supervisor.Identity `json:"virtiofsd,omitempty"`
	// Pool marks a warm-pool VM: booted for no cluster (see pool.go), or one whose claim
	// has not finished. Recover destroys every such VM: an unclaimed one is cheap to boot
	// again, and a half-claimed one may hold a tap of either name.
	Pool bool `json:"pool,omitempty"`
	// PoolTap is the pool tap (swp<owner>-...) a VM being claimed had before ClaimTap renamed it
	// to Tap; "" once the claim is done.
	PoolTap string `json:"poolTap,omitempty"`
	// Claimed is when a pool VM was handed to its cluster; nil for a node booted for it.
	// The node's boot and join deadlines count from here, not from Created.
	Claimed *time.Time `json:"claimed,omitempty"`
	// Cgroup is the group qemu runs in (Config.Cgroups); "" for none. Kept here, not
	// derived from the directory: a claimed pool VM changes directory, not group.
	Cgroup string `json:"cgroup,omitempty"`
	// CgroupDirs are that group's directories (one per controller on cgroup v1), so
	// that `socialweb down`, which knows no --cgroup-parent, removes them too.
	CgroupDirs []string `json:"cgroupDirs,omitempty"`
	// UID is the user and group qemu runs as once started (Config.VMUIDBase plus a slot
	// no other VM of this host holds); 0: root, a VM started without a base.
	UID int `json:"uid,omitempty"`
}

// since is when the node was given to its cluster: its claim, or its boot.
func (r record) since() time.Time {
	if r.Claimed != nil {
		return *r.Claimed
	}
	return r.Created
}

// writeRecord replaces dir/instance.json atomically (write, fsync, rename, fsync dir).
func writeRecord(dir string, r record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	final := filepath.Join(dir, fileRecord)
	tmp := final + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("writing instance record: %w", err)
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, final)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing instance record %s: %w", final, err)
	}
	return syncDir(dir)
}

func readRecord(dir string) (record, error) {
	r, err := readRecordAnyName(dir)
	if err != nil {
		return r, err
	}
	if r.Request.Name != filepath.Base(dir) {
		return r, fmt.Errorf("instance record %s names node %q", filepath.Join(dir, fileRecord), r.Request.Name)
	}
	return r, nil
}

// readRecordAnyName reads a record without checking that it names its directory: a pool
// VM whose claim renamed the directory before the record was rewritten.
func readRecordAnyName(dir string) (record, error) {
	var r record
	b, err := os.ReadFile(filepath.Join(dir, fileRecord))
	if err != nil {
		return r, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("instance record %s: %w", filepath.Join(dir, fileRecord), err)
	}
	if r.Version != recordVersion {
		return r, fmt.Errorf("instance record %s: version %d, this provider reads %d", filepath.Join(dir, fileRecord), r.Version, recordVersion)
	}
	return r, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// tailLines returns the last n lines of a file (carriage returns dropped), "" if it
// cannot be read.
func tailLines(path string, n int) string {
	if n <= 0 {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	want := min(max(int64(n)*256, 16<<10), 1<<20)
	off := max(st.Size()-want, 0)
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && len(buf) > 0 {
		return ""
	}
	s := strings.ReplaceAll(string(buf), "\r", "")
	s = strings.TrimRight(s, "\n")
	lines := strings.Split(s, "\n")
	if off > 0 && len(lines) > 1 {
		lines = lines[1:] // the first one is partial
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	if len(lines) == 1 && lines[0] == "" {
		return ""
	}
	return strings.Join(lines, "\n")
}
