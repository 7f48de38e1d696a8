// Package backup writes and reads a tenant's backup: one file holding its
// datastore (a consistent sqlite copy, made from sqlite or postgres alike),
// its whole PKI (CAs, keys, the
// service-account signing key) and its Cluster spec, so a restored tenant
// accepts every credential made before the backup.
//
// The file is a gzipped tar, mode 0600, not encrypted: it holds CA keys, so
// whoever may read it may act as the tenant's admin, the same as whoever may
// read the state dir. Its first entry names the format and version, its last
// one the SHA-256 of every entry before it; a reader checks both, so a file
// that is not a backup, of another version, cut short or altered is refused
// before anything is restored from it.
package backup

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Format and Version name what Write writes; Read refuses any other.
const (
	Format  = "socialweb-backup"
	Version = 1
)

// Entry names inside the archive. Datastore and the pki/ files are written
// where a cluster's directory keeps them.
const (
	HeaderEntry    = "socialweb-backup.json"
	ClusterEntry   = "cluster.json"
	DatastoreEntry = "state.db"
	PKIPrefix      = "pki/"
	SumsEntry      = "sha256sums.json"
)

// Header is the first entry: what the file is and where it came from.
type Header struct {
	Format  string    `json:"format"`
	Version int       `json:"version"`
	Cluster string    `json:"cluster"`
	Created time.Time `json:"created"`
	// Host is the hostname the backup was taken on, for the operator's eyes.
	Host string `json:"host,omitempty"`
	// Datastore is the kind the tenant used ("sqlite" or "postgres"); the
	// archive holds a sqlite file either way.
	Datastore string `json:"datastore"`
	// Server and ServerName are the address and TLS server name the
	// tenant's admin kubeconfig named: a restore compares them with its own
	// to tell clients what to change.
	Server     string `json:"server,omitempty"`
	ServerName string `json:"serverName,omitempty"`
	// Rows is the number of rows in the datastore copy (kine keeps history,
	// so more than the objects).
	Rows int64 `json:"rows"`
}

// Archive is a backup's content besides its files on disk.
type Archive struct {
	Header Header
	// Cluster is the Cluster object's JSON (name and spec, no status).
	Cluster json.RawMessage
}

// Error kinds a reader tells apart; each error wraps one.
var (
	ErrNotBackup = errors.New("not a socialweb backup")
	ErrVersion   = errors.New("unsupported backup version")
	ErrTruncated = errors.New("backup is truncated")
	ErrCorrupt   = errors.New("backup is corrupt")
)

// Write writes an archive of a, the datastore file db and every regular file
// in pkiDir to w.
func Write(w io.Writer, a Archive, db, pkiDir string) error {
	a.Header.Format, a.Header.Version = Format, Version
	hdr, err := json.MarshalIndent(a.Header, "", "  ")
	if err != nil {
		return err
	}
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	sums := map[string]string{}
	add := func(name string, r io.Reader, size int64) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: size, ModTime: a.Header.Created, Typeflag: tar.TypeReg}); err != nil {
			return fmt.Errorf("writing %s into the backup: %w", name, err)
		}
		h := sha256.New()
		n, err := io.Copy(io.MultiWriter(tw, h), r)
		if err != nil {
			return fmt.Errorf("writing %s into the backup: %w", name, err)
		}
		if n != size {
			return fmt.Errorf("writing %s into the backup: %d bytes, want %d (did it change while being read?)", name, n, size)
		}
		sums[name] = hex.EncodeToString(h.Sum(nil))
		return nil
	}
	addBytes := func(name string, b []byte) error { return add(name, strings.NewReader(string(b)), int64(len(b))) }
	addFile := func(name, p string) error {
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		return add(name, f, st.Size())
	}
	if err := addBytes(HeaderEntry, hdr); err != nil {
		return err
	}
	if err := addBytes(ClusterEntry, a.Cluster); err != nil {
		return err
	}
	if err := addFile(DatastoreEntry, db); err != nil {
		return err
	}
	entries, err := os.ReadDir(pkiDir)
	if err != nil {
		return fmt.Errorf("reading the PKI: %w", err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".") {
			continue // atomicfile's temporaries
		}
		if err := addFile(PKIPrefix+e.Name(), filepath.Join(pkiDir, e.Name())); err != nil {
			return err
		}
	}
	sumsJSON, err := json.MarshalIndent(sums, "", "  ")
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: SumsEntry, Mode: 0o600, Size: int64(len(sumsJSON)), ModTime: a.Header.Created, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(sumsJSON); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

