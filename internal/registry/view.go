package registry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
)

// What a cluster's nodes may see.
//
// Every cluster sees the shared images: those the operator pushed host-wide and those
// pulled through anonymously (a public image crosses the uplink once for all tenants:
// that is the point of the cache). Besides, each cluster has an overlay of its own,
// the repository _tenants/<cluster>/<name>, read first: images pushed for it alone
// (`image push --cluster`) and images it pulled with credentials (upstream refused an
// anonymous pull). Another cluster never reads that overlay: naming the same image
// without credentials upstream accepts, it is refused, even though the bytes are here.
//
// Blobs are stored once, whoever pulled them, but a node is served a blob under a
// name only if its view of that name references it, or upstream says the name holds
// it for this node's credentials (or none). Knowing a digest is not enough.
//
// Credentials come from the node: when upstream wants them, the node is answered 401
// with a Basic challenge, and containerd sends the Pod's imagePullSecret (kubelet
// hands it to the CRI for the image's registry). They travel over the cluster's own
// bridge, are used for that request's upstream calls, and are not stored.

type view struct {
	tenant string              // "" sees the shared images only
	auth   authn.Authenticator // what the node sent; nil: nothing
}

func (v *view) forRequest(r *http.Request) *view {
	out := &view{tenant: v.tenant}
	if u, p, ok := r.BasicAuth(); ok && (u != "" || p != "") {
		out.auth = &authn.Basic{Username: u, Password: p}
	}
	return out
}

func (v *view) credentials() authn.Authenticator {
	if v == nil || v.auth == nil {
		return authn.Anonymous
	}
	return v.auth
}

// tenantsDir holds the clusters' overlays among the repositories; a repository name
// component cannot start with "_", so no image name reaches it.
const tenantsDir = "_tenants"

func overlay(tenant, name string) string { return tenantsDir + "/" + tenant + "/" + name }

// splitOverlay returns the cluster and name of an overlay repository.
func splitOverlay(repo string) (tenant, name string, ok bool) {
	rest, ok := strings.CutPrefix(repo, tenantsDir+"/")
	if !ok {
		return "", repo, false
	}
	tenant, name, ok = strings.Cut(rest, "/")
	return tenant, name, ok
}

// upstreamOf is the upstream repository of name, if the registry pulls it through.
func (s *Server) upstreamOf(name string) (upstreamRef, bool) {
	up, ok := splitCanonical(name)
	if s.Upstream == nil || !ok || s.names.isSelf(up.registry) {
		return upstreamRef{}, false
	}
	return up, true
}

func isAuthErr(err error) bool {
	var ue *UpstreamError
	return errors.As(err, &ue) && (ue.Status == http.StatusUnauthorized || ue.Status == http.StatusForbidden)
}

func challenge(up upstreamRef) error {
	return errf(errUnauthorized, "upstream %s wants credentials for %s and this node sent none: give the Pod an imagePullSecret for %s", up.registry, up.canonical, up.registry)
}

