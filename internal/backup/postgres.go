package backup

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// A postgres tenant's datastore travels as the same sqlite file a sqlite
// tenant's does: kine's table has the same columns in both, so one archive
// format restores into either kind of daemon.

// kineColumns are kine's table's columns, alike in its sqlite and postgres schemas.
const kineColumns = "id, name, created, deleted, create_revision, prev_revision, lease, value, old_value"

// The tables as kine v0.17 creates them; kine adds its indexes when it starts.
const (
	sqliteKineTable = `CREATE TABLE kine (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, created INTEGER, deleted INTEGER,
		create_revision INTEGER, prev_revision INTEGER, lease INTEGER, value BLOB, old_value BLOB)`
	postgresKineTable = `CREATE TABLE IF NOT EXISTS kine (id BIGSERIAL PRIMARY KEY, name text COLLATE "C", created INTEGER, deleted INTEGER,
		create_revision BIGINT, prev_revision BIGINT, lease INTEGER, value bytea, old_value bytea)`
)

// DumpPostgres copies the kine table at endpoint (the tenant's own postgres
// URL) into a new sqlite file dst, in one REPEATABLE READ transaction: the
// table at one instant, as VACUUM INTO gives for sqlite. It returns the rows.
func DumpPostgres(ctx context.Context, endpoint, dst string) (int64, error) {
	if _, err := os.Stat(dst); err == nil {
		return 0, fmt.Errorf("copying the datastore: %s exists", dst)
	}
	src, err := sql.Open("pgx", endpoint)
	if err != nil {
		return 0, err
	}
	defer src.Close()
	tx, err := src.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return 0, fmt.Errorf("reading the postgres datastore: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	f.Close()
	out, err := openSQLite(dst, "")
	if err != nil {
		return 0, err
	}
	defer out.Close()
	if _, err := out.ExecContext(ctx, sqliteKineTable); err != nil {
		return 0, fmt.Errorf("making the datastore copy: %w", err)
	}
	outTx, err := out.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer outTx.Rollback() //nolint:errcheck // a no-op after Commit
	n, err := copyRows(ctx, tx, outTx, "?")
	if err != nil {
		return 0, fmt.Errorf("copying the postgres datastore: %w", err)
	}
	return n, outTx.Commit()
}

// LoadPostgres copies the sqlite datastore src into the kine table at
// endpoint, which must hold no rows yet, in one transaction, and moves the
// table's id sequence past the last row so kine's next write follows it.
func LoadPostgres(ctx context.Context, src, endpoint string) (int64, error) {
	in, err := openSQLite(src, "")
	if err != nil {
		return 0, fmt.Errorf("opening the restored datastore: %w", err)
	}
	defer in.Close()
	db, err := sql.Open("pgx", endpoint)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("writing the postgres datastore: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if _, err := tx.ExecContext(ctx, postgresKineTable); err != nil {
		return 0, fmt.Errorf("making kine's table: %w", err)
	}
	var held int64
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM kine").Scan(&held); err != nil {
		return 0, err
	}
	if held > 0 {
		return 0, fmt.Errorf("the database already holds %d datastore rows: a restore goes into a new database only", held)
	}
	n, err := copyRows(ctx, in, tx, "$")
	if err != nil {
		return 0, fmt.Errorf("copying into the postgres datastore: %w", err)
	}
	if _, err := tx.ExecContext(ctx, "SELECT setval(pg_get_serial_sequence('kine', 'id'), GREATEST((SELECT MAX(id) FROM kine), 1))"); err != nil {
		return 0, fmt.Errorf("moving kine's id sequence: %w", err)
	}
	return n, tx.Commit()
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// copyRows copies every row of kine from one database to the other, in id
// order; mark is the target's placeholder ("?" or "$", numbered).
func copyRows(ctx context.Context, from querier, to execer, mark string) (int64, error) {
	cols := strings.Split(kineColumns, ", ")
	marks := make([]string, len(cols))
	for i := range marks {
		marks[i] = "?"
		if mark == "$" {
			marks[i] = fmt.Sprintf("$%d", i+1)
		}
	}
	insert := "INSERT INTO kine (" + kineColumns + ") VALUES (" + strings.Join(marks, ", ") + ")"
	rows, err := from.QueryContext(ctx, "SELECT "+kineColumns+" FROM kine ORDER BY id")
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	var n int64
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return n, err
		}
		// sqlite keeps names as TEXT; a driver may hand them over as bytes.
		if b, ok := vals[1].([]byte); ok {
			vals[1] = string(b)
		}
		if _, err := to.ExecContext(ctx, insert, vals...); err != nil {
			return n, err
		}
		n++
	}
	return n, rows.Err()
}
