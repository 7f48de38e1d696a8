package registry

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// privateUpstream is a registry (this package's) behind TLS where every repository
// under private/ needs user ci and a password, and where a blob is served only under a
// repository that references it (as distribution does).
type privateUpstream struct {
	*upstreamFake
	password string
	mu       sync.Mutex
	owners   map[string]string // blob digest -> the repository it was pushed for
}

func newPrivateUpstream(t *testing.T) *privateUpstream {
	p := &privateUpstream{upstreamFake: &upstreamFake{hits: map[string]int{}}, password: "s3cret", owners: map[string]string{}}
	p.reg = &Server{Dir: t.TempDir(), Logger: testLogger(t)}
	h := p.reg.Handler()
	p.ts = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := strings.TrimPrefix(r.URL.Path, "/v2/")
		if strings.HasPrefix(path, "private/") {
			u, pw, ok := r.BasicAuth()
			if !ok || u != "ci" || pw != p.password {
				w.Header().Set("WWW-Authenticate", `Basic realm="upstream"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
				return
			}
		}
		if repo, digest, ok := strings.Cut(path, "/blobs/"); ok {
			p.mu.Lock()
			owner, known := p.owners[digest]
			p.mu.Unlock()
			if known && owner != repo {
				http.Error(w, `{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown to registry"}]}`, http.StatusNotFound)
				return
			}
		}
		if kind := strings.Contains(path, "/manifests/"); kind {
			p.mu.Lock()
			p.hits[r.Method+" manifest"]++
			p.mu.Unlock()
		} else if strings.Contains(path, "/blobs/") {
			p.mu.Lock()
			p.hits[r.Method+" blob"]++
			p.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(p.ts.Close)
	p.push = httptestServer(t, p.reg)
	return p
}

func (p *privateUpstream) image(t *testing.T, repo, tag, seed string) testImage {
	img := makeImage(t, p.push, repo, seed, false)
	pushManifest(t, p.push, repo, tag, img.manifest, img.mediaType)
	p.mu.Lock()
	p.owners[sha(img.layer)], p.owners[sha(img.config)] = repo, repo
	p.mu.Unlock()
	return img
}

func basic(user, pw string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pw))
}

// The attacks on visibility: what tenant A pulled with its credentials, tenant
// B cannot have without credentials upstream accepts, by name or by digest, though the
// bytes are on the host; a public image is shared; an image pushed for A is A's alone.
func TestViewsKeepPrivateImagesToTheirCluster(t *testing.T) {
	p := newPrivateUpstream(t)
	secret := p.image(t, "private/app", "1", "the secret layer")
	public := p.image(t, "team/tool", "1", "a public layer")
	pool := x509.NewCertPool()
	pool.AddCert(p.ts.Certificate())
	s := &Server{Dir: t.TempDir(), Logger: testLogger(t), Upstream: &Upstream{Mirrors: map[string]string{"upstream.test": p.ts.URL}, RootCAs: pool, TagTTL: time.Hour}}
	a := httptest.NewServer(s.NodeHandlerFor("a"))
	b := httptest.NewServer(s.NodeHandlerFor("b"))
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	const m = "/v2/private/app/manifests/1?ns=upstream.test"
	layer := func(repo string, img testImage) string {
		return "/v2/" + repo + "/blobs/" + sha(img.layer) + "?ns=upstream.test"
	}

	// A's node asks without credentials: a Basic challenge, which containerd answers
	// with the Pod's imagePullSecret.
	r := do(t, a, "GET", m, nil)
	if r.status != http.StatusUnauthorized || !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Basic ") || !strings.Contains(string(r.body), "imagePullSecret") {
		t.Fatalf("A without credentials: %d %q %s; want 401 with a Basic challenge naming an imagePullSecret", r.status, r.header.Get("WWW-Authenticate"), r.body)
	}
	if r := do(t, a, "GET", m, nil, "Authorization", basic("ci", "wrong")); r.status != http.StatusUnauthorized || !strings.Contains(string(r.body), "refused the credentials") {
		t.Fatalf("A with a wrong password: %d %s; want 401 saying upstream refused them", r.status, r.body)
	}
	do(t, a, "GET", m, nil, "Authorization", basic("ci", p.password)).expect(t, "A with credentials", http.StatusOK)
	if got := do(t, a, "GET", layer("private/app", secret), nil, "Authorization", basic("ci", p.password)).expect(t, "A's layer", http.StatusOK); string(got.body) != string(secret.layer) {
		t.Fatalf("A's layer is %q", got.body)
	}
	// Cached for A: later pulls need no credentials and no upstream request.
	gets := p.count("GET manifest")
	do(t, a, "GET", m, nil).expect(t, "A again, cached", http.StatusOK)
	do(t, a, "GET", layer("private/app", secret), nil).expect(t, "A's layer again", http.StatusOK)
	if p.count("GET manifest") != gets {
		t.Error("A's cached private manifest was fetched again")
	}

	// B, the attacker, knows the name and the digests.
	for _, tc := range []struct {
		name, path string
		hdr        []string
		status     int
	}{
		{"the tag, no credentials", m, nil, http.StatusUnauthorized},
		{"the tag, a wrong password", m, []string{"Authorization", basic("ci", "guess")}, http.StatusUnauthorized},
		{"the manifest by digest", "/v2/private/app/manifests/" + sha(secret.manifest) + "?ns=upstream.test", nil, http.StatusUnauthorized},
		{"the layer under its name", layer("private/app", secret), nil, http.StatusUnauthorized},
		{"the layer under a public name", layer("team/tool", secret), nil, http.StatusNotFound},
		{"the layer under a local name", "/v2/scratch/blobs/" + sha(secret.layer), nil, http.StatusNotFound},
		{"the layer under A's overlay path", "/v2/_tenants/a/upstream.test/private/app/blobs/" + sha(secret.layer), nil, http.StatusBadRequest},
		{"the tags", "/v2/private/app/tags/list?ns=upstream.test", nil, http.StatusNotFound},
	} {
		t.Run("B: "+tc.name, func(t *testing.T) {
			r := do(t, b, "GET", tc.path, nil, tc.hdr...)
			if r.status != tc.status || bytes.Contains(r.body, secret.layer) || bytes.Contains(r.body, secret.manifest) {
				t.Errorf("GET %s: %d %s; want %d and nothing of A's image", tc.path, r.status, r.body, tc.status)
			}
		})
	}

	// What B's Pod is told (internal/pullevents puts it in an Event).
	if f, ok := s.LastFailure("b", "upstream.test/private/app:1"); !ok || f.Reason != "ImageNotAllowed" || !strings.Contains(f.Message, "imagePullSecret") {
		t.Errorf("LastFailure(b) = %+v, %v; want ImageNotAllowed naming an imagePullSecret", f, ok)
	}
	if f, ok := s.LastFailure("a", "upstream.test/private/app:1"); ok {
		t.Errorf("LastFailure(a) = %+v after A's successful pull, want none", f)
	}

	// B with credentials upstream accepts gets the image too; the bytes are not
	// fetched again (upstream is asked about them, not for them).
	blobGets := p.count("GET blob")
	do(t, b, "GET", m, nil, "Authorization", basic("ci", p.password)).expect(t, "B with credentials", http.StatusOK)
	do(t, b, "GET", layer("private/app", secret), nil, "Authorization", basic("ci", p.password)).expect(t, "B's layer", http.StatusOK)
	if p.count("GET blob") != blobGets {
		t.Error("B's pull fetched the layer's bytes again: a layer is stored once")
	}

	// A public image is shared: both pull it without credentials, fetched once.
	for _, v := range []*httptest.Server{a, b} {
		do(t, v, "GET", "/v2/team/tool/manifests/1?ns=upstream.test", nil).expect(t, "public manifest", http.StatusOK)
		do(t, v, "GET", layer("team/tool", public), nil).expect(t, "public layer", http.StatusOK)
	}
	if got := p.count("GET blob") - blobGets; got != 1 {
		t.Errorf("the public layer was fetched %d times for two clusters, want 1", got)
	}

	// Pushed for A alone: A sees it, B does not, though both name it the same.
	entries, digests := ociLayout(t, []map[string]string{{}})
	if _, err := s.ImportFor(context.Background(), "a", bytes.NewReader(makeTar(t, entries, false)), "localhost:5000/app:1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ImportFor(context.Background(), "a/../b", bytes.NewReader(makeTar(t, entries, false)), "localhost:5000/app:1"); err == nil {
		t.Error("ImportFor took a cluster name with a path in it")
	}
	do(t, a, "GET", "/v2/app/manifests/1", nil).expect(t, "A's own image", http.StatusOK)
	do(t, b, "GET", "/v2/app/manifests/1", nil).expect(t, "B asking for A's own image", http.StatusNotFound)
	do(t, b, "GET", "/v2/app/manifests/"+digests[0], nil).expect(t, "B asking for A's own image by digest", http.StatusNotFound)
	var doc manifestDoc
	json.Unmarshal(do(t, a, "GET", "/v2/app/manifests/1", nil).body, &doc)
	do(t, a, "GET", "/v2/app/blobs/"+doc.Layers[0].Digest, nil).expect(t, "A's own layer", http.StatusOK)
	do(t, b, "GET", "/v2/app/blobs/"+doc.Layers[0].Digest, nil).expect(t, "B asking for A's own layer", http.StatusNotFound)
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, r := range list {
		seen[r.Name+":"+r.Tag] = r.Cluster
	}
	if c, ok := seen["app:1"]; !ok || c != "a" {
		t.Errorf("List says app:1 is seen by %q (listed %v), want cluster a", c, ok)
	}

	// A goes: its overlay with it.
	if err := ForgetCluster(s.Dir, "a"); err != nil {
		t.Fatal(err)
	}
	if r := do(t, a, "GET", m, nil); r.status != http.StatusUnauthorized {
		t.Errorf("a new cluster named a got the deleted one's private image: %d", r.status)
	}
}

