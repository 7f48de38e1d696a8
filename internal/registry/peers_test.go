package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// peerHost is one host's registry as its peers see it: its PeerHandler on an
// httptest server that counts the requests it is sent (no TLS: that is the daemon's).
type peerHost struct {
	s    *Server
	host *httptest.Server // its own Handler, for the test to push to
	peer *httptest.Server // PeerHandler
	hits atomic.Int64
}

func newPeerHost(t *testing.T, s *Server) *peerHost {
	h := &peerHost{s: s, host: httptestServer(t, s)}
	ph := s.PeerHandler()
	h.peer = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.hits.Add(1)
		ph.ServeHTTP(w, r)
	}))
	t.Cleanup(h.peer.Close)
	return h
}

func (h *peerHost) asPeer(name string) Peer { return Peer{Name: name, BaseURL: h.peer.URL} }

// withPeers is a fresh host registry whose Peers are peers.
func withPeers(t *testing.T, up *Upstream, peers ...Peer) *Server {
	return &Server{Dir: t.TempDir(), Logger: testLogger(t), Upstream: up, Peers: func() []Peer { return peers }}
}

func nodeServer(t *testing.T, h http.Handler) *httptest.Server {
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts
}

func listed(t *testing.T, s *Server) map[string]ImageRef {
	t.Helper()
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]ImageRef{}
	for _, r := range list {
		out[r.Cluster+"/"+r.Name+":"+r.Tag] = r
	}
	return out
}

// An image pushed host-wide on A is pulled by a node of B: B copies it from A, as a
// pushed image of its own, and serves it from its store from then on.
func TestPeersServePushedImages(t *testing.T) {
	a := newPeerHost(t, &Server{Dir: t.TempDir(), Logger: testLogger(t)})
	app := makeImage(t, a.host, "team/app", "app", false)
	appDigest := pushManifest(t, a.host, "team/app", "1", app.manifest, app.mediaType)
	// A mirror's name pushed on the host (`image push docker.io/library/busybox:stable`).
	bb := makeImage(t, a.host, "docker.io/library/busybox", "busybox", true)
	pushManifest(t, a.host, "docker.io/library/busybox", "stable", bb.manifest, bb.mediaType)
	// An index, its one platform pushed by digest.
	child := makeImage(t, a.host, "team/multi", "amd64", false)
	childDigest := pushManifest(t, a.host, "team/multi", sha(child.manifest), child.manifest, child.mediaType)
	index, _ := json.Marshal(manifestDoc{SchemaVersion: 2, MediaType: MediaTypeOCIIndex, Manifests: []descriptor{
		{MediaType: MediaTypeOCIManifest, Digest: childDigest, Size: int64(len(child.manifest)), Platform: &platform{"amd64", "linux", ""}},
	}})
	pushManifest(t, a.host, "team/multi", "1", index, MediaTypeOCIIndex)

	b := withPeers(t, nil, a.asPeer("a"))
	node := nodeServer(t, b.NodeHandlerFor("x"))
	r := do(t, node, "GET", "/v2/team/app/manifests/1", nil).expect(t, "B's node: team/app:1", http.StatusOK)
	if !bytes.Equal(r.body, app.manifest) || r.header.Get("Docker-Content-Digest") != appDigest {
		t.Fatalf("team/app:1 from B: digest %s, body %s", r.header.Get("Docker-Content-Digest"), r.body)
	}
	if r := do(t, node, "GET", "/v2/team/app/blobs/"+sha(app.layer), nil).expect(t, "B's node: layer", http.StatusOK); !bytes.Equal(r.body, app.layer) {
		t.Fatalf("layer from B: %q", r.body)
	}
	do(t, node, "HEAD", "/v2/library/busybox/manifests/stable?ns=docker.io", nil).expect(t, "B's node: busybox (a mirror's name)", http.StatusOK)
	do(t, node, "GET", "/v2/library/busybox/blobs/"+sha(bb.config)+"?ns=docker.io", nil).expect(t, "B's node: busybox's config", http.StatusOK)
	r = do(t, node, "GET", "/v2/team/multi/manifests/1", nil).expect(t, "B's node: the index", http.StatusOK)
	if !bytes.Equal(r.body, index) {
		t.Fatalf("index from B: %s", r.body)
	}
	do(t, node, "GET", "/v2/team/multi/manifests/"+childDigest, nil).expect(t, "B's node: the index's platform", http.StatusOK)
	do(t, node, "GET", "/v2/team/multi/blobs/"+sha(child.layer), nil).expect(t, "B's node: the platform's layer", http.StatusOK)

	// In B's store as pushed, host-wide: listed, and served to B's own peers.
	got := listed(t, b)
	for _, k := range []string{"/team/app:1", "/docker.io/library/busybox:stable", "/team/multi:1"} {
		if _, ok := got[k]; !ok {
			t.Errorf("B lists %v, without %s", got, k)
		}
	}
	bPeer := nodeServer(t, b.PeerHandler())
	do(t, bPeer, "GET", "/v2/docker.io/library/busybox/manifests/stable", nil).expect(t, "B serves its copy to its peers (pushed)", http.StatusOK)

	// Later pulls, by any cluster's nodes, do not ask A.
	hits := a.hits.Load()
	other := nodeServer(t, b.NodeHandlerFor("y"))
	do(t, node, "GET", "/v2/team/app/manifests/1", nil).expect(t, "again", http.StatusOK)
	do(t, other, "GET", "/v2/team/app/manifests/"+appDigest, nil).expect(t, "another cluster, by digest", http.StatusOK)
	do(t, other, "GET", "/v2/team/app/blobs/"+sha(app.layer), nil).expect(t, "another cluster, the layer", http.StatusOK)
	if n := a.hits.Load(); n != hits {
		t.Errorf("A was asked %d more times for what B holds", n-hits)
	}

	// A reference by digest that B has never seen is fetched as well.
	app2 := makeImage(t, a.host, "team/app", "app2", false)
	d2 := pushManifest(t, a.host, "team/app", "2", app2.manifest, app2.mediaType)
	do(t, node, "GET", "/v2/team/app/manifests/"+d2, nil).expect(t, "B's node: by digest", http.StatusOK)
	do(t, node, "GET", "/v2/team/app/blobs/"+sha(app2.layer), nil).expect(t, "B's node: its layer", http.StatusOK)
}

