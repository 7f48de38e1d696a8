package buildcache

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCredentials(t *testing.T) {
	k1 := []byte("host key one, thirty-two bytes..")
	k2 := []byte("host key two, thirty-two bytes..")
	ak, sk := Credentials(k1, "ci", "uid-1")
	if ak != "sw-ci" || len(sk) != 64 {
		t.Errorf("Credentials = %q, %q; want sw-ci and 64 hex characters", ak, sk)
	}
	tests := []struct {
		name    string
		key     []byte
		cluster string
		uid     string
		same    bool
	}{
		{"same key and cluster", k1, "ci", "uid-1", true},
		{"another cluster", k1, "cj", "uid-1", false},
		{"the cluster made again", k1, "ci", "uid-2", false},
		{"another host key", k2, "ci", "uid-1", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, s := Credentials(tt.key, tt.cluster, tt.uid)
			if (s == sk) != tt.same {
				t.Errorf("secret %s against %s: same %v, want %v", s, sk, s == sk, tt.same)
			}
		})
	}
}

func TestLoadOrCreateKey(t *testing.T) {
	tests := []struct {
		name    string
		content []byte // nil: no file
		mode    os.FileMode
		wantErr string
	}{
		{"missing: made", nil, 0, ""},
		{"existing 0600", bytes.Repeat([]byte{7}, 32), 0o600, ""},
		{"existing 0400", bytes.Repeat([]byte{7}, 40), 0o400, ""},
		{"readable by others", bytes.Repeat([]byte{7}, 32), 0o644, "chmod 600"},
		{"readable by group", bytes.Repeat([]byte{7}, 32), 0o640, "chmod 600"},
		{"too short", []byte("short"), 0o600, "at least 32"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "buildcache.key")
			if tt.content != nil {
				if err := os.WriteFile(path, tt.content, tt.mode); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(path, tt.mode); err != nil { // past the umask
					t.Fatal(err)
				}
			}
			key, err := LoadOrCreateKey(path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want one saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.content != nil && !bytes.Equal(key, tt.content) {
				t.Errorf("key %x, want the file's %x", key, tt.content)
			}
			if len(key) < KeySize {
				t.Errorf("key of %d bytes", len(key))
			}
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if tt.content == nil && st.Mode().Perm() != 0o600 {
				t.Errorf("made with mode %o, want 600", st.Mode().Perm())
			}
			again, err := LoadOrCreateKey(path)
			if err != nil || !bytes.Equal(again, key) {
				t.Errorf("second load: %x, %v; want the same key", again, err)
			}
			if left, _ := os.ReadDir(filepath.Dir(path)); len(left) != 1 {
				t.Errorf("files left: %v", left)
			}
		})
	}
}

func TestAccessSecretRoundTrip(t *testing.T) {
	a := Access{Endpoint: "10.250.1.1:5001", Bucket: "sw-ci", AccessKey: "sw-ci", SecretKey: "00ff"}
	tests := []struct {
		name string
		data map[string][]byte
		want string // error, "" for a.
	}{
		{"whole", a.SecretData(), ""},
		{"no secret key", func() map[string][]byte { d := a.SecretData(); delete(d, "secretKey"); return d }(), "got only 3 of them filled"},
		{"empty", nil, "got only 0 of them filled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := AccessFromSecret(tt.data)
			switch {
			case tt.want == "" && (err != nil || got != a):
				t.Errorf("AccessFromSecret = %+v, %v; want %+v", got, err, a)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("AccessFromSecret = %v, want an error saying %q", err, tt.want)
			}
		})
	}
}
