package tenantuid

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// The files below are in a directory the tenant's uid writes (a control plane's
// run dir): it may have replaced any of them with a symlink (the daemon's write
// would land on another tenant's file or the host's), a FIFO (the daemon's open
// or read would block), or a hard link to a file of another owner. So the daemon
// opens them never through a symlink, never blocking, and takes only a regular
// file owned by the tenant's uid. The directory itself is safe to name by path:
// its parent is root's and not writable by the tenant.

// ErrNotOwned is the error for a file that is not a regular file of the owner.
var ErrNotOwned = errors.New("not a regular file of the tenant's uid")

// OpenAppend opens path to append, for the tenant o, creating it (owned by o,
// mode 0600) if it does not exist.
func OpenAppend(path string, o Owner) (*os.File, error) {
	for range 2 {
		f, err := open(path, unix.O_WRONLY|unix.O_APPEND, o)
		if !errors.Is(err, os.ErrNotExist) {
			return f, err
		}
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if errors.Is(err, unix.EEXIST) {
			continue // made meanwhile: open what is there, checked
		}
		if err != nil {
			return nil, &os.PathError{Op: "create", Path: path, Err: err}
		}
		if err := unix.Fchown(fd, o.UID, o.GID); err != nil {
			unix.Close(fd)
			return nil, &os.PathError{Op: "chown", Path: path, Err: err}
		}
		return os.NewFile(uintptr(fd), path), nil
	}
	return nil, fmt.Errorf("opening %s: it keeps appearing and going", path)
}

// OpenRead opens path, a file of the tenant o, to read.
func OpenRead(path string, o Owner) (*os.File, error) {
	return open(path, unix.O_RDONLY, o)
}

// Lstat is path's file info, without following a symlink, if it is a regular file
// of o (else ErrNotOwned): what a mark's or stamp's existence and time are read by.
func Lstat(path string, o Owner) (os.FileInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || !ok || int(st.Uid) != o.UID {
		return nil, fmt.Errorf("%s: %w", path, ErrNotOwned)
	}
	return fi, nil
}

// open opens path with flags, O_NOFOLLOW and O_NONBLOCK (a FIFO opens at once and
// is then refused), and checks what it opened.
func open(path string, flags int, o Owner) (*os.File, error) {
	fd, err := unix.Open(path, flags|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			err = fmt.Errorf("a symlink: %w", ErrNotOwned)
		} else if errors.Is(err, unix.ENXIO) {
			err = fmt.Errorf("a FIFO or socket: %w", ErrNotOwned) // a FIFO with no reader, opened to write
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != o.UID {
		unix.Close(fd)
		return nil, fmt.Errorf("%s (mode %o, uid %d): %w", path, st.Mode, st.Uid, ErrNotOwned)
	}
	// A regular file: blocking from here on, as os.File expects of one.
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "fcntl", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}
