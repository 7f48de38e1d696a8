package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/socialweb-computer/socialweb/internal/buildinfo"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
)

// The checks of /readyz, by the names its body gives them.
const (
	checkManagementAPI = "management-api"
	checkProvider      = "provider"
	checkRegistry      = "registry"
)

// readyTimeout bounds each /readyz check: one that hangs fails.
const readyTimeout = 3 * time.Second

// check is one readiness check; its error says what failed and where to look.
type check struct {
	name string
	run  func(ctx context.Context) error
}

// readiness holds the checks of /readyz. Each is set once what it checks exists
// (Run brings them up in turn) and fails until then.
type readiness struct {
	mu     sync.Mutex
	names  []string
	checks map[string]func(context.Context) error
}

func newReadiness(names ...string) *readiness {
	return &readiness{names: names, checks: map[string]func(context.Context) error{}}
}

func (r *readiness) set(name string, f func(context.Context) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checks[name] = f
}

// list is every check in order, those not set yet failing as not started.
func (r *readiness) list() []check {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]check, 0, len(r.names))
	for _, n := range r.names {
		f := r.checks[n]
		if f == nil {
			f = func(context.Context) error {
				return errors.New("not started yet: the daemon is still starting; see its log")
			}
		}
		out = append(out, check{name: n, run: f})
	}
	return out
}

// healthzHandler is liveness: answering at all is the check.
func healthzHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
}

// readyzHandler runs every check at once, each bounded by timeout, and answers
// 200 if all pass, else 503, with a line per check as kube-apiserver's
// /readyz?verbose does: "[+]name ok" or "[-]name failed: why".
func readyzHandler(checks func() []check, timeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cs := checks()
		errs := make([]error, len(cs))
		var wg sync.WaitGroup
		for i, c := range cs {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(r.Context(), timeout)
				defer cancel()
				errs[i] = c.run(ctx)
			})
		}
		wg.Wait()
		var b bytes.Buffer
		var failed []string
		for i, c := range cs {
			if errs[i] != nil {
				failed = append(failed, c.name)
				fmt.Fprintf(&b, "[-]%s failed: %v\n", c.name, errs[i])
				continue
			}
			fmt.Fprintf(&b, "[+]%s ok\n", c.name)
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if len(failed) > 0 {
			fmt.Fprintf(&b, "readyz check failed: %s\n", strings.Join(failed, ", "))
			w.WriteHeader(http.StatusServiceUnavailable)
		} else {
			b.WriteString("readyz check passed\n")
		}
		_, _ = w.Write(b.Bytes())
	})
}

// managementAPICheck GETs the management API's /readyz as the daemon itself
// connects to it (its rest config); logPath is where to look when it fails.
func managementAPICheck(cfg *rest.Config, logPath string) (func(context.Context) error, error) {
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("a client for the management API's readiness: %w", err)
	}
	url := strings.TrimSuffix(cfg.Host, "/") + "/readyz"
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("GET %s: %w; see %s", url, err, logPath)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<10))
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s answered %s%s; see %s", url, resp.Status, failedChecks(body), logPath)
		}
		return nil
	}, nil
}

// failedChecks is the failing lines ("[-]...") of a kube-apiserver /readyz
// body, as ": a; b", or "" if it names none.
func failedChecks(body []byte) string {
	var failed []string
	for l := range strings.Lines(string(body)) {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "[-]") {
			failed = append(failed, strings.TrimPrefix(l, "[-]"))
		}
	}
	if len(failed) == 0 {
		return ""
	}
	return ": " + strings.Join(failed, "; ")
}

// providerCheck passes once the provider runs: its Cluster informer has listed
// the Clusters, so it reconciles them.
func providerCheck(synced func() bool) func(context.Context) error {
	return func(context.Context) error {
		if !synced() {
			return errors.New("the provider has not listed the Clusters yet (it has not started, or the management API does not answer lists); see the daemon's log")
		}
		return nil
	}
}

// registryCheck passes while the registry's store directory can be read.
func registryCheck(dir string) func(context.Context) error {
	return func(context.Context) error {
		f, err := os.Open(dir)
		if err == nil {
			_, err = f.Readdirnames(1)
			f.Close()
			if errors.Is(err, io.EOF) {
				err = nil
			}
		}
		if err != nil {
			return fmt.Errorf("the registry's store %s cannot be read: %w; check that disk and the directory's permissions", dir, err)
		}
		return nil
	}
}

// buildInfoCollector is socialweb_build_info: 1, labeled with the running build.
func buildInfoCollector(i buildinfo.Info) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "socialweb_build_info",
		Help: "Always 1; its labels say which build runs: socialweb version, commit, Kubernetes version, Go version.",
	}, []string{"version", "commit", "kubernetes", "go"})
	g.WithLabelValues(i.Version, i.Commit, i.Kubernetes, i.Go).Set(1)
	return g
}

// rolloutCollectors report this daemon's upgrade of control planes an earlier
// daemon left on another build: how many it replaced and kept, and whether it
// stopped (alert on socialweb_rollout_halted).
func rolloutCollectors(sup *supervisor.Supervisor) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "socialweb_rollout_halted",
			Help: "1 when the upgrade of control planes to this build stopped at one that failed (see the log's \"rolling upgrade stopped\"); 0 otherwise"},
			func() float64 {
				if sup.Rollout().Halted != "" {
					return 1
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "socialweb_rollout_replaced",
			Help: "control planes of an earlier build or configuration this daemon replaced with its own"},
			func() float64 { return float64(len(sup.Rollout().Replaced)) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "socialweb_rollout_kept",
			Help: "control planes of an earlier build or configuration this daemon kept as they were (--upgrade-strategy manual, or after the rollout stopped)"},
			func() float64 { return float64(len(sup.Rollout().Kept)) }),
	}
}
