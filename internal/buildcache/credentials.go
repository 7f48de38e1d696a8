package buildcache

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// KeySize is the size of a key LoadOrCreateKey makes, and the least it accepts.
const KeySize = 32

// Credentials are the access key and secret of cluster in its incarnation uid (its
// object's UID), derived from the host's key so that the daemon finds the same pair
// after a restart without storing one per cluster. Knowing one cluster's secret tells
// nothing of another's, and a cluster deleted and made again under its name gets a new
// secret: a runner configuration written for the old one opens nothing.
func Credentials(key []byte, cluster, uid string) (accessKey, secret string) {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("buildcache/" + cluster + "/" + uid))
	return "sw-" + cluster, hex.EncodeToString(mac.Sum(nil))
}

// LoadOrCreateKey reads the host's build cache key from path, making a random one (mode
// 0600) if there is none. A key file that group or others may read or write is refused:
// every cluster's secret follows from it.
func LoadOrCreateKey(path string) ([]byte, error) {
	key, err := loadKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	if err := createKey(path); err != nil {
		return nil, err
	}
	return loadKey(path)
}

func loadKey(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("build cache key: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("build cache key: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("build cache key %s is not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("build cache key %s has mode %04o, open to group or others, and every cluster's cache secret follows from it: chmod 600 %s", path, perm, path)
	}
	key, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return nil, fmt.Errorf("build cache key %s: %w", path, err)
	}
	if len(key) < KeySize {
		return nil, fmt.Errorf("build cache key %s is %d bytes; at least %d are needed (delete it to have a new one made)", path, len(key), KeySize)
	}
	return key, nil
}

// createKey writes a new key to path unless one appeared meanwhile: it is written whole
// to a temporary file, then linked into place, which fails rather than replace a key
// another process made first.
func createKey(path string) error {
	key := make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("build cache key: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*") // 0600
	if err != nil {
		return fmt.Errorf("build cache key: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(key); err != nil {
		tmp.Close()
		return fmt.Errorf("build cache key: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("build cache key: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("build cache key: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("build cache key: %w", err)
	}
	return nil
}
