package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
)

// Server is the host-side OCI registry. The zero value is not usable: set Dir.
type Server struct {
	// Dir holds the content store (created if missing).
	Dir string
	// Logger receives one line per request (Debug; Info for 4xx, Error for 5xx).
	// Default slog.Default().
	Logger *slog.Logger
	// SelfHosts are extra host names or addresses (port ignored) that mean this registry
	// when containerd sends them as ?ns= (localhost, 127.0.0.1 and ::1 always do): a
	// reference to one of them is a local repository, not a mirrored one.
	SelfHosts []string
	// LayersStored, if set, is called with the layers of every image manifest stored
	// (pushed, or loaded by Import; for an index, those of the manifests it lists that
	// are here), once the manifest is in place. It runs in the storing goroutine: queue
	// work, do not do it there (internal/layerstore's Preparer.Enqueue returns at once).
	LayersStored func([]Layer)
	// Upstream, if set, fetches what nodes ask for under another registry's name and
	// the store lacks (pull-through); nil serves only what was pushed (offline).
	Upstream *Upstream
	// MaxBlobSize caps one blob fetched from upstream or pushed over HTTP; 0 is
	// DefaultMaxBlobSize.
	MaxBlobSize int64
	// ClusterQuota caps the bytes a cluster may bring into the store (charges.go): a
	// fetch from upstream for its nodes that would take it past the quota is refused
	// with QUOTA_EXCEEDED, shared images included; what is stored is served whatever
	// the quota. 0 is none.
	ClusterQuota int64
	// Peers, if set, lists the other hosts of the service, asked for a pushed image a
	// node wants and this store lacks before upstream is (peers.go).
	Peers func() []Peer

	once     sync.Once
	initErr  error
	st       *store
	names    names
	log      *slog.Logger
	metrics  pullMetrics
	failures failures

	fillMu   sync.Mutex
	fills    map[string]*fill     // blobs being fetched from upstream, by digest
	awaiting map[string]time.Time // pulled image manifests whose blobs are not all here

	peerMu     sync.Mutex
	peerCopies map[string]chan struct{} // copies from peers under way, by cluster, name and reference
}

func (s *Server) init() error {
	s.once.Do(func() {
		s.log = s.Logger
		if s.log == nil {
			s.log = slog.Default()
		}
		s.names = newNames(s.SelfHosts)
		s.st, s.initErr = openStore(s.Dir, s.log)
		if s.initErr == nil && s.Upstream != nil {
			if err := s.Upstream.Validate(); err != nil {
				s.initErr = fmt.Errorf("registry upstream: %w", err)
			}
			s.Upstream.init()
		}
	})
	return s.initErr
}

// Handler returns the registry's HTTP handler (everything under /v2/), pushes
// included: for the host's own clients and tests, never for a node.
func (s *Server) Handler() http.Handler { return s.handler(nil) }

// NodeHandler is what a cluster's nodes are served: pulls only. A node runs tenant
// code (a privileged Pod can speak HTTP to it), and every tenant pulls from this
// store, so a node that could write could replace the images other tenants run.
// Every write, and _catalog (which names every tenant's images), is refused with
// DENIED, and the refusal is logged at Warn with the caller's address. It sees the
// shared images only; NodeHandlerFor is a cluster's.
func (s *Server) NodeHandler() http.Handler { return s.handler(&view{}) }

// NodeHandlerFor is what cluster's nodes are served: NodeHandler, seeing besides the
// shared images those pushed for cluster alone and those it pulled with credentials.
func (s *Server) NodeHandlerFor(cluster string) http.Handler {
	return s.handler(&view{tenant: cluster})
}

// handler serves the host (v nil: everything) or a node's view (pulls only).
func (s *Server) handler(v *view) http.Handler {
	pullOnly := v != nil
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		denied := ""
		if pullOnly {
			denied = refusedToNodes(r)
		}
		var rv *view
		if v != nil {
			rv = v.forRequest(r)
		}
		switch err := s.init(); {
		case err != nil:
			writeError(rec, err)
		case denied != "":
			fail(rec, errf(errDenied, "%s: nodes may only pull (GET and HEAD); images are added on the host with `socialweb image push`", denied))
		default:
			s.serve(rec, r, rv)
		}
		if pullOnly && isRead(r.Method) {
			s.metrics.served(rec.bytes)
		}
		if denied != "" {
			s.log.Warn("registry refused a node's request", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "reason", denied)
			return
		}
		attrs := []any{"method", r.Method, "path", r.URL.Path, "status", rec.status, "bytes", rec.bytes, "duration", time.Since(start).Round(time.Microsecond)}
		if ns := r.URL.Query().Get("ns"); ns != "" {
			attrs = append(attrs, "ns", ns)
		}
		switch {
		case rec.status >= 500:
			s.log.Error("registry request failed", append(attrs, "error", rec.errMsg)...)
		case rec.status == http.StatusNotFound && r.Method == http.MethodHead:
			s.log.Debug("registry request", attrs...) // existence checks before a push
		case rec.status >= 400:
			s.log.Info("registry request rejected", append(attrs, "error", rec.errMsg)...)
		default:
			s.log.Debug("registry request", attrs...)
		}
	})
}

