package datastore

import (
	"context"
	"database/sql"
	"fmt"
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
