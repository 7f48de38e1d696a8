package datastore

import (
	"context"
	"database/sql"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

func TestOpen(t *testing.T) {
	tests := []struct {
		url      string
		wantKind string
		wantErr  string
	}{
		{"", "sqlite", ""},
		{"sqlite", "sqlite", ""},
		{"postgres://u:secret@127.0.0.1:5432/postgres", "postgres", ""},
		{"postgresql://127.0.0.1/postgres", "postgres", ""},
		{"mysql://root@127.0.0.1/db", "", `scheme "mysql" is not supported`},
		{"not a url", "", "want \"sqlite\" or a postgres://"},
		{"postgres:///nohost", "", "has no host"},
	}
	for _, tt := range tests {
		s, err := Open(tt.url)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Open(%q) err = %v, want %q", tt.url, err, tt.wantErr)
			}
			continue
		}
		if err != nil || s.Kind() != tt.wantKind {
			t.Errorf("Open(%q) = %v, %v; want kind %s", tt.url, s, err, tt.wantKind)
		}
	}
}

func TestDescribeHidesPassword(t *testing.T) {
	s, err := Open("postgres://u:hunter2@127.0.0.1:5432/postgres")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(s.Describe(), "hunter2") {
		t.Errorf("Describe leaks the password: %s", s.Describe())
	}
}

func TestPostgresThatDoesNotAnswerSaysSo(t *testing.T) {
	port := livetest.FreePort(t)
	s, err := Open(fmt.Sprintf("postgres://u:hunter2@127.0.0.1:%d/postgres?sslmode=disable", port))
	if err != nil {
		t.Fatal(err)
	}
	err = s.Check(context.Background())
	if err == nil || !strings.Contains(err.Error(), "does not answer") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("Check = %v; want a 'does not answer' error without the password", err)
	}
}

