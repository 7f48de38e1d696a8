package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// TestBadInputChangesNothing: each bad input exits non-zero with a message
// that says what was wrong, and leaves no Cluster, file or lease behind.
func TestBadInputChangesNothing(t *testing.T) {
	d := newDaemon(t, 2)
	d.start()
	d.mustCLI("cluster", "create", "dup")
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantErr  string
	}{
		{"name not a DNS label", []string{"cluster", "create", "Bad_Name"}, 2, "not a DNS-1123 label"},
		{"name too long", []string{"cluster", "create", strings.Repeat("a", 41)}, 2, "at most 40"},
		{"no name", []string{"cluster", "create"}, 2, "exactly one cluster NAME"},
		{"max-nodes does not parse", []string{"cluster", "create", "ok1", "--max-nodes", "abc"}, 2, "invalid argument"},
		{"hold does not parse", []string{"cluster", "create", "ok1", "--hold", "soon"}, 2, "invalid argument"},
		{"sleep-after below the minimum", []string{"cluster", "create", "ok1", "--sleep-after", "5s"}, 2, "want 0 (never sleep) or 30s or more"},
		{"sleep-after negative", []string{"cluster", "create", "ok1", "--sleep-after", "-1m"}, 2, "want 0 (never sleep) or 30s or more"},
		{"negative max-nodes", []string{"cluster", "create", "ok1", "--max-nodes", "-1"}, 2, "want 0 or more"},
		{"memory does not parse", []string{"cluster", "create", "ok1", "--node-memory", "lots"}, 2, "want a positive quantity"},
		{"nodes larger than the host (CPUs)", []string{"cluster", "create", "ok1", "--node-cpus", "64"}, 2, "do not fit this host"},
		{"node CPUs beyond any host", []string{"cluster", "create", "ok1", "--node-cpus", "4096"}, 2, "want 1 to 256"},
		{"nodes larger than the host (memory)", []string{"cluster", "create", "ok1", "--node-memory", "64Ti"}, 2, "use --node-memory"},
		{"largest node below the smallest", []string{"cluster", "create", "ok1", "--node-cpus", "2", "--max-node-cpus", "1"}, 2, "want --max-node-cpus 2 or more"},
		{"largest node beyond the host", []string{"cluster", "create", "ok1", "--max-node-memory", "64Ti"}, 2, "use --max-node-memory"},
		{"negative node disk", []string{"cluster", "create", "ok1", "--node-disk", "-1Gi"}, 2, "want a positive quantity"},
		{"nodes below the image's minimum", []string{"cluster", "create", "ok1", "--node-memory", "64Mi"}, 2, "below the 256 MiB"},
		{"unknown flag", []string{"cluster", "create", "ok1", "--nodes", "3"}, 2, "unknown flag"},
		{"duplicate create", []string{"cluster", "create", "dup"}, 1, "already exists"},
		{"get unknown", []string{"cluster", "get", "nosuch"}, 1, "not found"},
		{"delete unknown", []string{"cluster", "delete", "nosuch"}, 1, "not found"},
		{"kubeconfig unknown", []string{"cluster", "kubeconfig", "nosuch"}, 1, "not found"},
		{"bad output format", []string{"cluster", "get", "dup", "-o", "xml"}, 2, "want one of json, yaml, wide"},
		{"idle schedule does not parse", []string{"cluster", "create", "ok1", "--idle-nodes", "1", "--idle-schedule", "weekdays 08:00-18:00"}, 2, `day "weekdays"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errOut, code := d.cli(tt.args...)
			if code != tt.wantCode || !strings.Contains(errOut, tt.wantErr) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, errOut, tt.wantCode, tt.wantErr)
			}
		})
	}
	// kubectl meets the same refusals in the management API's CRD, with messages that say
	// what would be right: here an idleSchedule window.Parse would refuse.
	mgmt := d.management()
	for _, tt := range []struct{ name, schedule, wantErr string }{
		{"idleSchedule not DAYS HH:MM-HH:MM", "weekdays 08:00-18:00", `e.g. "Mon-Fri 08:00-18:00 Europe/Berlin"`},
		{"idleSchedule with a one-digit hour", "Mon-Fri 8:00-18:00", "idleSchedule must be DAYS HH:MM-HH:MM [ZONE]"},
		{"idleSchedule with an empty span", "Mon-Fri 08:00-08:00", "idleSchedule's span is empty"},
	} {
		t.Run("kubectl: "+tt.name, func(t *testing.T) {
			c := &v1.Cluster{TypeMeta: metav1.TypeMeta{APIVersion: v1.Group + "/" + v1.Version, Kind: v1.Kind},
				ObjectMeta: metav1.ObjectMeta{Name: "ok2"}, Spec: v1.ClusterSpec{IdleNodes: 1, IdleSchedule: tt.schedule}}
			u, err := c.ToUnstructured()
			if err != nil {
				t.Fatal(err)
			}
			_, err = mgmt.Resource(v1.ClusterResource).Create(context.Background(), u, metav1.CreateOptions{})
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tt.wantErr) || strings.Contains(err.Error(), "should match") {
				t.Errorf("create with idleSchedule %q: %v; want Invalid saying %q", tt.schedule, err, tt.wantErr)
			}
		})
	}
	out := d.mustCLI("cluster", "list")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], "dup ") {
		t.Errorf("after bad input, cluster list =\n%s\nwant only dup", out)
	}
	entries, _ := os.ReadDir(filepath.Join(d.stateDir, "clusters"))
	if len(entries) != 1 || entries[0].Name() != "dup" {
		t.Errorf("cluster dirs after bad input: %v, want only dup", entries)
	}
}

// TestServeRefusesBadConfigBeforeCreatingAnything: serve exits non-zero
// with a clear message and creates no state dir.
func TestServeRefusesBadConfigBeforeCreatingAnything(t *testing.T) {
	deadPort := livetest.FreePort(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"postgres that does not answer", []string{"--datastore", fmt.Sprintf("postgres://u:secret@127.0.0.1:%d/postgres?sslmode=disable", deadPort)}, "does not answer"},
		{"unknown datastore", []string{"--datastore", "mysql://x@127.0.0.1/db"}, "not supported"},
		{"port range backwards", []string{"--port-range", "9000-8000"}, "LOW <= HIGH"},
		{"api port inside the range", []string{"--api-port", "9001", "--port-range", "9000-9010"}, "inside --port-range"},
		{"hold does not parse", []string{"--default-hold", "forever"}, "invalid argument"},
		{"memory does not parse", []string{"--default-node-memory", "lots"}, "want a quantity"},
		{"default sleep-after below the minimum", []string{"--default-sleep-after", "10s"}, "want 0 (never sleep) or 30s or more"},
		{"node image that is not one", []string{"--node-image", "/nonexistent/image"}, "socialweb image build"},
		{"unknown accelerator", []string{"--accel", "hvf"}, "want auto"},
		{"TCG translation cache out of range", []string{"--tcg-cache-mib", "8"}, "want 0 (qemu's default, 1024) or 32 to 1024 MiB"},
		{"front door domain that is no DNS name", []string{"--front-door", "127.0.0.1:9443", "--front-door-domain", "Tenants_Example"}, "want a lowercase DNS name"},
		{"front door without a port", []string{"--front-door", "127.0.0.1"}, "want HOST:PORT"},
		{"front door on a tenant port", []string{"--front-door", "127.0.0.1:9005", "--port-range", "9000-9010"}, "pick another port"},
		{"front door on a port in use", []string{"--front-door", busy.Addr().String()}, "stop what listens there"},
		{"control-plane uid base among users' uids", []string{"--control-plane-uid-base", "1000"}, "--control-plane-uid-base 1000: want 0 (control planes run as root) or at least 65536"},
		{"front door without a connection limit", []string{"--front-door-max-conns", "0"}, "--front-door-max-conns 0: want 1 to 1048576"},
		{"front door limit per source above the total", []string{"--front-door", "127.0.0.1:9443", "--front-door-max-conns-per-source", "100", "--front-door-max-conns", "10"}, "--front-door-max-conns-per-source 100: want 1 to the limit from everyone (10)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := filepath.Join(stateTempDir(t), "state")
			args := append([]string{"serve", "--state-dir", state, "--metrics-address", ""}, tt.args...)
			_, errOut, code := run(args...)
			if code == 0 || !strings.Contains(errOut, tt.wantErr) {
				t.Errorf("exit %d, stderr %q; want non-zero and %q", code, errOut, tt.wantErr)
			}
			if strings.Contains(errOut, "secret") {
				t.Errorf("the error leaks a password: %q", errOut)
			}
			if _, err := os.Stat(state); !os.IsNotExist(err) {
				t.Errorf("a refused serve created %s", state)
			}
		})
	}
	t.Run("CLI without a daemon", func(t *testing.T) {
		_, errOut, code := run("cluster", "list", "--state-dir", t.TempDir())
		if code == 0 || !strings.Contains(errOut, "socialweb serve") {
			t.Errorf("exit %d, stderr %q; want advice to start the daemon", code, errOut)
		}
	})
	t.Run("bad accelerator twin", func(t *testing.T) {
		t.Setenv("SOCIALWEB_ACCEL", "xen")
		state := filepath.Join(stateTempDir(t), "s")
		_, errOut, code := run("serve", "--state-dir", state)
		if code == 0 || !strings.Contains(errOut, `"xen"`) {
			t.Errorf("exit %d, stderr %q; want the value refused", code, errOut)
		}
		if _, err := os.Stat(state); !os.IsNotExist(err) {
			t.Errorf("a refused serve created %s", state)
		}
	})
	t.Run("state dir tenant uids cannot reach", func(t *testing.T) {
		state := filepath.Join(t.TempDir(), "s") // the test's temporary dir above is 0700
		_, errOut, code := run("serve", "--state-dir", state)
		if code == 0 || !strings.Contains(errOut, "is not searchable by other users") {
			t.Errorf("exit %d, stderr %q; want the unsearchable directory named", code, errOut)
		}
		if _, err := os.Stat(state); !os.IsNotExist(err) {
			t.Errorf("a refused serve created %s", state)
		}
	})
	t.Run("bad environment twin", func(t *testing.T) {
		t.Setenv("SOCIALWEB_DEFAULT_MAX_NODES", "many")
		_, errOut, code := run("serve", "--state-dir", filepath.Join(stateTempDir(t), "s"))
		if code == 0 || !strings.Contains(errOut, "SOCIALWEB_DEFAULT_MAX_NODES") {
			t.Errorf("exit %d, stderr %q; want the env var named", code, errOut)
		}
	})
}
