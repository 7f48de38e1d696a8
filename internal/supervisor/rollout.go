package supervisor

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Upgrade says what a new daemon does with a process an earlier daemon left
// running whose fingerprint (build or configuration) differs from its own.
type Upgrade string

const (
	// UpgradeRolling replaces such processes one at a time, each once the one
	// before serves; a replacement that fails stops the rollout (the rest keep
	// running as they are).
	UpgradeRolling Upgrade = "rolling"
	// UpgradeOnRestart replaces them all at once, as the daemon starts.
	UpgradeOnRestart Upgrade = "on-restart"
	// UpgradeManual keeps them running; each runs the new build once it next
	// restarts for another reason (a sleep and wake, a crash, a daemon restart
	// with another strategy).
	UpgradeManual Upgrade = "manual"
)

// Upgrades are the strategies, for help texts and errors.
func Upgrades() []Upgrade { return []Upgrade{UpgradeRolling, UpgradeOnRestart, UpgradeManual} }

// ParseUpgrade reads a strategy.
func ParseUpgrade(s string) (Upgrade, error) {
	for _, u := range Upgrades() {
		if string(u) == s {
			return u, nil
		}
	}
	return "", fmt.Errorf("upgrade strategy %q: want one of %v", s, Upgrades())
}

// RolloutState is what a rolling upgrade did so far.
type RolloutState struct {
	Mode     Upgrade
	Current  string   // the process being replaced now
	Replaced []string // replaced, serving
	Kept     []string // left as they were (manual, or after a halt)
	Halted   string   // why the rollout stopped; empty while it goes on
}

// readyTimeout bounds the wait for a replacement to serve.
const readyTimeout = 5 * time.Minute

// rollout lets one replacement run at a time.
type rollout struct {
	mode  Upgrade
	log   *slog.Logger
	token chan struct{}

	mu sync.Mutex
	st RolloutState
}

func newRollout(mode Upgrade, log *slog.Logger) *rollout {
	if mode == "" {
		mode = UpgradeRolling
	}
	r := &rollout{mode: mode, log: log, token: make(chan struct{}, 1)}
	r.st.Mode = mode
	return r
}

func (r *rollout) state() RolloutState {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.st
	st.Replaced = append([]string(nil), st.Replaced...)
	st.Kept = append([]string(nil), st.Kept...)
	return st
}

func (r *rollout) keepReason() string {
	if r.mode == UpgradeManual {
		return "the manual upgrade strategy keeps it until it next restarts"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return "the rollout stopped: " + r.st.Halted
}

// step is one replacement of a rolling upgrade; nil for the other strategies.
type step struct {
	r     *rollout
	name  string
	once  sync.Once
	begun time.Time
}

// begin decides for name's process of another fingerprint: keep it, or replace
// it (then, rolling, after the replacement before it serves: it blocks until
// then, and the caller reports through the step).
func (r *rollout) begin(name string) (*step, bool) {
	switch r.mode {
	case UpgradeManual:
		r.kept(name)
		return nil, true
	case UpgradeOnRestart:
		return nil, false
	}
	r.token <- struct{}{}
	r.mu.Lock()
	halted := r.st.Halted != ""
	if !halted {
		r.st.Current = name
	}
	r.mu.Unlock()
	if halted {
		<-r.token
		r.kept(name)
		return nil, true
	}
	return &step{r: r, name: name, begun: time.Now()}, false
}

func (r *rollout) kept(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.st.Kept = append(r.st.Kept, name)
}

// done ends the step: the replacement serves (why empty) or failed.
func (s *step) done(why string) {
	s.once.Do(func() {
		r := s.r
		r.mu.Lock()
		r.st.Current = ""
		if why == "" {
			r.st.Replaced = append(r.st.Replaced, s.name)
		} else {
			r.st.Halted = fmt.Sprintf("the new build's %s %s", s.name, why)
		}
		halted := r.st.Halted
		r.mu.Unlock()
		if why == "" {
			r.log.Info("replaced with the new build; it serves", "process", s.name, "took", time.Since(s.begun).Round(time.Millisecond))
		} else {
			r.log.Error("rolling upgrade stopped: the processes not yet replaced keep their build; fix the build (see the process's log) and restart the daemon", "process", s.name, "why", halted)
		}
		<-r.token
	})
}

// failed ends the step with a start that failed.
func (s *step) failed(why string) { s.done("failed to start: " + why) }

// watch waits for the replacement to serve (spec.Ready) and ends the step; an
// exit first (a crash) or no answer within readyTimeout ends it failed. The
// returned channel carries the run's exit on, whenever it comes.
func (s *step) watch(spec Spec, exited <-chan error) <-chan error {
	out := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
		defer cancel()
		if spec.Ready == nil {
			s.done("")
			out <- <-exited
			return
		}
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case err := <-exited:
				s.done(fmt.Sprintf("exited before it served (%v)", err))
				out <- err
				return
			case <-ctx.Done():
				s.done(fmt.Sprintf("did not serve within %s", readyTimeout))
				out <- <-exited
				return
			case <-tick.C:
				rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
				err := spec.Ready(rctx)
				rcancel()
				if err == nil {
					s.done("")
					out <- <-exited
					return
				}
			}
		}
	}()
	return out
}
