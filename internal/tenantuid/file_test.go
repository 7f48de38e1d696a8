package tenantuid

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestHostileFilesAreRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the files are made as another uid") // chown
	}
	dir := t.TempDir()
	tenant := Owner{UID: DefaultBase + 7500, GID: DefaultBase + 7500}
	other := Owner{UID: DefaultBase + 7501, GID: DefaultBase + 7501}
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("not the tenant's"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := func(name string, o Owner) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, o.UID, o.GID); err != nil {
			t.Fatal(err)
		}
		return p
	}
	own := file("own", tenant)
	others := file("others", other)
	roots := file("roots", Owner{})
	link := filepath.Join(dir, "link")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	dangling := filepath.Join(dir, "dangling")
	if err := os.Symlink(filepath.Join(dir, "made-through-the-link"), dangling); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(fifo, tenant.UID, tenant.GID); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		path string
		ok   bool
	}{
		{"the tenant's own file", own, true},
		{"another tenant's file", others, false},
		{"root's file", roots, false},
		{"a symlink to a secret", link, false},
		{"a dangling symlink", dangling, false},
		{"a FIFO", fifo, false},
		{"a directory", sub, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for op, f := range map[string]func(string, Owner) (*os.File, error){"OpenRead": OpenRead, "OpenAppend": OpenAppend} {
				got, err := f(tc.path, tenant)
				if got != nil {
					got.Close()
				}
				if (err == nil) != tc.ok {
					t.Errorf("%s: error %v, want ok %v", op, err, tc.ok)
				}
			}
			_, err := Lstat(tc.path, tenant)
			if (err == nil) != tc.ok {
				t.Errorf("Lstat: error %v, want ok %v", err, tc.ok)
			}
		})
	}
	if _, err := os.Lstat(filepath.Join(dir, "made-through-the-link")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("OpenAppend made a file through a dangling symlink: %v", err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "not the tenant's" {
		t.Errorf("the symlink's target was written: %q", b)
	}

	// A missing file is made, the tenant's.
	made := filepath.Join(dir, "new.log")
	f, err := OpenAppend(made, tenant)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := Lstat(made, tenant); err != nil {
		t.Errorf("the file OpenAppend made is not the tenant's: %v", err)
	}
}
