// Package logrotate bounds a log file by size: past MaxSize, LOG becomes LOG.1
// (LOG.1 becomes LOG.2, and so on), the oldest past Keep is removed, and a new
// LOG is begun.
//
// A control plane rotates its own stdout and stderr (Stdio): the file is its,
// not a pipe to the daemon, so it outlives the daemon that started it (a pipe's
// reader gone, the next write would kill it with SIGPIPE), and a panic's trace
// reaches the file even when the process dies of it.
package logrotate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Rotation bounds a log. MaxSize 0 never rotates; Keep 0 keeps no old log.
type Rotation struct {
	MaxSize int64
	Keep    int
}

// MaxKeep is the most old logs a Rotation may keep.
const MaxKeep = 100

// Validate refuses a negative size and a Keep out of 0-MaxKeep.
func (r Rotation) Validate() error {
	if r.MaxSize < 0 {
		return fmt.Errorf("max size %d: want 0 (never rotate) or more", r.MaxSize)
	}
	if r.Keep < 0 || r.Keep > MaxKeep {
		return fmt.Errorf("keep %d: want 0-%d", r.Keep, MaxKeep)
	}
	return nil
}

// Shift moves the log at path out of the way: LOG.i to LOG.i+1 (dropping those
// past keep, also ones an earlier larger keep left), LOG to LOG.1, or LOG
// removed when keep is 0. The next write to path begins a new file.
func Shift(path string, keep int) error {
	if err := removeOld(path, keep); err != nil {
		return err
	}
	if keep == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing the full log: %w", err)
		}
		return nil
	}
	for i := keep - 1; i >= 1; i-- {
		err := os.Rename(numbered(path, i), numbered(path, i+1))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("shifting old logs: %w", err)
		}
	}
	if err := os.Rename(path, numbered(path, 1)); err != nil {
		return fmt.Errorf("renaming the full log: %w", err)
	}
	return nil
}

// removeOld removes LOG.N for every N >= keep: the oldest kept one is shifted
// out now, and any past it were kept under a larger keep.
func removeOld(path string, keep int) error {
	// ReadDir, not Glob: the state dir's path may hold glob syntax.
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("listing old logs: %w", err)
	}
	prefix := filepath.Base(path) + "."
	for _, e := range entries {
		n, err := strconv.Atoi(strings.TrimPrefix(e.Name(), prefix))
		if !strings.HasPrefix(e.Name(), prefix) || err != nil || n < 1 || n < keep {
			continue
		}
		if err := os.Remove(filepath.Join(filepath.Dir(path), e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing an old log: %w", err)
		}
	}
	return nil
}

func numbered(path string, i int) string { return path + "." + strconv.Itoa(i) }

// Stdio keeps this process's stdout and stderr, which its parent opened on path
// to append, within r: every interval, a file past MaxSize is shifted and a new
// one put on fds 1 and 2 (dup3, so a write in flight lands whole in one file or
// the other). A file may pass MaxSize by what is written in one interval. It
// returns when ctx ends; it does nothing if fd 1 is not path (a terminal).
func Stdio(ctx context.Context, path string, r Rotation, interval time.Duration, log *slog.Logger) {
	if r.MaxSize <= 0 || !sameFile(1, path) {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var st unix.Stat_t
		if err := unix.Fstat(1, &st); err != nil || st.Size < r.MaxSize {
			continue
		}
		if err := rotateStdio(path, r.Keep); err != nil {
			if !failing {
				log.Warn("rotating the log; it keeps growing until this works", "log", path, "err", err)
			}
			failing = true
			continue
		}
		failing = false
	}
}

// rotateStdio shifts path and opens a new one on fds 1 and 2.
func rotateStdio(path string, keep int) error {
	if err := Shift(path, keep); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening a new log: %w", err)
	}
	defer f.Close()
	for _, fd := range []int{1, 2} {
		if err := unix.Dup3(int(f.Fd()), fd, 0); err != nil {
			return fmt.Errorf("putting the new log on fd %d: %w", fd, err)
		}
	}
	return nil
}

// sameFile reports whether fd is the file at path.
func sameFile(fd int, path string) bool {
	var a unix.Stat_t
	if err := unix.Fstat(fd, &a); err != nil {
		return false
	}
	b, err := os.Stat(path)
	if err != nil {
		return false
	}
	st, ok := b.Sys().(*syscall.Stat_t)
	return ok && st.Dev == a.Dev && st.Ino == a.Ino
}
