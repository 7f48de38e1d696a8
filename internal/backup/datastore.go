package backup

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"

	// kine's own sqlite driver (the cgo build): the copy is read the way kine
	// writes it.
	_ "github.com/mattn/go-sqlite3"
)

// openSQLite opens an existing sqlite file without ever creating one.
func openSQLite(p string, extra string) (*sql.DB, error) {
	if _, err := os.Stat(p); err != nil {
		return nil, err
	}
	u := url.URL{Scheme: "file", Opaque: p, RawQuery: "mode=rw&_busy_timeout=30000" + extra}
	return sql.Open("sqlite3", u.String())
}

// CopyDatastore copies the sqlite datastore src to dst (which must not
// exist) with VACUUM INTO: one read transaction, so the copy is the
// database at one instant even while kine writes (WAL lets a reader run
// beside the writer), and a sleeping tenant's file at rest copies the same.
// It returns the copy's row count.
func CopyDatastore(ctx context.Context, src, dst string) (int64, error) {
	if _, err := os.Stat(dst); err == nil {
		return 0, fmt.Errorf("copying the datastore: %s exists", dst)
	}
	db, err := openSQLite(src, "")
	if err != nil {
		return 0, fmt.Errorf("opening the datastore %s: %w", src, err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "VACUUM INTO ?", dst); err != nil {
		return 0, fmt.Errorf("copying the datastore %s: %w", src, err)
	}
	if err := os.Chmod(dst, 0o600); err != nil {
		return 0, err
	}
	return CheckDatastore(ctx, dst)
}

// CheckDatastore says whether p is a whole sqlite database holding kine's
// table, and how many rows that table has.
func CheckDatastore(ctx context.Context, p string) (int64, error) {
	db, err := openSQLite(p, "")
	if err != nil {
		return 0, fmt.Errorf("opening the datastore copy: %w", err)
	}
	defer db.Close()
	var check string
	if err := db.QueryRowContext(ctx, "PRAGMA quick_check").Scan(&check); err != nil {
		return 0, fmt.Errorf("%w: the datastore is not a sqlite database: %v", ErrCorrupt, err)
	}
	if check != "ok" {
		return 0, fmt.Errorf("%w: the datastore fails sqlite's check: %s", ErrCorrupt, check)
	}
	var rows int64
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM kine").Scan(&rows); err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return 0, err
		}
		return 0, fmt.Errorf("%w: the datastore holds no kine table: %v", ErrCorrupt, err)
	}
	return rows, nil
}
