package registry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Several hosts of one service each keep a store of their own. The pull-through part
// stays per host: each fetches from upstream what its own nodes use, and no host
// needs another to serve an image the world has. A pushed image exists on the host it
// was pushed on only, so a node that asks its host for an image the store lacks has it
// looked for among the other hosts first (Server.Peers): a peer that holds it as a
// pushed image, in the same scope (shared, or pushed for the asking node's cluster),
// serves the manifest, the manifests an index lists and every blob they reference
// (PeerHandler), and the asking host stores them as pushed content of that same scope,
// as `socialweb image push` there would have: served from then on without asking
// again, never replaced from upstream, charged as a push is. Only when no peer has it
// does the request go on as before (upstream, or MANIFEST_UNKNOWN).
//
// A peer is asked only when the node's view lacks the reference entirely: a name this
// host already serves (shared, pulled or pushed) is served as it is, even if another
// host holds a cluster's own image of that name. A tag copied from a peer is not
// asked again: pushing a new image under the same tag on the first host does not
// reach a host that copied the old one (a digest reference is not affected).

// Peer is another host's registry, asked for pushed images this one lacks.
type Peer struct {
	// Name is the host's, for logs.
	Name string
	// BaseURL is where its PeerHandler is served, e.g. https://10.0.0.2:7444.
	BaseURL string
	// Client makes the requests (with the host's client certificate); nil is
	// http.DefaultClient.
	Client *http.Client
}

// peerManifestTimeout bounds one manifest request to a peer: a peer that does not
// answer in that time is skipped, and the node's request goes on.
const peerManifestTimeout = 15 * time.Second

// ClusterParam is the query parameter that scopes a PeerHandler request to one
// cluster's own pushed images; without it, the shared pushed images are read.
const ClusterParam = "cluster"

// PeerHandler serves other hosts of the service, read-only: GET and HEAD of the
// manifests and blobs of pushed images, by canonical name (docker.io/library/busybox,
// or a local name as it is stored), the shared ones, or with ?cluster=NAME that
// cluster's own. A pulled-through image is not served (each host fetches those from
// upstream itself), nor is a blob no pushed manifest of that name and scope
// references. Writes, _catalog and tags/list are refused with DENIED. It does no
// authentication: the daemon serves it only over mutual TLS (internal/daemon/peers.go).
func (s *Server) PeerHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		if err := s.init(); err != nil {
			writeError(rec, err)
		} else {
			s.servePeer(rec, r)
		}
		attrs := []any{"method", r.Method, "path", r.URL.Path, "cluster", r.URL.Query().Get(ClusterParam), "status", rec.status,
			"bytes", rec.bytes, "remote", r.RemoteAddr, "duration", time.Since(start).Round(time.Microsecond)}
		switch {
		case rec.status == http.StatusForbidden:
			s.log.Warn("registry refused a peer's request", append(attrs, "error", rec.errMsg)...)
		case rec.status >= 500:
			s.log.Error("registry peer request failed", append(attrs, "error", rec.errMsg)...)
		default:
			s.log.Debug("registry peer request", attrs...)
		}
	})
}

func (s *Server) servePeer(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	if !isRead(r.Method) {
		fail(w, errf(errDenied, "%s: peers may only read (GET and HEAD)", r.Method))
		return
	}
	rt, ok := parseRoute(r.Method, r.URL.Path)
	if !ok {
		writeJSON(w, http.StatusNotFound, errorBody{[]errorEntry{{Code: "NOT_FOUND", Message: "no such endpoint: " + r.URL.Path}}})
		return
	}
	switch rt.kind {
	case "base":
		writeJSON(w, http.StatusOK, struct{}{})
		return
	case "manifest", "blob":
	default:
		fail(w, errf(errDenied, "peers may read manifests and blobs of pushed images only"))
		return
	}
	repo, err := peerRepo(rt.pathName, r.URL.Query().Get(ClusterParam))
	if err != nil {
		fail(w, err)
		return
	}
	if rt.kind == "manifest" {
		content, mt, digest, err := s.pushedManifest(repo, rt.ref)
		if err != nil {
			fail(w, err)
			return
		}
		h := w.Header()
		h.Set("Content-Type", mt)
		h.Set("Docker-Content-Digest", digest)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(content))
		return
	}
	if err := checkDigest(rt.ref); err != nil {
		fail(w, err)
		return
	}
	if !s.pushedRefs(repo)[rt.ref] {
		fail(w, errf(errBlobUnknown, "blob %s is not part of an image pushed as %s", rt.ref, rt.pathName))
		return
	}
	f, err := s.st.openBlob(rt.ref)
	if err != nil {
		fail(w, err)
		return
	}
	defer f.Close()
	serveBlobFile(w, r, f, rt.ref)
}

