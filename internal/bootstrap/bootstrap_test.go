package bootstrap

import (
	"bytes"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, KeySize) }

func TestSealOpen(t *testing.T) {
	key, plain := testKey(1), []byte("-----BEGIN EC PRIVATE KEY-----\nserver CA\n")
	sealed, err := Seal(key, "server-ca.key", plain)
	if err != nil {
		t.Fatal(err)
	}
	if sealed[0] != 1 || len(sealed) != 1+12+len(plain)+16 {
		t.Fatalf("sealed blob is %d bytes, version %d: want 1 + 12 + %d + 16, version 1", len(sealed), sealed[0], len(plain))
	}
	again, _ := Seal(key, "server-ca.key", plain)
	if bytes.Equal(sealed, again) {
		t.Error("two seals of the same data are equal: the nonce is not random")
	}
	with := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(sealed)) }
	tests := []struct {
		name    string
		key     []byte
		entry   string
		sealed  []byte
		wantErr error  // nil: must open to plain
		wantMsg string // a substring the error must hold
	}{
		{"round trip", key, "server-ca.key", sealed, nil, ""},
		{"wrong key", testKey(2), "server-ca.key", sealed, ErrWrongKey, `"server-ca.key"`},
		{"wrong name", key, "client-ca.key", sealed, ErrWrongKey, `"client-ca.key"`},
		{"truncated", key, "server-ca.key", sealed[:20], ErrWrongKey, "too short"},
		{"empty", key, "server-ca.key", nil, ErrWrongKey, "too short"},
		{"flipped ciphertext byte", key, "server-ca.key", with(func(b []byte) []byte { b[20] ^= 1; return b }), ErrWrongKey, ""},
		{"flipped nonce byte", key, "server-ca.key", with(func(b []byte) []byte { b[3] ^= 0x80; return b }), ErrWrongKey, ""},
		{"flipped tag byte", key, "server-ca.key", with(func(b []byte) []byte { b[len(b)-1] ^= 1; return b }), ErrWrongKey, ""},
		{"unknown version", key, "server-ca.key", with(func(b []byte) []byte { b[0] = 2; return b }), nil, "format version 2"},
		{"short key", key[:16], "server-ca.key", sealed, nil, "cluster key is 16 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Open(tt.key, tt.entry, tt.sealed)
			if tt.wantErr == nil && tt.wantMsg == "" {
				if err != nil || !bytes.Equal(got, plain) {
					t.Fatalf("Open = %q, %v; want %q", got, err, plain)
				}
				return
			}
			if err == nil {
				t.Fatalf("Open succeeded (%q); want an error", got)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("error %q does not wrap %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not say %q", err, tt.wantMsg)
			}
		})
	}
}

func TestLoadOrCreateKey(t *testing.T) {
	valid := hex.EncodeToString(testKey(7))
	tests := []struct {
		name    string
		content string // "": no file
		mode    os.FileMode
		create  bool
		want    []byte // nil: a new random key
		wantMsg string // "": success
	}{
		{"creates when missing", "", 0, true, nil, ""},
		{"reads with newline", valid + "\n", 0o600, false, testKey(7), ""},
		{"reads without newline", valid, 0o400, false, testKey(7), ""},
		{"missing and create false", "", 0, false, nil, "copy the key file of the service's first host here"},
		{"group readable", valid + "\n", 0o640, false, nil, "chmod 600"},
		{"world readable", valid + "\n", 0o644, false, nil, "chmod 600"},
		{"not hex", strings.Repeat("zz", KeySize) + "\n", 0o600, false, nil, "want 64 hex characters"},
		{"too short", valid[:62] + "\n", 0o600, false, nil, "want 64 hex characters"},
		{"too long", valid + "00\n", 0o600, false, nil, "want 64 hex characters"},
		{"two newlines", valid + "\n\n", 0o600, false, nil, "want 64 hex characters"},
		{"empty", "\n", 0o600, false, nil, "want 64 hex characters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state", "cluster.key")
			if tt.content != "" {
				if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(path, tt.mode); err != nil {
					t.Fatal(err)
				}
			}
			key, err := LoadOrCreateKey(path, tt.create)
			if tt.wantMsg != "" {
				if err == nil {
					t.Fatalf("LoadOrCreateKey succeeded; want an error saying %q", tt.wantMsg)
				}
				for _, want := range []string{tt.wantMsg, path} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
				if strings.Contains(err.Error(), valid[:16]) {
					t.Errorf("error %q echoes the key file's content", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(key) != KeySize || (tt.want != nil && !bytes.Equal(key, tt.want)) {
				t.Fatalf("key = %x; want %d bytes %x", key, KeySize, tt.want)
			}
			if tt.content != "" {
				return
			}
			// A new key: 0600 file of 64 hex chars + newline in a 0700 directory, read back the same.
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o600 {
				t.Errorf("key file mode %04o; want 0600", st.Mode().Perm())
			}
			if dst, _ := os.Stat(filepath.Dir(path)); dst.Mode().Perm() != 0o700 {
				t.Errorf("key directory mode %04o; want 0700", dst.Mode().Perm())
			}
			data, _ := os.ReadFile(path)
			if string(data) != hex.EncodeToString(key)+"\n" {
				t.Errorf("key file holds %q; want %q", data, hex.EncodeToString(key)+"\n")
			}
			again, err := LoadOrCreateKey(path, true)
			if err != nil || !bytes.Equal(again, key) {
				t.Errorf("reading the new key back = %x, %v; want %x", again, err, key)
			}
			if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
				t.Errorf("directory holds %d files after creating the key; want 1 (no temp file left)", len(entries))
			}
		})
	}
}
