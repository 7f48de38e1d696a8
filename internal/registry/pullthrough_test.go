package registry

import (
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// upstreamFake is a real registry (this package's, read-write) behind TLS that counts
// the requests it is sent, standing in for docker.io or ghcr.io.
type upstreamFake struct {
	reg  *Server
	ts   *httptest.Server
	push *httptest.Server // plain, for the test to push to
	mu   sync.Mutex
	hits map[string]int // "GET manifest", "HEAD manifest", "GET blob"
	gate chan struct{}  // if set, blob GETs wait for it to close
	down atomic.Bool
}

func newUpstream(t *testing.T) *upstreamFake {
	u := &upstreamFake{hits: map[string]int{}}
	u.reg = &Server{Dir: t.TempDir(), Logger: testLogger(t)}
	h := u.reg.Handler()
	u.ts = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u.down.Load() {
			hj, _ := w.(http.Hijacker)
			c, _, _ := hj.Hijack()
			c.Close()
			return
		}
		kind := ""
		switch {
		case strings.Contains(r.URL.Path, "/manifests/"):
			kind = "manifest"
		case strings.Contains(r.URL.Path, "/blobs/"):
			kind = "blob"
		}
		if kind != "" {
			u.mu.Lock()
			u.hits[r.Method+" "+kind]++
			gate := u.gate
			u.mu.Unlock()
			if kind == "blob" && gate != nil {
				<-gate
			}
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(u.ts.Close)
	u.push = httptestServer(t, u.reg)
	return u
}

// publish pushes a new image (its layer made from seed) upstream as repo:tag.
func (u *upstreamFake) publish(t *testing.T, repo, tag, seed string) (testImage, string) {
	img := makeImage(t, u.push, repo, seed, false)
	return img, pushManifest(t, u.push, repo, tag, img.manifest, img.mediaType)
}

func (u *upstreamFake) count(k string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[k]
}

// cache is a host registry pulling "upstream.test" through from u.
func (u *upstreamFake) cache(t *testing.T, tweak func(*Upstream)) (*Server, *httptest.Server) {
	pool := x509.NewCertPool()
	pool.AddCert(u.ts.Certificate())
	up := &Upstream{Mirrors: map[string]string{"upstream.test": u.ts.URL}, RootCAs: pool}
	if tweak != nil {
		tweak(up)
	}
	s := &Server{Dir: t.TempDir(), Logger: testLogger(t), Upstream: up}
	node := httptest.NewServer(s.NodeHandler())
	t.Cleanup(node.Close)
	return s, node
}

// A node pulls an image the host never had: the manifest and blobs come from upstream
// once, and every later pull is served from the store.
func TestPullThroughFetchesOnceThenServesFromTheStore(t *testing.T) {
	u := newUpstream(t)
	img, d := u.publish(t, "team/app", "1.0", "v1")
	_, node := u.cache(t, nil)

	for round := 1; round <= 3; round++ {
		r := do(t, node, "GET", "/v2/team/app/manifests/1.0?ns=upstream.test", nil, "Accept", manifestAccept).expect(t, "manifest", http.StatusOK)
		if r.header.Get("Docker-Content-Digest") != d || string(r.body) != string(img.manifest) {
			t.Fatalf("round %d: manifest %s, want %s", round, r.header.Get("Docker-Content-Digest"), d)
		}
		for _, b := range [][]byte{img.config, img.layer} {
			r := do(t, node, "GET", "/v2/team/app/blobs/"+sha(b)+"?ns=upstream.test", nil).expect(t, "blob", http.StatusOK)
			if string(r.body) != string(b) {
				t.Fatalf("round %d: blob %s is %q, want %q", round, sha(b), r.body, b)
			}
		}
	}
	if got := u.count("GET manifest"); got != 1 {
		t.Errorf("upstream saw %d manifest GETs for three pulls, want 1", got)
	}
	if got := u.count("GET blob"); got != 2 {
		t.Errorf("upstream saw %d blob GETs for three pulls of two blobs, want 2", got)
	}
	// A digest reference is never checked again, whatever the TTL.
	do(t, node, "HEAD", "/v2/team/app/manifests/"+d+"?ns=upstream.test", nil).expect(t, "by digest", http.StatusOK)
	if got := u.count("HEAD manifest") + u.count("GET manifest"); got != 1 {
		t.Errorf("a digest pull asked upstream (%d manifest requests in all)", got)
	}
}

// Nodes pulling a blob at the same time share one upstream fetch, and each starts
// receiving bytes before upstream has sent the whole blob.
func TestPullThroughSharesOneFetchAndStreams(t *testing.T) {
	u := newUpstream(t)
	img, _ := u.publish(t, "team/big", "1", "v1")
	_, node := u.cache(t, nil)
	do(t, node, "GET", "/v2/team/big/manifests/1?ns=upstream.test", nil).expect(t, "the manifest, first, as containerd does", http.StatusOK)
	u.mu.Lock()
	u.gate = make(chan struct{})
	u.mu.Unlock()

	var wg sync.WaitGroup
	bodies := make([]string, 4)
	for i := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := node.Client().Get(node.URL + "/v2/team/big/blobs/" + sha(img.layer) + "?ns=upstream.test")
			if err != nil {
				t.Error(err)
				return
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			bodies[i] = string(b)
		}()
	}
	time.Sleep(300 * time.Millisecond) // all four are waiting on the one fetch
	close(u.gate)
	wg.Wait()
	for i, b := range bodies {
		if b != string(img.layer) {
			t.Errorf("node %d got %q, want the layer", i, b)
		}
	}
	if got := u.count("GET blob"); got != 1 {
		t.Errorf("upstream saw %d GETs of the blob for four nodes at once, want 1", got)
	}
}

// A tag is trusted for TagTTL, then checked with a HEAD; a moved tag is fetched again.
// A tag pushed on the host is never replaced from upstream.
func TestPullThroughTagTTL(t *testing.T) {
	u := newUpstream(t)
	_, d1 := u.publish(t, "team/app", "latest", "v1")
	ttl := 300 * time.Millisecond
	s, node := u.cache(t, func(up *Upstream) { up.TagTTL = ttl })
	get := func() string {
		return do(t, node, "HEAD", "/v2/team/app/manifests/latest?ns=upstream.test", nil).expect(t, "manifest", http.StatusOK).header.Get("Docker-Content-Digest")
	}
	if got := get(); got != d1 {
		t.Fatalf("first pull %s, want %s", got, d1)
	}
	_, d2 := u.publish(t, "team/app", "latest", "v2")
	if got := get(); got != d1 {
		t.Errorf("within the TTL: %s, want the cached %s", got, d1)
	}
	time.Sleep(ttl + 50*time.Millisecond)
	if got := get(); got != d2 {
		t.Errorf("after the TTL: %s, want the moved tag's %s", got, d2)
	}
	if got := u.count("HEAD manifest"); got != 1 {
		t.Errorf("upstream saw %d HEADs, want 1 (one check after the TTL)", got)
	}

	// The operator pushes their own build over the tag: upstream never overrides it.
	host := httptestServer(t, s)
	mine := makeImage(t, host, "upstream.test/team/app", "mine", false)
	dm := pushManifest(t, host, "upstream.test/team/app", "latest", mine.manifest, mine.mediaType)
	time.Sleep(ttl + 50*time.Millisecond)
	heads := u.count("HEAD manifest")
	if got := get(); got != dm {
		t.Errorf("pushed tag: %s, want %s", got, dm)
	}
	if u.count("HEAD manifest") != heads {
		t.Error("a pushed tag was checked against upstream")
	}
}

// Upstream down: what is cached is still served, past its TTL; what is not gets an
// error that says upstream could not be reached.
func TestPullThroughUpstreamDown(t *testing.T) {
	u := newUpstream(t)
	img, d := u.publish(t, "team/app", "1", "v1")
	_, node := u.cache(t, func(up *Upstream) { up.TagTTL = time.Millisecond; up.Timeout = 2 * time.Second })
	do(t, node, "GET", "/v2/team/app/manifests/1?ns=upstream.test", nil).expect(t, "warm", http.StatusOK)
	do(t, node, "GET", "/v2/team/app/blobs/"+sha(img.layer)+"?ns=upstream.test", nil).expect(t, "warm", http.StatusOK)
	u.down.Store(true)
	time.Sleep(5 * time.Millisecond)
	r := do(t, node, "GET", "/v2/team/app/manifests/1?ns=upstream.test", nil).expect(t, "cached, upstream down", http.StatusOK)
	if r.header.Get("Docker-Content-Digest") != d {
		t.Errorf("cached manifest %s, want %s", r.header.Get("Docker-Content-Digest"), d)
	}
	do(t, node, "GET", "/v2/team/app/blobs/"+sha(img.layer)+"?ns=upstream.test", nil).expect(t, "cached blob", http.StatusOK)
	r = do(t, node, "GET", "/v2/team/other/manifests/1?ns=upstream.test", nil).expect(t, "uncached, upstream down", http.StatusServiceUnavailable)
	if r.errCode() != errUnavailable || !strings.Contains(string(r.body), "could not be reached") || strings.Contains(string(r.body), "plain http") {
		t.Errorf("body %s: want UNAVAILABLE saying upstream could not be reached", r.body)
	}
}

// What upstream refuses, and what the operator's lists refuse, reach the node as
// errors that say so; and a tenant cannot point the host at a private address.
func TestPullThroughRefusals(t *testing.T) {
	u := newUpstream(t)
	img, _ := u.publish(t, "team/app", "1", "v1")
	_, node := u.cache(t, func(up *Upstream) {
		up.Deny = []string{"*.evil.example"}
		up.Timeout = 2 * time.Second
	})
	_, allowOnly := u.cache(t, func(up *Upstream) { up.Allow = []string{"quay.io"} })
	for _, tc := range []struct {
		name   string
		ts     *httptest.Server
		path   string
		status int
		code   string
		says   string
	}{
		{"no such image upstream", node, "/v2/team/nope/manifests/1?ns=upstream.test", 404, errManifestUnknown, "has no such image"},
		{"denied registry", node, "/v2/x/manifests/1?ns=r.evil.example", 403, errDenied, "denied by this host's operator"},
		{"denied registry, blob", node, "/v2/x/blobs/" + sha(img.layer) + "?ns=r.evil.example", 403, errDenied, "denied"},
		{"not in the allow list", allowOnly, "/v2/team/app/manifests/1?ns=upstream.test", 403, errDenied, "not in this host's allow list"},
		{"metadata service", node, "/v2/latest/manifests/1?ns=169.254.169.254", 503, errUnavailable, "not a public address"},
		{"the host's LAN", node, "/v2/x/manifests/1?ns=10.1.2.3:5000", 503, errUnavailable, "not a public address"},
		{"another loopback address", node, "/v2/x/manifests/1?ns=127.0.0.2:6443", 503, errUnavailable, "not a public address"},
		{"IPv6 unique local", node, "/v2/x/manifests/1?ns=[fd00::1]:443", 503, errUnavailable, "not a public address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, tc.ts, "GET", tc.path, nil)
			if r.status != tc.status || r.errCode() != tc.code || !strings.Contains(string(r.body), tc.says) {
				t.Errorf("GET %s: %d %s, want %d %s saying %q", tc.path, r.status, r.body, tc.status, tc.code, tc.says)
			}
		})
	}
	if got := u.count("GET manifest"); got != 1 {
		t.Errorf("upstream saw %d manifest GETs, want 1 (only the missing image; refusals never reach it)", got)
	}
}