// peerRepo is the repository a peer's request names: the canonical name as it is in
// the path (no ?ns= mapping), in cluster's overlay if cluster is set.
func peerRepo(path, cluster string) (string, error) {
	name, err := newNames(nil).local(path)
	if err != nil {
		return "", err
	}
	if name != path {
		return "", errf(errNameInvalid, "%q is not a canonical repository name (want e.g. docker.io/library/busybox)", path)
	}
	if cluster == "" {
		return name, nil
	}
	if !isClusterName(cluster) {
		return "", errf(errNameInvalid, "%s %q is not a cluster name", ClusterParam, cluster)
	}
	return overlay(cluster, name), nil
}

func isClusterName(c string) bool { return componentRE.MatchString(c) && !strings.ContainsAny(c, "._") }

// pushedManifest is manifest repo:ref if it was pushed (or copied from a peer) rather
// than pulled through.
func (s *Server) pushedManifest(repo, ref string) ([]byte, string, string, error) {
	content, mt, digest, err := s.st.getManifest(repo, ref)
	if err != nil {
		return nil, "", "", err
	}
	pushed := false
	if strings.Contains(ref, ":") {
		pushed = s.pushedRefs(repo)[digest]
	} else {
		_, pulled := s.st.pulledTag(repo, ref, digest)
		pushed = !pulled
	}
	if !pushed {
		return nil, "", "", errf(errManifestUnknown, "manifest %s@%s was not pushed on this host", repo, ref)
	}
	return content, mt, digest, nil
}

// pushedRefs is every digest the pushed images of repo are or reference (an index's
// manifests and theirs included). In a repository that cannot be pulled through (a
// local name) everything was pushed; in a mirror's, the images its pushed tags name
// (a manifest pushed there by digest alone is not told from one pulled by digest).
func (s *Server) pushedRefs(repo string) map[string]bool {
	_, name, _ := splitOverlay(repo)
	if _, mirrored := splitCanonical(name); !mirrored {
		return s.st.repoRefs(repo)
	}
	tags, _ := s.st.tags(repo)
	set := map[string]bool{}
	for _, tag := range tags {
		_, _, digest, err := s.st.getManifest(repo, tag)
		if err != nil {
			continue
		}
		if _, pulled := s.st.pulledTag(repo, tag, digest); !pulled {
			s.st.addReachable(digest, set)
		}
	}
	return set
}

// addReachable adds manifest digest and what it references, recursively, to set.
func (st *store) addReachable(digest string, set map[string]bool) {
	if set[digest] {
		return
	}
	set[digest] = true
	b, err := st.readManifestBlob(digest)
	if err != nil {
		return
	}
	m, _, err := parseManifest(b, "")
	if err != nil {
		return
	}
	for _, d := range m.Manifests {
		st.addReachable(d.Digest, set)
	}
	if m.Config != nil {
		set[m.Config.Digest] = true
	}
	for _, l := range m.Layers {
		set[l.Digest] = true
	}
}

func (st *store) readManifestBlob(digest string) ([]byte, error) {
	f, err := st.openBlob(digest)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxManifestSize))
}

// fromPeers looks for name:ref among the peers as v sees it (v's cluster's own images
// first, then the shared ones) and, if one has it, copies it into this store in that
// scope. ok is false when no peer has it (or there are none).
func (s *Server) fromPeers(ctx context.Context, v *view, name, ref string) (content []byte, mt, digest string, ok bool) {
	if s.Peers == nil || v == nil {
		return nil, "", "", false
	}
	peers := s.Peers()
	if len(peers) == 0 {
		return nil, "", "", false
	}
	// One copy at a time per name and reference: the nodes that ask meanwhile wait for
	// it and read the store.
	key := v.tenant + "\x00" + name + "\x00" + ref
	s.peerMu.Lock()
	if wait, busy := s.peerCopies[key]; busy {
		s.peerMu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, "", "", false
		}
		return s.localManifest(v, name, ref)
	}
	done := make(chan struct{})
	if s.peerCopies == nil {
		s.peerCopies = map[string]chan struct{}{}
	}
	s.peerCopies[key] = done
	s.peerMu.Unlock()
	defer func() {
		s.peerMu.Lock()
		delete(s.peerCopies, key)
		s.peerMu.Unlock()
		close(done)
	}()
	scopes := []string{""}
	if v.tenant != "" {
		scopes = []string{v.tenant, ""}
	}
	failed := map[int]bool{} // not asked again in this request
	for _, cluster := range scopes {
		for i, p := range peers {
			if failed[i] {
				continue
			}
			content, mt, digest, err := s.copyFromPeer(ctx, p, cluster, name, ref)
			if err == nil {
				return content, mt, digest, true
			}
			if !IsCode(err, errManifestUnknown) {
				failed[i] = true
				s.log.Warn("asking a peer host for a pushed image", "peer", p.Name, "cluster", cluster, "name", name, "ref", ref, "err", err)
			}
			if ctx.Err() != nil {
				return nil, "", "", false
			}
		}
	}
	return nil, "", "", false
}