// Only images every cluster may pull reach the layer share (LayersStored, AllLayers):
// not those pushed for one cluster, nor those pulled with one's credentials.
func TestLayerShareHoldsOnlySharedImages(t *testing.T) {
	p := newPrivateUpstream(t)
	secret := p.image(t, "private/app", "1", "secret")
	public := p.image(t, "team/tool", "1", "public")
	pool := x509.NewCertPool()
	pool.AddCert(p.ts.Certificate())
	var mu sync.Mutex
	announced := map[string]bool{}
	s := &Server{Dir: t.TempDir(), Logger: testLogger(t), Upstream: &Upstream{Mirrors: map[string]string{"upstream.test": p.ts.URL}, RootCAs: pool},
		LayersStored: func(ls []Layer) {
			mu.Lock()
			defer mu.Unlock()
			for _, l := range ls {
				announced[l.Digest] = true
			}
		}}
	a := httptest.NewServer(s.NodeHandlerFor("a"))
	t.Cleanup(a.Close)
	creds := []string{"Authorization", basic("ci", p.password)}
	for _, img := range []struct {
		repo string
		img  testImage
	}{{"private/app", secret}, {"team/tool", public}} {
		do(t, a, "GET", "/v2/"+img.repo+"/manifests/1?ns=upstream.test", nil, creds...).expect(t, "manifest", http.StatusOK)
		for _, b := range [][]byte{img.img.config, img.img.layer} {
			do(t, a, "GET", "/v2/"+img.repo+"/blobs/"+sha(b)+"?ns=upstream.test", nil, creds...).expect(t, "blob", http.StatusOK)
		}
	}
	entries, _ := ociLayout(t, []map[string]string{{}})
	if _, err := s.ImportFor(context.Background(), "a", bytes.NewReader(makeTar(t, entries, false)), "localhost:5000/own:1"); err != nil {
		t.Fatal(err)
	}
	var own manifestDoc
	json.Unmarshal(do(t, a, "GET", "/v2/own/manifests/1", nil).expect(t, "own", http.StatusOK).body, &own)
	mu.Lock()
	if !announced[sha(public.layer)] || announced[sha(secret.layer)] || announced[own.Layers[0].Digest] {
		t.Errorf("announced %v: want the public layer %s only", announced, sha(public.layer))
	}
	mu.Unlock()
	all, err := s.AllLayers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range all {
		if l.Digest == sha(secret.layer) || l.Digest == own.Layers[0].Digest {
			t.Errorf("AllLayers lists %s, a layer of a cluster's own image", l.Digest)
		}
	}
}

