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
}

// Start serves from a new state dir on free ports, with node networks in
// networkRange (apart from the tests' 1-150 and other benches'), and waits until
// its management API answers. extra are more serve flags.
func Start(bin, networkRange string, extra ...string) (*Daemon, error) {
	state, err := os.MkdirTemp("", "socialweb-bench-")
	if err != nil {
		return nil, err
	}
	d := &Daemon{Bin: bin, State: state, Log: state + ".log"}
	port := FreePort()
	args := append([]string{"serve", "--state-dir", state, "--api-port", strconv.Itoa(FreePort()),
		"--port-range", fmt.Sprintf("%d-%d", port, port), "--network-range", networkRange, "--metrics-address", ""}, extra...)
	d.cmd = exec.Command(bin, args...)
	logf, err := os.Create(d.Log)
	if err != nil {
		return nil, err
	}
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s serve: %w", bin, err)
	}
	for end := time.Now().Add(3 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		if _, err := d.CLI("cluster", "list"); err == nil {
			return d, nil
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

// Stop ends the daemon and what it left (node VMs, networks) and removes its state
// dir; its log stays for a failed run to read.
func (d *Daemon) Stop() {
	if d.cmd.ProcessState == nil {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		_ = d.cmd.Wait()
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
