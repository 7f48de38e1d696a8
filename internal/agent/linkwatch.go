package agent

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// A warm-pool VM waits with its NIC's carrier down, and the host's claim brings it up
// (qemu's set_link) once the identity is on the disk. linkWatch turns that into a wake-up:
// the agent blocks on the kernel's link notifications instead of reading the identity
// disk many times a second, which under TCG cost a waiting VM about 8% of a host core.

// linkWatch delivers a value on C (coalesced) whenever the kernel reports a change to a
// network link. Close stops it.
type linkWatch struct {
	C <-chan struct{}
	f *os.File
}

// watchLinks subscribes to the kernel's link notifications (rtnetlink, RTMGRP_LINK) and
// sets every link but loopback administratively up: the kernel reports carrier changes
// only for links that are up. Nothing is configured on them.
func watchLinks(links []string) (*linkWatch, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: unix.RTMGRP_LINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink bind to link notifications: %w", err)
	}
	// Non-blocking, so reads go through Go's poller and Close wakes a blocked Read.
	f := os.NewFile(uintptr(fd), "rtnetlink")
	var errs []error
	for _, l := range links {
		if l == "lo" {
			continue
		}
		if err := setLinkUp(l); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		f.Close()
		return nil, err
	}
	c := make(chan struct{}, 1)
	go func() {
		buf := make([]byte, 16<<10)
		for {
			// ENOBUFS: messages were dropped, so something changed all the same.
			if _, err := f.Read(buf); err != nil && !errors.Is(err, unix.ENOBUFS) {
				return // closed
			}
			select {
			case c <- struct{}{}:
			default:
			}
		}
	}()
	return &linkWatch{C: c, f: f}, nil
}

func (w *linkWatch) Close() error { return w.f.Close() }

// setLinkUp sets IFF_UP on the link named name.
func setLinkUp(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("setting %s up: %w", name, err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return fmt.Errorf("setting %s up: %w", name, err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("setting %s up: reading its flags: %w", name, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("setting %s up: %w", name, err)
	}
	return nil
}
