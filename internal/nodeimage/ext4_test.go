package nodeimage

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// bigFileSize is above 2 GiB, where mke2fs 1.47.2/1.47.3 refuse file data under -d (B6).
const bigFileSize = 2560 << 20

// largeTree builds a tree with a sparse 2.5 GiB file "big" holding random 64 KiB chunks
// on both sides of the 2 GiB mark (random data, not zeros: mke2fs skips zero blocks, which
// is why a 3.5 GB file of zeros was accepted in the seed's measurement), plus a few small
// files. It costs a few hundred KiB of disk.
func largeTree(t *testing.T) (string, map[int64][]byte) {
	t.Helper()
	tree := filepath.Join(t.TempDir(), "tree")
	for _, d := range []string{"etc", "usr/bin"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(tree, "etc/hostname"), []byte("node\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../etc/hostname", filepath.Join(tree, "usr/bin/link")); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(tree, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunks := map[int64][]byte{}
	for _, off := range []int64{0, 2<<30 - 32<<10, 2<<30 + 1<<20, 3<<29 + 4096*7, bigFileSize - 64<<10} {
		b := make([]byte, 64<<10)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
		chunks[off] = b
	}
	if err := f.Truncate(bigFileSize); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 > 64<<20 {
		t.Skipf("the filesystem of %s does not keep files sparse (%d MiB allocated); this test would write 2.5 GiB", tree, st.Blocks*512>>20)
	}
	return tree, chunks
}

var blockSizeRE = regexp.MustCompile(`Block size:\s+(\d+)`)

// verifyChunks reads every block of every chunk back out of the image, locating it with
// debugfs bmap, so the check does not rely on mounting (or on the code under test).
func verifyChunks(t *testing.T, image, file string, chunks map[int64][]byte) {
	t.Helper()
	ctx := context.Background()
	r := &runner{}
	out, err := r.run(ctx, false, "debugfs", "-R", "stats", image)
	if err != nil {
		t.Fatal(err)
	}
	m := blockSizeRE.FindSubmatch(out)
	if m == nil {
		t.Fatalf("no block size in debugfs stats")
	}
	bs, _ := strconv.ParseInt(string(m[1]), 10, 64)
	img, err := os.Open(image)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	size, err := ext4FileSize(ctx, r, image, file)
	if err != nil {
		t.Fatal(err)
	}
	if size != bigFileSize {
		t.Errorf("%s is %d bytes in the image, want %d", file, size, bigFileSize)
	}
	for off, want := range chunks {
		for i := int64(0); i < int64(len(want)); i += bs {
			lblk := (off + i) / bs
			pblk, err := ext4PhysicalBlock(ctx, r, image, file, lblk)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, bs)
			if pblk == 0 {
				t.Fatalf("%s: logical block %d (offset %d) is a hole in the image, want data", file, lblk, off+i)
			}
			if _, err := img.ReadAt(got, pblk*bs); err != nil {
				t.Fatal(err)
			}
			// the chunk may start mid-block: compare the overlapping part
			blockStart := lblk * bs
			lo := max(off, blockStart)
			hi := min(off+int64(len(want)), blockStart+bs)
			if !bytes.Equal(got[lo-blockStart:hi-blockStart], want[lo-off:hi-off]) {
				t.Fatalf("%s: data at offset %d differs in the image", file, lo)
			}
		}
	}
}

func diskUsage(file string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(file, &st); err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%d MiB apparent, %d MiB on disk", st.Size>>20, st.Blocks*512>>20)
}

// TestMakeExt4LargeFile is seed blocker B6: a staged tree holding a file over 2 GiB must
// either become an image with the file intact, or fail before anything boots with an
// error that says why.
func TestMakeExt4LargeFile(t *testing.T) {
	needTools(t, "mkfs.ext4", "debugfs")
	tree, chunks := largeTree(t)
	img := filepath.Join(t.TempDir(), "rootfs.ext4")
	t0 := time.Now()
	res, err := MakeExt4(context.Background(), tree, img, Ext4Options{HeadroomMiB: 64,
		Progress: func(step, msg string) { t.Logf("%s: %s", step, msg) }})
	if err != nil {
		if os.Geteuid() != 0 && strings.Contains(err.Error(), "B6") && strings.Contains(err.Error(), "needs root") {
			needLive(t, "this host's mke2fs has the B6 bug and the fallback needs root; the error is the intended one: "+err.Error())
		}
		t.Fatalf("MakeExt4 with a %d MiB file: %v", bigFileSize>>20, err)
	}
	t.Logf("MakeExt4: %s via %s in %s; image %s (%s)", res.LargeFiles, res.Method, time.Since(t0).Round(time.Millisecond), img, diskUsage(img))
	if len(res.LargeFiles) != 1 || res.LargeFiles[0] != "big" {
		t.Errorf("LargeFiles = %v, want [big]", res.LargeFiles)
	}
	// the tree is measured by allocated blocks: a sparse file stays sparse in the image
	if res.TreeBytes < 5*64<<10 || res.ImageBytes < res.TreeBytes+64<<20 {
		t.Errorf("tree %d KiB, image %d MiB: want the chunks counted and 64 MiB headroom", res.TreeBytes>>10, res.ImageBytes>>20)
	}
	verifyChunks(t, img, "/big", chunks)
	r := &runner{}
	if out, err := r.run(context.Background(), false, "debugfs", "-R", "cat /etc/hostname", img); err != nil || string(out) != "node\n" {
		t.Errorf("/etc/hostname in the image = %q, %v", out, err)
	}
	if CheckTools(nil, "e2fsck") == nil {
		if out, err := exec.Command("e2fsck", "-fn", img).CombinedOutput(); err != nil {
			t.Errorf("e2fsck -fn: %v\n%s", err, out)
		}
	}
}

// fakeB6Mkfs is a mkfs.ext4 that refuses -d the way mke2fs 1.47.3 does (seed section 7)
// and otherwise runs the real one, so the fallback is tested on a host whose e2fsprogs
// does not have the bug.
func fakeB6Mkfs(t *testing.T) string {
	t.Helper()
	real, err := toolPath(nil, "mkfs.ext4")
	if err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`#!/bin/sh
for a in "$@"; do
	if [ "$a" = -d ]; then
		echo 'Copying files into the device: __populate_fs: Ext2 file too big while writing file "big"' >&2
		echo 'mkfs.ext4: Ext2 file too big while populating file system' >&2
		exit 1
	fi
done
exec %s "$@"
`, real)
	p := filepath.Join(t.TempDir(), "mkfs.ext4")
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestMakeExt4FallsBackWhenMkfsRefusesLargeFile(t *testing.T) {
	needTools(t, "mkfs.ext4", "debugfs")
	tree, chunks := largeTree(t)
	fake := fakeB6Mkfs(t)
	root := os.Geteuid() == 0

	type fallbackCase struct {
		name       string
		method     Ext4Method
		tools      map[string]string
		needRoot   bool
		wantMethod Ext4Method
		wantErr    []string
	}
	tests := []fallbackCase{
		{name: "auto falls back to a loop-mounted copy", method: Ext4Auto, needRoot: true, wantMethod: Ext4LoopCopy},
		{name: "explicit loop copy", method: Ext4LoopCopy, needRoot: true, wantMethod: Ext4LoopCopy},
		{name: "mkfs -d only fails with the reason", method: Ext4PopulateD,
			wantErr: []string{"B6", `refused "big"`, "Ext2 file too big", "e2fsprogs#258", "loop-copy"}},
		{name: "auto without mount fails with the reason", method: Ext4Auto, needRoot: true,
			tools:   map[string]string{"mount": "/nonexistent/mount"},
			wantErr: []string{"B6", "fallback", "not possible", "mount"}},
	}
	if !root {
		tests = append(tests, fallbackCase{name: "auto as non-root fails with the reason", method: Ext4Auto, wantErr: []string{"B6", "needs root"}})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.needRoot {
				needRoot(t, "loop-mounting an image")
			}
			tools := map[string]string{"mkfs.ext4": fake}
			for k, v := range tc.tools {
				tools[k] = v
			}
			img := filepath.Join(t.TempDir(), "rootfs.ext4")
			res, err := MakeExt4(context.Background(), tree, img, Ext4Options{HeadroomMiB: 64, Method: tc.method, Tools: tools})
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("MakeExt4 succeeded via %s, want an error", res.Method)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error lacks %q: %v", w, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Method != tc.wantMethod {
				t.Errorf("method = %s, want %s", res.Method, tc.wantMethod)
			}
			if tc.method == Ext4Auto && !strings.Contains(res.Fallback, "B6") {
				t.Errorf("Fallback = %q, want the B6 reason", res.Fallback)
			}
			verifyChunks(t, img, "/big", chunks)
			if mps, _ := mountsUnder(filepath.Dir(img)); len(mps) > 0 {
				t.Errorf("left mounted: %v", mps)
			}
			t.Logf("%s: image %s", res.Method, diskUsage(img))
		})
	}
}

