package registry

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// store is the on-disk content store (layout in the package documentation). Blobs are
// immutable and written by temp file + rename after their digest is checked; tags and
// revision links are small files replaced the same way, so a reader sees the old or the
// new state, never a torn one, and several processes may share a directory.
type store struct {
	dir string
	log *slog.Logger

	mu      sync.Mutex
	uploads map[string]*upload
	refs    map[string]refsCache // repoRefs, by repository
}

// upload is one blob upload session. Its data is a file in <dir>/uploads; the running
// hash lets the final PUT verify the digest without reading the data again.
type upload struct {
	mu      sync.Mutex
	id      string
	name    string // canonical repository name it was started for
	path    string
	size    int64
	h       hash.Hash
	started time.Time
	touched time.Time // last chunk; a session idle UploadTTL is gone
	done    bool
}

// UploadTTL is how long an upload session may sit idle before it and its data go.
const UploadTTL = time.Hour

// staleUpload is how old an abandoned upload or import staging file must be before a
// new store removes it (other processes may be using the directory right now).
const staleUpload = 24 * time.Hour

func openStore(dir string, log *slog.Logger) (*store, error) {
	if dir == "" {
		return nil, errors.New("registry: Server.Dir is empty")
	}
	for _, d := range []string{"blobs/sha256", "repositories", "uploads"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("registry: %w", err)
		}
	}
	s := &store{dir: dir, log: log, uploads: map[string]*upload{}}
	if ents, err := os.ReadDir(s.uploadsDir()); err == nil {
		for _, e := range ents {
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > staleUpload {
				os.RemoveAll(filepath.Join(s.uploadsDir(), e.Name()))
			}
		}
	}
	if err := s.chargeExisting(); err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	return s, nil
}

func (s *store) uploadsDir() string { return filepath.Join(s.dir, "uploads") }

func (s *store) blobPath(digest string) string {
	return filepath.Join(s.dir, "blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

func (s *store) manifestsDir(name string) string {
	return filepath.Join(s.dir, "repositories", filepath.FromSlash(name), "_manifests")
}

func (s *store) tagPath(name, tag string) string {
	return filepath.Join(s.manifestsDir(name), "tags", tag)
}

func (s *store) revisionPath(name, digest string) string {
	return filepath.Join(s.manifestsDir(name), "revisions", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

func checkDigest(d string) error {
	if !digestRE.MatchString(d) {
		if strings.HasPrefix(d, "sha256:") || !strings.Contains(d, ":") {
			return errf(errDigestInvalid, "invalid digest %q", d)
		}
		return errf(errUnsupported, "digest algorithm of %q is not supported (only sha256)", d)
	}
	return nil
}

func randomID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// tempFile creates a temporary file in the uploads directory (same file system as the
// blobs, so rename is atomic).
func (s *store) tempFile(prefix string) (*os.File, error) {
	return os.CreateTemp(s.uploadsDir(), prefix+"-*")
}

// statBlob returns the size of blob digest, or BLOB_UNKNOWN.
func (s *store) statBlob(digest string) (int64, error) {
	if err := checkDigest(digest); err != nil {
		return 0, err
	}
	st, err := os.Stat(s.blobPath(digest))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, errf(errBlobUnknown, "blob %s is not in the registry", digest)
		}
		return 0, err
	}
	return st.Size(), nil
}

func (s *store) openBlob(digest string) (*os.File, error) {
	if err := checkDigest(digest); err != nil {
		return nil, err
	}
	f, err := os.Open(s.blobPath(digest))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errf(errBlobUnknown, "blob %s is not in the registry", digest)
	}
	return f, err
}

// commitBlob syncs and closes tmp (whose content hashes to digest) and moves it into the
// blob store, charged to cluster by ("" nobody; charges.go). A blob already present is
// left alone: same digest, same bytes.
func (s *store) commitBlob(tmp *os.File, digest, by string) error {
	name := tmp.Name()
	err := tmp.Sync()
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(name)
		return err
	}
	return s.commitPath(name, digest, by)
}

