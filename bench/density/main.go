// Command density measures how many tenant control planes one host holds (issue 13,
// part 4). Each mode runs its own `socialweb serve` on a fresh temp state dir
// (--node-network=false: no nodes; --metrics-address ""; its own API port and a free
// port range for N+1 tenants) and creates tenants 4 at a time with `cluster create
// NAME --wait`, logging progress every 25 tenants with the elapsed time and the PSS
// of the daemon and all its descendants.
//
//   - awake: today's build, no sleep. Creates up to -tenants and stops early when
//     MemAvailable falls below -reserve-mib or a create fails; reports how many it
//     held, their PSS, and the first-request latency against awake tenants.
//   - sleep: --default-sleep-after (30s). Creates -tenants (each starts awake and falls
//     asleep after the sleep-after; MemAvailable under -reserve-mib pauses the creates
//     until enough have), keeps -awake of them awake (a namespace list every 10 s with
//     each one's own kubeconfig), waits until the rest are Asleep, then reports the PSS
//     by part (the daemon process, the management API, each tenant's processes: a
//     sleeping tenant should have none), memory per sleeping tenant (what is left over
//     the daemon alone once every awake tenant's processes are subtracted, each PSS the
//     median of 3 reads), the wake latency (connection start to first response byte of
//     a pod list) over -wake-samples sleeping tenants, and create -> Ready of tenant N+1.
//     1000 tenants at 4 creates in flight and ~12 s per create on 2 cores: about 50 min
//     of creates, with some 15 tenants awake at a time.
//   - both (default): awake first, then sleep, in one table side by side.
//
// At the end of each mode the daemon is stopped with SIGTERM (deleting many clusters is
// slow and the state is thrown away), any process naming the state dir is killed and the
// dir is removed.
//
//	go run ./bench/density -bin bin/socialweb [-tenants 1000] [-awake 10] [-mode both|awake|sleep]
//	    [-concurrency 4] [-wake-samples 20] [-reserve-mib 2048] [-sleep-after 30s] [-settle 30s]
//	    [-sleep-timeout 20m] [-keep-logs] [-serve-arg --cgroup-parent= ...]
//
// -serve-arg adds one flag to each daemon's serve command line (repeatable): the
// daemon gets no SOCIALWEB_* variable from the bench's environment, so a flag is the
// way to run it otherwise (bench/walls.sh runs it without cgroups with
// -serve-arg=--cgroup-parent=).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// options are the benchmark's flags.
type options struct {
	bin          string
	tenants      int
	awake        int
	mode         string
	concurrency  int
	wakeSamples  int
	reserveMiB   float64
	sleepAfter   time.Duration
	settle       time.Duration
	sleepTimeout time.Duration
	keepLogs     bool
	serveArgs    []string
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin/socialweb", "socialweb binary")
	flag.IntVar(&o.tenants, "tenants", 1000, "tenants to register (N); the sleep mode then creates one more and times it")
	flag.IntVar(&o.awake, "awake", 10, "tenants kept awake in sleep mode (K)")
	flag.StringVar(&o.mode, "mode", "both", "awake (no sleep, until the host runs out), sleep, or both")
	flag.IntVar(&o.concurrency, "concurrency", 4, "cluster creates in flight")
	flag.IntVar(&o.wakeSamples, "wake-samples", 20, "tenants whose first request is timed")
	flag.Float64Var(&o.reserveMiB, "reserve-mib", 2048, "stop creating when MemAvailable falls below this")
	flag.DurationVar(&o.sleepAfter, "sleep-after", 30*time.Second, "the daemon's --default-sleep-after in sleep mode")
	flag.DurationVar(&o.settle, "settle", 30*time.Second, "idle time before memory is read (after the last create; in sleep mode after all but K sleep)")
	flag.DurationVar(&o.sleepTimeout, "sleep-timeout", 20*time.Minute, "how long to wait for all but K tenants to be Asleep")
	flag.BoolVar(&o.keepLogs, "keep-logs", false, "keep each daemon's log (/tmp/socialweb-density-*.log)")
	flag.Func("serve-arg", "one more flag for each daemon's serve, as one argument (repeatable; e.g. -serve-arg=--cgroup-parent= for control planes without cgroups)", func(s string) error {
		o.serveArgs = append(o.serveArgs, s)
		return nil
	})
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := o.validate(); err != nil {
		log.Error("bad flags", "err", err)
		os.Exit(2)
	}
	// An interrupt cancels the run; each mode still stops its daemon and cleans up.
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	var reports []report
	for _, m := range o.modes() {
		r, err := run(ctx, o, m, log.With("mode", m))
		if err != nil {
			log.Error("benchmark failed", "mode", m, "err", err)
			cancel()
			os.Exit(1)
		}
		reports = append(reports, r)
	}
	printTable(os.Stdout, o, reports, "go run ./bench/density "+strings.Join(os.Args[1:], " "))
}

func (o options) validate() error {
	switch {
	case o.mode != "awake" && o.mode != "sleep" && o.mode != "both":
		return fmt.Errorf("-mode %q: want awake, sleep or both", o.mode)
	case o.tenants < 1:
		return fmt.Errorf("-tenants %d: want at least 1", o.tenants)
	case o.awake < 0 || o.awake > o.tenants:
		return fmt.Errorf("-awake %d: want 0 to -tenants (%d)", o.awake, o.tenants)
	case o.concurrency < 1:
		return fmt.Errorf("-concurrency %d: want at least 1", o.concurrency)
	case o.sleepAfter < 30*time.Second:
		return fmt.Errorf("-sleep-after %s: the daemon accepts 30s or more", o.sleepAfter)
	}
	return nil
}

func (o options) modes() []string {
	if o.mode == "both" {
		return []string{"awake", "sleep"}
	}
	return []string{o.mode}
}
