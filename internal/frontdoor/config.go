// Package frontdoor is one TCP listener that carries every tenant's apiserver.
// It reads the server name (SNI) of each TLS ClientHello, maps
// <cluster>.<domain> to that cluster's loopback apiserver, and from then on
// copies bytes both ways without looking at them. The TLS session is between
// the client and the tenant's apiserver: the door holds no tenant key, and a
// tenant's CA, serving certificate and client certificates work through it as
// they do on the tenant's own port. Because it never parses HTTP, watches,
// exec, attach and port-forward (SPDY or websocket upgrades) pass through as
// any other bytes.
package frontdoor

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/clienthello"
)

// DefaultDomain is the SNI domain when none is configured. Names under
// .localhost are reserved for this host (RFC 6761), so the default never
// claims a name someone else owns; a door reached from other machines wants a
// domain of its own (and, for GitLab Runner, a wildcard DNS record for it).
const DefaultDomain = "socialweb.localhost"

// Defaults of the door's limits.
const (
	// DefaultHelloTimeout bounds the wait for a ClientHello: a client that
	// connects and sends nothing must not hold a connection for ever.
	DefaultHelloTimeout = 10 * time.Second
	// DefaultMaxHello bounds the bytes read before the name is known.
	DefaultMaxHello = clienthello.MaxBytes
	// DefaultDialTimeout bounds the connection to a tenant's loopback port.
	DefaultDialTimeout = 5 * time.Second
	// DefaultMaxConnsPerSource bounds the connections the door carries at
	// once for one source: kubectl opens a handful, a GitLab Runner's jobs
	// a few each (attach, logs, watches), so 64 fits a busy CI host behind
	// one address while one client alone cannot take the door.
	DefaultMaxConnsPerSource = 64
	// DefaultMaxConns bounds the connections the door carries at once from
	// everyone: each is two descriptors and two goroutines.
	DefaultMaxConns = 4096
	// MaxMaxConns is the largest MaxConns (and so MaxConnsPerSource) taken.
	MaxMaxConns = 1 << 20
)

// Config is where the door listens and the names it answers to.
type Config struct {
	// Address is host:port to listen on, e.g. 0.0.0.0:8443.
	Address string
	// Domain: a cluster NAME is reached as NAME.Domain.
	Domain string
	// HelloTimeout, MaxHello and DialTimeout are limits; 0 is the default.
	HelloTimeout time.Duration
	MaxHello     int
	DialTimeout  time.Duration
	// MaxConnsPerSource and MaxConns bound the client connections the door
	// holds at once from one source (an IPv4 address, or an IPv6 /64) and
	// from everyone; a connection beyond either is closed as it is
	// accepted. 0 is the default; see ValidateMaxConns and
	// ValidateMaxConnsPerSource.
	MaxConnsPerSource int
	MaxConns          int
	// ServiceAddress, if set, is host:port kubeconfigs name instead of the
	// door's own address: a DNS name for every host's door, so a kubeconfig
	// survives its cluster moving between hosts.
	ServiceAddress string
	// IsPeer says whether a source is another host of the service, whose door
	// passes on connections for clusters this host runs; nil: none is.
	IsPeer func(netip.Addr) bool
}

// ValidateMaxConns says whether total can be the door's MaxConns, and if
// not what would be accepted.
func ValidateMaxConns(total int) error {
	if total < 1 || total > MaxMaxConns {
		return fmt.Errorf("%d: want 1 to %d connections carried at once from everyone (default %d)", total, MaxMaxConns, DefaultMaxConns)
	}
	return nil
}

// ValidateMaxConnsPerSource says whether perSource can be the door's
// MaxConnsPerSource beside a MaxConns of total, and if not what would be
// accepted.
func ValidateMaxConnsPerSource(perSource, total int) error {
	if perSource < 1 || perSource > total {
		return fmt.Errorf("%d: want 1 to the limit from everyone (%d) connections carried at once from one source, an IPv4 address or IPv6 /64 (default %d)", perSource, total, DefaultMaxConnsPerSource)
	}
	return nil
}

// ValidateDomain says whether domain can carry cluster names, and if not
// what would be accepted.
func ValidateDomain(domain string) error {
	want := fmt.Sprintf("want a lowercase DNS name such as %s or tenants.example.com (letters, digits, '-' and '.', no trailing dot, at most %d characters)", DefaultDomain, maxDomainLength)
	if domain == "" {
		return fmt.Errorf("the domain is empty: %s", want)
	}
	if len(domain) > maxDomainLength {
		return fmt.Errorf("%q is %d characters, too long for NAME.%s to stay a DNS name with cluster names of up to %d: %s", domain, len(domain), domain, v1.MaxNameLength, want)
	}
	if errs := validation.IsDNS1123Subdomain(domain); len(errs) > 0 {
		return fmt.Errorf("%q is not a DNS name (%s): %s", domain, strings.Join(errs, "; "), want)
	}
	return nil
}

// maxDomainLength leaves room for the longest cluster name and its dot in a
// 253-character DNS name.
const maxDomainLength = validation.DNS1123SubdomainMaxLength - v1.MaxNameLength - 1

// ValidateAddress says whether address is a host:port the door can listen on
// and name in kubeconfigs.
func ValidateAddress(address string) error {
	want := "want HOST:PORT such as 0.0.0.0:8443 (every interface) or 127.0.0.1:8443, with a port from 1 to 65535"
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("%q: %v; %s", address, err, want)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%q: port %q; %s", address, port, want)
	}
	if host != "" && net.ParseIP(host) == nil && len(validation.IsDNS1123Subdomain(host)) > 0 {
		return fmt.Errorf("%q: host %q is neither an IP address nor a DNS name; %s", address, host, want)
	}
	return nil
}

// Port is the port of a valid Address.
func (c Config) Port() int {
	_, port, _ := net.SplitHostPort(c.Address)
	p, _ := strconv.Atoi(port)
	return p
}

// ServerName is the SNI name a client asks for to reach cluster.
func (c Config) ServerName(cluster string) string { return cluster + "." + c.Domain }

// Server is the URL kubeconfigs name for the door. A door on every interface
// has no one address to name, so it is named by loopback: a copy of the
// kubeconfig used on another machine changes only the host of this URL, and
// tls-server-name keeps the certificate check and the routing.
func (c Config) Server() string {
	if c.ServiceAddress != "" {
		return "https://" + c.ServiceAddress
	}
	host, port, _ := net.SplitHostPort(c.Address)
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "https://" + net.JoinHostPort(host, port)
}

// cluster maps an SNI name to the cluster it asks for. Only one label under
// the domain is a cluster name; anything else is not ours.
func (c Config) cluster(serverName string) (string, bool) {
	name, ok := strings.CutSuffix(strings.ToLower(serverName), "."+c.Domain)
	if !ok || name == "" || strings.Contains(name, ".") {
		return "", false
	}
	return name, true
}

func (c Config) withDefaults() Config {
	if c.HelloTimeout <= 0 {
		c.HelloTimeout = DefaultHelloTimeout
	}
	if c.MaxHello <= 0 {
		c.MaxHello = DefaultMaxHello
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.MaxConnsPerSource <= 0 {
		c.MaxConnsPerSource = min(DefaultMaxConnsPerSource, c.MaxConns)
	}
	return c
}
