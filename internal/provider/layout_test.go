package provider

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/socialweb-computer/socialweb/internal/tenantuid"
)

func owned(t *testing.T, p string) (uid, gid int, mode os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return int(st.Uid), int(st.Gid), fi.Mode()
}

func write(t *testing.T, p, data string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestLayOutRunDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: files are given to another uid")
	}
	tenant := tenantuid.Owner{UID: tenantuid.DefaultBase + 7500, GID: tenantuid.DefaultBase + 7500}
	t.Run("an older daemon's layout is moved in", func(t *testing.T) {
		dir := t.TempDir()
		for _, n := range []string{"state.db", "state.db-wal", "up", "last-request", "controlplane.log", "controlplane.log.1", "kine.sock", "controlplane.json", "instance.json"} {
			write(t, filepath.Join(dir, n), n)
		}
		if err := layOutRunDir(dir, tenant); err != nil {
			t.Fatal(err)
		}
		run := filepath.Join(dir, "run")
		if uid, gid, mode := owned(t, run); uid != tenant.UID || gid != tenant.GID || mode.Perm() != 0o700 || !mode.IsDir() {
			t.Errorf("run dir: uid %d gid %d mode %v, want the tenant's, 0700", uid, gid, mode)
		}
		for _, n := range []string{"state.db", "state.db-wal", "up", "last-request", "controlplane.log", "controlplane.log.1"} {
			if uid, _, _ := owned(t, filepath.Join(run, n)); uid != tenant.UID {
				t.Errorf("run/%s is uid %d's, want the tenant's", n, uid)
			}
			if _, err := os.Lstat(filepath.Join(dir, n)); err == nil {
				t.Errorf("%s is left in the cluster dir", n)
			}
		}
		for _, n := range []string{"controlplane.json", "instance.json"} {
			if uid, _, _ := owned(t, filepath.Join(dir, n)); uid != 0 {
				t.Errorf("%s moved or changed owner (uid %d): it is the daemon's", n, uid)
			}
		}
		if _, err := os.Lstat(filepath.Join(dir, "kine.sock")); err == nil {
			t.Error("an old socket is left")
		}
		// Again: nothing to move, nothing changes.
		if err := layOutRunDir(dir, tenant); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("one in the run dir wins", func(t *testing.T) {
		dir := t.TempDir()
		if err := layOutRunDir(dir, tenant); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, "run", "state.db"), "new")
		write(t, filepath.Join(dir, "state.db"), "old")
		if err := layOutRunDir(dir, tenant); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "run", "state.db")); string(b) != "new" {
			t.Errorf("run/state.db = %q, want the one that was there", b)
		}
	})
	t.Run("a symlink in the cluster dir is not moved", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.Symlink("/etc/passwd", filepath.Join(dir, "state.db")); err != nil {
			t.Fatal(err)
		}
		if err := layOutRunDir(dir, tenant); err == nil {
			t.Error("a symlink named state.db was taken")
		}
	})
	t.Run("another base's run dir is given over, not what it did not own", func(t *testing.T) {
		dir := t.TempDir()
		prev := tenantuid.Owner{UID: 100000 + 7500, GID: 100000 + 7500}
		if err := layOutRunDir(dir, prev); err != nil {
			t.Fatal(err)
		}
		run := filepath.Join(dir, "run")
		write(t, filepath.Join(run, "state.db"), "x")
		write(t, filepath.Join(run, "planted"), "a hard link to a file not prev's")
		for n, o := range map[string]tenantuid.Owner{"state.db": prev, "planted": {}} {
			if err := os.Lchown(filepath.Join(run, n), o.UID, o.GID); err != nil {
				t.Fatal(err)
			}
		}
		if err := layOutRunDir(dir, tenant); err != nil {
			t.Fatal(err)
		}
		if uid, _, _ := owned(t, run); uid != tenant.UID {
			t.Errorf("run dir is uid %d's, want %d", uid, tenant.UID)
		}
		if uid, _, _ := owned(t, filepath.Join(run, "state.db")); uid != tenant.UID {
			t.Errorf("run/state.db is uid %d's, want %d", uid, tenant.UID)
		}
		if uid, _, _ := owned(t, filepath.Join(run, "planted")); uid != 0 {
			t.Errorf("a file the previous uid did not own was given to the tenant (uid %d)", uid)
		}
	})
}

func TestShareWithTenant(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: files are given to another gid")
	}
	tenant := tenantuid.Owner{UID: tenantuid.DefaultBase + 7500, GID: tenantuid.DefaultBase + 7500}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "pki"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"controlplane.json", "admin.kubeconfig", "scheduler-config.yaml", "instance.json", "pki/ca.key"} {
		write(t, filepath.Join(dir, n), n)
	}
	if err := shareWithTenant(dir, tenant); err != nil {
		t.Fatal(err)
	}
	for n, want := range map[string]os.FileMode{".": 0o750, "pki": 0o750, "controlplane.json": 0o640, "admin.kubeconfig": 0o640, "scheduler-config.yaml": 0o640, "pki/ca.key": 0o640} {
		uid, gid, mode := owned(t, filepath.Join(dir, n))
		if uid != 0 || gid != tenant.GID || mode.Perm() != want {
			t.Errorf("%s: uid %d gid %d mode %v, want root's, group %d, %v", n, uid, gid, mode.Perm(), tenant.GID, want)
		}
	}
	if _, gid, mode := owned(t, filepath.Join(dir, "instance.json")); gid != 0 || mode.Perm() != 0o600 {
		t.Errorf("instance.json: gid %d mode %v, want root's alone", gid, mode.Perm())
	}
}
