package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/socialweb-computer/socialweb/internal/cgroup"
	"github.com/socialweb-computer/socialweb/internal/provider"
)

// cgroupRecord says where serve put its control planes' groups, so that `socialweb
// down`, which has no --cgroup-parent, removes them after the daemon is gone.
type cgroupRecord struct {
	Root   string `json:"root"`
	Parent string `json:"parent"`
}

func cgroupRecordPath(stateDir string) string { return filepath.Join(stateDir, "cgroup.json") }

// recordCgroups writes (or, without cgroups, removes) the record of where the groups are.
func recordCgroups(stateDir, root, parent string) error {
	path := cgroupRecordPath(stateDir)
	if parent == "" {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	b, err := json.Marshal(cgroupRecord{Root: root, Parent: parent})
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// openRecordedCgroups opens the hierarchy a serve of stateDir recorded; nil if it
// recorded none.
func openRecordedCgroups(stateDir string) (*cgroup.Hierarchy, error) {
	b, err := os.ReadFile(cgroupRecordPath(stateDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r cgroupRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", cgroupRecordPath(stateDir), err)
	}
	return cgroup.Open(r.Root, r.Parent)
}

// removeControlPlaneGroups removes the groups of the clusters of stateDir, whose
// control planes are stopped: a group that still holds a process stays, with an error.
func removeControlPlaneGroups(h *cgroup.Hierarchy, stateDir string) error {
	if h == nil {
		return nil
	}
	dirs, err := os.ReadDir(filepath.Join(stateDir, "clusters"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var errs []error
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		errs = append(errs, h.Lookup(provider.CgroupName(stateDir, d.Name())).Remove())
	}
	return errors.Join(errs...)
}
