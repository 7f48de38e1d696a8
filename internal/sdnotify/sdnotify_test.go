package sdnotify

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// listen makes a unixgram socket as systemd's notification socket is: name is a
// path, or an @abstract name.
func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// receive reads one datagram, failing after 5 s.
func receive(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("no datagram: %v", err)
	}
	return string(buf[:n])
}

func TestSend(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "notify")
	abstract := fmt.Sprintf("@socialweb-sdnotify-test-%d", os.Getpid())
	listeners := map[string]*net.UnixConn{path: listen(t, path), abstract: listen(t, abstract)}
	for _, tc := range []struct {
		name, socket string
		sent         bool
		err          string // a substring of the error; "" for none
	}{
		{name: "no socket: nothing to do", socket: ""},
		{name: "a path", socket: path, sent: true},
		{name: "an abstract name", socket: abstract, sent: true},
		{name: "a relative path", socket: "notify", err: "want an absolute path"},
		{name: "a vsock address", socket: "vsock:2:1234", err: "want an absolute path"},
		{name: "nobody listens", socket: filepath.Join(dir, "missing"), err: "notifying systemd at"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent, err := send(tc.socket, Ready)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("send(%q): error %v, want %q", tc.socket, err, tc.err)
			}
			if sent != tc.sent {
				t.Fatalf("send(%q) sent %v, want %v", tc.socket, sent, tc.sent)
			}
			if c := listeners[tc.socket]; c != nil {
				if got := receive(t, c); got != Ready {
					t.Fatalf("the socket got %q, want %q", got, Ready)
				}
			}
		})
	}
}

func TestServing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	c := listen(t, path)
	t.Setenv(EnvSocket, path)
	ctx, cancel := context.WithCancel(context.Background())
	Serving(ctx, slog.New(slog.DiscardHandler))
	if got := receive(t, c); got != Ready {
		t.Fatalf("first message %q, want %q", got, Ready)
	}
	cancel()
	if got := receive(t, c); got != Stopping {
		t.Fatalf("after the context ended: %q, want %q", got, Stopping)
	}
}

func TestServingWithoutSystemd(t *testing.T) {
	t.Setenv(EnvSocket, "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	Serving(ctx, slog.New(slog.DiscardHandler)) // must neither block nor fail
}
