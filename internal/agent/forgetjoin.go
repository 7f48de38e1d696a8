package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/socialweb-computer/socialweb/internal/identity"
)

// Forgetting the join: once the node is up its kubelet holds a certificate, and the
// bootstrap token (deleted in the tenant by then) is of no use; but a privileged Pod could
// still read it where the boot left it. So the agent removes the bootstrap kubeconfig,
// waits for the host to rewrite the identity disk without the token (nodes.JoinForgetter)
// reading past the page cache, and then drops the disk's cached pages, which its own
// first read and the kernel's partition scan filled with the old document.

// joinForgetWait bounds the wait for the host's rewrite; joinForgetPoll is how often the
// disk is read meanwhile.
const (
	joinForgetWait = 5 * time.Minute
	joinForgetPoll = time.Second
)

// joinForgetting is what forgetJoin does, as functions a test can stand in for.
type joinForgetting struct {
	bootstrapKubeconfig string                 // removed once the kubelet's own kubeconfig exists
	kubeconfig          string                 // the kubelet's kubeconfig after its join
	read                func() ([]byte, error) // the identity disk, past the page cache
	flush               func() error           // drops the disk's cached pages
	poll, wait          time.Duration
}

// forgetJoin carries out f; it returns what it did, or why it stopped.
func forgetJoin(ctx context.Context, f joinForgetting) error {
	if _, err := os.Stat(f.kubeconfig); err != nil {
		return fmt.Errorf("the kubelet has no kubeconfig of its own (%w): keeping the bootstrap kubeconfig", err)
	}
	if err := os.Remove(f.bootstrapKubeconfig); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the bootstrap kubeconfig: %w", err)
	}
	deadline := time.Now().Add(f.wait)
	for {
		disk, err := f.read()
		if err == nil && !identity.HoldsJoinSecret(disk) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the host did not rewrite the identity disk without its token within %s (last read: %v)", f.wait, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(f.poll):
		}
	}
	if err := f.flush(); err != nil {
		return fmt.Errorf("dropping the identity disk's cached pages: %w", err)
	}
	return nil
}

// flushBlockDevice drops dev's clean cached pages (BLKFLSBUF), so the next buffered
// read of it comes from the device.
func flushBlockDevice(dev string) error {
	f, err := os.Open(dev)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.IoctlSetInt(int(f.Fd()), unix.BLKFLSBUF, 0)
}

// startForgettingJoin runs forgetJoin in the background for the identity disk dev.
func (a *Agent) startForgettingJoin(dev string) {
	f := joinForgetting{
		bootstrapKubeconfig: a.Layout.BootstrapKubeconfig,
		kubeconfig:          a.Layout.Kubeconfig,
		read:                func() ([]byte, error) { return readDirect(dev, identity.PoolDiskSize) },
		flush:               func() error { return flushBlockDevice(dev) },
		poll:                joinForgetPoll,
		wait:                joinForgetWait,
	}
	go func() {
		t0 := time.Now()
		if err := forgetJoin(a.bg, f); err != nil {
			if a.bg.Err() == nil {
				a.Log.Warn("the join secret may still be readable on this node", "err", err)
			}
			return
		}
		a.Log.Info("join forgotten: no bootstrap token on the identity disk or in a file", "took", time.Since(t0).Round(time.Millisecond))
	}()
}