// An image pushed on A for cluster x alone reaches x's nodes on B, into x's overlay
// there, and no other cluster's.
func TestPeersKeepClusterImagesToTheirCluster(t *testing.T) {
	a := newPeerHost(t, &Server{Dir: t.TempDir(), Logger: testLogger(t)})
	img := oneImageLayout(t, "x's own")
	if _, err := a.s.ImportFor(context.Background(), "x", bytes.NewReader(img.tar), "team/own:1"); err != nil {
		t.Fatal(err)
	}
	// Straight at A's peer handler: only with ?cluster=x.
	do(t, a.peer, "GET", "/v2/docker.io/team/own/manifests/1", nil).expect(t, "A, no cluster", http.StatusNotFound)
	do(t, a.peer, "GET", "/v2/docker.io/team/own/manifests/1?cluster=y", nil).expect(t, "A, cluster y", http.StatusNotFound)
	do(t, a.peer, "GET", "/v2/docker.io/team/own/manifests/1?cluster=x", nil).expect(t, "A, cluster x", http.StatusOK)

	b := withPeers(t, nil, a.asPeer("a"))
	y := nodeServer(t, b.NodeHandlerFor("y"))
	x := nodeServer(t, b.NodeHandlerFor("x"))
	shared := nodeServer(t, b.NodeHandler())
	const m = "/v2/team/own/manifests/1?ns=docker.io"
	if r := do(t, y, "GET", m, nil); r.status != http.StatusNotFound || r.errCode() != errManifestUnknown {
		t.Fatalf("cluster y's node on B: %d %s; want MANIFEST_UNKNOWN", r.status, r.body)
	}
	do(t, x, "GET", m, nil).expect(t, "cluster x's node on B", http.StatusOK)
	do(t, y, "GET", m, nil).expect(t, "cluster y's node after x's pull", http.StatusNotFound)
	do(t, shared, "GET", m, nil).expect(t, "a node of no cluster after x's pull", http.StatusNotFound)
	got := listed(t, b)
	if r, ok := got["x/docker.io/team/own:1"]; !ok || len(got) != 1 {
		t.Fatalf("B lists %v; want docker.io/team/own:1 of cluster x alone", got)
	} else if u, _ := b.Usage(); u["x"] != r.Size {
		t.Errorf("B charges cluster x %d bytes, want the image's %d (a push for it is its)", u["x"], r.Size)
	}
}