// Tenant B runs a registry that says yes to every blob: naming A's private layer under
// it gets B only what B's registry sends, never the bytes A pulled, and no fetch of A's.
func TestALyingUpstreamGetsNoStoredBlob(t *testing.T) {
	p := newPrivateUpstream(t)
	secret := p.image(t, "private/app", "1", "the secret layer")
	evil := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/blobs/") {
			w.Header().Set("Content-Length", "5")
			w.WriteHeader(http.StatusOK)
			if r.Method == http.MethodGet {
				w.Write([]byte("bogus"))
			}
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(evil.Close)
	pool := x509.NewCertPool()
	pool.AddCert(p.ts.Certificate())
	pool.AddCert(evil.Certificate())
	s := &Server{Dir: t.TempDir(), Logger: testLogger(t), Upstream: &Upstream{Mirrors: map[string]string{"upstream.test": p.ts.URL, "evil.test": evil.URL}, RootCAs: pool}}
	a := httptest.NewServer(s.NodeHandlerFor("a"))
	b := httptest.NewServer(s.NodeHandlerFor("b"))
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	creds := []string{"Authorization", basic("ci", p.password)}
	do(t, a, "GET", "/v2/private/app/manifests/1?ns=upstream.test", nil, creds...).expect(t, "A's private manifest", http.StatusOK)
	do(t, a, "GET", "/v2/private/app/blobs/"+sha(secret.layer)+"?ns=upstream.test", nil, creds...).expect(t, "A's private layer", http.StatusOK)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := s.st.statBlob(sha(secret.layer)); err == nil {
			break // the fill is committed: the stored copy is what B must not get
		}
		if time.Now().After(deadline) {
			t.Fatal("A's layer was not stored")
		}
	}

	res, err := b.Client().Get(b.URL + "/v2/x/blobs/" + sha(secret.layer) + "?ns=evil.test")
	var got []byte
	if err == nil {
		got, _ = io.ReadAll(res.Body)
		res.Body.Close()
	}
	if bytes.Contains(got, secret.layer) {
		t.Fatalf("B got A's private layer through a registry that lies: %q", got)
	}
	if _, err := s.st.statBlob(sha(secret.layer)); err != nil {
		t.Error("A's layer was lost")
	}
}
