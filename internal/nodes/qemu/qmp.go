package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// qmpConn is a minimal QMP client: connect, negotiate capabilities, run commands.
type qmpConn struct {
	c   net.Conn
	dec *json.Decoder
}

type qmpReply struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string          `json:"event"`
	QMP   json.RawMessage `json:"QMP"`
}

// maxSockPath is the longest unix socket path (sun_path is 108 bytes with the NUL).
const maxSockPath = 107

// dialSock connects to the QMP socket in a node dir. A path too long for a unix socket
// address is reached through a descriptor of the dir: /proc/self/fd/<n>/qmp.sock.
func dialSock(ctx context.Context, dir string) (net.Conn, error) {
	var d net.Dialer
	sock := filepath.Join(dir, sockName)
	if len(sock) <= maxSockPath {
		return d.DialContext(ctx, "unix", sock)
	}
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer syscall.Close(fd)
	return d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d/%s", fd, sockName))
}

// dialQMP connects to the QMP socket in a node dir and leaves it in command mode. ctx
// bounds the whole conversation, including later calls.
func dialQMP(ctx context.Context, dir string) (*qmpConn, error) {
	c, err := dialSock(ctx, dir)
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, sockName)
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	} else {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	q := &qmpConn{c: c, dec: json.NewDecoder(c)}
	var greeting qmpReply
	if err := q.dec.Decode(&greeting); err != nil {
		c.Close()
		return nil, fmt.Errorf("QMP greeting: %w", err)
	}
	if greeting.QMP == nil {
		c.Close()
		return nil, fmt.Errorf("QMP: %s did not greet", sock)
	}
	if _, err := q.call("qmp_capabilities"); err != nil {
		c.Close()
		return nil, err
	}
	return q, nil
}

// call runs one command and returns its "return" value, skipping asynchronous events.
func (q *qmpConn) call(cmd string) (json.RawMessage, error) {
	return q.callArgs(cmd, nil)
}

// callArgs is call with the command's arguments (nil for none).
func (q *qmpConn) callArgs(cmd string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("QMP %s: %w", cmd, err)
	}
	if _, err := q.c.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("QMP %s: %w", cmd, err)
	}
	for {
		var r qmpReply
		if err := q.dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("QMP %s: %w", cmd, err)
		}
		if r.Event != "" {
			continue
		}
		if r.Error != nil {
			return nil, fmt.Errorf("QMP %s: %s: %s", cmd, r.Error.Class, r.Error.Desc)
		}
		return r.Return, nil
	}
}

func (q *qmpConn) Close() error { return q.c.Close() }

// qmpStatus returns the VM's run state ("running", "paused", ...).
func qmpStatus(ctx context.Context, dir string) (string, error) {
	q, err := dialQMP(ctx, dir)
	if err != nil {
		return "", err
	}
	defer q.Close()
	raw, err := q.call("query-status")
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return "", fmt.Errorf("QMP query-status: %w", err)
	}
	return st.Status, nil
}

// qmpPowerdown presses the guest's (ACPI) power button.
func qmpPowerdown(ctx context.Context, dir string) error {
	q, err := dialQMP(ctx, dir)
	if err != nil {
		return err
	}
	defer q.Close()
	_, err = q.call("system_powerdown")
	return err
}

// nicNetdev is the id of every node VM's one NIC backend (see launch.args).
const nicNetdev = "net0"

// qmpSetLink sets the carrier of the VM's NIC as its guest sees it. A warm-pool VM waits
// with it down, and its claim brings it up: the guest's agent wakes on that link event
// instead of reading its identity disk many times a second.
func qmpSetLink(ctx context.Context, dir string, up bool) error {
	q, err := dialQMP(ctx, dir)
	if err != nil {
		return err
	}
	defer q.Close()
	_, err = q.callArgs("set_link", map[string]any{"name": nicNetdev, "up": up})
	return err
}
