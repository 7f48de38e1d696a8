package backup

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// testDatabase makes an empty database on the test server and returns its URL.
func testDatabase(t *testing.T, admin, name string) string {
	t.Helper()
	db, err := sql.Open("pgx", admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	for _, q := range []string{`DROP DATABASE IF EXISTS "` + name + `" WITH (FORCE)`, `CREATE DATABASE "` + name + `"`} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _, _ = db.Exec(`DROP DATABASE IF EXISTS "` + name + `" WITH (FORCE)`) })
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// TestPostgresRoundTrip: a postgres tenant's kine table goes into the archive's sqlite
// file and back into a new database whole, and its id sequence continues after it.
func TestPostgresRoundTrip(t *testing.T) {
	admin := livetest.Postgres(t)
	ctx := context.Background()
	src := testDatabase(t, admin, "socialweb_backup_test_src")
	db, err := sql.Open("pgx", src)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(postgresKineTable); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		var old any
		if i%2 == 1 {
			old = []byte{0, 1, byte(i)}
		}
		if _, err := db.Exec(`INSERT INTO kine (name, created, deleted, create_revision, prev_revision, lease, value, old_value) VALUES ($1, 1, 0, $2, 0, 0, $3, $4)`,
			fmt.Sprintf("/registry/configmaps/default/cm-%d", i), i+1, []byte{0xff, byte(i)}, old); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(t.TempDir(), DatastoreEntry)
	if n, err := DumpPostgres(ctx, src, file); err != nil || n != 50 {
		t.Fatalf("DumpPostgres: %d rows, %v", n, err)
	}
	if n, err := CheckDatastore(ctx, file); err != nil || n != 50 {
		t.Fatalf("the copy: %d rows, %v", n, err)
	}
	dst := testDatabase(t, admin, "socialweb_backup_test_dst")
	if n, err := LoadPostgres(ctx, file, dst); err != nil || n != 50 {
		t.Fatalf("LoadPostgres: %d rows, %v", n, err)
	}
	dump := func(u string) string {
		d, err := sql.Open("pgx", u)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		rows, err := d.Query("SELECT " + kineColumns + " FROM kine ORDER BY id")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var b strings.Builder
		for rows.Next() {
			vals := make([]any, 9)
			ptrs := make([]any, 9)
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%v\n", vals)
		}
		return b.String()
	}
	if a, b := dump(src), dump(dst); a != b {
		t.Errorf("the restored table differs:\n%s\nwant\n%s", b, a)
	}
	d2, _ := sql.Open("pgx", dst)
	defer d2.Close()
	var id int64
	if err := d2.QueryRow(`INSERT INTO kine (name, created, deleted, create_revision, prev_revision, lease, value) VALUES ('next', 1, 0, 0, 0, 0, '') RETURNING id`).Scan(&id); err != nil || id != 51 {
		t.Errorf("the next row got id %d (%v), want 51", id, err)
	}
	// Never into a database that holds rows.
	if _, err := LoadPostgres(ctx, file, dst); err == nil || !strings.Contains(err.Error(), "new database only") {
		t.Errorf("loading into a database with rows: %v", err)
	}
}
