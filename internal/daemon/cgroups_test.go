package daemon

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/socialweb-computer/socialweb/internal/provider"
)

// The groups of a state dir's clusters go, once recorded, with no --cgroup-parent at
// hand (socialweb down); another daemon's groups and a busy one stay.
func TestRemoveControlPlaneGroups(t *testing.T) {
	root, state := t.TempDir(), t.TempDir()
	for _, c := range []string{"memory", "pids", "cpu"} { // a v1 hierarchy
		if err := os.MkdirAll(filepath.Join(root, c), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, c, "cgroup.procs"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	group := func(stateDir, cluster string) []string {
		var ds []string
		for _, c := range []string{"memory", "pids", "cpu"} {
			ds = append(ds, filepath.Join(root, c, "sw", provider.CgroupName(stateDir, cluster)))
		}
		return ds
	}
	mk := func(ds []string) {
		for _, d := range ds {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range []string{"ci", "idle"} {
		if err := os.MkdirAll(filepath.Join(state, "clusters", c), 0o700); err != nil {
			t.Fatal(err)
		}
		mk(group(state, c))
	}
	other := group("/srv/another", "ci")
	mk(other)

	if err := recordCgroups(state, root, "sw"); err != nil {
		t.Fatal(err)
	}
	h, err := openRecordedCgroups(state)
	if err != nil || h == nil {
		t.Fatalf("openRecordedCgroups: %v, %v", h, err)
	}
	if err := removeControlPlaneGroups(h, state); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"ci", "idle"} {
		for _, d := range group(state, c) {
			if _, err := os.Stat(d); !os.IsNotExist(err) {
				t.Errorf("%s is left: %v", d, err)
			}
		}
	}
	for _, d := range other {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("another daemon's group %s went: %v", d, err)
		}
	}
	// Without cgroups the record goes, and there is nothing to open.
	if err := recordCgroups(state, root, ""); err != nil {
		t.Fatal(err)
	}
	if h, err := openRecordedCgroups(state); h != nil || err != nil {
		t.Errorf("after recording none: %v, %v", h, err)
	}
}
