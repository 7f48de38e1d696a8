// Package datastore gives each control plane a kine endpoint: a sqlite file
// in its own directory (the embedded default), or one database per control
// plane on a postgres server.
package datastore

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
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