// readManifest is manifest name:ref as v sees it, fetched from upstream first when
// it is missing or its tag is due a check. v nil is the host (shared images).
func (s *Server) readManifest(ctx context.Context, v *view, name, ref string) ([]byte, string, string, error) {
	if v != nil && v.tenant != "" {
		over := overlay(v.tenant, name)
		content, mt, digest, err := s.st.getManifest(over, ref)
		if err == nil {
			return s.overlayManifest(ctx, v, over, name, ref, content, mt, digest)
		}
		if !IsCode(err, errManifestUnknown) {
			return nil, "", "", err
		}
	}
	content, mt, digest, err := s.st.getManifest(name, ref)
	if IsCode(err, errManifestUnknown) {
		// Pushed on another host, perhaps: asked there before upstream (peers.go).
		if c, m, d, ok := s.fromPeers(ctx, v, name, ref); ok {
			return c, m, d, nil
		}
	}
	up, ok := s.upstreamOf(name)
	if !ok {
		return content, mt, digest, err
	}
	if err == nil {
		if strings.HasPrefix(ref, "sha256:") {
			s.metrics.hit()
			return content, mt, digest, nil
		}
		checked, pulled := s.st.pulledTag(name, ref, digest)
		if !pulled || time.Since(checked) < s.Upstream.TagTTL {
			s.metrics.hit()
			return content, mt, digest, nil
		}
		_, _, now, herr := s.Upstream.fetchManifest(ctx, up, ref, true, authn.Anonymous)
		switch {
		case herr == nil && now == digest:
			s.st.markPulled(name, ref, digest)
			s.metrics.hit()
			return content, mt, digest, nil
		case herr == nil:
			s.log.Info("upstream tag moved; fetching", "name", name, "tag", ref, "from", digest, "to", now)
		case isAuthErr(herr):
			// Upstream now wants credentials: the shared copy is no longer everyone's.
			return s.privateManifest(ctx, v, up, name, ref)
		default:
			s.log.Warn("upstream unreachable for a tag check; serving the cached manifest", "name", name, "tag", ref, "digest", digest, "err", herr)
			s.metrics.staleServed()
			return content, mt, digest, nil
		}
	} else if !IsCode(err, errManifestUnknown) {
		return nil, "", "", err
	}
	s.metrics.miss()
	b, umt, udigest, ferr := s.Upstream.fetchManifest(ctx, up, ref, false, authn.Anonymous)
	switch {
	case ferr == nil:
		return s.storePulled(v, name, ref, b, umt, udigest)
	case isAuthErr(ferr):
		return s.privateManifest(ctx, v, up, name, ref)
	case err == nil:
		s.log.Warn("upstream fetch of a moved tag failed; serving the cached manifest", "name", name, "tag", ref, "err", ferr)
		s.metrics.staleServed()
		return content, mt, digest, nil
	}
	s.noteFailure(v, name, ref, ferr)
	return nil, "", "", asRegistryError(up, "manifest "+ref, ferr)
}

// privateManifest fetches name:ref with the node's credentials into its cluster's
// overlay, or asks the node for credentials.
func (s *Server) privateManifest(ctx context.Context, v *view, up upstreamRef, name, ref string) ([]byte, string, string, error) {
	if v == nil || v.tenant == "" || v.auth == nil {
		s.noteFailure(v, name, ref, errors.New("upstream wants credentials; none sent"))
		return nil, "", "", challenge(up)
	}
	b, umt, udigest, err := s.Upstream.fetchManifest(ctx, up, ref, false, v.auth)
	if err != nil {
		s.noteFailure(v, name, ref, err)
		return nil, "", "", asRegistryError(up, "manifest "+ref, err)
	}
	s.log.Info("pulled with a cluster's credentials; only it sees the image", "cluster", v.tenant, "name", name, "ref", ref)
	return s.storePulled(v, overlay(v.tenant, name), ref, b, umt, udigest)
}

// overlayManifest serves a manifest of v's own overlay: pushed for it (never checked)
// or pulled with its credentials (a tag is checked with them again after the TTL,
// so a cluster whose credentials were revoked stops getting the tag).
func (s *Server) overlayManifest(ctx context.Context, v *view, over, name, ref string, content []byte, mt, digest string) ([]byte, string, string, error) {
	checked, pulled := s.st.pulledTag(over, ref, digest)
	up, ok := s.upstreamOf(name)
	if strings.HasPrefix(ref, "sha256:") || !pulled || !ok || time.Since(checked) < s.Upstream.TagTTL {
		s.metrics.hit()
		return content, mt, digest, nil
	}
	if v.auth == nil {
		return nil, "", "", challenge(up)
	}
	_, _, now, herr := s.Upstream.fetchManifest(ctx, up, ref, true, v.auth)
	switch {
	case herr == nil && now == digest:
		s.st.markPulled(over, ref, digest)
		s.metrics.hit()
		return content, mt, digest, nil
	case herr == nil:
		b, umt, udigest, err := s.Upstream.fetchManifest(ctx, up, ref, false, v.auth)
		if err == nil {
			s.metrics.miss()
			return s.storePulled(v, over, ref, b, umt, udigest)
		}
		herr = err
	}
	if isAuthErr(herr) {
		s.noteFailure(v, name, ref, herr)
		return nil, "", "", asRegistryError(up, "manifest "+ref, herr)
	}
	s.log.Warn("upstream unreachable for a tag check; serving the cluster's cached manifest", "cluster", v.tenant, "name", name, "tag", ref, "err", herr)
	s.metrics.staleServed()
	return content, mt, digest, nil
}