// ListenAndServe serves the registry on addr (host:port) until ctx is done, then shuts
// down gracefully (in-flight pulls get 5s) and returns nil.
func (s *Server) ListenAndServe(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	return s.Serve(ctx, ln)
}

// Serve is ListenAndServe on a listener the caller opened.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if err := s.init(); err != nil {
		ln.Close()
		return err
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 30 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
		case <-done:
			return
		}
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			srv.Close()
		}
	}()
	s.log.Info("registry listening", "address", ln.Addr().String(), "dir", s.Dir)
	err := srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		<-done
		return nil
	}
	srv.Close()
	return err
}

type recorder struct {
	http.ResponseWriter
	status      int
	bytes       int64
	wroteHeader bool
	errMsg      string
}

func (r *recorder) WriteHeader(code int) {
	if !r.wroteHeader {
		r.status, r.wroteHeader = code, true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if !r.wroteHeader {
		r.wroteHeader = true
	}
	n, err := r.ResponseWriter.Write(b)
	r.bytes += int64(n)
	return n, err
}

// ReadFrom keeps the underlying writer's sendfile path for blob downloads.
func (r *recorder) ReadFrom(src io.Reader) (int64, error) {
	r.wroteHeader = true
	var n int64
	var err error
	if rf, ok := r.ResponseWriter.(io.ReaderFrom); ok {
		n, err = rf.ReadFrom(src)
	} else {
		n, err = io.Copy(struct{ io.Writer }{r.ResponseWriter}, src)
	}
	r.bytes += n
	return n, err
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// cappedReader fails with SIZE_INVALID past left bytes.
type cappedReader struct {
	r    io.Reader
	left int64
}

func (c *cappedReader) Read(p []byte) (int, error) {
	if c.left < 0 {
		return 0, errf(errSizeInvalid, "the blob is over this registry's limit")
	}
	if int64(len(p)) > c.left+1 {
		p = p[:c.left+1]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left < 0 {
		return n, errf(errSizeInvalid, "the blob is over this registry's limit")
	}
	return n, err
}

// fail writes err as an OCI error response and notes it for the request log.
func fail(w http.ResponseWriter, err error) {
	if rec, ok := w.(*recorder); ok {
		rec.errMsg = err.Error()
	}
	writeError(w, err)
}

// route is a parsed /v2/ request path.
type route struct {
	kind     string // "base", "catalog", "tags", "manifest", "blob", "upload"
	pathName string // the name as it appears in the path
	ref      string // tag or digest (manifest), digest (blob), session id (upload)
}

func parseRoute(method, p string) (route, bool) {
	if p == "/v2" || p == "/v2/" {
		return route{kind: "base"}, true
	}
	rest, ok := strings.CutPrefix(p, "/v2/")
	if !ok {
		return route{}, false
	}
	if rest == "_catalog" {
		return route{kind: "catalog"}, true
	}
	seg := strings.Split(rest, "/")
	n := len(seg)
	join := func(k int) string { return strings.Join(seg[:k], "/") }
	switch {
	case n >= 3 && seg[n-2] == "tags" && seg[n-1] == "list":
		return route{"tags", join(n - 2), ""}, true
	case n >= 4 && seg[n-3] == "blobs" && seg[n-2] == "uploads":
		return route{"upload", join(n - 3), seg[n-1]}, true
	case n >= 3 && seg[n-2] == "blobs" && seg[n-1] == "uploads" && method == http.MethodPost:
		return route{"upload", join(n - 2), ""}, true
	case n >= 3 && seg[n-2] == "manifests":
		return route{"manifest", join(n - 2), seg[n-1]}, true
	case n >= 3 && seg[n-2] == "blobs":
		return route{"blob", join(n - 2), seg[n-1]}, true
	}
	return route{}, false
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request, v *view) {
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	rt, ok := parseRoute(r.Method, r.URL.Path)
	if !ok {
		writeJSON(w, http.StatusNotFound, errorBody{[]errorEntry{{Code: "NOT_FOUND", Message: "no such endpoint: " + r.URL.Path}}})
		return
	}
	switch rt.kind {
	case "base":
		if !isRead(r.Method) {
			fail(w, errf(errUnsupported, "%s /v2/ is not supported", r.Method))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "3")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "{}\n")
		return
	case "catalog":
		if !isRead(r.Method) {
			fail(w, errf(errUnsupported, "%s /v2/_catalog is not supported", r.Method))
			return
		}
		repos, err := s.st.catalog()
		if err != nil {
			fail(w, err)
			return
		}
		s.paginate(w, r, "/v2/_catalog", repos, func(page []string) any {
			return map[string][]string{"repositories": page}
		})
		return
	}
	ns := r.URL.Query().Get("ns")
	name, err := s.names.repo(ns, rt.pathName)
	if err != nil {
		fail(w, err)
		return
	}
	switch rt.kind {
	case "tags":
		if !isRead(r.Method) {
			fail(w, errf(errUnsupported, "%s on tags is not supported", r.Method))
			return
		}
		tags, err := s.tags(v, name)
		if err != nil {
			fail(w, err)
			return
		}
		s.paginate(w, r, "/v2/"+rt.pathName+"/tags/list", tags, func(page []string) any {
			return struct {
				Name string   `json:"name"`
				Tags []string `json:"tags"`
			}{rt.pathName, page}
		})
	case "manifest":
		s.manifest(w, r, v, name, rt)
	case "blob":
		s.blob(w, r, v, name, rt)
	case "upload":
		s.upload(w, r, name, rt, ns)
	}
	// What a node was refused explains its Pod's failed pull (LastFailure).
	if v != nil && v.tenant != "" && (rt.kind == "manifest" || rt.kind == "blob") {
		if rec, ok := w.(*recorder); ok {
			if rec.status >= 400 && rec.errMsg != "" {
				code, msg := codeOf(rec.errMsg)
				s.failures.note(v.tenant, name, code, msg)
			} else if rec.status < 300 && rt.kind == "manifest" {
				s.failures.forget(v.tenant, name)
				for _, repo := range []string{name, overlay(v.tenant, name)} {
					if _, err := os.Stat(s.st.manifestsDir(repo)); err == nil {
						s.st.markUsed(repo)
					}
				}
			}
		}
	}
}

// refusedToNodes says why a node may not make request r, or "" if it may: only GET
// and HEAD, and not the catalog.
func refusedToNodes(r *http.Request) string {
	if !isRead(r.Method) {
		return r.Method + " is a write"
	}
	if rt, ok := parseRoute(r.Method, r.URL.Path); ok && rt.kind == "catalog" {
		return "the catalog lists every tenant's images"
	}
	return ""
}

func isRead(m string) bool { return m == http.MethodGet || m == http.MethodHead }

// paginate writes a list response with the spec's n/last pagination and Link header.
func (s *Server) paginate(w http.ResponseWriter, r *http.Request, path string, all []string, body func([]string) any) {
	q := r.URL.Query()
	page := all
	if last := q.Get("last"); last != "" {
		i := sort.SearchStrings(page, last)
		if i < len(page) && page[i] == last {
			i++
		}
		page = page[i:]
	}
	if ns := q.Get("n"); ns != "" {
		n, err := strconv.Atoi(ns)
		if err != nil || n < 0 {
			fail(w, errf(errPaginationInvalid, "invalid n=%q", ns))
			return
		}
		if n < len(page) {
			page = page[:n]
			if n > 0 {
				v := url.Values{"n": {ns}, "last": {page[n-1]}}
				if q.Has("ns") {
					v.Set("ns", q.Get("ns"))
				}
				w.Header().Set("Link", fmt.Sprintf(`<%s?%s>; rel="next"`, path, v.Encode()))
			}
		}
	}
	if page == nil {
		page = []string{}
	}
	writeJSON(w, http.StatusOK, body(page))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

func (s *Server) manifest(w http.ResponseWriter, r *http.Request, v *view, name string, rt route) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		content, mt, digest, err := s.readManifest(r.Context(), v, name, rt.ref)
		if err != nil {
			fail(w, err)
			return
		}
		h := w.Header()
		h.Set("Content-Type", mt)
		h.Set("Docker-Content-Digest", digest)
		h.Set("ETag", `"`+digest+`"`)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(content))
	case http.MethodPut:
		content, err := io.ReadAll(io.LimitReader(r.Body, maxManifestSize+1))
		if err != nil {
			fail(w, err)
			return
		}
		digest, _, err := s.st.putManifest(name, rt.ref, content, r.Header.Get("Content-Type"), false)
		if err != nil {
			fail(w, err)
			return
		}
		s.stored(name, digest)
		w.Header().Set("Location", "/v2/"+rt.pathName+"/manifests/"+digest)
		w.Header().Set("Docker-Content-Digest", digest)
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusCreated)
	case http.MethodDelete:
		if err := s.st.deleteManifest(name, rt.ref); err != nil {
			fail(w, err)
			return
		}
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusAccepted)
	default:
		fail(w, errf(errUnsupported, "%s on a manifest is not supported", r.Method))
	}
}

