package controlplane

import (
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	genericapiserver "k8s.io/apiserver/pkg/server"
)

func TestDualListenerServesLoopbackAndLaterGateway(t *testing.T) {
	// 127.0.0.2 stands in for a gateway address: on Linux all of
	// 127.0.0.0/8 is local, so it binds without touching interfaces.
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := probe.Addr().(*net.TCPAddr).Port
	probe.Close()
	private := filepath.Join(t.TempDir(), "apiserver.sock")
	l, err := listenDual(port, 0, "127.0.0.2", private, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	answer := func(network, addr string) string {
		c, err := net.Dial(network, addr)
		if err != nil {
			return "refused: " + err.Error()
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		b, _ := io.ReadAll(c)
		return string(b)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("ok"))
			c.Close()
		}
	}()
	// Before Open, the private socket answers and the port holds its clients
	// (connected, in the backlog, unanswered).
	if got := answer("unix", private); got != "ok" {
		t.Errorf("the private socket answered %q before Open, want ok", got)
	}
	if got := answer("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); got != "" {
		t.Errorf("the port answered %q before Open, want a held connection", got)
	}
	l.Open()
	for _, host := range []string{"127.0.0.1", "127.0.0.2"} {
		deadline := time.Now().Add(5 * time.Second)
		for {
			c, err := net.Dial("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
			if err == nil {
				b, _ := io.ReadAll(c)
				c.Close()
				if string(b) != "ok" {
					t.Errorf("%s answered %q", host, b)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s:%d never accepted: %v", host, port, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if _, err := net.Dial("tcp", net.JoinHostPort("127.0.0.3", strconv.Itoa(port))); err == nil {
		t.Error("the listener accepts on an address it was not given")
	}
	l.Close()
	if _, err := l.Accept(); err == nil {
		t.Error("Accept after Close")
	}
}

// Before Open, the apiserver's own loopback client is let through (its start-up
// hooks call it before it is ready) and any other client is held, its hello read.
func TestListenerLetsTheLoopbackClientInFirst(t *testing.T) {
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := probe.Addr().(*net.TCPAddr).Port
	probe.Close()
	l, err := listenDual(port, 0, "", filepath.Join(t.TempDir(), "apiserver.sock"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	hello := func(serverName string) {
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(func() { c.Close() })
		go func() { _ = tls.Client(c, &tls.Config{ServerName: serverName, InsecureSkipVerify: true}).Handshake() }()
	}
	passed := func() bool {
		select {
		case c := <-accepted:
			c.Close()
			return true
		case <-time.After(time.Second):
			return false
		}
	}
	hello("tenant.socialweb.localhost")
	if passed() {
		t.Errorf("a client was passed on before Open")
	}
	hello(genericapiserver.LoopbackClientServerNameOverride)
	if !passed() {
		t.Errorf("the apiserver's loopback client was held before Open")
	}
	l.Open()
	if !passed() {
		t.Errorf("the held client was not passed on at Open")
	}
}