// Read checks the archive from r and writes its datastore and PKI under dir
// (which must exist) as a cluster directory keeps them: state.db and pki/,
// keys 0600. On error dir may hold part of them; the caller removes it.
func Read(r io.Reader, dir string) (Archive, error) {
	var a Archive
	gz, err := gzip.NewReader(r)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return a, fmt.Errorf("%w: the file is empty or cut short", ErrNotBackup)
		}
		return a, fmt.Errorf("%w: it is not gzip (%v); `socialweb cluster backup` writes one", ErrNotBackup, err)
	}
	tr := tar.NewReader(gz)
	sums := map[string]string{}
	var wantSums map[string]string
	first := true
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return a, readErr(err, first)
		}
		if wantSums != nil {
			return a, fmt.Errorf("%w: entry %q after the checksums", ErrCorrupt, h.Name)
		}
		if first && h.Name != HeaderEntry {
			return a, fmt.Errorf("%w: its first entry is %q, not %s", ErrNotBackup, h.Name, HeaderEntry)
		}
		if h.Typeflag != tar.TypeReg {
			return a, fmt.Errorf("%w: entry %q is not a regular file", ErrCorrupt, h.Name)
		}
		if _, dup := sums[h.Name]; dup {
			return a, fmt.Errorf("%w: entry %q twice", ErrCorrupt, h.Name)
		}
		hash := sha256.New()
		body := io.TeeReader(tr, hash)
		switch name := h.Name; {
		case name == HeaderEntry:
			if err := readJSON(body, &a.Header, 1<<20); err != nil {
				return a, fmt.Errorf("%w: reading its header: %v", errKind(err, ErrNotBackup), err)
			}
			if a.Header.Format != Format {
				return a, fmt.Errorf("%w: its header names format %q", ErrNotBackup, a.Header.Format)
			}
			if a.Header.Version != Version {
				return a, fmt.Errorf("%w: the file is version %d, this socialweb reads version %d; restore it with the socialweb build that wrote it, or a newer one", ErrVersion, a.Header.Version, Version)
			}
		case name == ClusterEntry:
			b, err := readAll(body, 1<<20)
			if err != nil {
				return a, fmt.Errorf("%w: reading %s: %v", errKind(err, ErrCorrupt), name, err)
			}
			a.Cluster = b
		case name == SumsEntry:
			if err := readJSON(tr, &wantSums, 1<<20); err != nil {
				return a, fmt.Errorf("%w: reading the checksums: %v", errKind(err, ErrCorrupt), err)
			}
			continue
		case name == DatastoreEntry || isPKIName(name):
			if err := writeEntry(filepath.Join(dir, filepath.FromSlash(name)), body); err != nil {
				return a, err
			}
		default:
			return a, fmt.Errorf("%w: unexpected entry %q", ErrCorrupt, h.Name)
		}
		// Whatever the entry's reader left unread counts too.
		if _, err := io.Copy(io.Discard, body); err != nil {
			return a, readErr(err, false)
		}
		sums[h.Name] = hex.EncodeToString(hash.Sum(nil))
		first = false
	}
	if first {
		return a, fmt.Errorf("%w: the archive is empty", ErrNotBackup)
	}
	// The tar ends before the gzip stream does: read that to its checksum too.
	if _, err := io.Copy(io.Discard, gz); err != nil {
		return a, readErr(err, false)
	}
	if wantSums == nil {
		return a, fmt.Errorf("%w: it ends before its checksums (%d entries read); the copy was cut short, take or copy it again", ErrTruncated, len(sums))
	}
	if err := compareSums(sums, wantSums); err != nil {
		return a, err
	}
	var missing []string
	for _, n := range append([]string{ClusterEntry, DatastoreEntry}, prefixed(RequiredPKI())...) {
		if _, ok := sums[n]; !ok {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return a, fmt.Errorf("%w: it lacks %s", ErrCorrupt, strings.Join(missing, ", "))
	}
	return a, nil
}

// compareSums checks every entry read against the checksums the writer recorded.
func compareSums(got, want map[string]string) error {
	var bad []string
	for n, s := range want {
		if g, ok := got[n]; !ok {
			bad = append(bad, n+" (missing)")
		} else if g != s {
			bad = append(bad, n+" (checksum differs)")
		}
	}
	for n := range got {
		if _, ok := want[n]; !ok {
			bad = append(bad, n+" (not in the checksums)")
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return fmt.Errorf("%w: %s; the file was altered or damaged after it was written, use another copy", ErrCorrupt, strings.Join(bad, ", "))
	}
	return nil
}

func prefixed(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = PKIPrefix + n
	}
	return out
}

// isPKIName accepts pki/NAME with a plain file name: no path can leave dir.
func isPKIName(name string) bool {
	base, ok := strings.CutPrefix(name, PKIPrefix)
	return ok && base != "" && base == path.Base(base) && !strings.HasPrefix(base, ".") && !strings.ContainsAny(base, `/\`)
}

// writeEntry writes a file at a mode that fits it: certificates and public
// keys 0644, the rest (keys, the datastore) 0600.
func writeEntry(p string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	mode := os.FileMode(0o600)
	if ext := filepath.Ext(p); ext == ".crt" || ext == ".pub" {
		mode = 0o644
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("restoring %s: %w", p, err)
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return readErr(err, false)
	}
	return f.Close()
}

func readAll(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return b, nil
}

func readJSON(r io.Reader, v any, limit int64) error {
	b, err := readAll(r, limit)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// readErr names a read error: a cut-short stream is truncation; anything else
// in the first entry means it is not a backup at all.
func readErr(err error, first bool) error {
	if first {
		return fmt.Errorf("%w: its start is no archive entry (%v)", ErrNotBackup, err)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: it ends in the middle of an entry; the copy was cut short, take or copy it again", ErrTruncated)
	}
	return fmt.Errorf("%w: %v", ErrCorrupt, err)
}

// errKind is ErrTruncated for a cut-short read, else def.
func errKind(err, def error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return ErrTruncated
	}
	return def
}

// RequiredPKI are the files without which old credentials would not work:
// the CAs that signed the serving and client certificates, and the key
// service-account tokens are signed with.
func RequiredPKI() []string {
	return []string{"server-ca.crt", "server-ca.key", "client-ca.crt", "client-ca.key", "sa.key", "sa.pub"}
}
