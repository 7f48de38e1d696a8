package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWrite(t *testing.T) {
	tests := []struct {
		name     string
		existing []byte // nil: no file before
		mode     os.FileMode
	}{
		{"new secret", nil, 0o600},
		{"replaces a wider file with a secret", []byte("old"), 0o600},
		{"public file", []byte("old"), 0o644},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "f")
			if tt.existing != nil {
				if err := os.WriteFile(path, tt.existing, 0o666); err != nil {
					t.Fatal(err)
				}
			}
			if err := Write(path, []byte("new"), tt.mode); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil || string(b) != "new" {
				t.Fatalf("content %q, %v; want new", b, err)
			}
			st, _ := os.Stat(path)
			if st.Mode().Perm() != tt.mode {
				t.Errorf("mode %o, want %o", st.Mode().Perm(), tt.mode)
			}
			if left, _ := os.ReadDir(dir); len(left) != 1 {
				t.Errorf("temporary files left: %v", left)
			}
		})
	}
	if err := Write(filepath.Join(t.TempDir(), "missing", "f"), nil, 0o600); err == nil {
		t.Error("writing into a missing directory succeeded")
	}
}
