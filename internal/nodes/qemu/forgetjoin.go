package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/socialweb-computer/socialweb/internal/identity"
)

// ForgetJoin rewrites node name's identity disk in place without its bootstrap token
// (nodes.JoinForgetter): the token is deleted in the tenant once the node registers, and
// the disk then keeps only what a node read at boot and no secret. The guest agent, which
// waits for this, then drops the disk's cached pages. A warm-pool VM not yet claimed, an
// unknown node and a disk already rewritten are left as they are.
func (p *Provider) ForgetJoin(ctx context.Context, name string) error {
	if err := p.ready(); err != nil {
		return err
	}
	p.mu.Lock()
	in := p.insts[name]
	var dir string
	pool := false
	if in != nil {
		dir, pool = in.dir, in.rec.Pool || in.claiming || in.deleting != nil
	}
	p.mu.Unlock()
	if in == nil || pool {
		return nil
	}
	// The directory is root's alone (giveFiles), so the name cannot be a planted link;
	// O_NOFOLLOW all the same, as for every file the daemon writes there.
	f, err := os.OpenFile(filepath.Join(dir, fileIdentity), os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // deleted meanwhile
	}
	if err != nil {
		return fmt.Errorf("node %s: opening its identity disk: %w", name, err)
	}
	defer f.Close()
	disk, err := io.ReadAll(io.LimitReader(f, identity.MaxSize))
	if err != nil {
		return fmt.Errorf("node %s: reading its identity disk: %w", name, err)
	}
	out, changed, err := identity.ForgetJoin(disk)
	if err != nil || !changed {
		if err != nil {
			return fmt.Errorf("node %s: %w", name, err)
		}
		return nil
	}
	if _, err := f.WriteAt(out, 0); err != nil {
		return fmt.Errorf("node %s: rewriting its identity disk: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("node %s: rewriting its identity disk: %w", name, err)
	}
	p.log.Info("node joined: its identity disk no longer holds the bootstrap token", "node", name)
	return nil
}