// commitPath moves file name into the blob store as digest and charges it to cluster by
// if this call is what put it there.
func (s *store) commitPath(name, digest, by string) error {
	dst := s.blobPath(digest)
	if _, err := os.Stat(dst); err == nil {
		os.Remove(name)
		return nil
	}
	if err := os.Chmod(name, 0o644); err != nil {
		os.Remove(name)
		return err
	}
	// A hard link fails if the blob is there, so of two writers of one blob (two
	// processes) exactly one stores it and is charged for it.
	err := os.Link(name, dst)
	if errors.Is(err, fs.ErrExist) {
		os.Remove(name)
		return nil
	}
	if err != nil {
		// A file system without hard links: rename (the same bytes, whoever wins).
		if err := os.Rename(name, dst); err != nil {
			os.Remove(name)
			return err
		}
	} else {
		os.Remove(name)
	}
	s.charge(by, digest)
	return nil
}

// writeBlob stores r's content, charged to cluster by if it is new; when want is set
// the content must hash to it (DIGEST_INVALID otherwise, and nothing is stored).
func (s *store) writeBlob(r io.Reader, want, by string) (string, int64, error) {
	if want != "" {
		if err := checkDigest(want); err != nil {
			return "", 0, err
		}
	}
	tmp, err := s.tempFile("blob")
	if err != nil {
		return "", 0, err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), r)
	if err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return "", n, err
	}
	got := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if want != "" && got != want {
		tmp.Close()
		os.Remove(tmp.Name())
		return "", n, errf(errDigestInvalid, "content digest is %s, not %s", got, want)
	}
	return got, n, s.commitBlob(tmp, got, by)
}

// writeFileAtomic replaces path with data via a temp file and rename.
func (s *store) writeFileAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := s.tempFile("meta")
	if err != nil {
		return err
	}
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}

// ---- uploads ----

func (s *store) startUpload(name string) (*upload, error) {
	f, err := s.tempFile("upload")
	if err != nil {
		return nil, err
	}
	f.Close()
	now := time.Now()
	u := &upload{id: randomID(), name: name, path: f.Name(), h: sha256.New(), started: now, touched: now}
	s.mu.Lock()
	var stale []*upload
	for _, o := range s.uploads {
		if now.Sub(o.touched) > UploadTTL {
			stale = append(stale, o)
		}
	}
	s.uploads[u.id] = u
	s.mu.Unlock()
	for _, o := range stale {
		if o.mu.TryLock() { // one in use is not idle
			s.log.Info("upload session expired", "name", o.name, "id", o.id, "bytes", o.size)
			s.endUpload(o, true)
			o.mu.Unlock()
		}
	}
	return u, nil
}

// getUpload returns the session id started for repository name, locked; the caller
// unlocks it.
func (s *store) getUpload(name, id string) (*upload, error) {
	s.mu.Lock()
	u := s.uploads[id]
	s.mu.Unlock()
	if u == nil || u.name != name {
		return nil, errf(errBlobUploadUnknown, "no upload %q for repository %s", id, name)
	}
	u.mu.Lock()
	if u.done {
		u.mu.Unlock()
		return nil, errf(errBlobUploadUnknown, "upload %q is finished", id)
	}
	if time.Since(u.touched) > UploadTTL {
		s.endUpload(u, true)
		u.mu.Unlock()
		return nil, errf(errBlobUploadUnknown, "upload %q expired after %s idle; start it again", id, UploadTTL)
	}
	return u, nil
}

// appendUpload writes r at the end of u's data; when expect >= 0 the chunk must be
// exactly that long. On error the data is cut back to what it was, so a client can retry
// the chunk.
func (s *store) appendUpload(u *upload, r io.Reader, expect, max int64) error {
	f, err := os.OpenFile(u.path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Seek(u.size, io.SeekStart); err != nil {
		return err
	}
	// Hash into a copy so a failed chunk leaves u.h as it was.
	h, err := cloneHash(u.h)
	if err != nil {
		return err
	}
	room := max - u.size
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(r, room+1))
	if err == nil && n > room {
		err = errf(errSizeInvalid, "the blob is over this registry's limit of %d bytes", max)
	}
	if err == nil && expect >= 0 && n != expect {
		err = errf(errBlobUploadInvalid, "chunk has %d bytes, Content-Range said %d", n, expect)
	}
	if err != nil {
		f.Truncate(u.size)
		return err
	}
	u.size += n
	u.h = h
	u.touched = time.Now()
	return nil
}

