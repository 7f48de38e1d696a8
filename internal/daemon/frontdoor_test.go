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
		FrontDoorDomain: frontdoor.DefaultDomain,
		Defaults:        provider.Defaults{MaxNodes: 1, NodeCPUs: 1, PodsPerNode: 1, NodeMemory: resource.MustParse("1Gi")},
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
