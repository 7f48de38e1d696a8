package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"k8s.io/apimachinery/pkg/api/resource"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
)

// nodeSizeFlags are `cluster create`'s node size flags.
type nodeSizeFlags struct {
	cpus, maxCPUs                    int32
	memory, maxMemory, disk, maxDisk string
}

// hostLimits is what no node of this host can exceed.
type hostLimits struct {
	// fits says why a node of cpus and memMiB could never run here (qemu.CheckHostFits);
	// 0 is not checked.
	fits func(cpus, memMiB int64) error
	// stateDir is where node disks live: none can be larger than its filesystem.
	stateDir string
}

// specField is the flag of each node size field of a ClusterSpec.
func specField(field string) string {
	switch field {
	case "nodeCPUs":
		return "--node-cpus"
	case "maxNodeCPUs":
		return "--max-node-cpus"
	case "nodeMemory":
		return "--node-memory"
	case "maxNodeMemory":
		return "--max-node-memory"
	case "nodeDisk":
		return "--node-disk"
	case "maxNodeDisk":
		return "--max-node-disk"
	}
	return field
}

// apply sets in spec the sizes given (changed), leaving the rest to the daemon's
// defaults. It refuses, saying what would be accepted, a zero or negative size, a
// minimum above its maximum, and a size no node of this host could have.
func (f nodeSizeFlags) apply(spec *v1.ClusterSpec, changed func(string) bool, host hostLimits) error {
	var errs []error
	for _, c := range []struct {
		flag string
		v    int32
		to   *int32
	}{{"node-cpus", f.cpus, &spec.NodeCPUs}, {"max-node-cpus", f.maxCPUs, &spec.MaxNodeCPUs}} {
		if !changed(c.flag) {
			continue
		}
		if c.v < 1 {
			errs = append(errs, fmt.Errorf("--%s %d: want 1 or more", c.flag, c.v))
			continue
		}
		*c.to = c.v
	}
	for _, q := range []struct {
		flag, v, example string
		to               *resource.Quantity
	}{
		{"node-memory", f.memory, "2Gi or 512Mi", &spec.NodeMemory}, {"max-node-memory", f.maxMemory, "16Gi", &spec.MaxNodeMemory},
		{"node-disk", f.disk, "10Gi", &spec.NodeDisk}, {"max-node-disk", f.maxDisk, "50Gi", &spec.MaxNodeDisk},
	} {
		if !changed(q.flag) {
			continue
		}
		v, err := resource.ParseQuantity(q.v)
		if err != nil || v.Sign() <= 0 {
			errs = append(errs, fmt.Errorf("--%s %q: want a positive quantity such as %s", q.flag, q.v, q.example))
			continue
		}
		*q.to = v
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := v1.ValidateNodeSizes(*spec, specField); err != nil {
		return err
	}
	return host.check(*spec)
}

// check refuses sizes no node of this host could have.
func (h hostLimits) check(s v1.ClusterSpec) error {
	var errs []error
	if h.fits != nil {
		if err := h.fits(int64(s.NodeCPUs), s.NodeMemory.Value()>>20); err != nil {
			errs = append(errs, err)
		}
		if s.MaxNodeCPUs > 0 || !s.MaxNodeMemory.IsZero() {
			if err := h.fits(int64(s.MaxNodeCPUs), s.MaxNodeMemory.Value()>>20); err != nil {
				// CheckHostFits speaks of the minimum's flags.
				msg := strings.NewReplacer("--node-cpus", "--max-node-cpus", "--node-memory", "--max-node-memory").Replace(err.Error())
				errs = append(errs, fmt.Errorf("the largest node: %s", msg))
			}
		}
	}
	if total, at := filesystemMiB(h.stateDir); total > 0 {
		for _, d := range []struct {
			flag string
			v    resource.Quantity
		}{{"--node-disk", s.NodeDisk}, {"--max-node-disk", s.MaxNodeDisk}} {
			if d.v.Value()>>20 > total {
				errs = append(errs, fmt.Errorf("%s %s: more than the %d GiB filesystem at %s that holds node disks: use %s %dGi or less",
					d.flag, d.v.String(), total>>10, at, d.flag, total>>10))
			}
		}
	}
	return errors.Join(errs...)
}

// filesystemMiB is the size of the filesystem dir is (or would be) on, and the existing
// directory it was measured at; 0 if unknown.
func filesystemMiB(dir string) (int64, string) {
	if dir == "" {
		return 0, ""
	}
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		var st syscall.Statfs_t
		if err := syscall.Statfs(d, &st); err == nil {
			return int64(st.Blocks) * int64(st.Bsize) >> 20, d
		} else if !errors.Is(err, os.ErrNotExist) || d == filepath.Dir(d) {
			return 0, ""
		}
	}
}