// Upstream sending other bytes than the digest named: nothing is stored, and the next
// pull asks again.
func TestPullThroughRefusesABadDigest(t *testing.T) {
	u := newUpstream(t)
	u.publish(t, "team/app", "1", "v1")
	s, node := u.cache(t, nil)
	wrong := sha([]byte("something else"))
	// Upstream serves any blob for any digest (its blobs are global): ask for a digest
	// whose content upstream lacks, under a layer's name, by planting the bytes.
	if _, _, err := u.reg.st.writeBlob(strings.NewReader("tampered"), "", ""); err != nil {
		t.Fatal(err)
	}
	if err := copyFile(u.reg.st.blobPath(sha([]byte("tampered"))), u.reg.st.blobPath(wrong)); err != nil {
		t.Fatal(err)
	}
	res, err := node.Client().Get(node.URL + "/v2/team/app/blobs/" + wrong + "?ns=upstream.test")
	if err == nil {
		io.ReadAll(res.Body)
		res.Body.Close()
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := s.st.statBlob(wrong); err == nil {
		t.Fatalf("a blob whose bytes do not hash to %s was stored", wrong)
	}
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

func TestValidateUpstream(t *testing.T) {
	for _, tc := range []struct {
		name string
		u    *Upstream
		err  string
	}{
		{"empty", &Upstream{}, ""},
		{"mirror", &Upstream{Mirrors: map[string]string{"docker.io": "https://mirror.example"}}, ""},
		{"plain http mirror", &Upstream{Mirrors: map[string]string{"registry.example:5000": "http://10.0.0.5:5000"}}, ""},
		{"mirror with a path", &Upstream{Mirrors: map[string]string{"docker.io": "https://mirror.example/v2"}}, "no path"},
		{"mirror not a URL", &Upstream{Mirrors: map[string]string{"docker.io": "mirror.example"}}, "http(s)://"},
		{"mirror of a non-registry", &Upstream{Mirrors: map[string]string{"library": "https://m.example"}}, "not a registry host"},
		{"pattern", &Upstream{Allow: []string{"*.example.com", "quay.io"}, Deny: []string{"ghcr.io"}}, ""},
		{"bad pattern", &Upstream{Deny: []string{"ghcr.io/org"}}, "*.suffix"},
		{"negative TTL", &Upstream{TagTTL: -time.Second}, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.u.Validate()
			if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.err)
			}
		})
	}
}

