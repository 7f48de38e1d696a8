package daemon

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/socialweb-computer/socialweb/internal/frontdoor"
	"github.com/socialweb-computer/socialweb/internal/provider"
)

// Bad front-door input is refused by Validate, which runs before anything is
// created, with what would be accepted.
func TestValidateFrontDoor(t *testing.T) {
	base := Options{
		StateDir: t.TempDir(), APIPort: 7443, PortRange: "7500-7599", NetworkRange: "1-190", Accel: "tcg",
		FrontDoorDomain: frontdoor.DefaultDomain, FrontDoorMaxConnsPerSource: frontdoor.DefaultMaxConnsPerSource, FrontDoorMaxConns: frontdoor.DefaultMaxConns,
		Defaults: provider.Defaults{MaxNodes: 1, NodeCPUs: 1, PodsPerNode: 1, NodeMemory: resource.MustParse("1Gi")},
	}
	tests := []struct {
		name    string
		change  func(*Options)
		wantErr string
	}{
		{"off (the default)", func(*Options) {}, ""},
		{"on every interface", func(o *Options) { o.FrontDoor = "0.0.0.0:8443" }, ""},
		{"on loopback, another domain", func(o *Options) { o.FrontDoor, o.FrontDoorDomain = "127.0.0.1:8443", "tenants.example.com" }, ""},
		{"a domain that is no DNS name", func(o *Options) { o.FrontDoorDomain = "Tenants_Example" }, "--front-door-domain \"Tenants_Example\" is not a DNS name"},
		{"a bad domain with the door off", func(o *Options) { o.FrontDoorDomain = "tenants.example.com." }, "want a lowercase DNS name"},
		{"an empty domain", func(o *Options) { o.FrontDoor, o.FrontDoorDomain = ":8443", "" }, "--front-door-domain the domain is empty"},
		{"no port", func(o *Options) { o.FrontDoor = "0.0.0.0" }, "want HOST:PORT"},
		{"port 0", func(o *Options) { o.FrontDoor = ":0" }, "want HOST:PORT"},
		{"the management API's port", func(o *Options) { o.FrontDoor = "0.0.0.0:7443" }, "port 7443 is the management API's"},
		{"a tenant's port", func(o *Options) { o.FrontDoor = "127.0.0.1:7550" }, "pick another port"},
		{"limits of 1", func(o *Options) { o.FrontDoorMaxConnsPerSource, o.FrontDoorMaxConns = 1, 1 }, ""},
		{"no limit in total", func(o *Options) { o.FrontDoorMaxConns = 0 }, "--front-door-max-conns 0: want 1 to 1048576 connections"},
		{"a limit in total too high", func(o *Options) { o.FrontDoorMaxConns = 1 << 21 }, "--front-door-max-conns 2097152: want 1 to 1048576"},
		{"no limit per source, the door off", func(o *Options) { o.FrontDoorMaxConnsPerSource = 0 }, "--front-door-max-conns-per-source 0: want 1 to the limit from everyone (4096)"},
		{"more per source than in total", func(o *Options) { o.FrontDoor, o.FrontDoorMaxConnsPerSource, o.FrontDoorMaxConns = ":8443", 100, 10 }, "--front-door-max-conns-per-source 100: want 1 to the limit from everyone (10)"},
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
}
