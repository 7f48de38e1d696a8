package nodeimage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// Ext4Method says how MakeExt4 fills the filesystem.
type Ext4Method string

const (
	// Ext4Auto uses mkfs.ext4 -d and falls back to Ext4LoopCopy when mkfs.ext4 refuses a
	// large file (seed blocker B6).
	Ext4Auto Ext4Method = "auto"
	// Ext4PopulateD is `mkfs.ext4 -d <tree>` only: no root needed.
	Ext4PopulateD Ext4Method = "mkfs-d"
	// Ext4LoopCopy makes an empty filesystem, loop-mounts it and copies the tree with
	// `cp -a` through the kernel's ext4 driver: needs root and loop devices.
	Ext4LoopCopy Ext4Method = "loop-copy"
)

// LargeFileBytes is the size from which a file is "large" for B6: mke2fs 1.47.2 and
// 1.47.3 refuse such files with data past 2 GiB under -d.
const LargeFileBytes = 2 << 30

// Ext4Options configure MakeExt4.
type Ext4Options struct {
	// SizeBytes is the exact image size; 0 sizes it as tree + metadata + HeadroomMiB.
	SizeBytes   int64
	HeadroomMiB int
	Label       string
	Method      Ext4Method
	Tools       map[string]string
	Progress    func(step, msg string)
}

// Ext4Result describes a filesystem image MakeExt4 wrote.
type Ext4Result struct {
	TreeBytes  int64      `json:"treeBytes"`
	ImageBytes int64      `json:"imageBytes"`
	Method     Ext4Method `json:"method"`
	// LargeFiles are tree-relative paths of files of LargeFileBytes or more; their sizes
	// were verified in the image.
	LargeFiles []string `json:"largeFiles,omitempty"`
	// Fallback says why Ext4Auto did not use mkfs.ext4 -d.
	Fallback string `json:"fallback,omitempty"`
}

// treeStats measures a tree the way it will occupy an ext4 filesystem with 4 KiB blocks.
type treeStats struct {
	bytes  int64 // data and directory blocks, rounded to 4 KiB
	inodes int64
	large  map[string]int64
}

func measureTree(tree string) (treeStats, error) {
	st := treeStats{large: map[string]int64{}}
	seen := map[[2]uint64]bool{}
	err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		sys, _ := info.Sys().(*syscall.Stat_t)
		if sys != nil && !info.IsDir() && sys.Nlink > 1 {
			k := [2]uint64{sys.Dev, sys.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		st.inodes++
		switch {
		case info.IsDir():
			st.bytes += 4096
		case info.Mode().IsRegular():
			alloc := info.Size()
			if sys != nil && sys.Blocks*512 < alloc {
				alloc = sys.Blocks * 512 // sparse: holes take no blocks
			}
			st.bytes += (alloc + 4095) &^ 4095
			if info.Size() >= LargeFileBytes {
				rel, _ := filepath.Rel(tree, p)
				st.large[rel] = info.Size()
			}
		case info.Mode()&fs.ModeSymlink != 0 && info.Size() >= 60:
			st.bytes += 4096
		}
		return nil
	})
	return st, err
}

// minImageBytes is the smallest image that holds the tree with headroom to spare: the tree,
// 1/16 for extent and directory overhead, 256 bytes of inode table per 16 KiB (mke2fs's
// default inode ratio), the journal (at most 64 MiB for images up to 16 GiB, 1 GiB beyond),
// a 32 MiB allowance for group descriptors and bitmaps, 5% root reserve, and the headroom.
func minImageBytes(tree int64, inodes int64, headroomMiB int) int64 {
	const mib = 1 << 20
	need := tree + tree/16 + inodes*256 + 32*mib + int64(headroomMiB)*mib
	journal := int64(64 * mib)
	if need > 16<<30 {
		journal = 1 << 30
	}
	need += journal
	need += need/64 + need/19 // inode tables (256 B per 16 KiB) and the 5% reserve
	return (need + mib - 1) / mib * mib
}

var mkfsTooBigRE = regexp.MustCompile(`(?i)file too big while writing file "([^"]*)"`)

