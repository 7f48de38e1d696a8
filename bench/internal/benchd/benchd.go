// Package benchd runs a socialweb daemon for a benchmark: its own state dir, ports and
// node networks, a CLI bound to it, and a stop that leaves nothing behind.
package benchd

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// Daemon is a running `socialweb serve`.
type Daemon struct {
	Bin, State, Log string
	cmd             *exec.Cmd
	exited          chan struct{}
}

// Start serves from a new state dir on free ports, with node networks in
// networkRange (apart from the tests' 1-150 and other benches'), and waits until
// its management API answers. extra are more serve flags.
func Start(bin, networkRange string, extra ...string) (*Daemon, error) {
	state, err := os.MkdirTemp("", "socialweb-bench-")
	if err != nil {
		return nil, err
	}
	port := FreePort()
	args := append([]string{"--api-port", strconv.Itoa(FreePort()), "--port-range", fmt.Sprintf("%d-%d", port, port),
		"--network-range", networkRange, "--metrics-address", ""}, extra...)
	return Serve(bin, state, args...)
}

// Serve runs `socialweb serve --state-dir state args...` (a state dir made before, or
// one a daemon killed left, which it then serves again) and waits until its
// management API answers. Its output is appended to state+".log".
func Serve(bin, state string, args ...string) (*Daemon, error) {
	d := &Daemon{Bin: bin, State: state, Log: state + ".log", exited: make(chan struct{})}
	d.cmd = exec.Command(bin, append([]string{"serve", "--state-dir", state}, args...)...)
	logf, err := os.OpenFile(d.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s serve: %w", bin, err)
	}
	go func() { _ = d.cmd.Wait(); logf.Close(); close(d.exited) }()
	for end := time.Now().Add(3 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		if _, err := d.CLI("cluster", "list"); err == nil {
			return d, nil
		}
		select {
		case <-d.exited:
			return nil, fmt.Errorf("the daemon exited during its start: %s (log: %s)", d.cmd.ProcessState, d.Log)
		default:
		}
		if time.Now().After(end) {
			d.Stop()
			return nil, fmt.Errorf("the daemon's management API did not answer within 3m (log: %s)", d.Log)
		}
	}
}

// CLI runs a socialweb command against the daemon.
func (d *Daemon) CLI(args ...string) (string, error) {
	out, err := exec.Command(d.Bin, append(args, "--state-dir", d.State)...).CombinedOutput()
	return string(out), err
}

// PID is the daemon's process id.
func (d *Daemon) PID() int { return d.cmd.Process.Pid }

// Kill ends the daemon with SIGKILL, as a crash would, and waits until it is gone:
// what it ran (control planes, node VMs) and its state dir stay.
func (d *Daemon) Kill() {
	_ = d.cmd.Process.Kill()
	<-d.exited
}

// Stop ends the daemon and what it left (node VMs, networks) and removes its state
// dir; its log stays for a failed run to read.
func (d *Daemon) Stop() {
	select {
	case <-d.exited:
	default:
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		<-d.exited
	}
	_, _ = d.CLI("down")
	os.RemoveAll(d.State)
}

// FreePort is a loopback TCP port free now, below the ephemeral range (where a
// client's port could take it meanwhile).
func FreePort() int {
	for {
		p := 10000 + rand.IntN(22000)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err == nil {
			l.Close()
			return p
		}
	}
}