// localManifest is name:ref from v's overlay or the shared store, if it is here.
func (s *Server) localManifest(v *view, name, ref string) ([]byte, string, string, bool) {
	if v.tenant != "" {
		if c, mt, d, err := s.st.getManifest(overlay(v.tenant, name), ref); err == nil {
			return c, mt, d, true
		}
	}
	c, mt, d, err := s.st.getManifest(name, ref)
	return c, mt, d, err == nil
}

// copyFromPeer copies pushed image name:ref of scope cluster ("" shared) from p into
// the same scope here: the blobs first, then the manifests, through the store's push
// path (digests checked, an image manifest only once its blobs are all here).
// MANIFEST_UNKNOWN: p does not have it.
func (s *Server) copyFromPeer(ctx context.Context, p Peer, cluster, name, ref string) ([]byte, string, string, error) {
	repo := name
	if cluster != "" {
		repo = overlay(cluster, name)
	}
	start := time.Now()
	content, mt, err := s.peerManifest(ctx, p, cluster, name, ref)
	if err != nil {
		return nil, "", "", err
	}
	m, mt, err := parseManifest(content, mt)
	if err != nil {
		return nil, "", "", fmt.Errorf("peer %s sent manifest %s:%s: %w", p.Name, name, ref, err)
	}
	var n int64
	if isIndexType(mt) {
		for _, c := range m.Manifests {
			k, err := s.copyChildFromPeer(ctx, p, cluster, name, c)
			if IsCode(err, errManifestUnknown) {
				continue // a platform the peer does not hold either
			}
			if err != nil {
				return nil, "", "", err
			}
			n += k
		}
	} else if n, err = s.copyBlobsFromPeer(ctx, p, cluster, name, m); err != nil {
		return nil, "", "", err
	}
	digest, mt, err := s.st.putManifest(repo, ref, content, mt, true)
	if err != nil {
		return nil, "", "", fmt.Errorf("storing %s:%s from peer %s: %w", name, ref, p.Name, err)
	}
	if !strings.Contains(ref, ":") {
		// A pushed tag: never checked against upstream, whatever this host pulled before.
		s.st.forgetPulled(repo, ref)
	}
	s.stored(repo, digest)
	s.log.Info("pushed image copied from a peer host", "peer", p.Name, "cluster", cluster, "name", name, "ref", ref, "digest", digest,
		"bytes", n+int64(len(content)), "duration", time.Since(start).Round(time.Millisecond))
	return content, mt, digest, nil
}

// copyChildFromPeer copies image manifest d that an index lists, with its blobs; the
// index's own putManifest links it.
func (s *Server) copyChildFromPeer(ctx context.Context, p Peer, cluster, name string, d descriptor) (int64, error) {
	content, mt, err := s.peerManifest(ctx, p, cluster, name, d.Digest)
	if err != nil {
		return 0, err
	}
	m, mt, err := parseManifest(content, mt)
	if err != nil {
		return 0, fmt.Errorf("peer %s sent manifest %s@%s: %w", p.Name, name, d.Digest, err)
	}
	if isIndexType(mt) {
		return 0, errf(errManifestInvalid, "peer %s: index %s lists index %s; nested indexes are not copied", p.Name, name, d.Digest)
	}
	n, err := s.copyBlobsFromPeer(ctx, p, cluster, name, m)
	if err != nil {
		return 0, err
	}
	if _, _, err := s.st.writeBlob(bytes.NewReader(content), d.Digest, cluster); err != nil {
		return 0, err
	}
	return n + int64(len(content)), nil
}

