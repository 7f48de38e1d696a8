package daemon

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/socialweb-computer/socialweb/internal/provider"
)

func TestValidateSizeDefaults(t *testing.T) {
	q := resource.MustParse
	base := func(f func(*provider.Defaults)) provider.Defaults {
		d := provider.Defaults{NodeCPUs: 2, NodeMemory: q("2Gi"), NodeDisk: q("10Gi")}
		f(&d)
		return d
	}
	tests := []struct {
		name    string
		d       provider.Defaults
		wantErr string
	}{
		{"serve's defaults: fixed size", base(func(*provider.Defaults) {}), ""},
		{"a range", base(func(d *provider.Defaults) { d.MaxNodeCPUs, d.MaxNodeMemory, d.MaxNodeDisk = 8, q("16Gi"), q("50Gi") }), ""},
		{"no disk", base(func(d *provider.Defaults) { d.NodeDisk = resource.Quantity{} }), ""},
		{"max cpus below", base(func(d *provider.Defaults) { d.MaxNodeCPUs = 1 }), "--default-max-node-cpus 1: want 0 (the same as --default-node-cpus) or 2 or more"},
		{"negative max cpus", base(func(d *provider.Defaults) { d.MaxNodeCPUs = -1 }), "--default-max-node-cpus -1"},
		{"max memory below", base(func(d *provider.Defaults) { d.MaxNodeMemory = q("1Gi") }), "--default-max-node-memory 1Gi: want 0 (the same as --default-node-memory) or 2Gi or more"},
		{"max disk below", base(func(d *provider.Defaults) { d.MaxNodeDisk = q("5Gi") }), "--default-max-node-disk 5Gi: want 0 (the same as --default-node-disk) or 10Gi or more"},
		{"negative disk", base(func(d *provider.Defaults) { d.NodeDisk = q("-1Gi") }), "--default-node-disk -1Gi"},
	}
	for _, tc := range tests {
		err := validateSizeDefaults(tc.d)
		if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.wantErr)
		}
	}
}
