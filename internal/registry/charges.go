package registry

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Charges: what each cluster brought into the cache, which its quota
// (Server.ClusterQuota, serve --image-cluster-quota) counts.
//
//	<Dir>/charges/<cluster>/<hex>    blob sha256:<hex> was stored because of cluster
//
// A blob is charged to the cluster whose request stored it: a fetch from upstream its
// node started (a shared image pulled anonymously, or its own with credentials), or a
// push for it alone (`image push --cluster`). Only the process that put the blob in
// place charges (commitPath), so a blob has one charge. A blob already stored costs a
// cluster nothing, and a blob another cluster brought in stays charged to that one
// while this one uses it: the charge goes when the blob leaves the store (GC), or
// with its cluster (ForgetCluster), never to whoever uses it next. Pushes host-wide,
// and blobs whose cluster was deleted, are charged to nobody.
//
// The charges are files beside the blobs, like every other record here, so they
// survive a restart and several processes (the daemon, `image push --cluster`, `image
// gc`) keep them together.
const chargesDir = "charges"

func (s *store) chargePath(cluster, digest string) string {
	return filepath.Join(s.dir, chargesDir, cluster, strings.TrimPrefix(digest, "sha256:"))
}

// charge records that cluster brought blob digest into the store. A failure is logged,
// not returned: the blob is stored by then, and the cost is only an undercount.
func (s *store) charge(cluster, digest string) {
	if cluster == "" {
		return
	}
	if strings.ContainsAny(cluster, "/.") {
		s.log.Warn("not charging a blob to a name that is not a cluster's", "cluster", cluster, "digest", digest)
		return
	}
	p := s.chargePath(cluster, digest)
	err := os.MkdirAll(filepath.Dir(p), 0o755)
	if err == nil {
		err = os.WriteFile(p, nil, 0o644)
	}
	if err != nil {
		s.log.Warn("recording which cluster brought a blob in; its quota will not count it", "cluster", cluster, "digest", digest, "err", err)
	}
}

// charged is the bytes of the blobs in the store charged to cluster.
func (s *store) charged(cluster string) (int64, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, chargesDir, cluster))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	} else if err != nil {
		return 0, fmt.Errorf("reading cluster %s's charges: %w", cluster, err)
	}
	var total int64
	for _, e := range ents {
		if st, err := os.Stat(s.blobPath("sha256:" + e.Name())); err == nil {
			total += st.Size()
		}
	}
	return total, nil
}

// charges is every charge: the digests charged to each cluster (whether or not the
// blob is still there).
func (s *store) charges() (map[string]map[string]bool, error) {
	root := filepath.Join(s.dir, chargesDir)
	clusters, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("reading the clusters' charges: %w", err)
	}
	out := map[string]map[string]bool{}
	for _, c := range clusters {
		if !c.IsDir() {
			continue
		}
		ents, err := os.ReadDir(filepath.Join(root, c.Name()))
		if err != nil {
			return nil, fmt.Errorf("reading cluster %s's charges: %w", c.Name(), err)
		}
		ds := map[string]bool{}
		for _, e := range ents {
			if d := "sha256:" + e.Name(); checkDigest(d) == nil {
				ds[d] = true
			}
		}
		out[c.Name()] = ds
	}
	return out, nil
}

// chargeExisting charges, once, the blobs stored before charges were kept: each
// blob a cluster's own images reference to that cluster (the first by name when two
// do), as the quota counted them then. Which cluster brought a shared image in was
// not recorded, so its blobs are charged to nobody. The charges are built aside and
// renamed into place, so a process sees all of them or none.
func (s *store) chargeExisting() error {
	root := filepath.Join(s.dir, chargesDir)
	if _, err := os.Stat(root); err == nil {
		return nil
	}
	tmp, err := os.MkdirTemp(s.uploadsDir(), "charges-")
	if err != nil {
		return fmt.Errorf("charging the images stored before charges were kept: %w", err)
	}
	defer os.RemoveAll(tmp)
	repos, err := s.catalog()
	if err != nil {
		return fmt.Errorf("charging the images stored before charges were kept: %w", err)
	}
	taken := map[string]bool{}
	for _, r := range repos {
		cluster, _, ok := splitOverlay(r)
		if !ok {
			continue
		}
		for d := range s.repoRefs(r) {
			if taken[d] || checkDigest(d) != nil {
				continue
			}
			if _, err := os.Stat(s.blobPath(d)); err != nil {
				continue
			}
			taken[d] = true
			p := filepath.Join(tmp, cluster, strings.TrimPrefix(d, "sha256:"))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return fmt.Errorf("charging the images stored before charges were kept: %w", err)
			}
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				return fmt.Errorf("charging the images stored before charges were kept: %w", err)
			}
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("charging the images stored before charges were kept: %w", err)
	}
	if err := os.Rename(tmp, root); err != nil {
		if _, serr := os.Stat(root); serr == nil {
			return nil // another process did it first
		}
		return fmt.Errorf("charging the images stored before charges were kept: %w", err)
	}
	if len(taken) > 0 {
		s.log.Info("charged the clusters' own images stored before charges were kept", "blobs", len(taken))
	}
	return nil
}

// newBytes is what storing manifest b (Content-Type ct) would add to the store: b, and
// for an image manifest the config and layers not stored yet, by their descriptors'
// sizes. An index's manifests are counted when they are fetched.
func (s *store) newBytes(b []byte, ct string) int64 {
	var n int64
	sum := sha256.Sum256(b)
	if _, err := os.Stat(s.blobPath("sha256:" + hex.EncodeToString(sum[:]))); err != nil {
		n += int64(len(b))
	}
	m, mt, err := parseManifest(b, ct)
	if err != nil {
		if m, mt, err = parseManifest(b, ""); err != nil {
			return n
		}
	}
	if isIndexType(mt) {
		return n
	}
	seen := map[string]bool{}
	for _, d := range append([]descriptor{*m.Config}, m.Layers...) {
		if isForeignLayer(d) || seen[d.Digest] || d.Size < 0 {
			continue
		}
		seen[d.Digest] = true
		if _, err := s.statBlob(d.Digest); err != nil {
			n += d.Size
		}
	}
	return n
}