// blob serves a blob. Blobs are global (content-addressed, shared by every repository),
// so any repository name serves any blob: pulls through the mirror never miss a layer
// another name pushed.
func (s *Server) blob(w http.ResponseWriter, r *http.Request, v *view, name string, rt route) {
	if !isRead(r.Method) {
		fail(w, errf(errUnsupported, "%s on a blob is not supported", r.Method))
		return
	}
	if v != nil {
		s.nodeBlob(w, r, v, name, rt.ref)
		return
	}
	f, err := s.st.openBlob(rt.ref)
	if IsCode(err, errBlobUnknown) && s.Upstream != nil {
		if up, ok := s.upstreamOf(name); ok {
			s.pullBlob(w, r, nil, up, rt.ref, authn.Anonymous)
			return
		}
	}
	if err != nil {
		fail(w, err)
		return
	}
	defer f.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Docker-Content-Digest", rt.ref)
	h.Set("ETag", `"`+rt.ref+`"`)
	h.Set("Cache-Control", "max-age=31536000")
	http.ServeContent(w, r, "", time.Time{}, f)
}

func (s *Server) upload(w http.ResponseWriter, r *http.Request, name string, rt route, ns string) {
	q := r.URL.Query()
	location := func(id string) string {
		l := "/v2/" + rt.pathName + "/blobs/uploads/" + id
		if ns != "" {
			l += "?" + url.Values{"ns": {ns}}.Encode()
		}
		return l
	}
	created := func(digest string) {
		w.Header().Set("Location", "/v2/"+rt.pathName+"/blobs/"+digest)
		w.Header().Set("Docker-Content-Digest", digest)
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusCreated)
	}
	progress := func(u *upload, status int) {
		w.Header().Set("Location", location(u.id))
		w.Header().Set("Docker-Upload-UUID", u.id)
		end := u.size - 1
		if end < 0 {
			end = 0
		}
		w.Header().Set("Range", fmt.Sprintf("0-%d", end))
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(status)
	}
	if rt.ref == "" {
		if r.Method != http.MethodPost {
			fail(w, errf(errUnsupported, "%s on blob uploads is not supported", r.Method))
			return
		}
		if d := q.Get("mount"); d != "" {
			if _, err := s.st.statBlob(d); err == nil {
				created(d) // blobs are global: mounting from any repository is a no-op
				return
			}
		}
		if d := q.Get("digest"); d != "" {
			if _, _, err := s.st.writeBlob(&cappedReader{r: r.Body, left: s.maxBlob()}, d, ""); err != nil {
				fail(w, err)
				return
			}
			created(d)
			return
		}
		u, err := s.st.startUpload(name)
		if err != nil {
			fail(w, err)
			return
		}
		u.mu.Lock()
		defer u.mu.Unlock()
		progress(u, http.StatusAccepted)
		return
	}
	u, err := s.st.getUpload(name, rt.ref)
	if err != nil {
		fail(w, err)
		return
	}
	defer u.mu.Unlock()
	switch r.Method {
	case http.MethodGet:
		progress(u, http.StatusNoContent)
	case http.MethodPatch, http.MethodPut:
		expect := int64(-1)
		if cr := r.Header.Get("Content-Range"); cr != "" {
			start, end, ok := parseContentRange(cr)
			if !ok || start != u.size {
				w.Header().Set("Range", fmt.Sprintf("0-%d", max(u.size-1, 0)))
				fail(w, errf(errRangeInvalid, "Content-Range %q does not continue the upload at offset %d", cr, u.size))
				return
			}
			expect = end - start + 1
		}
		if err := s.st.appendUpload(u, r.Body, expect, s.maxBlob()); err != nil {
			fail(w, err)
			return
		}
		if r.Method == http.MethodPatch {
			progress(u, http.StatusAccepted)
			return
		}
		d := q.Get("digest")
		if d == "" {
			fail(w, errf(errDigestInvalid, "PUT to finish an upload needs ?digest="))
			return
		}
		if err := s.st.finishUpload(u, d); err != nil {
			fail(w, err)
			return
		}
		created(d)
	case http.MethodDelete:
		s.st.endUpload(u, true)
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusNoContent)
	default:
		fail(w, errf(errUnsupported, "%s on a blob upload is not supported", r.Method))
	}
}

// parseContentRange parses "start-end" (what Docker and the OCI spec send), also with a
// "bytes " prefix or "bytes=".
func parseContentRange(s string) (int64, int64, bool) {
	s = strings.TrimPrefix(strings.TrimPrefix(strings.TrimSpace(s), "bytes"), "=")
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '/'); i >= 0 {
		s = s[:i]
	}
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, false
	}
	start, err1 := strconv.ParseInt(a, 10, 64)
	end, err2 := strconv.ParseInt(b, 10, 64)
	if err1 != nil || err2 != nil || start < 0 || end < start {
		return 0, 0, false
	}
	return start, end, true
}