func TestPostgresDatabasePerControlPlane(t *testing.T) {
	admin := livetest.Postgres(t)
	s, err := Open(admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	name := "dstest-" + strings.ToLower(t.Name()[len(t.Name())-6:])
	defer s.Remove(ctx, name, "")
	ep, err := s.Ensure(ctx, name, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ensure(ctx, name, ""); err != nil {
		t.Fatalf("second Ensure: %v", err)
	}
	if !strings.Contains(ep, DatabaseName(name)) {
		t.Errorf("endpoint %s does not name database %s", ep, DatabaseName(name))
	}
	db, err := sql.Open("pgx", ep)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Ping(); err != nil {
		t.Fatalf("tenant database not reachable: %v", err)
	}
	db.Close()
	if err := s.Remove(ctx, name, ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, name, ""); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	adb, _ := sql.Open("pgx", admin)
	defer adb.Close()
	var n int
	if err := adb.QueryRow("SELECT count(*) FROM pg_database WHERE datname = $1", DatabaseName(name)).Scan(&n); err != nil || n != 0 {
		t.Errorf("database still exists after Remove (count %d, %v)", n, err)
	}
}

// Each control plane's endpoint logs in as a role of its own: it owns its database
// (kine can make its tables), is no superuser, cannot connect to another tenant's
// database, and a database made before roles were is handed over to it.
func TestPostgresRolePerControlPlane(t *testing.T) {
	admin := livetest.Postgres(t)
	s, err := Open(admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, b := "dsrole-a", "dsrole-b"
	for _, n := range []string{a, b} {
		defer s.Remove(ctx, n, "")
	}
	// b's database predates roles: made by the admin, with a table of the admin's.
	adb, err := sql.Open("pgx", admin)
	if err != nil {
		t.Fatal(err)
	}
	defer adb.Close()
	s.Remove(ctx, b, "")
	if _, err := adb.ExecContext(ctx, `CREATE DATABASE "`+DatabaseName(b)+`"`); err != nil {
		t.Fatal(err)
	}
	bAdmin := strings.Replace(admin, "/postgres?", "/"+DatabaseName(b)+"?", 1)
	if bdb, err := sql.Open("pgx", bAdmin); err == nil {
		if _, err := bdb.ExecContext(ctx, `CREATE TABLE kine (id bigserial primary key, name text)`); err != nil {
			t.Fatalf("making the old table (admin URL %s): %v", bAdmin, err)
		}
		bdb.Close()
	}
	epA, err := s.Ensure(ctx, a, "")
	if err != nil {
		t.Fatal(err)
	}
	epB, err := s.Ensure(ctx, b, "")
	if err != nil {
		t.Fatal(err)
	}
	if again, err := s.Ensure(ctx, a, ""); err != nil || again != epA {
		t.Errorf("a second Ensure gave %v, %v; want the same endpoint (running control planes keep their password)", again, err)
	}
	for _, tc := range []struct{ name, ep, table string }{{a, epA, "t"}, {b, epB, "kine"}} {
		db, err := sql.Open("pgx", tc.ep)
		if err != nil {
			t.Fatal(err)
		}
		var user string
		var super bool
		if err := db.QueryRowContext(ctx, "SELECT current_user, usesuper FROM pg_user WHERE usename = current_user").Scan(&user, &super); err != nil {
			t.Fatalf("%s's endpoint does not log in: %v", tc.name, err)
		}
		if user != DatabaseName(tc.name) || super {
			t.Errorf("%s logs in as %s (superuser %v), want %s and no superuser", tc.name, user, super, DatabaseName(tc.name))
		}
		if tc.table == "t" {
			if _, err := db.ExecContext(ctx, `CREATE TABLE t (x int)`); err != nil {
				t.Errorf("%s cannot make a table in its own database: %v", tc.name, err)
			}
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO `+tc.table+` DEFAULT VALUES`); err != nil {
			t.Errorf("%s cannot write its own table %s: %v", tc.name, tc.table, err)
		}
		db.Close()
	}
	// a's credentials on b's database.
	cross, _ := url.Parse(epA)
	cross.Path = "/" + DatabaseName(b)
	db, _ := sql.Open("pgx", cross.String())
	err = db.PingContext(ctx)
	db.Close()
	if err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("a's role connecting to b's database: %v; want permission denied", err)
	}
	if err := s.Remove(ctx, a, ""); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := adb.QueryRowContext(ctx, "SELECT count(*) FROM pg_roles WHERE rolname = $1", DatabaseName(a)).Scan(&n); err != nil || n != 0 {
		t.Errorf("role %s left after Remove (%d, %v)", DatabaseName(a), n, err)
	}
}

// The servers a kine endpoint dials are what its control plane's wall lets it reach.
func TestServers(t *testing.T) {
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		name, endpoint string
		want           []netip.AddrPort
		wantErr        string
	}{
		{"sqlite", "sqlite:///var/lib/socialweb/clusters/a/run/state.db?_journal_mode=WAL", nil, ""},
		{"postgres", "postgres://r:p@127.0.0.1:5433/socialweb_t_a?sslmode=disable", []netip.AddrPort{ap("127.0.0.1:5433")}, ""},
		{"default port", "postgresql://r:p@127.0.0.1/socialweb_t_a", []netip.AddrPort{ap("127.0.0.1:5432")}, ""},
		{"IPv6", "postgres://r:p@[::1]:5432/db", []netip.AddrPort{ap("[::1]:5432")}, ""},
		{"IPv6 without a port", "postgres://r:p@[2001:db8::5]/db", []netip.AddrPort{ap("[2001:db8::5]:5432")}, ""},
		{"several hosts", "postgres://r:p@10.0.0.5:5432,10.0.0.6:5433/db", []netip.AddrPort{ap("10.0.0.5:5432"), ap("10.0.0.6:5433")}, ""},
		{"a unix socket", "postgres://r:p@%2Fvar%2Frun%2Fpostgresql/db", nil, ""},
		{"a bad port", "postgres://r:p@10.0.0.5:0/db", nil, "not a TCP port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Servers(context.Background(), tc.endpoint)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || strings.Contains(err.Error(), ":p@") {
					t.Fatalf("err = %v, want %q without the password", err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("Servers = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}
