package daemon

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/socialweb-computer/socialweb/internal/frontdoor"
	"github.com/socialweb-computer/socialweb/internal/provider"
	"github.com/socialweb-computer/socialweb/internal/registry"
)

// The --registry-* flags are read by Validate, before anything is created.
func TestValidateRegistryUpstream(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	os.WriteFile(notPEM, []byte("hello"), 0o600)
	base := Options{
		StateDir: dir, APIPort: 7443, PortRange: "7500-7599", NetworkRange: "1-190", Accel: "tcg",
		FrontDoorDomain: frontdoor.DefaultDomain, FrontDoorMaxConnsPerSource: frontdoor.DefaultMaxConnsPerSource, FrontDoorMaxConns: frontdoor.DefaultMaxConns,
		Defaults: provider.Defaults{MaxNodes: 1, NodeCPUs: 1, PodsPerNode: 1, NodeMemory: resource.MustParse("1Gi")},
	}
	for _, tc := range []struct {
		name    string
		change  func(*Options)
		offline bool
		check   func(*registry.Upstream) bool
		wantErr string
	}{
		{"the default pulls through, 5m tags", func(*Options) {}, false, func(u *registry.Upstream) bool { return u.TagTTL == 5*time.Minute && len(u.Mirrors) == 0 }, ""},
		{"offline", func(o *Options) { o.RegistryOffline = true }, true, nil, ""},
		{"offline with a mirror", func(o *Options) { o.RegistryOffline, o.RegistryMirrors = true, []string{"docker.io=https://m.example"} }, false, nil, "--registry-offline fetches from no registry"},
		{"a mirror and lists", func(o *Options) {
			o.RegistryMirrors, o.RegistryAllow, o.RegistryDeny, o.RegistryTagTTL = []string{"docker.io=https://m.example"}, []string{"docker.io", "*.example.com"}, []string{"bad.example.com"}, time.Hour
		}, false, func(u *registry.Upstream) bool {
			return u.Mirrors["docker.io"] == "https://m.example" && len(u.Allow) == 2 && len(u.Deny) == 1 && u.TagTTL == time.Hour
		}, ""},
		{"a mirror without a URL", func(o *Options) { o.RegistryMirrors = []string{"docker.io"} }, false, nil, "--registry-mirror mirror \"docker.io\": want REGISTRY=URL"},
		{"a mirror with a path", func(o *Options) { o.RegistryMirrors = []string{"docker.io=https://m.example/v2/"} }, false, nil, "no path"},
		{"a pattern with a path", func(o *Options) { o.RegistryDeny = []string{"ghcr.io/org"} }, false, nil, "want a registry host"},
		{"a missing CA file", func(o *Options) { o.RegistryCAs = []string{filepath.Join(dir, "nope.pem")} }, false, nil, "--registry-ca " + filepath.Join(dir, "nope.pem")},
		{"a CA file without PEM", func(o *Options) { o.RegistryCAs = []string{notPEM} }, false, nil, "no PEM certificate"},
		{"a negative TTL", func(o *Options) { o.RegistryTagTTL = -time.Second }, false, nil, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.change(&o)
			v, err := Validate(context.Background(), o, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Validate: %v, want %q", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if tc.offline != (v.upstream == nil) {
				t.Fatalf("upstream %+v, want offline %v", v.upstream, tc.offline)
			}
			if tc.check != nil && !tc.check(v.upstream) {
				t.Errorf("upstream %+v is not what the flags said", v.upstream)
			}
		})
	}
}
