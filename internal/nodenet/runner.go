package nodenet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// Runner runs one host command (ip, nft, sysctl, iptables). The Manager
// takes it as a dependency so unit tests can record the exact commands.
type Runner interface {
	// Run runs name with args, feeding stdin when it is not empty, and
	// returns stdout. A failure is a *CmdError (or wraps exec.ErrNotFound).
	Run(ctx context.Context, stdin string, name string, args ...string) (string, error)
}

// CmdError is a command that ran and failed.
type CmdError struct {
	Cmd    string // the command line
	Err    error  // usually *exec.ExitError
	Stderr string
}

func (e *CmdError) Error() string {
	msg := strings.TrimSpace(e.Stderr)
	if msg == "" {
		msg = e.Err.Error()
	}
	return fmt.Sprintf("%s: %s", e.Cmd, msg)
}

func (e *CmdError) Unwrap() error { return e.Err }

// ExecRunner runs commands on this host.
type ExecRunner struct{}

// Run implements Runner.
func (ExecRunner) Run(ctx context.Context, stdin string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return "", err
		}
		return stdout.String(), &CmdError{Cmd: cmdLine(name, args), Err: err, Stderr: stderr.String()}
	}
	return stdout.String(), nil
}

func cmdLine(name string, args []string) string {
	return strings.TrimSpace(name + " " + strings.Join(args, " "))
}

// stderrHas reports whether err is a failed command whose message contains
// any of subs (case-insensitive).
func stderrHas(err error, subs ...string) bool {
	var ce *CmdError
	if !errors.As(err, &ce) {
		return false
	}
	s := strings.ToLower(ce.Stderr)
	for _, sub := range subs {
		if strings.Contains(s, strings.ToLower(sub)) {
			return true
		}
	}
	return false
}

// isExists: the object is already there.
func isExists(err error) bool { return stderrHas(err, "file exists") }

// isNotFound: the object (device, route, table) is not there.
func isNotFound(err error) bool {
	return stderrHas(err, "cannot find device", "does not exist", "no such process",
		"no such file or directory", "no such device")
}

// explain wraps err with what was being done and what the operator can do
// about it: "creating bridge swb3: ...: Operation not permitted: run as root
// (CAP_NET_ADMIN)".
func explain(err error, format string, a ...any) error {
	what := fmt.Sprintf(format, a...)
	switch {
	case errors.Is(err, exec.ErrNotFound):
		var ee *exec.Error
		bin := ""
		if errors.As(err, &ee) {
			bin = ee.Name
		}
		pkg := map[string]string{"ip": "iproute2", "nft": "nftables", "sysctl": "procps", "iptables": "iptables"}[bin]
		if pkg == "" {
			return fmt.Errorf("%s: %w", what, err)
		}
		return fmt.Errorf("%s: %w: install it (apt-get install %s)", what, err, pkg)
	case stderrHas(err, "operation not permitted", "permission denied"):
		return fmt.Errorf("%s: %w: run as root (needs CAP_NET_ADMIN)", what, err)
	case stderrHas(err, "/dev/net/tun"):
		return fmt.Errorf("%s: %w: load the tun module (modprobe tun) and check /dev/net/tun exists", what, err)
	case stderrHas(err, "could not process rule", "operation not supported"):
		return fmt.Errorf("%s: %w: the kernel lacks a netfilter feature; load nf_tables, nft_masq, nft_chain_nat and nf_nat (modprobe)", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
