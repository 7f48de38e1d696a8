package gitlab

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/socialweb-computer/socialweb/internal/atomicfile"
)

// Files an --out directory holds.
const (
	KubeconfigFile = "kubeconfig"
	CAFile         = "ca.crt"
	TemplateFile   = "config.template.toml"
)

// CheckOutDir says whether files can be written into dir (made, 0700, if missing)
// without writing any: dir must be a directory or not exist yet, and the directory
// that holds it, or the nearest one that exists, must take a new file. It returns dir
// made absolute, since the template names ca.crt by its full path.
func CheckOutDir(dir string) (string, error) {
	if dir == "" {
		return "", errors.New("--out is empty: name a directory (it is made if missing)")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("--out %s: %w", dir, err)
	}
	// The nearest path that exists decides: a directory to write in, or a file in the way.
	p := abs
	for {
		st, err := os.Stat(p)
		if err == nil {
			if st.IsDir() {
				break
			}
			if p == abs {
				return "", fmt.Errorf("--out %s is a file, not a directory: name a directory (it is made if missing) for %s, %s and %s", dir, KubeconfigFile, CAFile, TemplateFile)
			}
			return "", fmt.Errorf("--out %s cannot be made: %s is a file, not a directory", dir, p)
		}
		if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			return "", fmt.Errorf("--out %s: %w", dir, err)
		}
		parent := filepath.Dir(p)
		if parent == p {
			break
		}
		p = parent
	}
	// Permission bits do not say it all (root, read-only mounts): try, and leave nothing.
	probe, err := os.CreateTemp(p, ".socialweb-out-probe-*")
	if err != nil {
		return "", fmt.Errorf("--out %s: cannot write in %s (%v): name a directory this user may write", dir, p, err)
	}
	probe.Close()
	os.Remove(probe.Name())
	return abs, nil
}

// WriteOutDir writes the runner's files for cred into dir (made 0700 if missing):
// kubeconfig and the template 0600 (they hold the token), ca.crt 0644. Everything is
// rendered before the first file is written, and each file is replaced whole, so a
// failure leaves the old files or the new, never a mix within one file.
func WriteOutDir(dir string, cred Credential, s Settings) error {
	abs, err := CheckOutDir(dir)
	if err != nil {
		return err
	}
	kubeconfig, err := cred.Kubeconfig()
	if err != nil {
		return err
	}
	template, err := cred.RunnerTemplate(filepath.Join(abs, CAFile), s)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return fmt.Errorf("--out %s: %w", dir, err)
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{CAFile, cred.CA, 0o644},
		{KubeconfigFile, kubeconfig, 0o600},
		{TemplateFile, template, 0o600},
	} {
		if err := atomicfile.Write(filepath.Join(abs, f.name), f.data, f.mode); err != nil {
			return fmt.Errorf("--out %s: %w", dir, err)
		}
	}
	return nil
}
