package nodenet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/socialweb-computer/socialweb/internal/dnswire"
)

// DNSForwarder relays DNS messages, unparsed, from guests to the host's
// resolvers: UDP to UDP, TCP to TCP. It listens on one address (a cluster's
// gateway), never on all of them.
type DNSForwarder struct {
	udp       *net.UDPConn
	tcp       *net.TCPListener
	upstreams []string
	// Timeout is how long one upstream gets to answer before the next is tried.
	Timeout time.Duration
	Log     *slog.Logger
	sem     chan struct{}
}

// ListenDNS binds UDP and TCP on addr (host:port; port 0 picks one, the
// same for both) for upstreams (host:port each).
func ListenDNS(addr string, upstreams []string) (*DNSForwarder, error) {
	if len(upstreams) == 0 {
		return nil, fmt.Errorf("DNS forwarder on %s: no upstream resolvers (check nameserver lines in /etc/resolv.conf)", addr)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("DNS forwarder address %q: %w (want gateway:53)", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		return nil, fmt.Errorf("DNS forwarder address %q: give the cluster's gateway address, not a name or a wildcard", addr)
	}
	for try := 0; ; try++ {
		uc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, bindHint(addr, err)
		}
		taddr := net.JoinHostPort(host, fmt.Sprint(uc.LocalAddr().(*net.UDPAddr).Port))
		tl, err := net.Listen("tcp", taddr)
		if err != nil {
			uc.Close()
			if port == "0" && try < 5 { // the UDP port's TCP twin was taken: pick again
				continue
			}
			return nil, bindHint(taddr, err)
		}
		return &DNSForwarder{
			udp: uc.(*net.UDPConn), tcp: tl.(*net.TCPListener), upstreams: upstreams,
			Timeout: 2 * time.Second, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			sem: make(chan struct{}, 256),
		}, nil
	}
}

func bindHint(addr string, err error) error {
	switch {
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("DNS forwarder listening on %s: %w: run as root (binding port 53 needs CAP_NET_BIND_SERVICE)", addr, err)
	case strings.Contains(err.Error(), "cannot assign requested address"):
		return fmt.Errorf("DNS forwarder listening on %s: %w: the address is not on this host; run Manager.Ensure for the cluster first (it puts the gateway on the bridge)", addr, err)
	case strings.Contains(err.Error(), "address already in use"):
		return fmt.Errorf("DNS forwarder listening on %s: %w: another DNS server holds the port (a wildcard-bound resolver like dnsmasq?); stop it or bind it to specific addresses", addr, err)
	}
	return fmt.Errorf("DNS forwarder listening on %s: %w", addr, err)
}

// Addr is the address the forwarder listens on (UDP and TCP alike).
func (f *DNSForwarder) Addr() string { return f.udp.LocalAddr().String() }

// Serve relays until ctx is done, then closes the sockets and returns nil.
func (f *DNSForwarder) Serve(ctx context.Context) error {
	var wg sync.WaitGroup
	stop := context.AfterFunc(ctx, func() { f.udp.Close(); f.tcp.Close() })
	defer stop()
	wg.Add(2)
	go func() { defer wg.Done(); f.serveUDP(ctx, &wg) }()
	go func() { defer wg.Done(); f.serveTCP(ctx, &wg) }()
	<-ctx.Done()
	wg.Wait()
	return nil
}

// ServeDNS listens on addr and relays to upstreams until ctx is done.
func ServeDNS(ctx context.Context, addr string, upstreams []string) error {
	f, err := ListenDNS(addr, upstreams)
	if err != nil {
		return err
	}
	return f.Serve(ctx)
}

func (f *DNSForwarder) serveUDP(ctx context.Context, wg *sync.WaitGroup) {
	buf := make([]byte, 65535)
	for {
		n, client, err := f.udp.ReadFromUDP(buf)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			f.Log.Warn("dns: reading query", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if n < dnswire.HeaderLen || buf[2]&0x80 != 0 { // too short, or a response
			continue
		}
		select {
		case f.sem <- struct{}{}:
		default:
			continue // overloaded: drop; the client retries
		}
		q := append([]byte(nil), buf[:n]...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-f.sem }()
			if resp := f.exchange(ctx, "udp", q); resp != nil {
				f.udp.WriteToUDP(resp, client)
			}
		}()
	}
}

func (f *DNSForwarder) serveTCP(ctx context.Context, wg *sync.WaitGroup) {
	for {
		c, err := f.tcp.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			f.Log.Warn("dns: accepting", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			r := bufio.NewReader(c)
			for {
				c.SetDeadline(time.Now().Add(10 * time.Second))
				q, err := dnswire.ReadTCP(r)
				if err != nil || len(q) < dnswire.HeaderLen {
					return
				}
				resp := f.exchange(ctx, "tcp", q)
				if resp == nil {
					return
				}
				if err := dnswire.WriteTCP(c, resp); err != nil {
					return
				}
			}
		}()
	}
}

// exchange asks the upstreams in order and returns the first answer whose ID
// matches the query's; nil when none answered.
func (f *DNSForwarder) exchange(ctx context.Context, network string, q []byte) []byte {
	for _, up := range f.upstreams {
		if ctx.Err() != nil {
			return nil
		}
		resp, err := dnswire.Exchange(ctx, network, up, q, f.Timeout)
		if err == nil {
			return resp
		}
		f.Log.Debug("dns: upstream failed", "upstream", up, "net", network, "err", err)
	}
	f.Log.Warn("dns: no upstream answered", "upstreams", f.upstreams, "net", network)
	return nil
}

// ResolvConfUpstreams reads the nameserver lines of a resolv.conf (usually
// /etc/resolv.conf) as host:53 addresses. Loopback stubs (127.0.0.53) are
// kept: they are on this host, and the forwarder, running on the host,
// reaches them; an upstream that does not answer is skipped per query.
func ResolvConfUpstreams(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading upstream resolvers: %w", err)
	}
	var ups []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			host, _, _ := strings.Cut(f[1], "%") // fe80::1%eth0: keep the zone for Dial
			if net.ParseIP(host) != nil {
				ups = append(ups, net.JoinHostPort(f[1], "53"))
			}
		}
	}
	if len(ups) == 0 {
		return nil, fmt.Errorf("%s has no nameserver lines: give the DNS forwarder upstreams explicitly", path)
	}
	return ups, nil
}