// What A pulled through from upstream is not served to peers: B fetches its own from
// upstream. A tag pushed over the same repository is.
func TestPeersDoNotServePulledImages(t *testing.T) {
	u := newUpstream(t)
	pulledImg, pulled := u.publish(t, "team/app", "1.0", "from upstream")
	aServer, aNode := u.cache(t, nil)
	do(t, aNode, "GET", "/v2/team/app/manifests/1.0?ns=upstream.test", nil).expect(t, "A's node pulls through", http.StatusOK)
	do(t, aNode, "GET", "/v2/team/app/blobs/"+sha(pulledImg.layer)+"?ns=upstream.test", nil).expect(t, "A's node: the layer", http.StatusOK)
	a := newPeerHost(t, aServer)
	mine := makeImage(t, a.host, "upstream.test/team/app", "pushed on A", false)
	pushManifest(t, a.host, "upstream.test/team/app", "mine", mine.manifest, mine.mediaType)

	for _, p := range []string{"manifests/1.0", "manifests/" + pulled, "blobs/" + sha(pulledImg.layer), "blobs/" + sha(pulledImg.config)} {
		do(t, a.peer, "GET", "/v2/upstream.test/team/app/"+p, nil).expect(t, "A's peer handler: pulled "+p, http.StatusNotFound)
	}
	do(t, a.peer, "GET", "/v2/upstream.test/team/app/manifests/mine", nil).expect(t, "A's peer handler: the pushed tag", http.StatusOK)
	do(t, a.peer, "GET", "/v2/upstream.test/team/app/blobs/"+sha(mine.layer), nil).expect(t, "A's peer handler: its layer", http.StatusOK)

	// B pulls through from upstream itself.
	b := withPeers(t, aServer.Upstream, a.asPeer("a"))
	node := nodeServer(t, b.NodeHandlerFor("x"))
	gets := u.count("GET manifest")
	do(t, node, "GET", "/v2/team/app/manifests/1.0?ns=upstream.test", nil).expect(t, "B's node", http.StatusOK)
	if u.count("GET manifest") != gets+1 {
		t.Errorf("B did not fetch the pulled image from upstream")
	}
	if _, pulledHere := b.st.pulledTag("upstream.test/team/app", "1.0", pulled); !pulledHere {
		t.Errorf("B's 1.0 is not recorded as pulled through")
	}
	do(t, node, "GET", "/v2/team/app/manifests/mine?ns=upstream.test", nil).expect(t, "B's node: the tag pushed on A", http.StatusOK)
	if _, pulledHere := b.st.pulledTag("upstream.test/team/app", "mine", sha(mine.manifest)); pulledHere {
		t.Errorf("B's copy of the pushed tag is recorded as pulled through")
	}
}

// PeerHandler reads manifests and blobs only.
func TestPeerHandlerReadsOnly(t *testing.T) {
	a := newPeerHost(t, &Server{Dir: t.TempDir(), Logger: testLogger(t)})
	img := makeImage(t, a.host, "team/app", "app", false)
	d := pushManifest(t, a.host, "team/app", "1", img.manifest, img.mediaType)
	evil := makeImage(t, a.host, "scratch/evil", "evil", false)
	for _, tc := range []struct {
		name, method, path string
		body               []byte
		hdr                []string
	}{
		{"manifest over the tag", "PUT", "/v2/team/app/manifests/1", evil.manifest, []string{"Content-Type", evil.mediaType}},
		{"start an upload", "POST", "/v2/team/app/blobs/uploads/", nil, nil},
		{"monolithic blob", "POST", "/v2/team/app/blobs/uploads/?digest=" + sha([]byte("x")), []byte("x"), nil},
		{"patch an upload", "PATCH", "/v2/team/app/blobs/uploads/some-session", []byte("x"), nil},
		{"delete the tag", "DELETE", "/v2/team/app/manifests/1", nil, nil},
		{"delete by digest", "DELETE", "/v2/team/app/manifests/" + d, nil, nil},
		{"delete a blob", "DELETE", "/v2/team/app/blobs/" + sha(img.layer), nil, nil},
		{"the catalog", "GET", "/v2/_catalog", nil, nil},
		{"tags", "GET", "/v2/team/app/tags/list", nil, nil},
		{"an upload's state", "GET", "/v2/team/app/blobs/uploads/some-session", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, a.peer, tc.method, tc.path, tc.body, tc.hdr...)
			if r.status != http.StatusForbidden || r.errCode() != errDenied {
				t.Fatalf("%s %s: %d %s; want 403 DENIED", tc.method, tc.path, r.status, r.body)
			}
		})
	}
	do(t, a.peer, "GET", "/v2/", nil).expect(t, "base", http.StatusOK)
	do(t, a.peer, "GET", "/v2/team/app/manifests/1?cluster=Not_A_Cluster", nil).expect(t, "a bad cluster name", http.StatusBadRequest)
	do(t, a.peer, "GET", "/v2/localhost/team/app/manifests/1", nil).expect(t, "a name that is not canonical", http.StatusBadRequest)
	do(t, a.peer, "GET", "/v2/scratch/evil/blobs/"+sha(evil.layer), nil).expect(t, "a blob no pushed manifest of the name references", http.StatusNotFound)
	r := do(t, a.host, "GET", "/v2/team/app/manifests/1", nil).expect(t, "the tag afterwards", http.StatusOK)
	if r.header.Get("Docker-Content-Digest") != d {
		t.Errorf("team/app:1 is %s after the attempts, want %s", r.header.Get("Docker-Content-Digest"), d)
	}
}

