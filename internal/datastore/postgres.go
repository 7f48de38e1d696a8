package datastore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// postgres keeps one database per control plane on one server, so deleting
// a tenant is one DROP DATABASE and tenants never share tables.
type postgres struct {
	admin *url.URL // where CREATE/DROP DATABASE are issued
}

func openPostgres(raw string) (Store, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("datastore URL %s: %w", redact(raw), err)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("datastore URL %s has no host: want postgres://user:password@host:port/db", u.Redacted())
	}
	return postgres{admin: u}, nil
}

func (p postgres) Kind() string     { return "postgres" }
func (p postgres) Describe() string { return "postgres " + p.admin.Redacted() }

// DatabaseName is the database a control plane's data lives in.
func DatabaseName(name string) string {
	if name == "mgmt" {
		return "socialweb_mgmt"
	}
	return "socialweb_t_" + strings.ReplaceAll(name, "-", "_")
}

func (p postgres) open() (*sql.DB, error) {
	return sql.Open("pgx", p.admin.String())
}

func (p postgres) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	db, err := p.open()
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("datastore %s does not answer: %v; check the server is running and the URL (--datastore, $SOCIALWEB_DATASTORE) is right", p.admin.Redacted(), err)
	}
	return nil
}

func (p postgres) Ensure(ctx context.Context, name, _ string) (string, error) {
	db, err := p.open()
	if err != nil {
		return "", err
	}
	defer db.Close()
	dbName := DatabaseName(name)
	var exists bool
	if err := db.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", dbName).Scan(&exists); err != nil {
		return "", fmt.Errorf("looking up database %s on %s: %w", dbName, p.admin.Redacted(), err)
	}
	if !exists {
		// Identifiers cannot be parameters; dbName is built from a DNS label
		// so it needs no quoting beyond this.
		if _, err := db.ExecContext(ctx, `CREATE DATABASE "`+dbName+`"`); err != nil && !isDuplicateDatabase(err) {
			return "", fmt.Errorf("creating database %s on %s: %w", dbName, p.admin.Redacted(), err)
		}
	}
	u := *p.admin
	u.Path = "/" + dbName
	return u.String(), nil
}

func (p postgres) Remove(ctx context.Context, name, _ string) error {
	db, err := p.open()
	if err != nil {
		return err
	}
	defer db.Close()
	dbName := DatabaseName(name)
	if _, err := db.ExecContext(ctx, `DROP DATABASE IF EXISTS "`+dbName+`" WITH (FORCE)`); err != nil {
		return fmt.Errorf("dropping database %s on %s: %w", dbName, p.admin.Redacted(), err)
	}
	return nil
}

func isDuplicateDatabase(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P04"
}
