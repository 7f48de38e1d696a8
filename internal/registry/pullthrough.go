package registry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
)

// Pull-through: what a node asks for under a registry's name (?ns=docker.io) that the
// store lacks is fetched from upstream, stored, and served; later pulls by any node are
// served from the store. A tag fetched from upstream is checked again after TagTTL; a
// tag pushed on the host never is (pushed content wins), and a digest never changes.

// noteFailure logs why a node's fetch of name:ref failed.
func (s *Server) noteFailure(v *view, name, ref string, err error) {
	tenant := ""
	if v != nil {
		tenant = v.tenant
	}
	s.log.Info("pull through failed", "cluster", tenant, "name", name, "ref", ref, "err", err)
}

// putPulledManifest stores a manifest fetched from upstream as name:ref, charged to
// cluster by if it is new. Unlike a push, the blobs it references need not be here yet:
// they are fetched when asked for.
func (s *store) putPulledManifest(name, ref string, content []byte, contentType, by string) (string, string, error) {
	_, mt, err := parseManifest(content, contentType)
	if err != nil {
		if _, mt, err = parseManifest(content, ""); err != nil {
			return "", "", err
		}
	}
	sum := sha256.Sum256(content)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	if strings.HasPrefix(ref, "sha256:") && ref != digest {
		return "", "", errf(errDigestInvalid, "upstream sent a manifest whose digest is %s for %s", digest, ref)
	}
	if _, err := os.Stat(s.blobPath(digest)); err != nil {
		if _, _, err := s.writeBlob(strings.NewReader(string(content)), digest, by); err != nil {
			return "", "", err
		}
	}
	if err := s.link(name, digest, mt); err != nil {
		return "", "", err
	}
	if !strings.HasPrefix(ref, "sha256:") {
		if err := s.writeFileAtomic(s.tagPath(name, ref), []byte(digest+"\n")); err != nil {
			return "", "", err
		}
		s.markPulled(name, ref, digest)
	}
	return digest, mt, nil
}

// pulledPath records that tag came from upstream: its content is the digest fetched, its
// mtime when upstream last confirmed it.
func (s *store) pulledPath(name, tag string) string {
	return filepath.Join(s.dir, "upstream", filepath.FromSlash(name), "_tags", tag)
}

func (s *store) markPulled(name, tag, digest string) {
	if err := s.writeFileAtomic(s.pulledPath(name, tag), []byte(digest+"\n")); err != nil {
		s.log.Warn("recording a pulled tag", "name", name, "tag", tag, "err", err)
	}
}

// pulledTag says when upstream last confirmed name:tag at digest; pulled is false for a
// tag pushed on the host (or pushed over a pulled one), which upstream never overrides.
func (s *store) pulledTag(name, tag, digest string) (time.Time, bool) {
	p := s.pulledPath(name, tag)
	b, err := os.ReadFile(p)
	if err != nil || strings.TrimSpace(string(b)) != digest {
		return time.Time{}, false
	}
	st, err := os.Stat(p)
	if err != nil {
		return time.Time{}, false
	}
	return st.ModTime(), true
}

// awaitLayers announces an image manifest pulled through to LayersStored once its config
// and layers are all here (they arrive as nodes ask for them).
func (s *Server) awaitLayers(repo, digest, mt string) {
	if s.LayersStored == nil || isIndexType(mt) {
		return
	}
	if _, _, own := splitOverlay(repo); own {
		return // see stored
	}
	s.fillMu.Lock()
	if s.awaiting == nil {
		s.awaiting = map[string]time.Time{}
	}
	s.awaiting[digest] = time.Now()
	s.fillMu.Unlock()
	s.checkAwaiting()
}

func (s *Server) checkAwaiting() {
	s.fillMu.Lock()
	var ready []string
	for d, since := range s.awaiting {
		if time.Since(since) > 24*time.Hour {
			delete(s.awaiting, d) // a node never asked for the rest
			continue
		}
		if s.st.haveImage(d) {
			ready = append(ready, d)
			delete(s.awaiting, d)
		}
	}
	s.fillMu.Unlock()
	for _, d := range ready {
		s.stored("", d) // only shared repositories wait here (awaitLayers)
	}
}

