package daemon

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/socialweb-computer/socialweb/internal/frontdoor"
	"github.com/socialweb-computer/socialweb/internal/nodes/qemu"
	"github.com/socialweb-computer/socialweb/internal/provider"
)

// --warm-pool out of range, or with a default node size this host cannot run, is refused
// by Validate, before anything is created; its VMs have the default node size.
func TestValidateWarmPool(t *testing.T) {
	base := Options{
		StateDir: t.TempDir(), APIPort: 7443, PortRange: "7500-7599", NetworkRange: "1-190", Accel: "tcg",
		FrontDoorDomain: frontdoor.DefaultDomain, FrontDoorMaxConnsPerSource: frontdoor.DefaultMaxConnsPerSource, FrontDoorMaxConns: frontdoor.DefaultMaxConns,
		Defaults: provider.Defaults{MaxNodes: 1, NodeCPUs: 1, PodsPerNode: 1, NodeMemory: resource.MustParse("1Gi"),
			NodeDisk: resource.MustParse("10Gi")},
	}
	tests := []struct {
		name    string
		change  func(*Options)
		wantErr string
	}{
		{"off (the default)", func(*Options) {}, ""},
		{"one", func(o *Options) { o.WarmPool = 1 }, ""},
		{"the most", func(o *Options) { o.WarmPool = qemu.MaxPoolSize }, ""},
		{"negative", func(o *Options) { o.WarmPool = -1 }, "--warm-pool -1: want 0 (no pool) to 16"},
		{"too many", func(o *Options) { o.WarmPool = 17 }, "--warm-pool 17: want 0 (no pool) to 16"},
		{"a default size the host cannot run", func(o *Options) { o.WarmPool, o.Defaults.NodeMemory = 1, resource.MustParse("64Ti") },
			"--warm-pool 1: its VMs have the default node size"},
		{"off with that size", func(o *Options) { o.Defaults.NodeMemory = resource.MustParse("64Ti") }, ""},
		{"refill at once", func(o *Options) { o.WarmPool, o.WarmPoolRefillDelay = 1, 0 }, ""},
		{"refill after an hour", func(o *Options) { o.WarmPool, o.WarmPoolRefillDelay = 1, time.Hour }, ""},
		{"negative refill delay", func(o *Options) { o.WarmPool, o.WarmPoolRefillDelay = 1, -time.Second },
			"--warm-pool-refill-delay -1s: want 0 (boot a claimed VM's replacement at once) to 1h0m0s"},
		{"refill delay too long", func(o *Options) { o.WarmPool, o.WarmPoolRefillDelay = 1, 2*time.Hour },
			"--warm-pool-refill-delay 2h0m0s: want 0"},
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.change(&o)
			_, err := Validate(context.Background(), o, log)
			if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Validate: %v, want %q", err, tc.wantErr)
			}
		})
	}
	if got, want := warmPoolShape(base.Defaults), (qemu.PoolShape{CPUs: 1, MemoryMiB: 1024, DiskMiB: 10240}); got != want {
		t.Errorf("pool shape %+v, want the default node size %+v", got, want)
	}
}
