package qemu

import (
	"strings"
	"testing"
)

func TestVMLimits(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    launch
		mib  int64
	}{
		{"KVM: guest and overhead", launch{Accel: AccelKVM, CPUs: 1, MemoryMiB: 1024, TCGCacheMiB: 1024}, 1024 + vmOverheadMiB},
		{"TCG: and its cache", launch{Accel: AccelTCG, CPUs: 2, MemoryMiB: 1024, TCGCacheMiB: 256}, 1024 + 256 + vmOverheadMiB},
		{"TCG: qemu's default cache", launch{Accel: AccelTCG, CPUs: 4, MemoryMiB: 2048}, 2048 + 1024 + vmOverheadMiB},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := vmLimits(tc.l)
			if got.MemoryMax != tc.mib<<20 || got.PIDsMax != 512 || got.CPUMaxMilli != tc.l.CPUs*1000+500 || got.Validate() != nil {
				t.Errorf("vmLimits = %+v, want memory %d MiB, 512 pids, %d.5 cores, valid", got, tc.mib, tc.l.CPUs)
			}
		})
	}
}

// Group names are one path component, differ between daemons, and name the VM.
func TestVMGroup(t *testing.T) {
	a, b := VMGroup("/var/lib/socialweb", "/var/lib/socialweb/nodes/ci-abc"), VMGroup("/srv/other", "/srv/other/nodes/ci-abc")
	if a == b || !strings.HasPrefix(a, "vm-") || !strings.HasSuffix(a, "-ci-abc") || strings.Contains(a, "/") {
		t.Errorf("VMGroup: %q and %q", a, b)
	}
}

// Only a recorded directory that is the group under the cgroup mount is removed.
func TestGroupDirs(t *testing.T) {
	const g = "vm-0123abcd-ci-x"
	for _, tc := range []struct {
		dirs []string
		want int
	}{
		{[]string{"/sys/fs/cgroup/memory/socialweb/" + g, "/sys/fs/cgroup/pids/socialweb/" + g}, 2},
		{[]string{"/sys/fs/cgroup/socialweb/" + g}, 1},
		{[]string{"/etc/" + g}, 0},
		{[]string{"/sys/fs/cgroup/../../etc/" + g}, 0},
		{[]string{"sys/fs/cgroup/memory/socialweb/" + g}, 0},
		{[]string{"/sys/fs/cgroup/memory/socialweb/other"}, 0},
		{nil, 0},
	} {
		if got := groupDirs(record{Cgroup: g, CgroupDirs: tc.dirs}); len(got) != tc.want {
			t.Errorf("groupDirs(%v) = %v, want %d of them", tc.dirs, got, tc.want)
		}
	}
}
