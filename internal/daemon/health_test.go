package daemon

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/rest"

	"github.com/socialweb-computer/socialweb/internal/buildinfo"
)

func pass(context.Context) error { return nil }

func TestReadyz(t *testing.T) {
	hang := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	for _, tc := range []struct {
		name     string
		checks   []check
		wantCode int
		want     []string // lines of the body, in order
	}{
		{"all pass", []check{{"management-api", pass}, {"provider", pass}, {"registry", pass}}, http.StatusOK,
			[]string{"[+]management-api ok", "[+]provider ok", "[+]registry ok", "readyz check passed"}},
		{"one fails, named with why", []check{{"management-api", pass}, {"provider", func(context.Context) error { return errors.New("not synced; see the log") }}},
			http.StatusServiceUnavailable,
			[]string{"[+]management-api ok", "[-]provider failed: not synced; see the log", "readyz check failed: provider"}},
		{"a check that hangs fails at the timeout", []check{{"management-api", hang}, {"registry", pass}}, http.StatusServiceUnavailable,
			[]string{"[-]management-api failed: context deadline exceeded", "[+]registry ok", "readyz check failed: management-api"}},
		{"every failure is named", []check{{"a", func(context.Context) error { return errors.New("x") }}, {"b", func(context.Context) error { return errors.New("y") }}},
			http.StatusServiceUnavailable, []string{"[-]a failed: x", "[-]b failed: y", "readyz check failed: a, b"}},
		{"no checks pass", nil, http.StatusOK, []string{"readyz check passed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := readyzHandler(func() []check { return tc.checks }, 50*time.Millisecond)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			if rec.Code != tc.wantCode {
				t.Errorf("status %d, want %d", rec.Code, tc.wantCode)
			}
			if got, want := rec.Body.String(), strings.Join(tc.want, "\n")+"\n"; got != want {
				t.Errorf("body\n%s\nwant\n%s", got, want)
			}
		})
	}
}

// Checks not set yet fail as still starting; set, they run, in the order named.
func TestReadinessList(t *testing.T) {
	r := newReadiness(checkManagementAPI, checkProvider)
	r.set(checkProvider, pass)
	cs := r.list()
	if len(cs) != 2 || cs[0].name != checkManagementAPI || cs[1].name != checkProvider {
		t.Fatalf("list = %+v, want management-api then provider", cs)
	}
	if err := cs[0].run(t.Context()); err == nil || !strings.Contains(err.Error(), "not started yet") {
		t.Errorf("an unset check: %v, want it to say it has not started", err)
	}
	if err := cs[1].run(t.Context()); err != nil {
		t.Errorf("a set check: %v", err)
	}
}

func TestHealthz(t *testing.T) {
	rec := httptest.NewRecorder()
	healthzHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if rec.Code != http.StatusOK || rec.Body.String() != "ok\n" {
		t.Errorf("/healthz = %d %q, want 200 ok", rec.Code, rec.Body.String())
	}
}

func TestManagementAPICheck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		code    int
		body    string
		wantErr string
	}{
		{"ready", http.StatusOK, "ok", ""},
		{"not ready, its failing checks named", http.StatusInternalServerError,
			"[+]ping ok\n[-]etcd failed: reason withheld\n[-]poststarthook/x failed: reason withheld\nreadyz check failed\n",
			"answered 500 Internal Server Error: etcd failed: reason withheld; poststarthook/x failed: reason withheld; see /state/mgmt/controlplane.log"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/readyz" {
					http.NotFound(w, r)
					return
				}
				w.WriteHeader(tc.code)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			f, err := managementAPICheck(&rest.Config{Host: srv.URL}, "/state/mgmt/controlplane.log")
			if err != nil {
				t.Fatal(err)
			}
			err = f(t.Context())
			if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("check: %v, want %q", err, tc.wantErr)
			}
		})
	}
	// Nothing listens: the error says where to look.
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	f, err := managementAPICheck(&rest.Config{Host: url}, "/state/mgmt/controlplane.log")
	if err != nil {
		t.Fatal(err)
	}
	if err := f(t.Context()); err == nil || !strings.Contains(err.Error(), "see /state/mgmt/controlplane.log") {
		t.Errorf("check of a management API that is down: %v, want it to name its log", err)
	}
}

func TestProviderCheck(t *testing.T) {
	if err := providerCheck(func() bool { return true })(t.Context()); err != nil {
		t.Errorf("synced: %v", err)
	}
	if err := providerCheck(func() bool { return false })(t.Context()); err == nil || !strings.Contains(err.Error(), "not listed the Clusters") {
		t.Errorf("not synced: %v, want it to say so", err)
	}
}

func TestRegistryCheck(t *testing.T) {
	dir := t.TempDir()
	if err := registryCheck(dir)(t.Context()); err != nil {
		t.Errorf("an empty readable dir: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "blob"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := registryCheck(dir)(t.Context()); err != nil {
		t.Errorf("a readable dir: %v", err)
	}
	missing := filepath.Join(dir, "gone")
	if err := registryCheck(missing)(t.Context()); err == nil || !strings.Contains(err.Error(), "the registry's store "+missing+" cannot be read") {
		t.Errorf("a missing dir: %v, want it named", err)
	}
}

func TestBuildInfoCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(buildInfoCollector(buildinfo.Info{Version: "v0.4.0", Commit: "abc", Kubernetes: "v1.37.2", Go: "go1.26.6"}))
	want := `
# HELP socialweb_build_info Always 1; its labels say which build runs: socialweb version, commit, Kubernetes version, Go version.
# TYPE socialweb_build_info gauge
socialweb_build_info{commit="abc",go="go1.26.6",kubernetes="v1.37.2",version="v0.4.0"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "socialweb_build_info"); err != nil {
		t.Error(err)
	}
}