func cloneHash(h hash.Hash) (hash.Hash, error) {
	m, ok := h.(interface{ MarshalBinary() ([]byte, error) })
	if !ok {
		return nil, errors.New("hash cannot be cloned")
	}
	state, err := m.MarshalBinary()
	if err != nil {
		return nil, err
	}
	c := sha256.New()
	if err := c.(interface{ UnmarshalBinary([]byte) error }).UnmarshalBinary(state); err != nil {
		return nil, err
	}
	return c, nil
}

// finishUpload checks u's data against digest and moves it into the blob store.
func (s *store) finishUpload(u *upload, digest string) error {
	if err := checkDigest(digest); err != nil {
		return err
	}
	got := "sha256:" + hex.EncodeToString(u.h.Sum(nil))
	if got != digest {
		s.endUpload(u, true)
		return errf(errDigestInvalid, "uploaded content has digest %s, not %s", got, digest)
	}
	if err := s.commitPath(u.path, digest, ""); err != nil { // uploads are the host's
		s.endUpload(u, true)
		return err
	}
	s.endUpload(u, false)
	return nil
}

// endUpload forgets u (the caller holds u.mu), removing its data unless it was moved into
// the blob store.
func (s *store) endUpload(u *upload, removeData bool) {
	u.done = true
	if removeData {
		os.Remove(u.path)
	}
	s.mu.Lock()
	delete(s.uploads, u.id)
	s.mu.Unlock()
}

// ---- manifests ----

// getManifest returns the manifest name:reference (a tag or a digest), its media type and
// digest.
func (s *store) getManifest(name, ref string) ([]byte, string, string, error) {
	digest := ref
	if strings.Contains(ref, ":") {
		if err := checkDigest(ref); err != nil {
			return nil, "", "", err
		}
	} else {
		if !tagRE.MatchString(ref) {
			return nil, "", "", errf(errTagInvalid, "invalid tag %q", ref)
		}
		b, err := os.ReadFile(s.tagPath(name, ref))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, "", "", errf(errManifestUnknown, "manifest %s:%s is not in the registry", name, ref)
		} else if err != nil {
			return nil, "", "", err
		}
		digest = strings.TrimSpace(string(b))
	}
	mt, err := os.ReadFile(s.revisionPath(name, digest))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", "", errf(errManifestUnknown, "manifest %s@%s is not in the registry", name, digest)
	} else if err != nil {
		return nil, "", "", err
	}
	content, err := os.ReadFile(s.blobPath(digest))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", "", errf(errManifestUnknown, "manifest %s@%s is linked but its content is missing", name, digest)
	} else if err != nil {
		return nil, "", "", err
	}
	return content, strings.TrimSpace(string(mt)), digest, nil
}

