// Package datastore gives each control plane a kine endpoint: a sqlite file
// in its own directory (the embedded default), or one database per control
// plane on a postgres server.
package datastore

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Store makes and removes the storage behind control planes.
type Store interface {
	// Kind is "sqlite" or "postgres".
	Kind() string
	// Ensure creates the storage for a control plane if it does not exist
	// and returns its kine endpoint. dir is the control plane's directory.
	Ensure(ctx context.Context, name, dir string) (string, error)
	// Remove deletes the storage; removing what is gone is not an error.
	Remove(ctx context.Context, name, dir string) error
	// Check says whether the store answers, with an error that says what to do.
	Check(ctx context.Context) error
	// Describe names the store without secrets, for logs and errors.
	Describe() string
}

// Open picks a driver by the URL's scheme: "sqlite" (or empty) for the
// embedded default, "postgres://" or "postgresql://" for a server.
func Open(raw string) (Store, error) {
	drivers := map[string]func(string) (Store, error){
		"sqlite":     func(string) (Store, error) { return sqlite{}, nil },
		"postgres":   openPostgres,
		"postgresql": openPostgres,
	}
	scheme := "sqlite"
	if raw != "" && raw != "sqlite" {
		u, err := url.Parse(raw)
		if err != nil || u.Scheme == "" {
			return nil, fmt.Errorf("datastore %q: want \"sqlite\" or a postgres://user:password@host:port/db URL", redact(raw))
		}
		scheme = u.Scheme
	}
	open, ok := drivers[scheme]
	if !ok {
		return nil, fmt.Errorf("datastore scheme %q is not supported: want \"sqlite\" or postgres://user:password@host:port/db", scheme)
	}
	return open(raw)
}

type sqlite struct{}

func (sqlite) Kind() string     { return "sqlite" }
func (sqlite) Describe() string { return "sqlite (one file per control plane)" }

func (sqlite) Ensure(_ context.Context, _, dir string) (string, error) {
	// Same tuning kine uses by default; WAL lets the apiserver read while
	// it writes.
	return "sqlite://" + filepath.Join(dir, "state.db") +
		"?_journal_mode=WAL&_busy_timeout=30000&_synchronous=NORMAL&_txlock=immediate&cache=shared", nil
}

// Remove is a no-op: the file lives in the control plane's directory, which
// the caller removes.
func (sqlite) Remove(context.Context, string, string) error { return nil }
func (sqlite) Check(context.Context) error                  { return nil }

// redact hides a URL's password.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		if i := strings.Index(raw, "@"); i >= 0 {
			return "***" + raw[i:]
		}
		return raw
	}
	return u.Redacted()
}

// Servers are the addresses a kine endpoint (what Ensure returned) dials: a
// postgres endpoint's host and port (5432 when it names none), its names resolved
// now; none for sqlite or a unix socket. A control plane's kernel wall lets it
// reach these and nothing else of the host's network.
func Servers(ctx context.Context, endpoint string) ([]netip.AddrPort, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, nil // sqlite: a file
	}
	var out []netip.AddrPort
	// pgx takes several hosts, comma-separated, for failover.
	for _, hp := range strings.Split(u.Host, ",") {
		if hp == "" {
			continue
		}
		host, port := hp, "5432"
		if h, p, err := net.SplitHostPort(hp); err == nil {
			host, port = h, p
		}
		host = strings.Trim(host, "[]")
		if strings.HasPrefix(host, "/") {
			continue // a unix socket's directory
		}
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("datastore %s: port %q is not a TCP port", redact(endpoint), port)
		}
		addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, fmt.Errorf("datastore %s: resolving %s: %w", redact(endpoint), host, err)
		}
		for _, a := range addrs {
			ap := netip.AddrPortFrom(a.Unmap(), uint16(n))
			if !slices.Contains(out, ap) {
				out = append(out, ap)
			}
		}
	}
	return out, nil
}