// A peer that is down, that lacks the image or that answers garbage is passed over:
// the node's request goes on as it would without peers.
func TestPeersDownOrMissingFallThrough(t *testing.T) {
	u := newUpstream(t)
	img, d := u.publish(t, "team/app", "1.0", "v1")
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	empty := newPeerHost(t, &Server{Dir: t.TempDir(), Logger: testLogger(t)})
	liar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", MediaTypeOCIManifest)
		w.Header().Set("Docker-Content-Digest", d) // not the digest of what follows
		w.Write([]byte(`{"schemaVersion":2,"config":{"digest":"` + sha([]byte("x")) + `","size":1},"layers":[]}`))
	}))
	t.Cleanup(liar.Close)
	pool := u.ts.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	b := withPeers(t, &Upstream{Mirrors: map[string]string{"upstream.test": u.ts.URL}, RootCAs: pool},
		Peer{Name: "down", BaseURL: down.URL}, Peer{Name: "liar", BaseURL: liar.URL}, empty.asPeer("empty"))
	node := nodeServer(t, b.NodeHandlerFor("x"))

	r := do(t, node, "GET", "/v2/team/app/manifests/1.0?ns=upstream.test", nil).expect(t, "from upstream", http.StatusOK)
	if r.header.Get("Docker-Content-Digest") != d {
		t.Fatalf("got %s, want upstream's %s", r.header.Get("Docker-Content-Digest"), d)
	}
	do(t, node, "GET", "/v2/team/app/blobs/"+sha(img.layer)+"?ns=upstream.test", nil).expect(t, "its layer", http.StatusOK)
	if empty.hits.Load() == 0 {
		t.Error("the peer after the one that is down and the liar was not asked")
	}
	if r := do(t, node, "GET", "/v2/nowhere/manifests/1", nil); r.status != http.StatusNotFound || r.errCode() != errManifestUnknown {
		t.Fatalf("a local name no one has: %d %s; want MANIFEST_UNKNOWN", r.status, r.body)
	}
	if list := listed(t, b); len(list) != 1 || !strings.HasPrefix(list["/upstream.test/team/app:1.0"].Digest, "sha256:") {
		t.Errorf("B lists %v; want upstream.test/team/app:1.0 alone", list)
	}
}

// Nodes that ask for the same missing image at once share one copy from the peer.
func TestPeersCopyOnce(t *testing.T) {
	a := newPeerHost(t, &Server{Dir: t.TempDir(), Logger: testLogger(t)})
	img := makeImage(t, a.host, "team/app", "app", false)
	d := pushManifest(t, a.host, "team/app", "1", img.manifest, img.mediaType)
	b := withPeers(t, nil, a.asPeer("a"))
	node := nodeServer(t, b.NodeHandlerFor("x"))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			r := do(t, node, "GET", "/v2/team/app/manifests/1", nil)
			if r.status != http.StatusOK || r.header.Get("Docker-Content-Digest") != d {
				t.Errorf("concurrent pull: %d %s", r.status, r.body)
			}
		})
	}
	wg.Wait()
	// x's own (none), then the shared manifest, its config and its layer.
	if n := a.hits.Load(); n != 4 {
		t.Errorf("A was asked %d times, want 4 (one copy)", n)
	}
}
