package controlplane

import (
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"
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
	l, err := listenDual(port, 0, "127.0.0.2", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
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
