package bootstrap

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"strings"
	"sync"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// freshDB makes a database of its own for one test on the live server and drops it after.
func freshDB(t *testing.T) *sql.DB {
	t.Helper()
	admin := livetest.Postgres(t)
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("SOCIALWEB_TEST_POSTGRES_URL: %v", err)
	}
	adb, err := sql.Open("pgx", admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { adb.Close() })
	suffix := make([]byte, 6)
	rand.Read(suffix)
	name := "swboot_test_" + hex.EncodeToString(suffix)
	if _, err := adb.Exec(`CREATE DATABASE "` + name + `"`); err != nil {
		t.Fatalf("creating test database %s: %v", name, err)
	}
	u.Path = "/" + name
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last-in first-out: close our pool, then drop.
	t.Cleanup(func() {
		if _, err := adb.Exec(`DROP DATABASE IF EXISTS "` + name + `" WITH (FORCE)`); err != nil {
			t.Errorf("dropping test database %s: %v", name, err)
		}
	})
	t.Cleanup(func() { db.Close() })
	return db
}

func rowCount(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM socialweb_bootstrap`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func equalSets(a, b map[string][]byte) bool {
	return maps.EqualFunc(a, b, func(x, y []byte) bool { return bytes.Equal(x, y) })
}

// The first host's entries win; a later host's new names are added.
func TestShareFirstHostWins(t *testing.T) {
	s, ctx, key := Store{DB: freshDB(t)}, context.Background(), testKey(1)
	first := map[string][]byte{"a": []byte("first a"), "b": []byte("first b")}
	got, err := s.Share(ctx, key, first)
	if err != nil {
		t.Fatal(err)
	}
	if !equalSets(got, first) {
		t.Fatalf("first Share = %q; want %q", got, first)
	}
	got, err = s.Share(ctx, key, map[string][]byte{"a": []byte("second a"), "c": []byte("second c")})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{"a": []byte("first a"), "b": []byte("first b"), "c": []byte("second c")}
	if !equalSets(got, want) {
		t.Fatalf("second Share = %q; want %q", got, want)
	}
}

// A host with another key fails, is told what to do, and leaves the table as it was.
func TestShareWrongKey(t *testing.T) {
	db := freshDB(t)
	s, ctx := Store{DB: db}, context.Background()
	if _, err := s.Share(ctx, testKey(1), map[string][]byte{"a": []byte("a")}); err != nil {
		t.Fatal(err)
	}
	before := rowCount(t, db)
	_, err := s.Share(ctx, testKey(2), map[string][]byte{"a": []byte("other a"), "new": []byte("new")})
	if !errors.Is(err, ErrWrongKey) {
		t.Fatalf("Share with another key = %v; want an error wrapping ErrWrongKey", err)
	}
	if !strings.Contains(err.Error(), "give this host that host's key file (--cluster-key-file)") {
		t.Errorf("error %q does not say what to do", err)
	}
	if after := rowCount(t, db); after != before {
		t.Errorf("table has %d rows after the failed Share, %d before; want nothing inserted", after, before)
	}
}

// Hosts starting at once on an empty database all end with one host's whole set.
func TestShareConcurrent(t *testing.T) {
	const hosts = 8
	s, ctx, key := Store{DB: freshDB(t), Table: "boot_race"}, context.Background(), testKey(3)
	offered := make([]map[string][]byte, hosts)
	got := make([]map[string][]byte, hosts)
	errs := make([]error, hosts)
	for i := range offered {
		offered[i] = map[string][]byte{}
		for _, name := range []string{"server-ca.crt", "server-ca.key", "client-ca.crt", "client-ca.key", "sa.key", "sa.pub"} {
			offered[i][name] = fmt.Appendf(nil, "host %d %s", i, name)
		}
	}
	var start, done sync.WaitGroup
	start.Add(1)
	for i := range hosts {
		done.Go(func() {
			start.Wait()
			got[i], errs[i] = s.Share(ctx, key, offered[i])
		})
	}
	start.Done()
	done.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("host %d: %v", i, err)
		}
	}
	for i := range got {
		if !equalSets(got[i], got[0]) {
			t.Errorf("host %d got %q; host 0 got %q", i, got[i], got[0])
		}
	}
	winner := -1
	for i := range offered {
		if equalSets(got[0], offered[i]) {
			winner = i
		}
	}
	if winner < 0 {
		t.Errorf("shared set %q is no host's whole set", got[0])
	}
}

// The table holds sealed bytes, never the plaintext.
func TestShareStoresSealed(t *testing.T) {
	db := freshDB(t)
	plain := []byte("-----BEGIN EC PRIVATE KEY----- secret CA key")
	if _, err := (Store{DB: db}).Share(context.Background(), testKey(4), map[string][]byte{"server-ca.key": plain}); err != nil {
		t.Fatal(err)
	}
	var sealed []byte
	if err := db.QueryRow(`SELECT sealed FROM socialweb_bootstrap WHERE name = 'server-ca.key'`).Scan(&sealed); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, plain) || bytes.Contains(sealed, []byte("PRIVATE KEY")) {
		t.Errorf("stored bytes hold the plaintext: %q", sealed)
	}
	if got, err := Open(testKey(4), "server-ca.key", sealed); err != nil || !bytes.Equal(got, plain) {
		t.Errorf("stored bytes open to %q, %v; want %q", got, err, plain)
	}
}
