package qemu

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/nodes"
)

// TestHostCapacity: a node boots only while the host's free memory (after the reserve
// and what running nodes may still take) holds its guest and the VMM's overhead, and the
// state dir's free space its disks; otherwise Create returns a CapacityError and leaves
// nothing behind. A node that is gone frees its share.
func TestHostCapacity(t *testing.T) {
	e := newFakeEnv(t)
	avail := int64(1024 + 2*(256+512) + 100) // reserve + two TCG nodes of 256 MiB + a bit
	e.deps.MemAvailable = func() (int64, error) { return avail, nil }
	p := e.provider(t)
	ctx := t.Context()
	for _, n := range []string{"a-one", "a-two"} {
		if _, err := p.Create(ctx, req("a", n)); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
	}
	_, err := p.Create(ctx, req("a", "a-three"))
	if !nodes.IsCapacity(err) || !strings.Contains(err.Error(), "MiB of host memory") || !strings.Contains(err.Error(), "1024 MiB reserve") {
		t.Fatalf("third node: %v; want a CapacityError about memory", err)
	}
	if _, err := os.Stat(filepath.Join(e.cfg.StateDir, "a-three")); !os.IsNotExist(err) {
		t.Errorf("a refused node left its directory: %v", err)
	}
	if err := p.Delete(ctx, "a-one"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Create(ctx, req("a", "a-three")); err != nil {
		t.Errorf("after a node was deleted: %v; want room again", err)
	}

	big := req("a", "a-huge-disk")
	big.DiskMiB = 1 << 40 // a petabyte and more
	avail = 1 << 30
	_, err = p.Create(ctx, big)
	if !nodes.IsCapacity(err) || !strings.Contains(err.Error(), "of disk in") {
		t.Errorf("a disk larger than the state dir: %v; want a CapacityError about disk", err)
	}
	for _, n := range []string{"a-two", "a-three"} {
		if err := p.Delete(ctx, n); err != nil {
			t.Error(err)
		}
	}
}

// TestDataDisk: a node with DiskMiB gets a sparse, ext4-formatted data disk of that
// size, attached read-write with discard and found by its serial; one without gets none.
func TestDataDisk(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("no mkfs.ext4 (e2fsprogs): apt-get install e2fsprogs")
	}
	e := newFakeEnv(t)
	p := e.provider(t)
	ctx := t.Context()
	r := req("a", "a-disk")
	r.DiskMiB = 10 << 10
	if _, err := p.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	info, _ := p.Info("a-disk")
	disk := filepath.Join(info.Dir, fileData)
	var st syscall.Stat_t
	if err := syscall.Stat(disk, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 10<<30 || st.Blocks*512 > 256<<20 {
		t.Errorf("data disk: %d bytes, %d allocated; want 10 GiB, sparse", st.Size, st.Blocks*512)
	}
	out, err := exec.Command("dumpe2fs", "-h", disk).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "socialweb-data") {
		t.Errorf("data disk is not the labelled ext4: %v\n%s", err, out)
	}
	// 5% of 10 GiB is more than the cap: 256 MiB of 4 KiB blocks are reserved.
	if m := regexp.MustCompile(`(?m)^Reserved block count:\s+(\d+)`).FindSubmatch(out); m == nil || string(m[1]) != "65536" {
		t.Errorf("data disk reserve: %q blocks; want 65536 (256 MiB)", m)
	}
	l := p.launchFor(p.insts["a-disk"])
	args := strings.Join(l.args(), " ")
	if !strings.Contains(args, "file="+disk+",format=raw,if=none,discard=unmap,detect-zeroes=unmap") || !strings.Contains(args, "serial="+identity.DataDiskSerial) {
		t.Errorf("qemu args lack the data disk: %s", args)
	}
	if i := p.Accel(); i == "" {
		t.Error("no accelerator")
	}
	plain := p.launchFor(&instance{dir: info.Dir, rec: record{Request: req("a", "x")}})
	if strings.Contains(strings.Join(plain.args(), " "), identity.DataDiskSerial) {
		t.Error("a node without DiskMiB got a data disk")
	}
	if err := p.Delete(ctx, "a-disk"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(disk); !os.IsNotExist(err) {
		t.Errorf("data disk left after Delete: %v", err)
	}
}

func TestDataDiskReservePercent(t *testing.T) {
	for _, c := range []struct {
		sizeMiB int64
		want    string
	}{
		{0, "0"},
		{1024, "5.000"},
		{3 << 10, "5.000"},
		{5120, "5.000"},
		{10 << 10, "2.500"},
		{40 << 10, "0.625"},
	} {
		if got := DataDiskReservePercent(c.sizeMiB); got != c.want {
			t.Errorf("DataDiskReservePercent(%d) = %s; want %s", c.sizeMiB, got, c.want)
		}
	}
}
