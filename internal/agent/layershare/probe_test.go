package layershare

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/socialweb-computer/socialweb/internal/layerstore"
	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// TestProbeIsTheHosts: the node reads the probe the host's store writes.
func TestProbeIsTheHosts(t *testing.T) {
	if probeDir != layerstore.ProbeDir || probeXattr != layerstore.ProbeXattr || probeValue != layerstore.ProbeValue {
		t.Errorf("node probe %s %s=%s, host's %s %s=%s", probeDir, probeXattr, probeValue,
			layerstore.ProbeDir, layerstore.ProbeXattr, layerstore.ProbeValue)
	}
}

func TestCheckXattrs(t *testing.T) {
	if os.Geteuid() != 0 {
		livetest.Skip(t, "needs root (trusted.* xattrs)")
	}
	tests := []struct {
		name    string
		make    func(t *testing.T, root string)
		wantErr string
	}{
		{"the host's store", func(t *testing.T, root string) {
			if _, err := layerstore.Open(root); err != nil {
				t.Fatal(err)
			}
		}, ""},
		{"no probe: an older host", func(t *testing.T, root string) {}, "has no xattr-probe"},
		{"probe without its xattr: virtiofsd dropped trusted.*", func(t *testing.T, root string) {
			mkdir(t, filepath.Join(root, probeDir))
		}, "does the host's virtiofsd pass trusted.* xattrs on?"},
		{"probe with another value", func(t *testing.T, root string) {
			p := filepath.Join(root, probeDir)
			mkdir(t, p)
			if err := unix.Setxattr(p, probeXattr, []byte("n"), 0); err != nil {
				t.Fatal(err)
			}
		}, `is "n", want "y"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			tt.make(t, root)
			err := CheckXattrs(root)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("CheckXattrs: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("CheckXattrs: %v, want an error with %q", err, tt.wantErr)
			}
		})
	}
}

func mkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}