// haveImage reports whether image manifest digest's config and layers are all stored.
func (s *store) haveImage(digest string) bool {
	b, err := os.ReadFile(s.blobPath(digest))
	if err != nil {
		return false
	}
	m, _, err := parseManifest(b, "")
	if err != nil || m.Config == nil {
		return false
	}
	for _, d := range append([]descriptor{*m.Config}, m.Layers...) {
		if isForeignLayer(d) {
			continue
		}
		if _, err := s.statBlob(d.Digest); err != nil {
			return false
		}
	}
	return true
}

// fill is one blob being fetched from upstream into a temp file. Every node asking for
// it meanwhile is served from that file as it grows, so a blob crosses the uplink once
// however many nodes pull it at the same time, and the first bytes reach a node before
// the last have arrived.
type fill struct {
	digest string
	by     string   // the cluster whose node started it, charged for the blob; "" nobody
	r      *os.File // the temp file, read with ReadAt by every reader
	ready  chan struct{}

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
	size    int64         // upstream's Content-Length, -1 unknown
	n       int64         // bytes in the file
	done    bool
	err     error
	refs    int
}

func (f *fill) state() (n int64, done bool, err error, changed chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n, f.done, f.err, f.changed
}

func (f *fill) update(fn func()) {
	f.mu.Lock()
	fn()
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
}

// release drops a reference; the last closes the file.
func (s *Server) release(f *fill) {
	s.fillMu.Lock()
	f.refs--
	last := f.refs == 0
	s.fillMu.Unlock()
	if last {
		f.r.Close()
	}
}

// acquireFill returns the running fetch of digest from up, starting one if none runs.
// A fill runs with the credentials of the node that started it, and its blob is
// charged to that node's cluster by; a node joins one only once its own view of the
// repository entitles it to the blob (nodeBlob).
func (s *Server) acquireFill(up upstreamRef, digest string, auth authn.Authenticator, by string) (*fill, error) {
	s.fillMu.Lock()
	defer s.fillMu.Unlock()
	if f, ok := s.fills[digest]; ok {
		f.refs++
		return f, nil
	}
	tmp, err := s.st.tempFile("pull")
	if err != nil {
		return nil, err
	}
	r, err := os.Open(tmp.Name())
	if err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, err
	}
	f := &fill{digest: digest, by: by, r: r, ready: make(chan struct{}), changed: make(chan struct{}), size: -1, refs: 2}
	if s.fills == nil {
		s.fills = map[string]*fill{}
	}
	s.fills[digest] = f
	go s.runFill(f, up, tmp, auth)
	return f, nil
}

// runFill fetches f's blob into tmp, checks its digest and size, and commits it. It
// does not run on any client's context: a node that gives up does not cost the others
// the bytes already fetched.
func (s *Server) runFill(f *fill, up upstreamRef, tmp *os.File, auth authn.Authenticator) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	err := s.fetchInto(ctx, cancel, f, up, tmp, auth)
	n, _, _, _ := f.state()
	if err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		s.log.Warn("blob pull through failed", "name", up.canonical, "digest", f.digest, "bytes", n, "err", err)
	} else {
		s.log.Info("blob pulled through", "name", up.canonical, "digest", f.digest, "bytes", n, "duration", time.Since(start).Round(time.Millisecond))
	}
	s.fillMu.Lock()
	delete(s.fills, f.digest)
	s.fillMu.Unlock()
	f.update(func() { f.done, f.err = true, err })
	select {
	case <-f.ready:
	default:
		close(f.ready)
	}
	s.release(f)
	if err == nil {
		s.checkAwaiting()
	}
}

