package nodeservice

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A directory of built-in images is used as it is: a tar there is taken, a missing
// one is an error that says how to make it, and nothing is built.
func TestBuiltinImageFromADirectory(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pause.tar"), []byte("layout"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, want, wantErr string
	}{
		{"pause", filepath.Join(dir, "pause.tar"), ""},
		{"busybox", "", "socialweb image builtin --out " + dir},
	} {
		got, err := BuiltinImage(context.Background(), tc.name, dir, slog.New(slog.DiscardHandler))
		if got != tc.want || (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("BuiltinImage(%s) = %q, %v; want %q, an error saying %q", tc.name, got, err, tc.want, tc.wantErr)
		}
	}
}