// MakeExt4 writes image as an ext4 filesystem holding tree (labelled o.Label), sized per
// o.SizeBytes or tree + headroom. Large files (>= 2 GiB) are verified in the result: a
// refusal by mkfs.ext4 -d (seed blocker B6) either falls back to a loop-mounted copy
// (Ext4Auto, as root) or fails here, before anything boots, with an error that says why.
func MakeExt4(ctx context.Context, tree, image string, o Ext4Options) (Ext4Result, error) {
	if o.Label == "" {
		o.Label = "rootfs"
	}
	if o.Method == "" {
		o.Method = Ext4Auto
	}
	r := &runner{tools: o.Tools, progress: o.Progress, step: "mkfs"}
	var res Ext4Result
	st, err := measureTree(tree)
	if err != nil {
		return res, fmt.Errorf("measuring %s: %w", tree, err)
	}
	res.TreeBytes = st.bytes
	for k := range st.large {
		res.LargeFiles = append(res.LargeFiles, k)
	}
	sort.Strings(res.LargeFiles)
	need := minImageBytes(st.bytes, st.inodes, o.HeadroomMiB)
	size := o.SizeBytes
	if size == 0 {
		size = need
	} else if size < need {
		return res, fmt.Errorf("diskMiB %d is too small: the rootfs tree takes %d MiB, and with headroomMiB %d and ext4 metadata the image needs at least %d MiB; set diskMiB to at least %d, lower headroomMiB, or use 0 for automatic sizing",
			size>>20, st.bytes>>20, o.HeadroomMiB, need>>20, need>>20)
	}
	res.ImageBytes = size
	if r.progress != nil {
		r.progress("mkfs", fmt.Sprintf("tree %d MiB, %d inodes, image %d MiB, %d large file(s), method %s",
			st.bytes>>20, st.inodes, size>>20, len(st.large), o.Method))
	}

	switch o.Method {
	case Ext4PopulateD, Ext4Auto:
		err := mkfsPopulate(ctx, r, tree, image, size, o.Label)
		if err == nil {
			res.Method = Ext4PopulateD
			break
		}
		var ce *cmdError
		m := []string(nil)
		if errors.As(err, &ce) {
			m = mkfsTooBigRE.FindStringSubmatch(ce.Output)
		}
		if m == nil {
			return res, err
		}
		ver := mke2fsVersion(ctx, mustTool(o.Tools, "mkfs.ext4"))
		why := fmt.Sprintf("mkfs.ext4 -d (mke2fs %s) refused %q with \"Ext2 file too big\" (seed blocker B6: mke2fs 1.47.2/1.47.3 cannot write file data past 2 GiB under -d, a 32-bit offset in misc/create_inode.c fixed upstream by tytso/e2fsprogs#258; Debian bookworm's 1.47.0 is not affected)", ver, m[1])
		if o.Method == Ext4PopulateD {
			return res, fmt.Errorf("%s; large files in the tree: %s; use method %q as root, or an e2fsprogs without the bug", why, strings.Join(res.LargeFiles, ", "), Ext4LoopCopy)
		}
		if reason := loopCopyUnavailable(o.Tools); reason != "" {
			return res, fmt.Errorf("%s; the fallback (loop-mount the image and cp -a the tree) is not possible: %s; large files in the tree: %s",
				why, reason, strings.Join(res.LargeFiles, ", "))
		}
		res.Fallback = why
		if r.progress != nil {
			r.progress("mkfs", "falling back to a loop-mounted copy: "+why)
		}
		fallthrough
	case Ext4LoopCopy:
		if o.Method == Ext4LoopCopy {
			if reason := loopCopyUnavailable(o.Tools); reason != "" {
				return res, fmt.Errorf("method %s: %s", Ext4LoopCopy, reason)
			}
		}
		if err := loopCopy(ctx, r, tree, image, size, o.Label); err != nil {
			return res, err
		}
		res.Method = Ext4LoopCopy
	default:
		return res, fmt.Errorf("unknown ext4 method %q (want %s, %s or %s)", o.Method, Ext4Auto, Ext4PopulateD, Ext4LoopCopy)
	}

	for _, rel := range res.LargeFiles {
		got, err := ext4FileSize(ctx, r, image, "/"+filepath.ToSlash(rel))
		if err != nil {
			return res, fmt.Errorf("verifying large file %s in %s: %w", rel, image, err)
		}
		if got != st.large[rel] {
			return res, fmt.Errorf("large file %s is %d bytes in %s but %d in the tree", rel, got, image, st.large[rel])
		}
	}
	return res, nil
}

