package nodenet

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/dnswire"
)

// The fake upstream knows one record.
const (
	fakeName = "registry.socialweb.test"
	fakeA    = "10.250.77.77"
)

// buildQuery is a hand-made DNS query for an A record.
func buildQuery(id uint16, name string) []byte {
	q := binary.BigEndian.AppendUint16(nil, id)
	q = append(q, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0) // RD; QDCOUNT 1
	for _, label := range strings.Split(name, ".") {
		q = append(q, byte(len(label)))
		q = append(q, label...)
	}
	return append(q, 0, 0, 1, 0, 1) // root, QTYPE A, QCLASS IN
}

// answerFor is the fake upstream: the query's header and question, then an
// A record for fakeName, or NXDOMAIN for anything else.
func answerFor(q []byte) []byte {
	if len(q) < 12 {
		return nil
	}
	i := 12
	var labels []string
	for i < len(q) && q[i] != 0 {
		l := int(q[i])
		if i+1+l > len(q) {
			return nil
		}
		labels = append(labels, string(q[i+1:i+1+l]))
		i += 1 + l
	}
	end := i + 5 // root byte, QTYPE, QCLASS
	if end > len(q) {
		return nil
	}
	resp := append([]byte(nil), q[:end]...)
	resp[2], resp[3] = 0x81, 0x80 // QR, RD, RA
	resp[6], resp[7], resp[8], resp[9], resp[10], resp[11] = 0, 0, 0, 0, 0, 0
	if strings.Join(labels, ".") != fakeName {
		resp[3] |= 3 // NXDOMAIN
		return resp
	}
	resp[7] = 1 // ANCOUNT
	resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4)
	return append(resp, net.ParseIP(fakeA).To4()...)
}

// parseA returns the A record of a response from answerFor, checking its ID.
func parseA(resp []byte, id uint16) (string, error) {
	if len(resp) < 12 || binary.BigEndian.Uint16(resp) != id || resp[2]&0x80 == 0 {
		return "", errors.New("not a response to our query")
	}
	if rcode := resp[3] & 0xf; rcode != 0 {
		return "", errors.New("rcode " + string('0'+rune(rcode)))
	}
	if binary.BigEndian.Uint16(resp[6:]) != 1 || len(resp) < 4 {
		return "", errors.New("no answer")
	}
	return net.IP(resp[len(resp)-4:]).String(), nil
}

// fakeUpstream serves answerFor on loopback UDP and TCP (same port) and
// counts queries.
type fakeUpstream struct {
	addr    string
	queries atomic.Int32
}

func startFakeUpstream(t *testing.T) *fakeUpstream {
	t.Helper()
	f := &fakeUpstream{}
	var uc net.PacketConn
	var tl net.Listener
	for range 10 {
		var err error
		if uc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if tl, err = net.Listen("tcp", uc.LocalAddr().String()); err == nil {
			break
		}
		uc.Close()
	}
	if tl == nil {
		t.Fatal("no loopback port free for UDP and TCP")
	}
	t.Cleanup(func() { uc.Close(); tl.Close() })
	f.addr = uc.LocalAddr().String()
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := uc.ReadFrom(buf)
			if err != nil {
				return
			}
			f.queries.Add(1)
			uc.WriteTo(answerFor(buf[:n]), from)
		}
	}()
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					q, err := dnswire.ReadTCP(r)
					if err != nil {
						return
					}
					f.queries.Add(1)
					dnswire.WriteTCP(c, answerFor(q))
				}
			}()
		}
	}()
	return f
}