// copyBlobsFromPeer fetches the config and layers of image manifest m this store lacks.
func (s *Server) copyBlobsFromPeer(ctx context.Context, p Peer, cluster, name string, m manifestDoc) (int64, error) {
	var n int64
	for _, d := range append([]descriptor{*m.Config}, m.Layers...) {
		if isForeignLayer(d) {
			continue
		}
		if _, err := s.st.statBlob(d.Digest); err == nil {
			continue
		}
		if d.Size > s.maxBlob() {
			return n, errf(errSizeInvalid, "blob %s of %s is %d bytes, over this host's limit of %d", d.Digest, name, d.Size, s.maxBlob())
		}
		body, err := s.peerGet(ctx, p, cluster, name, "blobs", d.Digest)
		if err != nil {
			return n, err
		}
		_, k, err := s.st.writeBlob(&cappedReader{r: body, left: s.maxBlob()}, d.Digest, cluster)
		body.Close()
		n += k
		if err != nil {
			return n, fmt.Errorf("blob %s of %s from peer %s: %w", d.Digest, name, p.Name, err)
		}
	}
	return n, nil
}

// peerManifest fetches manifest name:ref of scope cluster from p, checked against
// its digest (the reference's, or the one p says).
func (s *Server) peerManifest(ctx context.Context, p Peer, cluster, name, ref string) ([]byte, string, error) {
	ctx, cancel := context.WithTimeout(ctx, peerManifestTimeout)
	defer cancel()
	body, res, err := s.peerRequest(ctx, p, cluster, name, "manifests", ref)
	if err != nil {
		return nil, "", err
	}
	defer body.Close()
	content, err := io.ReadAll(io.LimitReader(body, maxManifestSize+1))
	if err != nil {
		return nil, "", fmt.Errorf("reading manifest %s:%s from peer %s: %w", name, ref, p.Name, err)
	}
	if len(content) > maxManifestSize {
		return nil, "", errf(errSizeInvalid, "peer %s sent a manifest over %d bytes", p.Name, maxManifestSize)
	}
	want := res.Header.Get("Docker-Content-Digest")
	if strings.Contains(ref, ":") {
		want = ref
	}
	if got := contentDigest(content); want == "" || got != want {
		return nil, "", errf(errDigestInvalid, "peer %s sent manifest %s:%s with digest %s, not %q", p.Name, name, ref, got, want)
	}
	return content, res.Header.Get("Content-Type"), nil
}

// peerGet opens blob name@digest of scope cluster on p.
func (s *Server) peerGet(ctx context.Context, p Peer, cluster, name, kind, ref string) (io.ReadCloser, error) {
	body, _, err := s.peerRequest(ctx, p, cluster, name, kind, ref)
	return body, err
}

// peerRequest GETs /v2/<name>/<kind>/<ref> from p. A 404 is MANIFEST_UNKNOWN or
// BLOB_UNKNOWN; any other status but 200 an error naming it.
func (s *Server) peerRequest(ctx context.Context, p Peer, cluster, name, kind, ref string) (io.ReadCloser, *http.Response, error) {
	u := strings.TrimSuffix(p.BaseURL, "/") + "/v2/" + name + "/" + kind + "/" + ref
	if cluster != "" {
		u += "?" + url.Values{ClusterParam: {cluster}}.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, nil, err
	}
	if kind == "manifests" {
		req.Header.Set("Accept", strings.Join([]string{MediaTypeOCIManifest, MediaTypeOCIIndex, MediaTypeDockerManifest, MediaTypeDockerList}, ", "))
	}
	c := p.Client
	if c == nil {
		c = http.DefaultClient
	}
	res, err := c.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("peer %s: %w", p.Name, err)
	}
	if res.StatusCode == http.StatusOK {
		return res.Body, res, nil
	}
	msg, _ := io.ReadAll(io.LimitReader(res.Body, 4<<10))
	res.Body.Close()
	if res.StatusCode == http.StatusNotFound {
		code := errManifestUnknown
		if kind == "blobs" {
			code = errBlobUnknown
		}
		return nil, nil, errf(code, "peer %s has no %s %s:%s", p.Name, strings.TrimSuffix(kind, "s"), name, ref)
	}
	return nil, nil, fmt.Errorf("peer %s answered %s for %s: %s", p.Name, res.Status, u, bytes.TrimSpace(msg))
}

func contentDigest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// forgetPulled drops the record that name:tag came from upstream.
func (st *store) forgetPulled(name, tag string) {
	if err := os.Remove(st.pulledPath(name, tag)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		st.log.Warn("forgetting that a tag was pulled", "name", name, "tag", tag, "err", err)
	}
}
