package backup

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/pki"
)

// fakeCluster makes a cluster directory as a provisioned tenant has one: a
// kine table in state.db (WAL, as kine opens it) and a real PKI.
func fakeCluster(t *testing.T, rows int) string {
	t.Helper()
	dir := t.TempDir()
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, DatastoreEntry)+"?_journal_mode=WAL")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE kine (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, value BLOB)`); err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		if _, err := db.Exec(`INSERT INTO kine (name, value) VALUES (?, ?)`, fmt.Sprintf("/registry/configmaps/default/cm-%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pki.Ensure(filepath.Join(dir, "pki"), pki.Options{Clients: []pki.Identity{pki.Admin}, FrontProxy: true}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func take(t *testing.T, clusterDir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	a := Archive{Header: Header{Cluster: "ci", Created: time.Unix(1700000000, 0).UTC(), Datastore: "sqlite"}, Cluster: json.RawMessage(`{"metadata":{"name":"ci"}}`)}
	if _, err := Take(context.Background(), &buf, Source{ClusterDir: clusterDir}, t.TempDir(), a); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	src := fakeCluster(t, 25)
	b := take(t, src)
	root := filepath.Join(t.TempDir(), "restore")
	a, dir, err := Stage(context.Background(), bytes.NewReader(b), root)
	if err != nil {
		t.Fatal(err)
	}
	if a.Header.Format != Format || a.Header.Version != Version || a.Header.Cluster != "ci" || a.Header.Rows != 25 || string(a.Cluster) != `{"metadata":{"name":"ci"}}` {
		t.Errorf("archive %+v %s", a.Header, a.Cluster)
	}
	if rows, err := CheckDatastore(context.Background(), filepath.Join(dir, DatastoreEntry)); err != nil || rows != 25 {
		t.Errorf("restored datastore: %d rows, %v; want 25", rows, err)
	}
	entries, _ := os.ReadDir(filepath.Join(src, "pki"))
	for _, e := range entries {
		want, _ := os.ReadFile(filepath.Join(src, "pki", e.Name()))
		p := filepath.Join(dir, "pki", e.Name())
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("pki/%s differs after the round trip (%v)", e.Name(), err)
		}
		st, _ := os.Stat(p)
		wantMode := os.FileMode(0o600)
		if strings.HasSuffix(e.Name(), ".crt") || strings.HasSuffix(e.Name(), ".pub") {
			wantMode = 0o644
		}
		if st.Mode().Perm() != wantMode {
			t.Errorf("pki/%s mode %o, want %o", e.Name(), st.Mode().Perm(), wantMode)
		}
	}
	// The same PKI: Ensure on the restored dir keeps every CA and key.
	if _, err := pki.Ensure(filepath.Join(dir, "pki"), pki.Options{Clients: []pki.Identity{pki.Admin}, FrontProxy: true}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"server-ca.key", "client-ca.key", "sa.key", "front-proxy-ca.key"} {
		a, _ := os.ReadFile(filepath.Join(src, "pki", f))
		b, _ := os.ReadFile(filepath.Join(dir, "pki", f))
		if !bytes.Equal(a, b) {
			t.Errorf("pki.Ensure replaced the restored %s", f)
		}
	}
	clusterDir := filepath.Join(t.TempDir(), "clusters", "ci")
	if err := Adopt(dir, clusterDir); err != nil {
		t.Fatal(err)
	}
	if err := Adopt(dir, clusterDir); err == nil {
		t.Error("adopting over an existing cluster dir succeeded")
	}
}

// TestCopyWhileWriting: the copy is one instant of a database being written.
func TestCopyWhileWriting(t *testing.T) {
	src := fakeCluster(t, 1)
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(src, DatastoreEntry)+"?_journal_mode=WAL&_busy_timeout=30000")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := db.Exec(`INSERT INTO kine (name, value) VALUES (?, ?)`, fmt.Sprintf("k%d", i), bytes.Repeat([]byte("x"), 512)); err != nil {
				t.Error(err)
				return
			}
		}
	})
	for i := range 5 {
		rows, err := CopyDatastore(context.Background(), filepath.Join(src, DatastoreEntry), filepath.Join(t.TempDir(), fmt.Sprint(i)))
		if err != nil || rows < 1 {
			t.Errorf("copy %d: %d rows, %v", i, rows, err)
		}
	}
	close(stop)
	wg.Wait()
}

// rewrite decompresses a backup, lets edit change its tar entries, and packs it again.
func rewrite(t *testing.T, b []byte, edit func(name string, body []byte) (string, []byte, bool)) []byte {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var out bytes.Buffer
	gw := gzip.NewWriter(&out)
	tw := tar.NewWriter(gw)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		name, body, keep := edit(h.Name, body)
		if !keep {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write(body)
	}
	tw.Close()
	gw.Close()
	return out.Bytes()
}

func gz(b []byte) []byte {
	var out bytes.Buffer
	w := gzip.NewWriter(&out)
	_, _ = w.Write(b)
	w.Close()
	return out.Bytes()
}

func TestBadInputIsRefusedAndLeavesNothing(t *testing.T) {
	good := take(t, fakeCluster(t, 3))
	keep := func(n string, b []byte) (string, []byte, bool) { return n, b, true }
	header := func(mut func(*Header)) []byte {
		return rewrite(t, good, func(n string, b []byte) (string, []byte, bool) {
			if n == HeaderEntry {
				var h Header
				_ = json.Unmarshal(b, &h)
				mut(&h)
				b, _ = json.Marshal(h)
			}
			return n, b, true
		})
	}
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 0xff
	tests := []struct {
		name string
		data []byte
		want error
		say  string
	}{
		{"empty file", nil, ErrNotBackup, "empty or cut short"},
		{"text file", []byte("hello, this is not a backup\n"), ErrNotBackup, "not gzip"},
		{"gzip of text", gz([]byte("plain text inside")), ErrNotBackup, ""},
		{"other tar", rewrite(t, good, func(n string, b []byte) (string, []byte, bool) { return "x/" + n, b, true }), ErrNotBackup, "first entry"},
		{"other format", header(func(h *Header) { h.Format = "velero" }), ErrNotBackup, "velero"},
		{"newer version", header(func(h *Header) { h.Version = 2 }), ErrVersion, "version 2"},
		{"cut in half", good[:len(good)/2], ErrTruncated, "cut short"},
		{"last bytes missing", good[:len(good)-10], ErrTruncated, ""},
		{"no checksums", rewrite(t, good, func(n string, b []byte) (string, []byte, bool) { return n, b, n != SumsEntry }), ErrTruncated, "before its checksums"},
		{"tampered datastore", rewrite(t, good, func(n string, b []byte) (string, []byte, bool) {
			if n == DatastoreEntry {
				b = bytes.Clone(b)
				b[len(b)-1] ^= 1
			}
			return n, b, true
		}), ErrCorrupt, "state.db (checksum differs)"},
		{"tampered key", rewrite(t, good, func(n string, b []byte) (string, []byte, bool) {
			if n == PKIPrefix+"client-ca.key" {
				b = append(bytes.Clone(b), '\n')
			}
			return n, b, true
		}), ErrCorrupt, "pki/client-ca.key (checksum differs)"},
		{"flipped byte in the file", flipped, ErrCorrupt, ""},
		{"entry leaving the dir", rewrite(t, good, func(n string, b []byte) (string, []byte, bool) {
			if n == PKIPrefix+"admin.crt" {
				n = PKIPrefix + "../../evil"
			}
			return n, b, true
		}), ErrCorrupt, "unexpected entry"},
		{"unexpected entry", rewrite(t, good, func(n string, b []byte) (string, []byte, bool) {
			if n == ClusterEntry {
				n = "etc/passwd"
			}
			return n, b, true
		}), ErrCorrupt, "unexpected entry"},
		{"untouched copy", rewrite(t, good, keep), nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "restore")
			_, dir, err := Stage(context.Background(), bytes.NewReader(tt.data), root)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Stage: %v", err)
				}
				os.RemoveAll(dir)
			} else if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.say) {
				t.Fatalf("Stage: %v; want %v saying %q", err, tt.want, tt.say)
			}
			if left, _ := os.ReadDir(root); len(left) != 0 {
				t.Errorf("left %v in the staging dir", left)
			}
		})
	}
}

func TestMissingPKIFileIsRefused(t *testing.T) {
	src := fakeCluster(t, 1)
	if err := os.Remove(filepath.Join(src, "pki", "sa.key")); err != nil {
		t.Fatal(err)
	}
	b := take(t, src)
	_, _, err := Stage(context.Background(), bytes.NewReader(b), t.TempDir())
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "pki/sa.key") {
		t.Fatalf("Stage: %v; want ErrCorrupt naming pki/sa.key", err)
	}
}

func TestStagedDir(t *testing.T) {
	for _, tc := range []struct {
		token string
		ok    bool
	}{
		{"r-123456", true},
		{"r-", false},
		{"../clusters/b", false},
		{"r-1/../../x", false},
		{"x-1", false},
	} {
		p, err := StagedDir("/var/lib/socialweb", tc.token)
		if (err == nil) != tc.ok {
			t.Errorf("StagedDir(%q) = %q, %v; ok=%v", tc.token, p, err, tc.ok)
		}
		if tc.ok && p != "/var/lib/socialweb/restore/"+tc.token {
			t.Errorf("StagedDir(%q) = %q", tc.token, p)
		}
	}
}

func TestTakeWithoutDatastoreSaysWhy(t *testing.T) {
	dir := t.TempDir()
	_, err := Take(context.Background(), io.Discard, Source{ClusterDir: dir}, t.TempDir(), Archive{Header: Header{Cluster: "ci"}})
	if err == nil || !strings.Contains(err.Error(), "provisioned") {
		t.Fatalf("Take of an empty dir: %v", err)
	}
}