// storePulled stores manifest b, fetched from upstream for v (nil: the host), as
// repo:ref, charged to v's cluster if new. That cluster's quota is asked first, for
// the manifest and the blobs it references that are not stored yet.
func (s *Server) storePulled(v *view, repo, ref string, b []byte, umt, udigest string) ([]byte, string, string, error) {
	s.metrics.fromUpstream(int64(len(b)))
	by := ""
	if v != nil {
		by = v.tenant
	}
	if by != "" && s.ClusterQuota > 0 {
		if why := s.overQuota(by, s.st.newBytes(b, umt)); why != "" {
			s.noteFailure(v, repo, ref, errors.New(why))
			return nil, "", "", errf(errOverQuota, "%s", why)
		}
	}
	got, gmt, err := s.st.putPulledManifest(repo, ref, b, umt, by)
	if err != nil {
		return nil, "", "", fmt.Errorf("storing manifest %s:%s from upstream: %w", repo, ref, err)
	}
	if udigest != "" && udigest != got {
		s.log.Warn("upstream's Docker-Content-Digest differs from its manifest's digest; the content's is kept", "name", repo, "ref", ref, "header", udigest, "content", got)
	}
	s.log.Info("manifest pulled through", "name", repo, "ref", ref, "digest", got, "mediaType", gmt)
	s.awaitLayers(repo, got, gmt)
	return b, gmt, got, nil
}

// nodeBlob serves blob digest under name to a node, if its view entitles it.
func (s *Server) nodeBlob(w http.ResponseWriter, r *http.Request, v *view, name, digest string) {
	if err := checkDigest(digest); err != nil {
		fail(w, err)
		return
	}
	up, pulls := s.upstreamOf(name)
	serve := func(auth authn.Authenticator) {
		f, err := s.st.openBlob(digest)
		if IsCode(err, errBlobUnknown) && pulls {
			s.pullBlob(w, r, v, up, digest, auth)
			return
		}
		if err != nil {
			fail(w, err)
			return
		}
		defer f.Close()
		serveBlobFile(w, r, f, digest)
	}
	if v.tenant != "" && s.st.repoRefs(overlay(v.tenant, name))[digest] {
		if _, err := s.st.statBlob(digest); err != nil && v.auth == nil && pulls {
			// Only credentials fetch the rest of a private image.
			fail(w, challenge(up))
			return
		}
		serve(v.credentials())
		return
	}
	if s.st.repoRefs(name)[digest] {
		serve(authn.Anonymous)
		return
	}
	if !pulls {
		fail(w, errf(errBlobUnknown, "blob %s is not part of %s", digest, name))
		return
	}
	// Not in this view of name. Upstream saying it holds the blob proves nothing (a
	// tenant can run a registry that says yes to every digest), so the node gets only
	// the bytes its upstream sends, fetched for it alone: never the stored copy, never
	// another node's fetch. What arrives and matches the digest is kept if new.
	if why := s.Upstream.allowed(up.registry); why != "" {
		fail(w, errf(errDenied, "%s", why))
		return
	}
	s.passThrough(w, r, v, name, up, digest)
}

