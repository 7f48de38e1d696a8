package supervisor

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// LogRotation bounds a process's log: past MaxSize bytes, LOG is renamed LOG.1
// (LOG.1 to LOG.2, and so on), the oldest past Keep is removed, and a new LOG is
// begun. MaxSize 0 never rotates; Keep 0 keeps no old log.
type LogRotation struct {
	MaxSize int64
	Keep    int
}

// MaxLogKeep is the most old logs LogRotation may keep.
const MaxLogKeep = 100

// Validate refuses a negative size and a Keep out of 0-MaxLogKeep.
func (r LogRotation) Validate() error {
	if r.MaxSize < 0 {
		return fmt.Errorf("max size %d: want 0 (never rotate) or more", r.MaxSize)
	}
	if r.Keep < 0 || r.Keep > MaxLogKeep {
		return fmt.Errorf("keep %d: want 0-%d", r.Keep, MaxLogKeep)
	}
	return nil
}

// logFile is a process's stdout and stderr: appended to its file, rotated by
// size. It never fails a write: an error would stop exec's copy, and the child
// would then die of SIGPIPE over a full disk; lost output is logged instead.
type logFile struct {
	path string
	rot  LogRotation
	log  *slog.Logger

	mu   sync.Mutex
	f    *os.File // nil after a failed reopen: the next write tries again
	size int64
	// next is the size at which to rotate: MaxSize, or another MaxSize further
	// after a rotation failed, so that a failing rename is not retried every write.
	next int64
	// failing says the last write or rotation failed: only the first of a run is logged.
	failing bool
}

// openLogFile opens path to append (a daemon restart continues the file).
func openLogFile(path string, rot LogRotation, log *slog.Logger) (*logFile, error) {
	w := &logFile{path: path, rot: rot, log: log, next: rot.MaxSize}
	if err := w.open(); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *logFile) open() error {
	f, err := os.OpenFile(w.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("opening log: %w", err)
	}
	w.f, w.size = f, st.Size()
	return nil
}

// Write appends p, rotating where it would take the file past MaxSize: after
// its last whole line that fits, or before it if none does. A line longer than
// MaxSize is cut at MaxSize.
func (w *logFile) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		room := w.next - w.size
		if w.rot.MaxSize <= 0 || int64(len(p)) <= room {
			w.write(p)
			break
		}
		cut := 0
		if room > 0 {
			cut = bytes.LastIndexByte(p[:room], '\n') + 1
		}
		if cut == 0 && w.size == 0 {
			cut = int(room)
		}
		w.write(p[:cut])
		p = p[cut:]
		if err := w.rotate(); err != nil {
			w.next = w.size + w.rot.MaxSize
			w.fail("rotating the log", err)
		} else {
			w.next = w.rot.MaxSize
		}
	}
	return n, nil
}

// write appends p to the file, reopening it if a rotation left none open.
func (w *logFile) write(p []byte) {
	if len(p) == 0 {
		return
	}
	if w.f == nil {
		if err := w.open(); err != nil {
			w.fail("reopening the log; output lost", err)
			return
		}
	}
	n, err := w.f.Write(p)
	w.size += int64(n)
	if err != nil {
		w.fail("writing the log; output lost", err)
		return
	}
	w.failing = false
}

func (w *logFile) fail(what string, err error) {
	if !w.failing {
		w.log.Warn(what, "log", w.path, "err", err)
	}
	w.failing = true
}

// rotate shifts LOG.i to LOG.i+1 (dropping those past Keep, also ones an earlier
// larger Keep left), LOG to LOG.1, and begins a new LOG.
func (w *logFile) rotate() error {
	if err := w.f.Close(); err != nil {
		w.log.Warn("closing the log to rotate it", "log", w.path, "err", err)
	}
	w.f = nil
	if err := w.removeOld(); err != nil {
		return err
	}
	if w.rot.Keep == 0 {
		if err := os.Remove(w.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing the full log: %w", err)
		}
	}
	for i := w.rot.Keep - 1; i >= 1; i-- {
		err := os.Rename(w.numbered(i), w.numbered(i+1))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("shifting old logs: %w", err)
		}
	}
	if w.rot.Keep > 0 {
		if err := os.Rename(w.path, w.numbered(1)); err != nil {
			return fmt.Errorf("renaming the full log: %w", err)
		}
	}
	return w.open()
}

// removeOld removes LOG.N for every N >= Keep: the oldest kept one is shifted
// out now, and any past it were kept under a larger Keep.
func (w *logFile) removeOld() error {
	// ReadDir, not Glob: the state dir's path may hold glob syntax.
	entries, err := os.ReadDir(filepath.Dir(w.path))
	if err != nil {
		return fmt.Errorf("listing old logs: %w", err)
	}
	prefix := filepath.Base(w.path) + "."
	for _, e := range entries {
		n, err := strconv.Atoi(strings.TrimPrefix(e.Name(), prefix))
		if !strings.HasPrefix(e.Name(), prefix) || err != nil || n < 1 || n < w.rot.Keep {
			continue
		}
		o := filepath.Join(filepath.Dir(w.path), e.Name())
		if err := os.Remove(o); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing an old log: %w", err)
		}
	}
	return nil
}

func (w *logFile) numbered(i int) string { return w.path + "." + strconv.Itoa(i) }

// Close closes the file.
func (w *logFile) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}
