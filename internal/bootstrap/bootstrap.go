// Package bootstrap keeps the data every host of a service must share before its
// management apiserver starts (CA certificates and keys, the service-account key
// pair) in one PostgreSQL table, sealed with AES-256-GCM under a cluster key that
// each host is given as a file. The first host to Share its set wins; every later
// host gets that same set back, and a host holding another key fails at start,
// told which key file it needs.
package bootstrap

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/socialweb-computer/socialweb/internal/atomicfile"
)

// KeySize is the cluster key's length in bytes.
const KeySize = 32

const (
	version   = 1
	nonceSize = 12
	tagSize   = 16
)

// ErrWrongKey says sealed data does not open: another key, another entry's blob,
// or altered bytes. GCM cannot tell these apart, so neither can we.
var ErrWrongKey = errors.New("sealed data does not open with this cluster key (another key, another entry's data, or altered bytes)")

// LoadOrCreateKey reads the cluster key at path (64 hex chars, optional trailing
// newline), or, when the file does not exist and create is true, makes one from
// crypto/rand and writes it with mode 0600 (its directory made 0700 if missing).
func LoadOrCreateKey(path string, create bool) ([]byte, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		if !create {
			return nil, fmt.Errorf("cluster key file %s does not exist: copy the key file of the service's first host here (mode 0600)", path)
		}
		return createKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("reading cluster key file %s: %w", path, err)
	}
	defer f.Close()
	// Stat the open file, not the path, so the mode checked is the file read.
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading cluster key file %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("cluster key file %s is not a regular file: point --cluster-key-file at the key file", path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("cluster key file %s has mode %04o, which lets others read the key: chmod 600 %s", path, perm, path)
	}
	// A key file is one short line; a limit keeps a wrong --cluster-key-file cheap.
	data, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return nil, fmt.Errorf("reading cluster key file %s: %w", path, err)
	}
	key, err := hex.DecodeString(strings.TrimSuffix(string(data), "\n"))
	if err != nil || len(key) != KeySize {
		// Never echo the content: it may be a key.
		return nil, fmt.Errorf("cluster key file %s does not hold a key: want %d hex characters (a %d-byte key) and an optional newline, found %d bytes that are not that; copy the key file of the service's first host here", path, 2*KeySize, KeySize, st.Size())
	}
	return key, nil
}

func createKey(path string) ([]byte, error) {
	key := make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("making a cluster key for %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("making the directory of cluster key file %s: %w", path, err)
	}
	// atomicfile sets 0600 before writing and renames into place: no reader sees
	// half a key, and the key never exists with a wider mode.
	if err := atomicfile.Write(path, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("saving the new cluster key: %w", err)
	}
	return key, nil
}

func aead(key []byte) (cipher.AEAD, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("cluster key is %d bytes, want %d: load it with LoadOrCreateKey", len(key), KeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("cluster key: %w", err)
	}
	return cipher.NewGCM(block)
}

// Seal encrypts plaintext with AES-256-GCM under key, binding name as associated
// data (so a blob cannot be swapped for another entry's). Output: 1 version byte
// (1) || 12-byte random nonce || ciphertext+tag.
func Seal(key []byte, name string, plaintext []byte) ([]byte, error) {
	g, err := aead(key)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 1+nonceSize, 1+nonceSize+len(plaintext)+tagSize)
	out[0] = version
	if _, err := rand.Read(out[1:]); err != nil {
		return nil, fmt.Errorf("sealing %q: making a nonce: %w", name, err)
	}
	return g.Seal(out, out[1:], plaintext, []byte(name)), nil
}

// Open reverses Seal; a wrong key, wrong name or tampered blob returns an error
// wrapping ErrWrongKey.
func Open(key []byte, name string, sealed []byte) ([]byte, error) {
	g, err := aead(key)
	if err != nil {
		return nil, err
	}
	if len(sealed) > 0 && sealed[0] != version {
		return nil, fmt.Errorf("opening %q: sealed in format version %d, this socialweb reads only version %d: run the same socialweb release on every host", name, sealed[0], version)
	}
	if len(sealed) < 1+nonceSize+tagSize {
		return nil, fmt.Errorf("opening %q: %d bytes is too short to be sealed data: %w", name, len(sealed), ErrWrongKey)
	}
	plain, err := g.Open(nil, sealed[1:1+nonceSize], sealed[1+nonceSize:], []byte(name))
	if err != nil {
		return nil, fmt.Errorf("opening %q: %w", name, ErrWrongKey)
	}
	return plain, nil
}

// Store keeps named sealed blobs in one table of a PostgreSQL database.
type Store struct {
	DB    *sql.DB
	Table string // default "socialweb_bootstrap"; one name, not schema-qualified
}

// Share makes the table if missing, offers every entry of local sealed under key
// (inserted only where the name is absent, all in one transaction), then returns
// every entry of the table opened. So the first host's entries win and every host
// ends with the same set. An entry that does not open with key fails the whole
// call (nothing of local is inserted) with an error wrapping ErrWrongKey.
func (s Store) Share(ctx context.Context, key []byte, local map[string][]byte) (map[string][]byte, error) {
	if s.DB == nil {
		return nil, errors.New("bootstrap store has no database: open the management datastore first")
	}
	if _, err := aead(key); err != nil {
		return nil, err
	}
	table := s.Table
	if table == "" {
		table = "socialweb_bootstrap"
	}
	q := pgx.Identifier{table}.Sanitize()
	fail := func(what string, err error) error {
		return fmt.Errorf("sharing bootstrap data in table %s: %s: %w; check the datastore is reachable and its user may create tables", table, what, err)
	}
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return nil, fail("beginning a transaction", err)
	}
	defer tx.Rollback() // a no-op once committed
	// One lock per table, held to commit, makes hosts take turns: concurrent
	// CREATE TABLE IF NOT EXISTS cannot collide on pg_type (23505), and two hosts'
	// inserts cannot interleave, deadlock, or mix their sets.
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "socialweb bootstrap "+table); err != nil {
		return nil, fail("locking", err)
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+q+` (name text PRIMARY KEY, sealed bytea NOT NULL, created timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fail("creating the table", err)
	}
	names := make([]string, 0, len(local))
	for name := range local {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		sealed, err := Seal(key, name, local[name])
		if err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+q+` (name, sealed) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`, name, sealed); err != nil {
			return nil, fail(fmt.Sprintf("offering entry %q", name), err)
		}
	}
	// Read inside the transaction: a wrong key rolls back this host's inserts.
	rows, err := tx.QueryContext(ctx, `SELECT name, sealed FROM `+q)
	if err != nil {
		return nil, fail("reading the entries", err)
	}
	defer rows.Close()
	shared := make(map[string][]byte)
	for rows.Next() {
		var name string
		var sealed []byte
		if err := rows.Scan(&name, &sealed); err != nil {
			return nil, fail("reading the entries", err)
		}
		plain, err := Open(key, name, sealed)
		if errors.Is(err, ErrWrongKey) {
			return nil, fmt.Errorf("bootstrap entry %q in table %s: the management plane in this database was made by a host with another cluster key: give this host that host's key file (--cluster-key-file): %w", name, table, err)
		}
		if err != nil {
			return nil, fmt.Errorf("bootstrap entry %q in table %s: %w", name, table, err)
		}
		shared[name] = plain
	}
	if err := rows.Err(); err != nil {
		return nil, fail("reading the entries", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fail("committing", err)
	}
	return shared, nil
}