func TestMakeExt4Sizing(t *testing.T) {
	needTools(t, "mkfs.ext4", "debugfs")
	tree := t.TempDir()
	if err := os.WriteFile(filepath.Join(tree, "data"), bytes.Repeat([]byte("x"), 5<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tests := []struct {
		name     string
		size     int64
		headroom int
		wantErr  string
	}{
		{name: "automatic size keeps the headroom free", headroom: 100},
		{name: "explicit size", size: 400 << 20, headroom: 100},
		{name: "explicit size too small", size: 120 << 20, headroom: 100, wantErr: "set diskMiB to at least"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			img := filepath.Join(t.TempDir(), "img")
			res, err := MakeExt4(ctx, tree, img, Ext4Options{SizeBytes: tc.size, HeadroomMiB: tc.headroom})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			st, _ := os.Stat(img)
			if tc.size != 0 && st.Size() != tc.size {
				t.Errorf("image is %d bytes, want %d", st.Size(), tc.size)
			}
			out, err := (&runner{}).run(ctx, false, "debugfs", "-R", "stats", img)
			if err != nil {
				t.Fatal(err)
			}
			free := field(t, out, `Free blocks:\s+(\d+)`)
			reserved := field(t, out, `Reserved block count:\s+(\d+)`)
			bs := field(t, out, `Block size:\s+(\d+)`)
			if avail := (free - reserved) * bs; avail < int64(tc.headroom)<<20 {
				t.Errorf("only %d MiB free for non-root after mkfs, want headroom %d MiB", avail>>20, tc.headroom)
			}
			t.Logf("tree %d KiB, image %d MiB, free %d MiB", res.TreeBytes>>10, res.ImageBytes>>20, (free-reserved)*bs>>20)
		})
	}
}

func field(t *testing.T, out []byte, re string) int64 {
	t.Helper()
	m := regexp.MustCompile(re).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no %s in debugfs output", re)
	}
	n, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return n
}
