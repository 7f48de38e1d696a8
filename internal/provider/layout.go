package provider

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/socialweb-computer/socialweb/internal/controlplane"
	"github.com/socialweb-computer/socialweb/internal/tenantuid"
)

// A cluster's dir is the daemon's: root-owned, readable by the tenant's gid (its
// config, kubeconfigs and PKI, 0640), writable by root alone, so the files the
// daemon trusts there (instance.json, controlplane.json) are never the tenant's.
// Its run dir (RunDir) is the tenant's uid's, 0700: all the control plane writes.

// shareWithTenant gives the files Prepare wrote in dir to the tenant's gid, to
// read: dir and pki/ 0750, the config, kubeconfigs and PKI 0640, root's.
// instance.json and an older daemon's run files stay root's alone.
func shareWithTenant(dir string, o tenantuid.Owner) error {
	share := func(p string, mode os.FileMode) error {
		// Lchown and a checked kind: dir is root's, yet nothing here follows a link.
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Type() != mode.Type() {
			return fmt.Errorf("%s is a %v, not a %v", p, fi.Mode().Type(), mode.Type())
		}
		if err := os.Lchown(p, 0, o.GID); err != nil {
			return err
		}
		return os.Chmod(p, mode.Perm())
	}
	if err := share(dir, fs.ModeDir|0o750); err != nil {
		return err
	}
	names := []string{controlplane.ConfigFile, "scheduler-config.yaml"}
	kubeconfigs, err := filepath.Glob(filepath.Join(dir, "*.kubeconfig"))
	if err != nil {
		return err
	}
	for _, k := range kubeconfigs {
		names = append(names, filepath.Base(k))
	}
	for _, n := range names {
		if err := share(filepath.Join(dir, n), 0o640); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	pkiDir := filepath.Join(dir, "pki")
	if err := share(pkiDir, fs.ModeDir|0o750); err != nil {
		return err
	}
	entries, err := os.ReadDir(pkiDir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		if err := share(filepath.Join(pkiDir, e.Name()), 0o640); err != nil {
			return err
		}
	}
	return nil
}

// layOutRunDir makes the cluster's run dir the tenant's, with no control plane
// of it running: created 0700 for o, the run files of an older daemon's tenant
// (the sqlite datastore, marks, log) moved into it from dir, and, if it was
// another uid's (a changed --control-plane-uid-base), what that uid owned in it
// given to o.
func layOutRunDir(dir string, o tenantuid.Owner) error {
	run := filepath.Join(dir, controlplane.RunDirName)
	if err := os.Mkdir(run, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	fi, err := os.Lstat(run)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", run)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Uid) != o.UID || int(st.Gid) != o.GID {
		if err := reown(run, int(st.Uid), o); err != nil {
			return err
		}
	}
	if err := os.Chmod(run, 0o700); err != nil {
		return err
	}
	files, sockets := controlplane.RunFiles()
	for _, s := range sockets {
		if err := os.Remove(filepath.Join(dir, s)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	logs, err := filepath.Glob(filepath.Join(dir, LogFile+"*"))
	if err != nil {
		return err
	}
	for _, l := range logs {
		files = append(files, filepath.Base(l))
	}
	for _, n := range files {
		if err := moveIn(filepath.Join(dir, n), filepath.Join(run, n), o); err != nil {
			return fmt.Errorf("moving %s into the run dir: %w", n, err)
		}
	}
	return nil
}

// moveIn moves from (in the cluster's dir: root's, made by the daemon or an
// older daemon's root control plane) to to in the run dir, o's. One already in
// the run dir wins: the old one is left where it is.
func moveIn(from, to string, o tenantuid.Owner) error {
	fi, err := os.Lstat(from)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", from)
	}
	if _, err := os.Lstat(to); err == nil {
		return nil
	}
	if err := os.Rename(from, to); err != nil {
		return err
	}
	return os.Lchown(to, o.UID, o.GID)
}

// reown gives run, and the entries in it that its previous owner uid owned, to
// o. Only those: an entry of another owner may be a hard link the tenant made to
// a file it must not get (where the host does not protect hard links).
func reown(run string, prev int, o tenantuid.Owner) error {
	entries, err := os.ReadDir(run)
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(run, e.Name())
		fi, err := os.Lstat(p)
		if err != nil {
			continue // gone meanwhile
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != prev {
			continue
		}
		if err := os.Lchown(p, o.UID, o.GID); err != nil {
			return err
		}
	}
	return os.Lchown(run, o.UID, o.GID)
}