// lookup asks server for fakeName over network ("udp" or "tcp").
func lookup(network, server, name string, id uint16) (string, error) {
	c, err := net.DialTimeout(network, server, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	q := buildQuery(id, name)
	var resp []byte
	if network == "tcp" {
		if err = dnswire.WriteTCP(c, q); err != nil {
			return "", err
		}
		resp, err = dnswire.ReadTCP(c)
	} else {
		if _, err = c.Write(q); err != nil {
			return "", err
		}
		buf := make([]byte, 4096)
		var n int
		n, err = c.Read(buf)
		resp = buf[:n]
	}
	if err != nil {
		return "", err
	}
	return parseA(resp, id)
}

// deadUpstream is a loopback UDP+TCP address where nothing answers: a UDP
// socket that never replies (so the forwarder has to time out) on a port
// whose TCP twin is closed (connection refused).
func deadUpstream(t *testing.T) string {
	t.Helper()
	uc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { uc.Close() })
	return uc.LocalAddr().String()
}

func TestDNSForwarder(t *testing.T) {
	up := startFakeUpstream(t)
	dead := deadUpstream(t)
	f, err := ListenDNS("127.0.0.1:0", []string{dead, up.addr})
	if err != nil {
		t.Fatal(err)
	}
	f.Timeout = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Serve(ctx) }()
	for i, network := range []string{"udp", "tcp", "udp", "tcp"} {
		id := uint16(0x1234 + i)
		got, err := lookup(network, f.Addr(), fakeName, id)
		if err != nil || got != fakeA {
			t.Fatalf("%s lookup via forwarder (first upstream dead) = %q, %v; want %s", network, got, err, fakeA)
		}
	}
	if _, err := lookup("udp", f.Addr(), "other.test", 7); err == nil || !strings.Contains(err.Error(), "rcode 3") {
		t.Errorf("unknown name: err = %v, want the upstream's NXDOMAIN relayed", err)
	}
	if n := up.queries.Load(); n != 5 {
		t.Errorf("upstream saw %d queries, want 5", n)
	}
	// A response sent to the forwarder is not relayed (no reflection loops).
	c, _ := net.Dial("udp", f.Addr())
	c.Write(answerFor(buildQuery(9, fakeName)))
	c.Close()
	time.Sleep(50 * time.Millisecond)
	if n := up.queries.Load(); n != 5 {
		t.Errorf("a response was relayed upstream")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Serve did not stop after cancel")
	}
	if _, err := lookup("tcp", f.Addr(), fakeName, 1); err == nil {
		t.Error("forwarder still answers after Serve returned")
	}
}

func TestDNSForwarderErrors(t *testing.T) {
	for addr, want := range map[string]string{
		"0.0.0.0:53":     "not a name or a wildcard",
		"192.0.2.254:53": "run Manager.Ensure",
		"nope":           "want gateway:53",
	} {
		if _, err := ListenDNS(addr, []string{"127.0.0.1:53"}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ListenDNS(%s) = %v, want an error containing %q", addr, err, want)
		}
	}
	if _, err := ListenDNS("127.0.0.1:0", nil); err == nil {
		t.Error("ListenDNS accepted no upstreams")
	}
	// Nothing answers: the client gets no answer (and times out), the forwarder keeps serving.
	f, err := ListenDNS("127.0.0.1:0", []string{deadUpstream(t)})
	if err != nil {
		t.Fatal(err)
	}
	f.Timeout = 100 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go f.Serve(ctx)
	if _, err := lookup("tcp", f.Addr(), fakeName, 3); err == nil {
		t.Error("got an answer with no live upstream")
	}
}

func TestResolvConfUpstreams(t *testing.T) {
	p := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(p, []byte("# generated\nsearch example.test\nnameserver 127.0.0.53\nnameserver  10.255.255.53 \nnameserver fe80::1%eth0\nnameserver bogus\noptions edns0\n"), 0o644)
	got, err := ResolvConfUpstreams(p)
	if want := []string{"127.0.0.53:53", "10.255.255.53:53", "[fe80::1%eth0]:53"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("upstreams = %q, %v; want %q", got, err, want)
	}
	os.WriteFile(p, []byte("search x\n"), 0o644)
	if _, err := ResolvConfUpstreams(p); err == nil {
		t.Error("no nameservers accepted")
	}
}