func (s *Server) fetchInto(ctx context.Context, cancel func(), f *fill, up upstreamRef, tmp *os.File, auth authn.Authenticator) error {
	body, size, err := s.Upstream.openBlob(ctx, up, f.digest, auth)
	if err != nil {
		close(f.ready)
		return err
	}
	defer body.Close()
	if max := s.maxBlob(); size > max {
		err := errf(errSizeInvalid, "blob %s of %s is %d bytes upstream, over this host's limit of %d", f.digest, up.canonical, size, max)
		close(f.ready)
		return err
	}
	f.update(func() { f.size = size })
	close(f.ready)
	// A body that stops moving is given up, so readers are not held forever.
	idle := time.AfterFunc(2*s.Upstream.Timeout, cancel)
	defer idle.Stop()
	h := sha256.New()
	buf := make([]byte, 256<<10)
	var n int64
	for {
		k, rerr := body.Read(buf)
		if k > 0 {
			idle.Reset(2 * s.Upstream.Timeout)
			if n+int64(k) > s.maxBlob() {
				return errf(errSizeInvalid, "blob %s of %s is over this host's limit of %d bytes", f.digest, up.canonical, s.maxBlob())
			}
			if _, err := tmp.Write(buf[:k]); err != nil {
				return fmt.Errorf("writing the blob: %w", err)
			}
			h.Write(buf[:k])
			n += int64(k)
			s.metrics.fromUpstream(int64(k))
			f.update(func() { f.n = n })
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return &UpstreamError{Registry: up.registry, Err: rerr}
		}
	}
	if size >= 0 && n != size {
		return fmt.Errorf("upstream sent %d bytes of %d", n, size)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != f.digest {
		return errf(errDigestInvalid, "upstream sent content with digest %s for %s", got, f.digest)
	}
	return s.st.commitBlob(tmp, f.digest, f.by)
}

// DefaultMaxBlobSize caps one blob, pulled or pushed over HTTP, unless Server.MaxBlobSize says.
const DefaultMaxBlobSize = 16 << 30

func (s *Server) maxBlob() int64 {
	if s.MaxBlobSize > 0 {
		return s.MaxBlobSize
	}
	return DefaultMaxBlobSize
}

// pullBlob serves blob digest of up, fetching it from upstream with auth. v (nil for
// the host) is told what failed.
func (s *Server) pullBlob(w http.ResponseWriter, r *http.Request, v *view, up upstreamRef, digest string, auth authn.Authenticator) {
	if why := s.Upstream.allowed(up.registry); why != "" {
		fail(w, errf(errDenied, "%s", why))
		return
	}
	by := ""
	if v != nil {
		by = v.tenant
	}
	// Joining a fetch already running brings nothing in; starting one would.
	s.fillMu.Lock()
	_, running := s.fills[digest]
	s.fillMu.Unlock()
	if !running {
		if why := s.overQuota(by, 1); why != "" {
			fail(w, errf(errOverQuota, "blob %s of %s: %s", digest, up.canonical, why))
			return
		}
	}
	s.metrics.miss()
	f, err := s.acquireFill(up, digest, auth, by)
	if err != nil {
		fail(w, err)
		return
	}
	defer s.release(f)
	select {
	case <-f.ready:
	case <-r.Context().Done():
		return
	}
	n, done, ferr, _ := f.state()
	if done && ferr != nil && n == 0 {
		s.noteFailure(v, up.canonical, digest, ferr)
		fail(w, asRegistryError(up, "blob "+digest, ferr))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Docker-Content-Digest", digest)
	h.Set("ETag", `"`+digest+`"`)
	if r.Method == http.MethodHead || r.Header.Get("Range") != "" {
		// Both need the whole blob for certain: wait for it.
		n, ferr, ok := f.wait(r.Context())
		if !ok {
			return
		}
		if ferr != nil {
			fail(w, asRegistryError(up, "blob "+digest, ferr))
			return
		}
		http.ServeContent(w, r, "", time.Time{}, io.NewSectionReader(f.r, 0, n))
		return
	}
	if size := f.total(); size >= 0 {
		h.Set("Content-Length", fmt.Sprint(size))
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	var off int64
	for {
		n, done, ferr, changed := f.state()
		if n > off {
			if _, err := io.Copy(w, io.NewSectionReader(f.r, off, n-off)); err != nil {
				return // the node went away
			}
			off = n
			rc.Flush()
			continue
		}
		if done {
			if ferr != nil {
				// Headers are sent: all that is left is to cut the body short, which the
				// node sees as a failed read and retries.
				panic(http.ErrAbortHandler)
			}
			return
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		}
	}
}

// wait returns once f is done: its size and error; ok is false if ctx ended first.
func (f *fill) wait(ctx context.Context) (int64, error, bool) {
	for {
		n, done, err, changed := f.state()
		if done {
			return n, err, true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return 0, nil, false
		}
	}
}

func (f *fill) total() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.size
}
