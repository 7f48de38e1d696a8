package nodeimage

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// ToolPackages maps every host program the builder (or its boot test) may run to the
// Debian package that provides it.
var ToolPackages = map[string]string{
	"apt-get":            "apt",
	"apt-cache":          "apt",
	"dpkg-deb":           "dpkg",
	"dpkg-query":         "dpkg",
	"debootstrap":        "debootstrap",
	"mkfs.ext4":          "e2fsprogs",
	"debugfs":            "e2fsprogs",
	"chroot":             "coreutils",
	"cp":                 "coreutils",
	"mount":              "mount",
	"umount":             "mount",
	"zstd":               "zstd",
	"qemu-system-x86_64": "qemu-system-x86",
	"e2fsck":             "e2fsprogs",
	"cpio":               "cpio",
}

// BuildTools are the programs Ensure needs before it starts; checked up front.
var BuildTools = []string{"apt-get", "apt-cache", "dpkg-deb", "dpkg-query", "debootstrap",
	"mkfs.ext4", "debugfs", "chroot", "cp"}

// toolPath resolves a tool, honouring overrides (tests use them to inject failures).
func toolPath(overrides map[string]string, name string) (string, error) {
	if p, ok := overrides[name]; ok {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s (override for %s): %w", p, name, err)
		}
		return p, nil
	}
	p, err := exec.LookPath(name)
	if err != nil {
		// root's PATH may lack /usr/sbin in minimal environments
		for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
			c := filepath.Join(dir, name)
			if st, e := os.Stat(c); e == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				return c, nil
			}
		}
		return "", err
	}
	return p, nil
}

// MissingToolsError lists host programs that are not installed and the Debian packages
// that provide them.
type MissingToolsError struct {
	Tools    []string
	Packages []string
}

func (e *MissingToolsError) Error() string {
	var parts []string
	for _, t := range e.Tools {
		parts = append(parts, fmt.Sprintf("%s (package %s)", t, pkgFor(t)))
	}
	return fmt.Sprintf("missing host tools: %s; install them with: apt-get install -y %s",
		strings.Join(parts, ", "), strings.Join(e.Packages, " "))
}

func pkgFor(tool string) string {
	if p, ok := ToolPackages[tool]; ok {
		return p
	}
	return "?"
}

// CheckTools returns a *MissingToolsError naming every tool in names that cannot be found
// (with overrides applied), or nil.
func CheckTools(overrides map[string]string, names ...string) error {
	var missing []string
	pkgs := map[string]bool{}
	for _, n := range names {
		if _, err := toolPath(overrides, n); err != nil {
			missing = append(missing, n)
			pkgs[pkgFor(n)] = true
		}
	}
	if len(missing) == 0 {
		return nil
	}
	var pl []string
	for p := range pkgs {
		pl = append(pl, p)
	}
	sort.Strings(pl)
	return &MissingToolsError{Tools: missing, Packages: pl}
}

// runner executes host tools with progress reporting and useful errors.
type runner struct {
	tools    map[string]string
	progress func(step, msg string)
	step     string
	env      []string
	dir      string // working directory; "" for the current one
}

// cmdError carries the tail of a failed command's output.
type cmdError struct {
	Cmd    string
	Err    error
	Output string
}

func (e *cmdError) Error() string {
	out := strings.TrimSpace(e.Output)
	if out == "" {
		return fmt.Sprintf("%s: %v", e.Cmd, e.Err)
	}
	return fmt.Sprintf("%s: %v:\n%s", e.Cmd, e.Err, out)
}

func (e *cmdError) Unwrap() error { return e.Err }

// tailBuffer keeps the last n lines written to it.
type tailBuffer struct {
	mu    sync.Mutex
	lines []string
	n     int
}

func (t *tailBuffer) add(l string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, l)
	if len(t.lines) > t.n {
		t.lines = t.lines[len(t.lines)-t.n:]
	}
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "\n")
}

// run runs a tool and returns its stdout. stderr (and stdout when stream is set) is kept
// for the error; with stream, every output line is also reported as progress.
func (r *runner) run(ctx context.Context, stream bool, name string, args ...string) ([]byte, error) {
	p, err := toolPath(r.tools, name)
	if err != nil {
		return nil, CheckTools(r.tools, name)
	}
	cmd := exec.CommandContext(ctx, p, args...)
	cmd.Dir = r.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	cmd.Env = append(cmd.Env, r.env...)
	tail := &tailBuffer{n: 30}
	var stdout bytes.Buffer
	var wg sync.WaitGroup
	pipe := func(w io.Writer) (io.WriteCloser, error) {
		pr, pw := io.Pipe()
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(pr)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				l := sc.Text()
				tail.add(l)
				if w != nil {
					fmt.Fprintln(w, l)
				}
				if stream && r.progress != nil {
					r.progress(r.step, l)
				}
			}
			_, _ = io.Copy(io.Discard, pr)
		}()
		return pw, nil
	}
	errw, _ := pipe(nil)
	cmd.Stderr = errw
	var outw io.WriteCloser
	if stream {
		outw, _ = pipe(&stdout)
		cmd.Stdout = outw
	} else {
		cmd.Stdout = &stdout
	}
	err = cmd.Run()
	errw.Close()
	if outw != nil {
		outw.Close()
	}
	wg.Wait()
	if err != nil {
		out := tail.String()
		if !stream && out == "" {
			out = lastLines(stdout.String(), 30)
		}
		return stdout.Bytes(), &cmdError{Cmd: name + " " + strings.Join(args, " "), Err: err, Output: out}
	}
	return stdout.Bytes(), nil
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// mountsUnder lists mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == abs || strings.HasPrefix(mp, abs+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(byte(c))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// removeTree deletes dir, first lazily unmounting anything mounted below it (a failed
// debootstrap can leave proc, sys or a bind of /dev mounted in its target). It refuses to
// delete if a mount remains, so host files are never removed through a bind mount.
func removeTree(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	mps, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	for _, mp := range mps {
		if p, err := toolPath(nil, "umount"); err == nil {
			_ = exec.Command(p, "-l", mp).Run()
		}
	}
	if mps, _ = mountsUnder(dir); len(mps) > 0 {
		return fmt.Errorf("refusing to remove %s: still mounted below it: %s", dir, strings.Join(mps, ", "))
	}
	return os.RemoveAll(dir)
}
