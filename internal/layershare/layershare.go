// Package layershare exports the host layer store (internal/layerstore) to one node VM,
// read-only, as a virtio-fs device: one virtiofsd per VM, serving the store on a
// vhost-user socket that the VM's qemu connects to.
//
// Debian's C virtiofsd (qemu 7.2, /usr/lib/qemu/virtiofsd) has no read-only option, and
// a guest's root may send any write request it likes: other tenants' nodes read the same
// store. So virtiofsd is started through a small wrapper (the socialweb binary re-run
// as `virtiofsd-ro`, see Main) that enters a private mount namespace, bind-mounts the
// store onto itself, remounts that bind read-only, nosuid and nodev, and only then execs
// virtiofsd. Every write through the share then fails with EROFS in the host kernel,
// whatever virtiofsd is asked. The namespace, and with it the mount, dies with the
// process: nothing is left on the host to clean up but the process itself.
//
// The guest mounts it with `mount -t virtiofs socialweb-layers DIR` (Tag) and finds the
// store's layout there: DIR/sha256/<hex>/fs and ready.json.
package layershare

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Tag is the virtio-fs mount tag of the layer store in every node VM.
const Tag = "socialweb-layers"

// DefaultVirtiofsd is where Debian bookworm's qemu-system-common puts virtiofsd.
const DefaultVirtiofsd = "/usr/lib/qemu/virtiofsd"

// WrapperCommand is the socialweb subcommand that runs Main.
const WrapperCommand = "virtiofsd-ro"

// envOwner marks a virtiofsd (and its wrapper) with the directory of the node it serves,
// so that a daemon restarted after a crash can find one no record names. It survives
// the exec into virtiofsd, and /proc/PID/environ shows it to root.
const envOwner = "SOCIALWEB_VIRTIOFSD_FOR"

// Config says how node VMs get the layer store.
type Config struct {
	// Dir is the layer store exported to every node (read-only).
	Dir string
	// Executable is the socialweb binary, re-run as the read-only wrapper.
	Executable string
	// Virtiofsd is the virtiofsd binary; "" is DefaultVirtiofsd.
	Virtiofsd string
}

// Validate checks that the store and both binaries are there, filling defaults.
func (c *Config) Validate() error {
	if c.Virtiofsd == "" {
		c.Virtiofsd = DefaultVirtiofsd
	}
	var errs []error
	if c.Dir == "" || !filepath.IsAbs(c.Dir) || strings.ContainsAny(c.Dir, ",\n") {
		errs = append(errs, fmt.Errorf("shared layers: store dir %q: want an absolute path without commas or newlines", c.Dir))
	} else if st, err := os.Stat(c.Dir); err != nil || !st.IsDir() {
		errs = append(errs, fmt.Errorf("shared layers: store dir %s is not a directory (%v)", c.Dir, err))
	}
	if st, err := os.Stat(c.Virtiofsd); err != nil || st.Mode()&0o111 == 0 {
		errs = append(errs, fmt.Errorf("shared layers: no virtiofsd at %s (%v): apt-get install qemu-system-common, or run serve with --shared-layers=false", c.Virtiofsd, err))
	}
	if st, err := os.Stat(c.Executable); c.Executable == "" || err != nil || st.Mode()&0o111 == 0 {
		errs = append(errs, fmt.Errorf("shared layers: the socialweb executable %q is needed to run virtiofsd read-only (%v)", c.Executable, err))
	}
	return errors.Join(errs...)
}

// Modcaps is virtiofsd's capability change: +sys_admin, -everything a writable share
// needs, dac_read_search for dac_override (see VirtiofsdArgs).
const Modcaps = "+sys_admin:+dac_read_search:-dac_override:-chown:-fowner:-fsetid:-setgid:-setuid:-mknod:-setfcap"

// VirtiofsdArgs is virtiofsd's command line (binary first) serving source on socket.
//
// cache=always: a layer's files never change once it is in place, so the guest may keep
// their pages and attributes as long as it likes (qemu's timeout for "always" is a day;
// negative lookups are not cached, so a layer prepared after a guest looked for it is
// found on the next look). xattr with CAP_SYS_ADMIN: overlayfs in the guest reads
// trusted.overlay.opaque through the share, and the host kernel shows trusted.* only to
// CAP_SYS_ADMIN. The share is read-only, so of virtiofsd's default capabilities (made to
// create files as the guest's users) it keeps none: reading any file and directory
// (CAP_DAC_READ_SEARCH, not CAP_DAC_OVERRIDE, which would also write) is all it does.
// sandbox=namespace: virtiofsd pivots into the share, so nothing else of the host is
// reachable from it.
func VirtiofsdArgs(virtiofsd, source, socket string) []string {
	return []string{virtiofsd,
		"--socket-path=" + socket,
		"-o", "source=" + source,
		"-o", "cache=always",
		"-o", "xattr",
		"-o", "modcaps=" + Modcaps,
		"-o", "sandbox=namespace",
		"-o", "log_level=warn",
	}
}