// putManifest stores content as manifest name:ref (ref a tag or the content's digest).
// Every blob an image manifest references must be present, and so must the manifests an
// index references unless lenient (Import of a partial multi-platform index), in which
// case missing ones are skipped. Manifests an index references are linked into name so
// they can be pulled from it by digest.
func (s *store) putManifest(name, ref string, content []byte, contentType string, lenient bool) (string, string, error) {
	if len(content) > maxManifestSize {
		return "", "", errf(errSizeInvalid, "manifest is %d bytes, more than the %d allowed", len(content), maxManifestSize)
	}
	m, mt, err := parseManifest(content, contentType)
	if err != nil {
		return "", "", err
	}
	sum := sha256.Sum256(content)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	tag := ""
	if strings.Contains(ref, ":") {
		if err := checkDigest(ref); err != nil {
			return "", "", err
		}
		if ref != digest {
			return "", "", errf(errDigestInvalid, "manifest digest is %s, not %s", digest, ref)
		}
	} else {
		if !tagRE.MatchString(ref) {
			return "", "", errf(errTagInvalid, "invalid tag %q", ref)
		}
		tag = ref
	}
	if isIndexType(mt) {
		for _, d := range m.Manifests {
			cmt := d.MediaType
			if _, err := s.statBlob(d.Digest); err != nil {
				if lenient && IsCode(err, errBlobUnknown) {
					s.log.Debug("index references a manifest that is not here; skipped", "name", name, "digest", d.Digest)
					continue
				}
				if IsCode(err, errBlobUnknown) {
					return "", "", &Error{errManifestBlobUnknown, fmt.Sprintf("index references manifest %s, which is not in the registry", d.Digest), map[string]string{"digest": d.Digest}}
				}
				return "", "", err
			}
			if !isManifestType(cmt) {
				b, err := os.ReadFile(s.blobPath(d.Digest))
				if err != nil {
					return "", "", err
				}
				if _, cmt, err = parseManifest(b, ""); err != nil {
					return "", "", errf(errManifestInvalid, "index entry %s: %v", d.Digest, err)
				}
			}
			if err := s.link(name, d.Digest, cmt); err != nil {
				return "", "", err
			}
		}
	} else {
		for _, d := range append([]descriptor{*m.Config}, m.Layers...) {
			if isForeignLayer(d) {
				continue
			}
			size, err := s.statBlob(d.Digest)
			if IsCode(err, errBlobUnknown) {
				return "", "", &Error{errManifestBlobUnknown, fmt.Sprintf("manifest references blob %s, which is not in the registry", d.Digest), map[string]string{"digest": d.Digest}}
			} else if err != nil {
				return "", "", err
			}
			if size != d.Size {
				return "", "", errf(errManifestInvalid, "descriptor of %s says %d bytes, the blob has %d", d.Digest, d.Size, size)
			}
		}
	}
	if _, err := os.Stat(s.blobPath(digest)); err != nil {
		by, _, _ := splitOverlay(name) // pushed for a cluster alone: its charge
		if _, _, err := s.writeBlob(bytes.NewReader(content), digest, by); err != nil {
			return "", "", err
		}
	}
	if err := s.link(name, digest, mt); err != nil {
		return "", "", err
	}
	if tag != "" {
		if err := s.writeFileAtomic(s.tagPath(name, tag), []byte(digest+"\n")); err != nil {
			return "", "", err
		}
	}
	return digest, mt, nil
}

// link records that manifest digest (media type mt) belongs to repository name.
func (s *store) link(name, digest, mt string) error {
	p := s.revisionPath(name, digest)
	if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == mt {
		return nil
	}
	return s.writeFileAtomic(p, []byte(mt+"\n"))
}

// deleteManifest removes tag ref, or manifest digest ref and every tag pointing at it.
// Blobs stay (there is no garbage collection).
func (s *store) deleteManifest(name, ref string) error {
	if !strings.Contains(ref, ":") {
		if !tagRE.MatchString(ref) {
			return errf(errTagInvalid, "invalid tag %q", ref)
		}
		err := os.Remove(s.tagPath(name, ref))
		if errors.Is(err, fs.ErrNotExist) {
			return errf(errManifestUnknown, "manifest %s:%s is not in the registry", name, ref)
		}
		return err
	}
	if err := checkDigest(ref); err != nil {
		return err
	}
	if err := os.Remove(s.revisionPath(name, ref)); errors.Is(err, fs.ErrNotExist) {
		return errf(errManifestUnknown, "manifest %s@%s is not in the registry", name, ref)
	} else if err != nil {
		return err
	}
	tags, _ := s.tags(name)
	for _, t := range tags {
		if b, err := os.ReadFile(s.tagPath(name, t)); err == nil && strings.TrimSpace(string(b)) == ref {
			os.Remove(s.tagPath(name, t))
		}
	}
	return nil
}

// tags lists the tags of repository name, sorted; NAME_UNKNOWN if it has never held a
// manifest.
func (s *store) tags(name string) ([]string, error) {
	if _, err := os.Stat(s.manifestsDir(name)); errors.Is(err, fs.ErrNotExist) {
		return nil, errf(errNameUnknown, "repository %s is not in the registry", name)
	}
	ents, err := os.ReadDir(filepath.Join(s.manifestsDir(name), "tags"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	tags := []string{}
	for _, e := range ents {
		if e.Type().IsRegular() && tagRE.MatchString(e.Name()) {
			tags = append(tags, e.Name())
		}
	}
	sort.Strings(tags)
	return tags, nil
}

// catalog lists the canonical names of every repository, sorted.
func (s *store) catalog() ([]string, error) {
	root := filepath.Join(s.dir, "repositories")
	var repos []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() && d.Name() == "_manifests" {
			rel, _ := filepath.Rel(root, filepath.Dir(p))
			repos = append(repos, filepath.ToSlash(rel))
			return filepath.SkipDir
		}
		return nil
	})
	sort.Strings(repos)
	return repos, err
}
