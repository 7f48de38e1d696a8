package backup

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/socialweb-computer/socialweb/internal/tenantuid"
)

// TestMain lets this test binary be the program CopyDatastoreAs runs.
func TestMain(m *testing.M) {
	if len(os.Args) == 4 && os.Args[1] == CopyCommand {
		if _, err := CopyDatastore(context.Background(), os.Args[2], os.Args[3]); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// tenantCluster is fakeCluster laid out as the daemon lays out a tenant of uid o:
// the cluster dir root:GID 0750, its datastore in run/, o's.
func tenantCluster(t *testing.T, o tenantuid.Owner, rows int) string {
	t.Helper()
	dir := fakeCluster(t, rows)
	// The test's temporary dir above is 0700: o must pass through it.
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(dir, 0, o.GID); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(dir, "run")
	if err := os.Mkdir(run, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{DatastoreEntry, DatastoreEntry + "-wal", DatastoreEntry + "-shm"} {
		if err := os.Rename(filepath.Join(dir, n), filepath.Join(run, n)); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		_ = os.Lchown(filepath.Join(run, n), o.UID, o.GID)
	}
	if err := os.Lchown(run, o.UID, o.GID); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestCopyAsTheTenant(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the copy runs as another uid")
	}
	a := tenantuid.Owner{UID: tenantuid.DefaultBase + 7500, GID: tenantuid.DefaultBase + 7500}
	b := tenantuid.Owner{UID: tenantuid.DefaultBase + 7501, GID: tenantuid.DefaultBase + 7501}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	aDir := tenantCluster(t, a, 5)
	rows, err := CopyDatastoreAs(ctx, a, filepath.Join(aDir, "run", DatastoreEntry), aDir, filepath.Join(t.TempDir(), "copy.db"))
	if err != nil || rows != 5 {
		t.Fatalf("copying a's own datastore: %d rows, %v; want 5", rows, err)
	}

	// a's datastore made a symlink to b's: the copy, as a, cannot read it.
	bDir := tenantCluster(t, b, 7)
	aDB := filepath.Join(aDir, "run", DatastoreEntry)
	for _, suffix := range []string{"", "-wal", "-shm"} {
		os.Remove(aDB + suffix)
	}
	if err := os.Symlink(filepath.Join(bDir, "run", DatastoreEntry), aDB); err != nil {
		t.Fatal(err)
	}
	if rows, err := CopyDatastoreAs(ctx, a, aDB, aDir, filepath.Join(t.TempDir(), "copy.db")); err == nil {
		t.Errorf("a's symlink to b's datastore was followed: %d rows copied", rows)
	} else {
		t.Logf("a symlink to b's datastore: %v", err)
	}

	// A FIFO: the child blocks, not root; the copy ends with its context.
	os.Remove(aDB)
	if err := unix.Mkfifo(aDB, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(aDB, a.UID, a.GID); err != nil {
		t.Fatal(err)
	}
	short, stop := context.WithTimeout(ctx, 2*time.Second)
	defer stop()
	start := time.Now()
	if _, err := CopyDatastoreAs(short, a, aDB, aDir, filepath.Join(t.TempDir(), "copy.db")); err == nil {
		t.Error("a FIFO was copied")
	} else {
		t.Logf("a FIFO: %v", err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("the copy of a FIFO took %v", took)
	}
	if left, _ := filepath.Glob(filepath.Join(aDir, ".backup-*")); len(left) > 0 {
		t.Errorf("work dirs left: %v", left)
	}
}