func mustTool(overrides map[string]string, name string) string {
	p, err := toolPath(overrides, name)
	if err != nil {
		return name
	}
	return p
}

func createSparse(image string, size int64) error {
	_ = os.Remove(image)
	f, err := os.OpenFile(image, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func mkfsPopulate(ctx context.Context, r *runner, tree, image string, size int64, label string) error {
	if err := createSparse(image, size); err != nil {
		return err
	}
	_, err := r.run(ctx, false, "mkfs.ext4", "-q", "-F", "-d", tree, "-L", label, image)
	return err
}

// loopCopyUnavailable says why Ext4LoopCopy cannot run here, or "".
func loopCopyUnavailable(tools map[string]string) string {
	if os.Geteuid() != 0 {
		return "it needs root (mount -o loop) and this process is not root"
	}
	if err := CheckTools(tools, "mount", "umount", "cp"); err != nil {
		return err.Error()
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return "there are no loop devices (/dev/loop-control is missing; modprobe loop)"
	}
	return ""
}

func loopCopy(ctx context.Context, r *runner, tree, image string, size int64, label string) (err error) {
	if err := createSparse(image, size); err != nil {
		return err
	}
	if _, err := r.run(ctx, false, "mkfs.ext4", "-q", "-F", "-L", label, image); err != nil {
		return err
	}
	mnt, err := os.MkdirTemp(filepath.Dir(image), ".mnt-")
	if err != nil {
		return err
	}
	defer func() {
		if mps, _ := mountsUnder(mnt); len(mps) == 0 {
			os.Remove(mnt)
		}
	}()
	if _, err := r.run(ctx, false, "mount", "-o", "loop", "-t", "ext4", image, mnt); err != nil {
		return err
	}
	mounted := true
	defer func() {
		if mounted {
			// context may be cancelled: unmount with a fresh one
			if _, uerr := r.run(context.Background(), false, "umount", mnt); uerr != nil && err == nil {
				err = uerr
			}
		}
	}()
	if _, err := r.run(ctx, false, "cp", "-a", "--sparse=always", tree+"/.", mnt+"/"); err != nil {
		return err
	}
	mounted = false
	if _, err := r.run(ctx, false, "umount", mnt); err != nil {
		mounted = true
		return err
	}
	return nil
}

var debugfsSizeRE = regexp.MustCompile(`Size: (\d+)`)

// ext4FileSize reads a file's size from an ext4 image with debugfs (no mount needed).
func ext4FileSize(ctx context.Context, r *runner, image, p string) (int64, error) {
	out, err := r.run(ctx, false, "debugfs", "-R", "stat "+quoteDebugfs(p), image)
	if err != nil {
		return 0, err
	}
	m := debugfsSizeRE.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("debugfs stat %s: no size in output: %s", p, lastLines(string(out), 5))
	}
	return strconv.ParseInt(string(m[1]), 10, 64)
}

// ext4PhysicalBlock maps a file's logical block to its physical block (0 for a hole).
func ext4PhysicalBlock(ctx context.Context, r *runner, image, p string, lblk int64) (int64, error) {
	out, err := r.run(ctx, false, "debugfs", "-R", fmt.Sprintf("bmap %s %d", quoteDebugfs(p), lblk), image)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(lastLines(string(out), 1)), 10, 64)
}

func quoteDebugfs(p string) string {
	if strings.ContainsAny(p, " \t\"") {
		return `"` + strings.ReplaceAll(p, `"`, `\"`) + `"`
	}
	return p
}
