// Package egressproxy scopes where a tenant's apiserver may connect. A tenant's admin
// chooses addresses the apiserver then dials: a Service's endpoints (services/proxy,
// aggregated APIs and admission webhooks, dialled at their endpoints), a Pod's IP
// (pods/proxy), a Node's address (logs, exec, nodes/proxy), a webhook's URL. The
// apiserver runs on the host, so without a wall each of those reaches the host's LAN and
// other tenants' nodes and Pods.
//
// kube-apiserver sends that traffic through its egress selector
// (--egress-selector-config-file): "cluster" for everything bound for the cluster's
// nodes and Pods, "controlplane" for URL webhooks, audit and tracing. Each is pointed at
// a Proxy here, an HTTP CONNECT server on a unix socket in the control plane's
// directory, which dials only what its Policy allows: the cluster's own nodes and Pods,
// or public addresses.
package egressproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/socialweb-computer/socialweb/internal/publicaddr"
)

// Policy says which addresses may be dialled.
type Policy struct {
	// Allow are prefixes that may be dialled (the cluster's nodes and Pods).
	Allow []netip.Prefix
	// Deny are addresses never dialled, even inside Allow (the gateway: the host).
	Deny []netip.Addr
	// Public allows public addresses not the host's own (publicaddr.Elsewhere).
	Public bool
}

// Check says why addr may not be dialled, or nil.
func (p Policy) Check(addr netip.Addr) error {
	addr = addr.Unmap()
	for _, d := range p.Deny {
		if d == addr {
			return fmt.Errorf("%s is the host", addr)
		}
	}
	for _, a := range p.Allow {
		if a.Contains(addr) {
			return nil
		}
	}
	if p.Public && publicaddr.Elsewhere(addr) {
		return nil
	}
	if p.Public {
		return fmt.Errorf("%s is neither this cluster's nor public", addr)
	}
	return fmt.Errorf("%s is not one of this cluster's nodes or Pods", addr)
}

// Proxy serves HTTP CONNECT under a Policy.
type Proxy struct {
	Name     string // for logs: "cluster", "controlplane"
	Policy   Policy
	Log      *slog.Logger
	Resolver *net.Resolver // nil: net.DefaultResolver
	// DialTimeout bounds a dial; 0 is 10s.
	DialTimeout time.Duration
}

// Serve accepts on ln until ctx ends.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	go func() { <-ctx.Done(); ln.Close() }()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("egress proxy %s: %w", p.Name, err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); p.handle(ctx, c) }()
	}
}

func (p *Proxy) handle(ctx context.Context, c net.Conn) {
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	c.SetReadDeadline(time.Time{})
	if req.Method != http.MethodConnect {
		io.WriteString(c, "HTTP/1.1 405 Method Not Allowed\r\n\r\n")
		return
	}
	target, err := p.resolve(ctx, req.Host)
	if err != nil {
		p.Log.Warn("apiserver egress refused", "selection", p.Name, "to", req.Host, "reason", err.Error())
		fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\n\r\nsocialweb refuses the apiserver's connection to %s: %v\n", req.Host, err)
		return
	}
	timeout := p.DialTimeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	d := net.Dialer{Timeout: timeout}
	up, err := d.DialContext(ctx, "tcp", target.String())
	if err != nil {
		fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\n\r\n%v\n", err)
		return
	}
	defer up.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// Bytes the apiserver sent after its CONNECT are already in br.
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, br); closeWrite(up); done <- struct{}{} }()
	go func() { io.Copy(c, up); closeWrite(c); done <- struct{}{} }()
	<-done
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

// resolve picks an address of hostport the policy allows; a name is resolved here and
// dialled by address, so what was checked is what is dialled.
func (p *Proxy) resolve(ctx context.Context, hostport string) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("bad CONNECT target %q: %w", hostport, err)
	}
	pn, err := strconv.ParseUint(port, 10, 16)
	if err != nil || pn == 0 {
		return netip.AddrPort{}, fmt.Errorf("bad port in %q", hostport)
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		r := p.Resolver
		if r == nil {
			r = net.DefaultResolver
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if addrs, err = r.LookupNetIP(rctx, "ip", host); err != nil {
			return netip.AddrPort{}, fmt.Errorf("resolving %s: %w", host, err)
		}
	}
	var errs []error
	for _, a := range addrs {
		if err := p.Policy.Check(a); err != nil {
			errs = append(errs, err)
			continue
		}
		return netip.AddrPortFrom(a.Unmap(), uint16(pn)), nil
	}
	return netip.AddrPort{}, errors.Join(errs...)
}
