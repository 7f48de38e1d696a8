package backup

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// StagingDir is where restores are unpacked inside a daemon's state dir:
// on the same filesystem as the clusters, so adopting one is a rename.
func StagingDir(stateDir string) string { return filepath.Join(stateDir, "restore") }

// StagedDir is the directory a restore named token was unpacked in; a token
// that could name anything else is refused, since it comes from an
// annotation anyone with the management API may write.
func StagedDir(stateDir, token string) (string, error) {
	digits, ok := strings.CutPrefix(token, "r-") // what os.MkdirTemp makes of "r-"
	if !ok || digits == "" || strings.Trim(digits, "0123456789") != "" {
		return "", fmt.Errorf("restore token %q is not one `socialweb cluster restore` makes", token)
	}
	return filepath.Join(StagingDir(stateDir), token), nil
}

// Source is where a tenant's data is: its cluster directory (the PKI, and
// the sqlite datastore in its run dir), and for a postgres tenant its kine endpoint.
type Source struct {
	ClusterDir string
	// Postgres is the tenant's own postgres URL; "" for a sqlite tenant.
	Postgres string
}

// Take writes a backup of src to w: a copy of its datastore (made in
// tmpDir, removed after) and its PKI. a.Header's Rows is filled in.
func Take(ctx context.Context, w io.Writer, src Source, tmpDir string, a Archive) (Header, error) {
	tmp, err := os.MkdirTemp(tmpDir, ".socialweb-backup-")
	if err != nil {
		return a.Header, fmt.Errorf("making room for the datastore copy: %w", err)
	}
	defer os.RemoveAll(tmp)
	db := filepath.Join(tmp, DatastoreEntry)
	var rows int64
	if src.Postgres != "" {
		rows, err = DumpPostgres(ctx, src.Postgres, db)
	} else {
		from, owner, derr := datastoreOf(src.ClusterDir)
		if derr != nil {
			return a.Header, derr
		}
		if _, err := os.Lstat(from); err != nil {
			return a.Header, fmt.Errorf("the datastore of %s: %w (is the cluster provisioned? `socialweb cluster get %s` says)", a.Header.Cluster, err, a.Header.Cluster)
		}
		if owner.Root() {
			rows, err = CopyDatastore(ctx, from, db)
		} else {
			rows, err = CopyDatastoreAs(ctx, owner, from, src.ClusterDir, db)
		}
	}
	if err != nil {
		return a.Header, err
	}
	a.Header.Rows = rows
	if err := Write(w, a, db, filepath.Join(src.ClusterDir, "pki")); err != nil {
		return a.Header, err
	}
	return a.Header, nil
}

// Stage unpacks the backup from r into a new directory under root, laid out
// as a cluster directory, and checks it whole: the archive's checksums, the
// datastore, every CA with its key. It returns the archive and the
// directory; on error it leaves nothing.
func Stage(ctx context.Context, r io.Reader, root string) (Archive, string, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return Archive{}, "", fmt.Errorf("making the restore staging dir: %w", err)
	}
	dir, err := os.MkdirTemp(root, "r-")
	if err != nil {
		return Archive{}, "", fmt.Errorf("making the restore staging dir: %w", err)
	}
	a, err := stage(ctx, r, dir)
	if err != nil {
		os.RemoveAll(dir)
		return a, "", err
	}
	return a, dir, nil
}

func stage(ctx context.Context, r io.Reader, dir string) (Archive, error) {
	a, err := Read(r, dir)
	if err != nil {
		return a, err
	}
	if _, err := CheckDatastore(ctx, filepath.Join(dir, DatastoreEntry)); err != nil {
		return a, err
	}
	if err := checkPKI(filepath.Join(dir, "pki"), time.Now()); err != nil {
		return a, err
	}
	return a, nil
}

// checkPKI checks that each CA's certificate and key belong together and are
// current, and that the service-account key pair does.
func checkPKI(dir string, now time.Time) error {
	for _, ca := range []string{"server-ca", "client-ca"} {
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, ca+".crt"), filepath.Join(dir, ca+".key"))
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrCorrupt, ca, err)
		}
		cert, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrCorrupt, ca, err)
		}
		if !cert.IsCA {
			return fmt.Errorf("%w: %s.crt is not a CA certificate", ErrCorrupt, ca)
		}
		if now.After(cert.NotAfter) {
			return fmt.Errorf("the backup's %s expired at %s: no credential it signed is accepted any more; create a new cluster instead", ca, cert.NotAfter.UTC().Format(time.RFC3339))
		}
	}
	key, err := readPEM(filepath.Join(dir, "sa.key"), "PRIVATE KEY")
	if err != nil {
		return err
	}
	pub, err := readPEM(filepath.Join(dir, "sa.pub"), "PUBLIC KEY")
	if err != nil {
		return err
	}
	k, err := x509.ParsePKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("%w: sa.key: %v", ErrCorrupt, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return fmt.Errorf("%w: sa.key holds no signing key", ErrCorrupt)
	}
	want, err := x509.MarshalPKIXPublicKey(signer.Public())
	if err != nil {
		return fmt.Errorf("%w: sa.key: %v", ErrCorrupt, err)
	}
	if !bytes.Equal(want, pub) {
		return fmt.Errorf("%w: sa.pub is not sa.key's public key", ErrCorrupt)
	}
	return nil
}

func readPEM(p, typ string) ([]byte, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != typ {
		return nil, fmt.Errorf("%w: %s is not a PEM %s", ErrCorrupt, filepath.Base(p), typ)
	}
	return blk.Bytes, nil
}

// Adopt moves a staged restore into place as the cluster directory
// clusterDir, which must not exist: a rename, so a cluster sees either no
// directory or the whole restored one.
func Adopt(staged, clusterDir string) error {
	if _, err := os.Stat(clusterDir); err == nil {
		return fmt.Errorf("restoring into %s: it exists already", clusterDir)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(clusterDir), 0o700); err != nil {
		return err
	}
	if err := os.Rename(staged, clusterDir); err != nil {
		return fmt.Errorf("restoring into %s: %w", clusterDir, err)
	}
	return nil
}
