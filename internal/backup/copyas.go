package backup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/socialweb-computer/socialweb/internal/tenantuid"
)

// CopyCommand is the hidden subcommand of this program that CopyDatastoreAs runs:
// `socialweb copy-datastore SRC DST` is CopyDatastore(SRC, DST).
const CopyCommand = "copy-datastore"

// datastoreOf is the sqlite file of the cluster in clusterDir and the uid that
// owns the directory it is in: its run dir's, or root's for a cluster laid out by
// an older daemon and not started since. The run dir itself cannot be replaced
// by its owner: the cluster dir is root's.
func datastoreOf(clusterDir string) (string, tenantuid.Owner, error) {
	run := filepath.Join(clusterDir, "run")
	fi, err := os.Lstat(run)
	if errors.Is(err, fs.ErrNotExist) {
		return filepath.Join(clusterDir, DatastoreEntry), tenantuid.Owner{}, nil
	}
	if err != nil {
		return "", tenantuid.Owner{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok {
		return "", tenantuid.Owner{}, fmt.Errorf("%s is not a directory", run)
	}
	return filepath.Join(run, DatastoreEntry), tenantuid.Owner{UID: int(st.Uid), GID: int(st.Gid)}, nil
}

// CopyDatastoreAs is CopyDatastore of a sqlite file in a directory o writes (a
// tenant's run dir), done by a child process of o's uid: the file may be a
// symlink to another tenant's datastore, or a FIFO, and root's sqlite would
// follow the one and block on the other. The child writes its copy into a
// directory of o's made in workDir (the cluster's dir, which o's gid may enter);
// root then reads that copy, checked as o's regular file, into dst.
func CopyDatastoreAs(ctx context.Context, o tenantuid.Owner, src, workDir, dst string) (int64, error) {
	if _, err := os.Stat(dst); err == nil {
		return 0, fmt.Errorf("copying the datastore: %s exists", dst)
	}
	work, err := os.MkdirTemp(workDir, ".backup-")
	if err != nil {
		return 0, fmt.Errorf("making room for the datastore copy: %w", err)
	}
	defer os.RemoveAll(work)
	if err := os.Lchown(work, o.UID, o.GID); err != nil {
		return 0, err
	}
	out := filepath.Join(work, DatastoreEntry)
	exe, err := os.Open("/proc/self/exe")
	if err != nil {
		return 0, fmt.Errorf("opening this program to run the copy: %w", err)
	}
	defer exe.Close()
	cmd := exec.CommandContext(ctx, "/proc/self/fd/3", CopyCommand, src, out)
	cmd.Args[0] = os.Args[0]
	cmd.ExtraFiles = []*os.File{exe}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: uint32(o.UID), Gid: uint32(o.GID), Groups: []uint32{}},
		Pdeathsig:  syscall.SIGKILL,
	}
	if msg, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("copying the datastore %s as uid %d: %w: %s", src, o.UID, err, msg)
	}
	in, err := tenantuid.OpenRead(out, o)
	if err != nil {
		return 0, fmt.Errorf("reading the datastore copy: %w", err)
	}
	defer in.Close()
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(f, in)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("reading the datastore copy: %w", err)
	}
	return CheckDatastore(ctx, dst)
}
