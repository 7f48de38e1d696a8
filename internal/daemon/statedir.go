package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/socialweb-computer/socialweb/internal/controlplane"
	"github.com/socialweb-computer/socialweb/internal/nodes/qemu"
)

// reachableByTenants checks that a tenant's uid can reach the state dir: every
// directory above it searchable by others. The daemon changes none of them.
func reachableByTenants(stateDir string) error {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return err
	}
	for d := filepath.Dir(abs); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err == nil && fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("--state-dir %s: %s (mode %04o) is not searchable by other users, and each tenant's control plane runs as a uid of its own (--control-plane-uid-base) that must reach its cluster's files: chmod o+x %s, pick a state dir elsewhere, or set --control-plane-uid-base 0 to run control planes as root",
				stateDir, d, fi.Mode().Perm(), d)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("--state-dir %s: %w", stateDir, err)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// stateDirModes makes the state dir and clusters/ in it, 0700, or with tenant
// uids 0711: a tenant's uid passes through to its own cluster's dir and lists
// neither. The datastore seeds are then readable by every tenant's uid (0755,
// files 0644), written by root alone: the management API captures them.
func stateDirModes(stateDir string, tenantUIDs bool) error {
	mode := os.FileMode(0o700)
	if tenantUIDs {
		mode = 0o711
	}
	clusters := filepath.Join(stateDir, "clusters")
	if err := os.MkdirAll(clusters, 0o700); err != nil {
		return fmt.Errorf("creating state dir: %w", err)
	}
	for _, d := range []string{stateDir, clusters} {
		if err := os.Chmod(d, mode); err != nil {
			return fmt.Errorf("setting the state dir's mode: %w", err)
		}
	}
	if !tenantUIDs {
		return nil
	}
	seeds := controlplane.SeedDirIn(stateDir)
	if err := os.MkdirAll(seeds, 0o755); err != nil {
		return fmt.Errorf("creating the seed dir: %w", err)
	}
	if err := os.Chmod(seeds, 0o755); err != nil {
		return fmt.Errorf("setting the seed dir's mode: %w", err)
	}
	files, err := filepath.Glob(filepath.Join(seeds, "seed-*.json"))
	if err != nil {
		return err
	}
	for _, f := range files {
		if fi, err := os.Lstat(f); err == nil && fi.Mode().IsRegular() {
			if err := os.Chmod(f, 0o644); err != nil {
				return fmt.Errorf("setting a seed's mode: %w", err)
			}
		}
	}
	return nil
}

// uidRangesApart checks that no control plane's uid (cpBase + a port) can be a
// VM's (vmBase + a slot): a shared uid would be a wall between them gone.
func uidRangesApart(cpBase, vmBase int64) error {
	if cpBase == 0 || vmBase == 0 {
		return nil
	}
	cpTop, vmTop := cpBase+65535, vmBase+qemu.VMUIDSlots-1
	if cpBase <= vmTop && vmBase <= cpTop {
		return fmt.Errorf("--control-plane-uid-base %d and --vm-uid-base %d overlap: control planes take %d-%d, VMs %d-%d; move one clear of the other", cpBase, vmBase, cpBase, cpTop, vmBase, vmTop)
	}
	return nil
}
