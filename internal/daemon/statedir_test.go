package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReachableByTenants(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mode    os.FileMode // of the directory above the state dir
		wantErr bool
	}{
		{"searchable by others", 0o711, false},
		{"listable by others", 0o755, false},
		{"root's alone", 0o700, true},
		{"group only", 0o750, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			above := filepath.Join(t.TempDir(), "above")
			if err := os.Mkdir(above, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Dir(above), 0o711); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Dir(filepath.Dir(above)), 0o711); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(above, tc.mode); err != nil {
				t.Fatal(err)
			}
			err := reachableByTenants(filepath.Join(above, "state", "not-yet"))
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want error %v", err, tc.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), above) {
				t.Errorf("the error does not name %s: %v", above, err)
			}
		})
	}
}

func TestUIDRangesApart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cp, vm  int64
		wantErr bool
	}{
		{"the defaults", 2_000_000_000, 2_000_100_000, false},
		{"control planes root", 0, 2_000_100_000, false},
		{"VMs root", 2_000_000_000, 0, false},
		{"VMs start inside the control planes' range", 2_000_000_000, 2_000_065_535, true},
		{"control planes start inside the VMs' range", 2_000_150_000, 2_000_100_000, true},
		{"just apart", 2_000_000_000, 2_000_065_536, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := uidRangesApart(tc.cp, tc.vm); (err != nil) != tc.wantErr {
				t.Errorf("uidRangesApart(%d, %d) = %v, want error %v", tc.cp, tc.vm, err, tc.wantErr)
			}
		})
	}
}
