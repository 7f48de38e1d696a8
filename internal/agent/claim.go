package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/socialweb-computer/socialweb/internal/boottimeline"
	"github.com/socialweb-computer/socialweb/internal/identity"
)

// A warm-pool VM boots before any cluster needs it, and its identity disk holds the pool
// document (identity.EncodePool) until the host claims the VM: the host rewrites the disk
// in place with the node's identity, then the agent goes on from the identity step.
const (
	// claimPoll is how often the disk is read while waiting without link notifications:
	// what a claim waits for at most on top of the host's rewrite.
	claimPoll = 50 * time.Millisecond
	// claimPollWoken is how often it is read when a link notification wakes the wait (the
	// claim brings the NIC's carrier up): only in case that wake-up is lost.
	claimPollWoken = time.Second
	// claimSettle is how long the disk may hold neither the pool document nor a valid
	// identity: a read torn by the host's rewrite passes within a poll or two, a bad
	// claim does not.
	claimSettle = 5 * time.Second
)

// claimPoller reads a warm-pool VM's identity disk until it holds an identity.
type claimPoller struct {
	read   func() ([]byte, error) // the whole disk, past the guest's page cache
	every  time.Duration
	settle time.Duration
	// wake, if set, says to read the disk now (a link came up: see linkWatch).
	wake <-chan struct{}
}

// wait reads the disk every p.every, and whenever p.wake fires, until identity.Decode
// accepts it. There is no
// timeout while the disk holds the pool document: the host destroys the pool VMs it
// does not need. Anything else (a read torn by the rewrite, a read error) is read again,
// for p.settle at most.
func (p claimPoller) wait(ctx context.Context) (identity.Identity, error) {
	var badSince time.Time
	for {
		b, err := p.read()
		var id identity.Identity
		if err == nil {
			id, err = identity.Decode(bytes.NewReader(b))
		}
		switch {
		case err == nil:
			return id, nil
		case errors.Is(err, identity.ErrUnclaimed):
			badSince = time.Time{}
		case badSince.IsZero():
			badSince = time.Now()
		case time.Since(badSince) >= p.settle:
			return identity.Identity{}, fmt.Errorf("the claimed identity disk held neither the pool document nor a valid identity for %s "+
				"(did the host's claim write a bad identity?): %w", p.settle, err)
		}
		select {
		case <-ctx.Done():
			return identity.Identity{}, fmt.Errorf("waiting to be claimed: %w", ctx.Err())
		case <-time.After(p.every):
		case <-p.wake:
		}
	}
}

// waitClaim is a warm-pool VM's wait at the identity step: logged once, and marked
// identity-wait on the boot timeline, so the host's start breakdown counts only what
// comes after the claim. Stop ends it (errStopped): the host destroying an unclaimed VM
// powers it off.
func (a *Agent) waitClaim(ctx context.Context, dev string, p claimPoller) (identity.Identity, error) {
	a.Log.Info("warm-pool VM: waiting to be claimed by a cluster", "device", dev)
	a.mark(boottimeline.StepIdentityWait)
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-a.stopAsked:
			cancel(errStopped)
		case <-wctx.Done():
		}
	}()
	if b, err := p.read(); err == nil {
		if pool, err := identity.DecodePool(bytes.NewReader(b)); err == nil && pool.Prewarm {
			stop := a.startPrewarm(wctx)
			defer stop()
		}
	}
	t0 := time.Now()
	id, err := p.wait(wctx)
	if err != nil {
		if errors.Is(context.Cause(wctx), errStopped) && ctx.Err() == nil {
			return id, errStopped
		}
		return id, err
	}
	a.Log.Info("claimed", "cluster", id.Cluster, "node", id.NodeName, "waited", time.Since(t0).Round(time.Millisecond))
	return id, nil
}

// readDirect reads the first size bytes of dev with O_DIRECT: the host rewrites a pool
// VM's identity disk under the running guest, and a buffered read would keep getting
// the page cache's copy of the pool document. O_DIRECT needs an aligned buffer: an
// anonymous mapping is page-aligned. size is a multiple of the page size
// (identity.PoolDiskSize).
func readDirect(dev string, size int) ([]byte, error) {
	f, err := os.OpenFile(dev, os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the identity disk for direct reads: %w", err)
	}
	defer f.Close()
	buf, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("a buffer for direct reads: %w", err)
	}
	defer syscall.Munmap(buf)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("reading %s: %w", dev, err)
	}
	return bytes.Clone(buf[:n]), nil
}