// passThrough streams blob digest of up, fetched with v's credentials, to the node,
// and stores it if it matches and the store lacks it.
func (s *Server) passThrough(w http.ResponseWriter, r *http.Request, v *view, name string, up upstreamRef, digest string) {
	s.metrics.miss()
	method := http.MethodGet
	if r.Method == http.MethodHead {
		method = http.MethodHead // upstream's word, and no bytes
	}
	body, size, err := s.Upstream.blobRequest(r.Context(), method, up, digest, v.credentials())
	if err != nil {
		if isAuthErr(err) && v.auth == nil {
			fail(w, challenge(up))
			return
		}
		s.noteFailure(v, name, digest, err)
		fail(w, asRegistryError(up, "blob "+digest, err))
		return
	}
	defer body.Close()
	if size > s.maxBlob() {
		fail(w, errf(errSizeInvalid, "blob %s of %s is %d bytes upstream, over this host's limit of %d", digest, up.canonical, size, s.maxBlob()))
		return
	}
	tmp, err := s.st.tempFile("pass")
	if err != nil {
		fail(w, err)
		return
	}
	defer os.Remove(tmp.Name())
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Docker-Content-Digest", digest)
	if size >= 0 {
		h.Set("Content-Length", fmt.Sprint(size))
	}
	w.WriteHeader(http.StatusOK)
	if method == http.MethodHead {
		return
	}
	sum := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, tmp, sum), &cappedReader{r: body, left: s.maxBlob()})
	s.metrics.fromUpstream(n)
	if err != nil || (size >= 0 && n != size) || "sha256:"+hex.EncodeToString(sum.Sum(nil)) != digest {
		tmp.Close()
		panic(http.ErrAbortHandler) // the node sees a cut body and discards it
	}
	if _, err := s.st.statBlob(digest); err != nil {
		// Kept only within the node's cluster's quota; the node has its bytes either way.
		if why := s.overQuota(v.tenant, n); why != "" {
			tmp.Close()
			s.log.Info("a passed-through blob is not kept", "cluster", v.tenant, "digest", digest, "why", why)
		} else if err := s.st.commitBlob(tmp, digest, v.tenant); err != nil {
			s.log.Warn("keeping a passed-through blob", "digest", digest, "err", err)
		}
		return
	}
	tmp.Close()
}

func serveBlobFile(w http.ResponseWriter, r *http.Request, f *os.File, digest string) {
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Docker-Content-Digest", digest)
	h.Set("ETag", `"`+digest+`"`)
	h.Set("Cache-Control", "max-age=31536000")
	http.ServeContent(w, r, "", time.Time{}, f)
}

// tags lists name's tags as v sees them: the shared ones and its overlay's.
func (s *Server) tags(v *view, name string) ([]string, error) {
	tags, err := s.st.tags(name)
	if v == nil || v.tenant == "" {
		return tags, err
	}
	own, oerr := s.st.tags(overlay(v.tenant, name))
	if err != nil && oerr != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, t := range append(tags, own...) {
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	sort.Strings(out)
	return out, nil
}

// repoRefs is every digest repository name's manifests are or reference (configs,
// layers, an index's manifests), cached until a manifest is added.
func (s *store) repoRefs(name string) map[string]bool {
	dir := filepath.Join(s.manifestsDir(name), "revisions", "sha256")
	st, err := os.Stat(dir)
	if err != nil {
		return nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	s.mu.Lock()
	c, ok := s.refs[name]
	s.mu.Unlock()
	if ok && c.mtime.Equal(st.ModTime()) && c.n == len(ents) {
		return c.set
	}
	set := map[string]bool{}
	for _, e := range ents {
		d := "sha256:" + e.Name()
		if checkDigest(d) != nil {
			continue
		}
		set[d] = true
		b, err := os.ReadFile(s.blobPath(d))
		if err != nil {
			continue
		}
		m, _, err := parseManifest(b, "")
		if err != nil {
			continue
		}
		if m.Config != nil {
			set[m.Config.Digest] = true
		}
		for _, l := range m.Layers {
			set[l.Digest] = true
		}
		for _, l := range m.Manifests {
			set[l.Digest] = true
		}
	}
	s.mu.Lock()
	if s.refs == nil {
		s.refs = map[string]refsCache{}
	}
	s.refs[name] = refsCache{st.ModTime(), len(ents), set}
	s.mu.Unlock()
	return set
}

type refsCache struct {
	mtime time.Time
	n     int
	set   map[string]bool
}

// ForgetCluster removes cluster's overlay from the registry in dir: the images pushed
// for it and the tags it pulled with credentials, and its charges. Their blobs stay
// for the other clusters that reference them (and for garbage collection), charged to
// nobody.
func ForgetCluster(dir, cluster string) error {
	if cluster == "" || strings.ContainsAny(cluster, "/.") {
		return fmt.Errorf("forgetting cluster %q: not a cluster name", cluster)
	}
	for _, d := range []string{filepath.Join(dir, "repositories", tenantsDir, cluster), filepath.Join(dir, "upstream", tenantsDir, cluster), filepath.Join(dir, chargesDir, cluster)} {
		if err := os.RemoveAll(d); err != nil {
			return fmt.Errorf("forgetting cluster %s's images: %w", cluster, err)
		}
	}
	return nil
}
