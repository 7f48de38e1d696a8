// Package sdnotify tells systemd what state the daemon is in (sd_notify(3)): a unit
// of Type=notify counts as started only once the daemon says READY=1, so `systemctl
// start` returns when the daemon serves, not when its process exists. Outside such
// a unit ($NOTIFY_SOCKET unset) every call does nothing.
package sdnotify

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
)

// EnvSocket is the variable systemd names its notification socket in.
const EnvSocket = "NOTIFY_SOCKET"

// Messages the daemon sends.
const (
	Ready    = "READY=1"
	Stopping = "STOPPING=1"
)

// Notify sends state to the socket $NOTIFY_SOCKET names. It reports whether it
// sent anything: false, nil without the variable.
func Notify(state string) (bool, error) {
	return send(os.Getenv(EnvSocket), state)
}

// send writes state as one datagram to socket: an absolute path, or an abstract
// name written with a leading '@' (Go's net package turns it into the NUL byte).
func send(socket, state string) (bool, error) {
	if socket == "" {
		return false, nil
	}
	if !strings.HasPrefix(socket, "/") && !strings.HasPrefix(socket, "@") {
		// systemd 254 and later may also name a vsock address; no unit of ours asks for one.
		return false, fmt.Errorf("$%s=%q: want an absolute path or an @abstract name", EnvSocket, socket)
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		return false, fmt.Errorf("notifying systemd at %s: %w", socket, err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return false, fmt.Errorf("notifying systemd at %s: %w", socket, err)
	}
	return true, nil
}

// Serving says READY=1 now and STOPPING=1 once ctx ends (shutdown begins): what
// `serve` calls when it starts to serve. A failure is logged, not returned: the
// daemon serves either way, and under Type=notify systemd says the start timed out.
func Serving(ctx context.Context, log *slog.Logger) {
	say := func(state string) {
		if sent, err := Notify(state); err != nil {
			log.Warn("telling systemd the daemon's state", "state", state, "err", err)
		} else if sent {
			log.Debug("told systemd the daemon's state", "state", state)
		}
	}
	say(Ready)
	context.AfterFunc(ctx, func() { say(Stopping) })
}
