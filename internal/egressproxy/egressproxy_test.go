package egressproxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

func TestPolicy(t *testing.T) {
	cluster := Policy{Allow: []netip.Prefix{netip.MustParsePrefix("10.250.3.0/24"), netip.MustParsePrefix("10.3.0.0/16")}, Deny: []netip.Addr{netip.MustParseAddr("10.250.3.1")}}
	control := cluster
	control.Public = true
	for _, tc := range []struct {
		name   string
		p      Policy
		addr   string
		allows bool
	}{
		{"a node", cluster, "10.250.3.7", true},
		{"a Pod", cluster, "10.3.1.9", true},
		{"the gateway (the host)", cluster, "10.250.3.1", false},
		{"another cluster's node", cluster, "10.250.4.2", false},
		{"another cluster's Pod", cluster, "10.4.0.5", false},
		{"the host's LAN", cluster, "192.168.1.10", false},
		{"loopback", cluster, "127.0.0.1", false},
		{"metadata", cluster, "169.254.169.254", false},
		{"public, for the cluster", cluster, "1.1.1.1", false},
		{"public, for the control plane", control, "1.1.1.1", true},
		{"LAN, for the control plane", control, "192.168.1.10", false},
		{"another cluster's node, for the control plane", control, "10.250.4.2", false},
		{"the gateway, for the control plane", control, "10.250.3.1", false},
		{"a v4-mapped LAN address", control, "::ffff:192.168.1.10", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Check(netip.MustParseAddr(tc.addr))
			if (err == nil) != tc.allows {
				t.Errorf("Check(%s) = %v, want allowed %v", tc.addr, err, tc.allows)
			}
		})
	}
}

// connect speaks HTTP CONNECT to the proxy on sock and returns its status line and the
// connection.
func connect(t *testing.T, sock, target string) (string, net.Conn) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		return resp.Status + " " + string(b), nil
	}
	return resp.Status, &bufConn{c, br}
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// The proxy tunnels what its policy allows, byte for byte, and refuses the rest with a
// 403 that says why, without dialling.
func TestProxy(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	var dialled atomic.Int32
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			dialled.Add(1)
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	sock := filepath.Join(t.TempDir(), "egress.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := &Proxy{Name: "cluster", Policy: Policy{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}, Log: slog.New(slog.DiscardHandler)}
	go p.Serve(ctx, ln)

	status, c := connect(t, sock, echo.Addr().String())
	if c == nil {
		t.Fatalf("CONNECT to an allowed address: %s", status)
	}
	io.WriteString(c, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("tunnel echoed %q, %v", buf, err)
	}
	c.Close()

	port := echo.Addr().(*net.TCPAddr).Port
	for _, target := range []string{fmt.Sprintf("127.0.0.2:%d", port), fmt.Sprintf("192.168.1.10:%d", port), "bad", "10.0.0.1:0"} {
		status, c := connect(t, sock, target)
		if c != nil || !strings.Contains(status, "403") {
			t.Errorf("CONNECT %s: %s, want 403", target, status)
		}
	}
	if n := dialled.Load(); n != 1 {
		t.Errorf("the echo server was dialled %d times, want once (refusals dial nothing)", n)
	}
}
