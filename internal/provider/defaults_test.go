package provider

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
)

func TestApplySizeDefaults(t *testing.T) {
	q := resource.MustParse
	// Defaults as `socialweb serve` has them: max 0 is "the same as the minimum".
	fixed := Defaults{NodeCPUs: 1, NodeMemory: q("1Gi"), NodeDisk: q("10Gi")}
	ranged := Defaults{NodeCPUs: 2, MaxNodeCPUs: 8, NodeMemory: q("2Gi"), MaxNodeMemory: q("16Gi"), NodeDisk: q("10Gi"), MaxNodeDisk: q("50Gi")}
	type size struct {
		cpus, maxCPUs              int32
		mem, maxMem, disk, maxDisk string
	}
	tests := []struct {
		name string
		spec v1.ClusterSpec
		d    Defaults
		want size
	}{
		{"nothing set, fixed defaults: today's fixed size", v1.ClusterSpec{}, fixed, size{1, 1, "1Gi", "1Gi", "10Gi", "10Gi"}},
		{"nothing set, ranged defaults", v1.ClusterSpec{}, ranged, size{2, 8, "2Gi", "16Gi", "10Gi", "50Gi"}},
		{"a set minimum above the default maximum fixes the size", v1.ClusterSpec{NodeCPUs: 4, NodeMemory: q("4Gi")}, fixed, size{4, 4, "4Gi", "4Gi", "10Gi", "10Gi"}},
		{"a set maximum below the default minimum lowers it", v1.ClusterSpec{MaxNodeCPUs: 1, MaxNodeMemory: q("1Gi"), MaxNodeDisk: q("5Gi")}, ranged, size{1, 1, "1Gi", "1Gi", "5Gi", "5Gi"}},
		{"a set maximum above the default minimum", v1.ClusterSpec{MaxNodeCPUs: 4, MaxNodeMemory: q("6Gi")}, fixed, size{1, 4, "1Gi", "6Gi", "10Gi", "10Gi"}},
		{"everything set is kept", v1.ClusterSpec{NodeCPUs: 3, MaxNodeCPUs: 5, NodeMemory: q("3Gi"), MaxNodeMemory: q("5Gi"), NodeDisk: q("20Gi"), MaxNodeDisk: q("30Gi")}, ranged,
			size{3, 5, "3Gi", "5Gi", "20Gi", "30Gi"}},
		{"no default disk: none", v1.ClusterSpec{}, Defaults{NodeCPUs: 1, NodeMemory: q("1Gi")}, size{1, 1, "1Gi", "1Gi", "0", "0"}},
	}
	for _, tc := range tests {
		s := tc.spec
		applySizeDefaults(&s, tc.d)
		got := size{s.NodeCPUs, s.MaxNodeCPUs, s.NodeMemory.String(), s.MaxNodeMemory.String(), s.NodeDisk.String(), s.MaxNodeDisk.String()}
		if got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
		if err := v1.ValidateNodeSizes(s, nil); err != nil {
			t.Errorf("%s: defaults made an invalid spec: %v", tc.name, err)
		}
	}
}
