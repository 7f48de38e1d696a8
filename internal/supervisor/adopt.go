package supervisor

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// errAdoptedExit is how an adopted process's exit reads: not the daemon's child,
// its exit status goes to whoever reaps it (init), not here.
var errAdoptedExit = errors.New("exited (started by an earlier daemon: its status is not known here)")

// pidfd opens a pidfd for the process id names, checking after the open that it
// is that process still: a pid recycled before the open fails the check, and
// one recycled after cannot be reached through the pidfd.
func pidfd(id Identity) (int, error) {
	fd, err := unix.PidfdOpen(id.PID, 0)
	if err != nil {
		return -1, fmt.Errorf("pidfd_open %d: %w", id.PID, err)
	}
	if !id.Alive() {
		unix.Close(fd)
		return -1, fmt.Errorf("process %d is gone: %w", id.PID, os.ErrNotExist)
	}
	return fd, nil
}

// adopt watches a process an earlier daemon started: its exit through a pidfd
// (it is not this daemon's child, so wait(2) cannot see it), signals through the
// same pidfd. The process is put into jail again: the group's limits may have
// changed, and a process moved out of it by hand must not stay out.
func adopt(id Identity, jail Jail) (*run, error) {
	fd, err := pidfd(id)
	if err != nil {
		return nil, err
	}
	if jail != nil {
		if err := jail.Add(id.PID); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("limiting the adopted process: %w", err)
		}
	}
	var mu sync.Mutex
	closed := false
	exited := make(chan error, 1)
	go func() {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			_, err := unix.Poll(fds, -1)
			if err == nil || !errors.Is(err, unix.EINTR) {
				break
			}
		}
		mu.Lock()
		closed = true
		unix.Close(fd)
		mu.Unlock()
		exited <- errAdoptedExit
	}()
	signal := func(sig syscall.Signal) error {
		mu.Lock()
		defer mu.Unlock()
		if closed {
			return os.ErrProcessDone
		}
		return unix.PidfdSendSignal(fd, sig, nil, 0)
	}
	return &run{pid: id.PID, exited: exited, signal: signal, adopted: true}, nil
}

// TakeFile duplicates file descriptor fd of the process recordPath names into
// this process (pidfd_getfd): a new daemon takes back the listening socket an
// earlier one gave its control plane, so that it can hand the same socket to
// the next run and no connection is refused in between.
func TakeFile(recordPath string, fd int, name string) (*os.File, error) {
	rec, err := readRecord(recordPath)
	if err != nil {
		return nil, err
	}
	pfd, err := pidfd(rec.Identity)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pfd)
	nfd, err := unix.PidfdGetfd(pfd, fd, 0)
	if err != nil {
		return nil, fmt.Errorf("taking fd %d of process %d: %w", fd, rec.PID, err)
	}
	unix.CloseOnExec(nfd)
	return os.NewFile(uintptr(nfd), name), nil
}
