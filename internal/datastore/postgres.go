package datastore

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// postgres keeps one database per control plane on one server, so deleting
// a tenant is one DROP DATABASE and tenants never share tables. Each database is
// owned by a login role of its own, whose password is derived from the admin URL
// (HMAC), and PUBLIC may not connect to it: a control plane's kine endpoint
// reaches its own database and no other, and holds no superuser password.
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
	// Identifiers cannot be parameters; dbName is built from a DNS label and the
	// password is hex, so neither needs quoting beyond this.
	role, password := dbName, p.password(dbName)
	var roleExists bool
	if err := db.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", role).Scan(&roleExists); err != nil {
		return "", fmt.Errorf("looking up role %s on %s: %w", role, p.admin.Redacted(), err)
	}
	verb := "CREATE"
	if roleExists {
		verb = "ALTER"
	}
	if _, err := db.ExecContext(ctx, verb+` ROLE "`+role+`" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '`+password+`'`); err != nil {
		return "", fmt.Errorf("%s role %s on %s: %w", strings.ToLower(verb)+"ing", role, p.admin.Redacted(), err)
	}
	if !exists {
		if _, err := db.ExecContext(ctx, `CREATE DATABASE "`+dbName+`" OWNER "`+role+`"`); err != nil && !isDuplicateDatabase(err) {
			return "", fmt.Errorf("creating database %s on %s: %w", dbName, p.admin.Redacted(), err)
		}
	}
	for _, q := range []string{`ALTER DATABASE "` + dbName + `" OWNER TO "` + role + `"`, `REVOKE ALL ON DATABASE "` + dbName + `" FROM PUBLIC`} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return "", fmt.Errorf("%s on %s: %w", q, p.admin.Redacted(), err)
		}
	}
	if exists {
		// A database made before roles were: its tables are the admin's.
		if err := p.handOver(ctx, dbName, role); err != nil {
			return "", err
		}
	}
	u := *p.admin
	u.Path = "/" + dbName
	u.User = url.UserPassword(role, password)
	return u.String(), nil
}

// password is role's: derived from the admin URL, so every Ensure gives the same one
// and a running control plane's connections keep working.
func (p postgres) password(role string) string {
	m := hmac.New(sha256.New, []byte("socialweb datastore role\x00"+p.admin.String()))
	m.Write([]byte(role))
	return hex.EncodeToString(m.Sum(nil))
}

// handOver gives role the tables, views and sequences of database dbName the admin
// owns (a table's own sequences go with it).
func (p postgres) handOver(ctx context.Context, dbName, role string) error {
	u := *p.admin
	u.Path = "/" + dbName
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		return err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relkind IN ('r', 'S', 'v') AND pg_get_userbyid(c.relowner) <> $1
		AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype IN ('a', 'i'))`, role)
	if err != nil {
		return fmt.Errorf("listing the tables of %s: %w", dbName, err)
	}
	var stmts []string
	for rows.Next() {
		var name, kind string
		if err := rows.Scan(&name, &kind); err != nil {
			rows.Close()
			return err
		}
		what := map[string]string{"r": "TABLE", "S": "SEQUENCE", "v": "VIEW"}[kind]
		stmts = append(stmts, `ALTER `+what+` public."`+strings.ReplaceAll(name, `"`, `""`)+`" OWNER TO "`+role+`"`)
	}
	rows.Close()
	for _, q := range stmts {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("%s in %s: %w", q, dbName, err)
		}
	}
	return nil
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
	if _, err := db.ExecContext(ctx, `DROP ROLE IF EXISTS "`+dbName+`"`); err != nil {
		return fmt.Errorf("dropping role %s on %s: %w", dbName, p.admin.Redacted(), err)
	}
	return nil
}

func isDuplicateDatabase(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P04"
}

// AdminURL is raw (a postgres admin URL) pointed at control plane name's
// database: for what the daemon itself keeps there beside kine's table.
func AdminURL(raw, name string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("datastore URL %s: %w", redact(raw), err)
	}
	u.Path = "/" + DatabaseName(name)
	return u.String(), nil
}
