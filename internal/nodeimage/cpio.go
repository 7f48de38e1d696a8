package nodeimage

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// cpioEntry is one member of an initramfs; Data is the content of a file or the target of
// a symlink.
type cpioEntry struct {
	Name  string // relative, without leading "/"
	Mode  uint32 // including the type bits (cpioDir, cpioFile, ...)
	Data  []byte
	Major uint32 // device numbers for character devices
	Minor uint32
}

const (
	cpioDir     = 0o040000
	cpioFile    = 0o100000
	cpioSymlink = 0o120000
	cpioChar    = 0o020000
)

// writeCpio writes entries as a "newc" (SVR4, no CRC) archive, the format the kernel
// unpacks into the initramfs. Entries are sorted so parents come first; uid, gid and
// mtime are 0, so the same input gives the same bytes.
func writeCpio(w io.Writer, entries []cpioEntry) error {
	sorted := append([]cpioEntry(nil), entries...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	ino := uint32(1)
	pad := func(n int) error {
		if n%4 == 0 {
			return nil
		}
		_, err := w.Write(make([]byte, 4-n%4))
		return err
	}
	write := func(e cpioEntry) error {
		name := e.Name + "\x00"
		nlink := uint32(1)
		if e.Mode&0o170000 == cpioDir {
			nlink = 2
		}
		hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
			ino, e.Mode, 0, 0, nlink, 0, len(e.Data), 0, 0, e.Major, e.Minor, len(name), 0)
		ino++
		if _, err := io.WriteString(w, hdr+name); err != nil {
			return err
		}
		if err := pad(len(hdr) + len(name)); err != nil {
			return err
		}
		if _, err := w.Write(e.Data); err != nil {
			return err
		}
		return pad(len(e.Data))
	}
	for _, e := range sorted {
		if e.Name == "" || strings.HasPrefix(e.Name, "/") || strings.Contains(e.Name, "..") {
			return fmt.Errorf("cpio: bad member name %q", e.Name)
		}
		if err := write(e); err != nil {
			return err
		}
	}
	return write(cpioEntry{Name: "TRAILER!!!"})
}
