package qemu

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// ficlone is the FICLONE ioctl (_IOW(0x94, 9, int)): share all of src's extents with dst
// (btrfs, XFS with reflink, bcachefs). ext4 answers EOPNOTSUPP.
const ficlone = 0x40049409

const (
	seekData = 3 // SEEK_DATA
	seekHole = 4 // SEEK_HOLE
)

// cloneMethod says how cloneFile made the copy.
type cloneMethod string

const (
	cloneReflink cloneMethod = "reflink"
	cloneSparse  cloneMethod = "sparse copy"
)

// cloneFile makes dst (which must not exist) a copy of src: a reflink where the
// filesystem supports one, else a copy of src's data extents only, leaving its holes as
// holes (the image's rootfs.ext4 is mostly free space). Like
// `cp --reflink=auto --sparse=always`, without depending on cp. On error dst is removed.
func cloneFile(src, dst string) (m cloneMethod, err error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return "", err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", err
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, out.Fd(), ficlone, in.Fd()); e == 0 {
		return cloneReflink, nil
	}
	return cloneSparse, sparseCopy(in, out, st.Size())
}

// sparseCopy copies the data segments of in (as SEEK_DATA/SEEK_HOLE report them) to the
// same offsets of out and sizes out to size. os.File.ReadFrom uses copy_file_range, which
// also shares extents where the filesystem can.
func sparseCopy(in, out *os.File, size int64) error {
	if err := out.Truncate(size); err != nil {
		return err
	}
	for off := int64(0); off < size; {
		data, err := in.Seek(off, seekData)
		if errors.Is(err, syscall.ENXIO) {
			break // no data past off: the rest is a hole
		}
		if err != nil {
			// No SEEK_DATA support: copy everything from here.
			return copyRange(in, out, off, size-off)
		}
		hole, err := in.Seek(data, seekHole)
		if err != nil {
			hole = size
		}
		if err := copyRange(in, out, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

func copyRange(in, out *os.File, off, n int64) error {
	if _, err := in.Seek(off, io.SeekStart); err != nil {
		return err
	}
	if _, err := out.Seek(off, io.SeekStart); err != nil {
		return err
	}
	got, err := io.Copy(out, io.LimitReader(in, n))
	if err != nil {
		return err
	}
	if got != n {
		return fmt.Errorf("copying %s: short copy at offset %d (%d of %d bytes)", in.Name(), off, got, n)
	}
	return nil
}
