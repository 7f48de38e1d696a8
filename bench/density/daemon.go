package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// daemon is one `socialweb serve` on its own temp state dir.
type daemon struct {
	bin, state, logPath string
	env                 []string
	cmd                 *exec.Cmd
	exited              chan error // receives the daemon's exit, once
	log                 *slog.Logger
}

// cleanEnv drops SOCIALWEB_* variables: they are the flags' environment twins
// and would change the daemon under measurement (a front door, a port range).
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SOCIALWEB_") {
			env = append(env, kv)
		}
	}
	return env
}

// startDaemon starts the daemon with ports for tenants+1 clusters and waits
// until it serves (its log says "serving" and the datastore seed exists).
func startDaemon(ctx context.Context, o options, sleep bool, log *slog.Logger) (*daemon, error) {
	state, err := os.MkdirTemp("", "socialweb-density-")
	if err != nil {
		return nil, fmt.Errorf("creating the state dir: %w", err)
	}
	d := &daemon{bin: o.bin, state: state, logPath: state + ".log", env: cleanEnv(), log: log}
	// One port for the management API, tenants+1 for the tenants, and slack.
	lo, err := freePortBlock(20000, o.tenants+3)
	if err != nil {
		_ = removeAll(state)
		return nil, err
	}
	args := []string{"serve", "--state-dir", state, "--node-network=false", "--metrics-address", "",
		"--api-port", strconv.Itoa(lo), "--port-range", fmt.Sprintf("%d-%d", lo+1, lo+o.tenants+2)}
	if sleep {
		args = append(args, "--default-sleep-after", o.sleepAfter.String())
	}
	args = append(args, o.serveArgs...)
	logf, err := os.Create(d.logPath)
	if err != nil {
		_ = removeAll(state)
		return nil, fmt.Errorf("creating the daemon log: %w", err)
	}
	defer logf.Close()
	d.cmd = exec.Command(o.bin, args...)
	d.cmd.Env = d.env
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		_ = removeAll(state)
		return nil, fmt.Errorf("starting %s serve: %w", o.bin, err)
	}
	log.Info("daemon started", "pid", d.cmd.Process.Pid, "state", state, "log", d.logPath, "args", strings.Join(args, " "))
	exited := make(chan error, 1)
	go func() { exited <- d.cmd.Wait() }()
	serving := func() bool {
		b, _ := os.ReadFile(d.logPath)
		seeds, _ := filepath.Glob(filepath.Join(state, "seeds", "seed-*.json"))
		return bytes.Contains(b, []byte(`"msg":"serving"`)) && len(seeds) > 0
	}
	for deadline := time.Now().Add(5 * time.Minute); !serving(); {
		select {
		case err := <-exited:
			exited <- err
			d.stop(exited)
			return nil, fmt.Errorf("the daemon exited before serving (%v); see %s", err, d.logPath)
		case <-ctx.Done():
			d.stop(exited)
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.stop(exited)
			return nil, fmt.Errorf("the daemon did not serve within 5m; see %s", d.logPath)
		}
	}
	d.exited = exited
	return d, nil
}

// cli runs a socialweb subcommand against this daemon.
func (d *daemon) cli(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, d.bin, append(args, "--state-dir", d.state)...)
	cmd.Env = d.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("socialweb %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// pssMiB is the PSS of the daemon and all its descendants.
func (d *daemon) pssMiB() (float64, error) {
	return treePssMiB(d.cmd.Process.Pid)
}

// parts is the PSS of the daemon's tree by part, each the median of 3 reads
// 2 s apart.
func (d *daemon) parts() (parts, error) {
	return medianParts(d.cmd.Process.Pid, d.state, 3, 2*time.Second)
}

// phases maps each cluster to its phase, from `cluster list` (which reads the
// management API only and wakes nothing).
func (d *daemon) phases(ctx context.Context) (map[string]string, error) {
	out, err := d.cli(ctx, "cluster", "list")
	if err != nil {
		return nil, err
	}
	m := parseClusterList(out)
	return m, nil
}

// parseClusterList reads `cluster list` output: NAME PHASE URL NODES AGE.
func parseClusterList(out string) map[string]string {
	m := map[string]string{}
	for i, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 2 {
			continue
		}
		m[f[0]] = f[1]
	}
	return m
}

// restConfig is the tenant's admin client config, from `cluster kubeconfig`.
func (d *daemon) restConfig(ctx context.Context, name string) (*rest.Config, error) {
	kc, err := d.cli(ctx, "cluster", "kubeconfig", name)
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(kc))
	if err != nil {
		return nil, fmt.Errorf("kubeconfig of %s: %w", name, err)
	}
	return cfg, nil
}

// stop sends SIGTERM (SIGKILL after 2 minutes), kills any process still
// naming the state dir, and removes the state dir (and the log unless kept).
func (d *daemon) stop(exited chan error) {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(2 * time.Minute):
		d.log.Warn("daemon did not stop in 2m after SIGTERM; killing it")
		_ = d.cmd.Process.Kill()
		<-exited
	}
	// The control planes die with the daemon (parent-death signal); this
	// catches anything that did not.
	if killed := killNaming(d.state); len(killed) > 0 {
		d.log.Warn("killed processes left after the daemon stopped", "pids", killed)
	}
	if !waitGone(d.state, 30*time.Second) {
		d.log.Error("processes naming the state dir survive SIGKILL", "state", d.state)
	}
	if err := removeAll(d.state); err != nil {
		d.log.Warn("cleanup", "err", err)
	}
}

// close stops the daemon started by startDaemon.
func (d *daemon) close(keepLog bool) {
	d.stop(d.exited)
	if !keepLog {
		if err := os.Remove(d.logPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			d.log.Warn("removing the daemon log", "err", err)
		}
	}
}
