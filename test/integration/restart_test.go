package integration

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// poller asks a tenant's apiserver for the default namespace every 100 ms, as a
// client that must not notice the daemon, and counts what failed.
type poller struct {
	name string
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	ok      int
	failed  []string
	longest time.Duration
}

func startPoller(t *testing.T, name string, cfg *rest.Config) *poller {
	t.Helper()
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = 90 * time.Second // the longest wait a client would sit out
	k := kubernetes.NewForConfigOrDie(cfg)
	p := &poller{name: name, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
			start := time.Now()
			_, err := k.CoreV1().Namespaces().Get(context.Background(), "default", metav1.GetOptions{})
			took := time.Since(start)
			p.mu.Lock()
			if err != nil {
				p.failed = append(p.failed, fmt.Sprintf("%s: %v", start.Format("15:04:05.000"), err))
			} else {
				p.ok++
			}
			p.longest = max(p.longest, took)
			p.mu.Unlock()
		}
	}()
	return p
}

// result stops the poller and says what it saw.
func (p *poller) result() (ok int, failed []string, longest time.Duration) {
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ok, p.failed, p.longest
}

// otherBuild writes a copy of the build under test with bytes appended: it runs
// the same, and its digest (what a daemon tells builds apart by) differs, as a
// new release's would.
func otherBuild(t *testing.T) string {
	t.Helper()
	src, err := os.Open(binary)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	path := filepath.Join(t.TempDir(), "socialweb-next")
	dst, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(dst, "\nsocialweb test build %d\n", time.Now().UnixNano())
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRestartKeepsTenantsUp is issue 40's restart and upgrade test: a client polls
// each of three tenants every 100 ms while the daemon is killed with -9 and started
// again, and then while it is stopped and replaced by another build. Not one request
// fails; the control planes are adopted across the first, and each runs the new build
// after the second, replaced one tenant at a time on the port the daemon holds.
func TestRestartKeepsTenantsUp(t *testing.T) {
	d := newDaemon(t, 3, "--control-planes-on-exit", "keep")
	d.start()
	names := []string{"keep-a", "keep-b", "keep-c"}
	for _, n := range names {
		d.mustCLI("cluster", "create", n, "--wait")
	}
	record := func(n string) string { return filepath.Join(d.stateDir, "clusters", n, "instance.json") }
	pidsOf := func() map[string]int {
		pids := map[string]int{}
		for _, n := range names {
			pids[n] = controlPlaneRunning(record(n))
		}
		return pids
	}
	measure := func(t *testing.T, what string, disturb func()) {
		var pollers []*poller
		for _, n := range names {
			cfg, _ := d.tenant(n)
			pollers = append(pollers, startPoller(t, n, cfg))
		}
		time.Sleep(time.Second) // answers before
		start := time.Now()
		disturb()
		time.Sleep(2 * time.Second) // answers after
		for _, p := range pollers {
			ok, failed, longest := p.result()
			t.Logf("%s, tenant %s: %d requests answered, %d failed, longest answer %s (over %s)",
				what, p.name, ok, len(failed), longest.Round(time.Millisecond), time.Since(start).Round(time.Second))
			if len(failed) > 0 {
				t.Errorf("%s: %d requests to %s failed; the first: %v", what, len(failed), p.name, failed[:min(5, len(failed))])
			}
			if ok < 10 {
				t.Errorf("%s: only %d requests to %s answered", what, ok, p.name)
			}
		}
	}

	t.Run("kill -9 and start", func(t *testing.T) {
		before := pidsOf()
		measure(t, "kill -9", func() {
			d.stop(syscall.SIGKILL)
			d.start()
			for _, n := range names {
				d.waitPhase(n, v1.PhaseReady, 2*time.Minute)
			}
		})
		if after := pidsOf(); !maps.Equal(before, after) || slices.Contains(slices.Collect(maps.Values(after)), 0) {
			t.Errorf("control planes %v after the restart, want %v adopted", after, before)
		}
	})

	t.Run("upgrade to another build", func(t *testing.T) {
		next := otherBuild(t)
		before := pidsOf()
		measure(t, "upgrade", func() {
			d.stop(syscall.SIGTERM) // keep: they serve on while no daemon runs
			for n, pid := range before {
				if controlPlaneRunning(record(n)) != pid {
					t.Errorf("%s's control plane stopped with the daemon (--control-planes-on-exit keep)", n)
				}
			}
			d.binary = next
			d.start()
			livetest.Eventually(t, 10*time.Minute, time.Second, "every control plane on the new build", func() bool {
				for _, n := range names {
					pid := controlPlaneRunning(record(n))
					if pid == 0 || pid == before[n] || exeOf(pid) != next {
						return false
					}
				}
				return true
			})
			for _, n := range names {
				d.waitPhase(n, v1.PhaseReady, 2*time.Minute)
			}
		})
		if exe := exeOf(controlPlaneRunning(filepath.Join(d.stateDir, "mgmt", "instance.json"))); exe != next {
			t.Errorf("the management API runs %s after the upgrade, want %s", exe, next)
		}
	})
}

func exeOf(pid int) string {
	p, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	return p
}
