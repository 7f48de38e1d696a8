package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"time"
)

// StopAll stops every node VM of a state dir that no daemon serves: it adopts the VMs
// their records name (as Recover does, killing unrecorded qemus of the dir), then
// deletes each (powerdown, then signals), removing its tap and directory; consoles are
// kept as Delete keeps them. It fails without touching anything while a provider holds
// the state dir. A missing state dir stops nothing.
//
// It is the way out of "VMs survive the daemon for adoption": `socialweb down`, and the
// demo's exit path after its daemon is gone.
func StopAll(ctx context.Context, stateDir string, networks Networks, log *slog.Logger) ([]string, error) {
	if _, err := os.Stat(stateDir); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	cfg := Config{StateDir: stateDir, StopGrace: DefaultStopGrace, ConsolesKept: DefaultConsolesKept}
	if err := checkStateDir(&cfg); err != nil {
		return nil, err
	}
	lock, err := lockStateDir(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	p := &Provider{cfg: cfg, deps: Deps{Networks: networks}, log: log, now: time.Now, lock: lock, insts: map[string]*instance{}}
	defer p.Close()
	res, err := p.Recover(ctx)
	if err != nil {
		return nil, fmt.Errorf("finding the node VMs of %s: %w", stateDir, err)
	}
	var (
		stopped []string
		errs    []error
	)
	p.mu.Lock()
	names := make([]string, 0, len(p.insts))
	for n := range p.insts {
		names = append(names, n)
	}
	p.mu.Unlock()
	slices.Sort(names)
	for _, n := range names {
		if err := p.Delete(ctx, n); err != nil {
			errs = append(errs, err)
			continue
		}
		stopped = append(stopped, n)
	}
	for _, vm := range res.Pool {
		stopped = append(stopped, "warm-pool VM "+vm)
	}
	for _, pid := range res.Killed {
		stopped = append(stopped, fmt.Sprintf("unrecorded qemu (pid %d)", pid))
	}
	return stopped, errors.Join(errs...)
}