// Command returns the wrapper command that runs virtiofsd for the node in nodeDir, with
// its socket at socket (relative paths are relative to cmd.Dir, which the caller sets).
// It runs in a new mount namespace of its own and a new session.
func (c Config) Command(nodeDir, socket string) *exec.Cmd {
	virtiofsd := c.Virtiofsd
	if virtiofsd == "" {
		virtiofsd = DefaultVirtiofsd
	}
	return wrapped(c.Executable, c.Dir, nodeDir, VirtiofsdArgs(virtiofsd, c.Dir, socket))
}

// wrapped is the wrapper (executable) running argv with source read-only.
func wrapped(executable, source, nodeDir string, argv []string) *exec.Cmd {
	cmd := exec.Command(executable, append([]string{WrapperCommand, "--source", source, "--"}, argv...)...)
	cmd.Env = append(os.Environ(), envOwner+"="+nodeDir)
	// Setsid: a terminal's signals to the daemon do not reach it (like qemu). The new
	// mount namespace is made private by the Go runtime; Main makes its own as well.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Unshareflags: syscall.CLONE_NEWNS}
	return cmd
}

// Main is the wrapper: args are `--source DIR -- PROGRAM ARGS...`. It makes DIR
// read-only in a private mount namespace and execs PROGRAM; it returns only on error.
func Main(args []string) error {
	if len(args) < 4 || args[0] != "--source" || args[2] != "--" {
		return fmt.Errorf("%s: want --source DIR -- PROGRAM [ARGS...], got %q", WrapperCommand, args)
	}
	source, argv := args[1], args[3:]
	if !filepath.IsAbs(source) {
		return fmt.Errorf("%s: --source %q: want an absolute path", WrapperCommand, source)
	}
	// Mount namespaces belong to threads until exec: unshare, mount and exec on one.
	runtime.LockOSThread()
	if err := readOnlyView(source); err != nil {
		return fmt.Errorf("%s: making %s read-only: %w", WrapperCommand, source, err)
	}
	if err := privatePidDir(); err != nil {
		return fmt.Errorf("%s: %w", WrapperCommand, err)
	}
	prog, err := exec.LookPath(argv[0])
	if err != nil {
		return fmt.Errorf("%s: %w", WrapperCommand, err)
	}
	return fmt.Errorf("%s: exec %s: %w", WrapperCommand, prog, unix.Exec(prog, argv, os.Environ()))
}

// readOnlyView gives this thread a private mount namespace in which source is a
// read-only, nosuid, nodev bind of itself.
func readOnlyView(source string) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare(CLONE_NEWNS): %w", err)
	}
	// Private first: neither the bind nor anything virtiofsd mounts may reach the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	// Not recursive: a filesystem mounted below the store would stay writable.
	if err := unix.Mount(source, source, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount: %w", err)
	}
	if err := unix.Mount("", source, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("read-only remount: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(source, &st); err != nil {
		return err
	}
	if st.Flags&unix.ST_RDONLY == 0 {
		return errors.New("the remount did not take: still writable")
	}
	return nil
}

// pidDir is where qemu 7.2's virtiofsd locks a pid file named after its socket path.
const pidDir = "/run/virtiofsd"

// privatePidDir mounts a tmpfs of this namespace's own on pidDir: every node's socket is
// "virtiofs.sock" in its own dir, so on the host's /run their pid files would be one file
// and a second virtiofsd would refuse to start ("Cannot lock pid file"); the tmpfs also
// goes with the process, so no pid file is left behind.
func privatePidDir() error {
	if err := os.MkdirAll(pidDir, 0o700); err != nil {
		return fmt.Errorf("virtiofsd's pid file dir: %w", err)
	}
	if err := unix.Mount("tmpfs", pidDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700,size=64k"); err != nil {
		return fmt.Errorf("a private tmpfs on %s: %w", pidDir, err)
	}
	return nil
}

// Owner is the node directory a running virtiofsd (or its wrapper) serves, from its
// environment; "" when pid is none of those.
func Owner(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return ""
	}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte(envOwner+"=")); ok {
			return string(v)
		}
	}
	return ""
}