func TestParseMirrors(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want map[string]string
		err  string
	}{
		{[]string{"docker.io=https://m.example"}, map[string]string{"docker.io": "https://m.example"}, ""},
		{[]string{"index.docker.io=https://m.example"}, map[string]string{"docker.io": "https://m.example"}, ""},
		{[]string{"GHCR.io=https://g.example", "quay.io=http://10.0.0.1:5000"}, map[string]string{"ghcr.io": "https://g.example", "quay.io": "http://10.0.0.1:5000"}, ""},
		{[]string{"docker.io"}, nil, "REGISTRY=URL"},
		{[]string{"docker.io=https://a", "docker.io=https://b"}, nil, "has a mirror already"},
	} {
		got, err := ParseMirrors(tc.in)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("ParseMirrors(%q) error %v, want %q", tc.in, err, tc.err)
			continue
		}
		if err == nil && len(got) != len(tc.want) {
			t.Errorf("ParseMirrors(%q) = %v, want %v", tc.in, got, tc.want)
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("ParseMirrors(%q)[%s] = %q, want %q", tc.in, k, got[k], v)
			}
		}
	}
}

// A node receives a blob's first bytes while upstream is still sending the rest.
func TestPullThroughStreams(t *testing.T) {
	blob := []byte(strings.Repeat("0123456789abcdef", 64<<10)) // 1 MiB
	digest := sha(blob)
	half := len(blob) / 2
	gate := make(chan struct{})
	cfg := []byte("{}")
	manifest, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": MediaTypeOCIManifest,
		"config": descriptor{MediaType: MediaTypeOCIConfig, Digest: sha(cfg), Size: 2},
		"layers": []descriptor{{MediaType: MediaTypeOCILayer, Digest: digest, Size: int64(len(blob))}}})
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v2/":
			w.WriteHeader(http.StatusOK)
		case "/v2/team/big/manifests/1":
			w.Header().Set("Content-Type", MediaTypeOCIManifest)
			w.Write(manifest)
		case "/v2/team/big/blobs/" + digest:
			w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
			if r.Method == http.MethodHead {
				return
			}
			w.Write(blob[:half])
			w.(http.Flusher).Flush()
			<-gate
			w.Write(blob[half:])
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(up.Close)
	pool := x509.NewCertPool()
	pool.AddCert(up.Certificate())
	s := &Server{Dir: t.TempDir(), Logger: testLogger(t), Upstream: &Upstream{Mirrors: map[string]string{"upstream.test": up.URL}, RootCAs: pool}}
	node := httptest.NewServer(s.NodeHandler())
	t.Cleanup(node.Close)

	do(t, node, "GET", "/v2/team/big/manifests/1?ns=upstream.test", nil).expect(t, "the manifest", http.StatusOK)
	res, err := node.Client().Get(node.URL + "/v2/team/big/blobs/" + digest + "?ns=upstream.test")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.ContentLength != int64(len(blob)) {
		t.Errorf("Content-Length %d, want %d (upstream's, sent before the body is in)", res.ContentLength, len(blob))
	}
	first := make([]byte, half)
	got := make(chan error, 1)
	go func() { _, err := io.ReadFull(res.Body, first); got <- err }()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		close(gate)
		t.Fatal("the first half did not reach the node while upstream held the second")
	}
	close(gate)
	rest, err := io.ReadAll(res.Body)
	if err != nil || string(first)+string(rest) != string(blob) {
		t.Fatalf("blob arrived as %d+%d bytes (err %v), want the %d sent", len(first), len(rest), err, len(blob))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := s.st.statBlob(digest); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the blob was not stored after it arrived")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An upload past MaxBlobSize is refused, monolithic or chunked, and nothing of it is
// stored; an upload session idle past UploadTTL is gone with its data.
func TestUploadCapsAndExpiry(t *testing.T) {
	s := &Server{Dir: t.TempDir(), Logger: testLogger(t), MaxBlobSize: 1000}
	ts := httptestServer(t, s)
	big := []byte(strings.Repeat("x", 1001))
	r := do(t, ts, "POST", "/v2/app/blobs/uploads/?digest="+sha(big), big)
	if r.status != http.StatusBadRequest || r.errCode() != errSizeInvalid {
		t.Errorf("monolithic upload of 1001 bytes: %d %s; want 400 SIZE_INVALID", r.status, r.body)
	}
	loc := do(t, ts, "POST", "/v2/app/blobs/uploads/", nil).expect(t, "start", http.StatusAccepted).header.Get("Location")
	do(t, ts, "PATCH", loc, big[:600]).expect(t, "first chunk", http.StatusAccepted)
	r = do(t, ts, "PATCH", loc, big[600:])
	if r.status != http.StatusBadRequest || r.errCode() != errSizeInvalid {
		t.Errorf("chunk past the limit: %d %s; want 400 SIZE_INVALID", r.status, r.body)
	}
	if _, err := s.st.statBlob(sha(big)); err == nil {
		t.Error("the oversized blob was stored")
	}
	// An idle session expires.
	loc = do(t, ts, "POST", "/v2/app/blobs/uploads/", nil).expect(t, "start", http.StatusAccepted).header.Get("Location")
	do(t, ts, "PATCH", loc, []byte("abc")).expect(t, "chunk", http.StatusAccepted)
	s.st.mu.Lock()
	var path string
	for id, u := range s.st.uploads {
		if strings.Contains(loc, id) {
			u.touched = time.Now().Add(-UploadTTL - time.Minute)
			path = u.path
		}
	}
	s.st.mu.Unlock()
	r = do(t, ts, "PATCH", loc, []byte("def"))
	if r.status != http.StatusNotFound || r.errCode() != errBlobUploadUnknown || !strings.Contains(string(r.body), "expired") {
		t.Errorf("chunk to an expired session: %d %s; want 404 BLOB_UPLOAD_UNKNOWN saying it expired", r.status, r.body)
	}
	if _, err := os.Stat(path); err == nil {
		t.Error("the expired session's data is still on disk")
	}
}
