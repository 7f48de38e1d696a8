package registry

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// A cluster's quota counts what it brought into the cache, shared images included;
// what is stored costs nobody anything more, and is served over the quota; the charges
// outlive the process and go with the blobs.
func TestClusterQuota(t *testing.T) {
	p := newPrivateUpstream(t)
	one := p.image(t, "team/one", "1", "one")
	two := p.image(t, "team/two", "1", "two")
	own := p.image(t, "private/own", "1", "own")
	size := func(img testImage) int64 { return int64(len(img.manifest) + len(img.config) + len(img.layer)) }
	if size(one) != size(two) || size(one) != size(own) {
		t.Fatalf("the images are %d, %d and %d bytes; the steps below want them equal", size(one), size(two), size(own))
	}
	quota := size(one) // one image
	pool := x509.NewCertPool()
	pool.AddCert(p.ts.Certificate())
	dir := t.TempDir()
	var s *Server
	nodes := map[string]*httptest.Server{}
	open := func() {
		s = &Server{Dir: dir, Logger: testLogger(t), ClusterQuota: quota, Upstream: &Upstream{Mirrors: map[string]string{"upstream.test": p.ts.URL}, RootCAs: pool}}
		for _, c := range []string{"a", "b"} {
			nodes[c] = httptest.NewServer(s.NodeHandlerFor(c))
			t.Cleanup(nodes[c].Close)
		}
	}
	open()
	// pull asks, as cluster c's node, for repo's manifest, blobs or both ("image"), and
	// returns the first answer that is not 200 (or the last).
	pull := func(c, repo string, img testImage, parts string, creds bool) resp {
		var hdr []string
		if creds {
			hdr = []string{"Authorization", basic("ci", p.password)}
		}
		var paths []string
		if parts != "blobs" {
			paths = append(paths, "/v2/"+repo+"/manifests/1?ns=upstream.test")
		}
		if parts != "manifest" {
			for _, b := range [][]byte{img.config, img.layer} {
				paths = append(paths, "/v2/"+repo+"/blobs/"+sha(b)+"?ns=upstream.test")
			}
		}
		var r resp
		for _, path := range paths {
			if r = do(t, nodes[c], "GET", path, nil, hdr...); r.status != http.StatusOK {
				break
			}
		}
		waitFills(t, s) // a blob is stored, and charged, after its last byte is sent
		return r
	}
	const absent = -1
	for _, st := range []struct {
		name    string
		act     func() // instead of a pull
		cluster string
		repo    string
		img     testImage
		parts   string
		creds   bool
		status  int
		usage   map[string]int64 // after; absent: no entry
	}{
		{name: "A pulls a public image: A is charged for all of it", cluster: "a", repo: "team/one", img: one, parts: "image",
			status: http.StatusOK, usage: map[string]int64{"a": quota}},
		{name: "B pulls it after: stored, so B is charged nothing", cluster: "b", repo: "team/one", img: one, parts: "image",
			status: http.StatusOK, usage: map[string]int64{"a": quota, "b": absent}},
		{name: "A, at its quota, is refused a public image not stored", cluster: "a", repo: "team/two", img: two, parts: "manifest",
			status: http.StatusForbidden, usage: map[string]int64{"a": quota, "b": absent}},
		{name: "A still pulls what is stored", cluster: "a", repo: "team/one", img: one, parts: "image",
			status: http.StatusOK, usage: map[string]int64{"a": quota}},
		{name: "B brings in the other image's manifest only", cluster: "b", repo: "team/two", img: two, parts: "manifest",
			status: http.StatusOK, usage: map[string]int64{"a": quota, "b": int64(len(two.manifest))}},
		{name: "A is refused its blobs: fetching them would store more", cluster: "a", repo: "team/two", img: two, parts: "blobs",
			status: http.StatusForbidden, usage: map[string]int64{"a": quota, "b": int64(len(two.manifest))}},
		{name: "B fetches them", cluster: "b", repo: "team/two", img: two, parts: "blobs",
			status: http.StatusOK, usage: map[string]int64{"a": quota, "b": size(two)}},
		{name: "A pulls that image now that B brought it in, charged nothing", cluster: "a", repo: "team/two", img: two, parts: "image",
			status: http.StatusOK, usage: map[string]int64{"a": quota, "b": size(two)}},
		{name: "the daemon restarts: the charges are as they were", act: open,
			usage: map[string]int64{"a": quota, "b": size(two)}},
		{name: "A is still refused an image not stored, its own with credentials", cluster: "a", repo: "private/own", img: own, parts: "manifest", creds: true,
			status: http.StatusForbidden, usage: map[string]int64{"a": quota}},
		{name: "GC evicts the images: their charges go with them", act: func() {
			age(t, dir)
			if _, err := s.GC(1, false); err != nil {
				t.Fatal(err)
			}
		}, usage: map[string]int64{"a": 0, "b": 0, "": 0}},
		{name: "B brings A's first image in again: B is charged, A no longer", cluster: "b", repo: "team/one", img: one, parts: "image",
			status: http.StatusOK, usage: map[string]int64{"a": 0, "b": size(one)}},
		{name: "A, under its quota again, pulls its own image: charged", cluster: "a", repo: "private/own", img: own, parts: "image", creds: true,
			status: http.StatusOK, usage: map[string]int64{"a": size(own), "b": size(one)}},
		{name: "A is deleted: its charges go with it", act: func() {
			if err := ForgetCluster(dir, "a"); err != nil {
				t.Fatal(err)
			}
		}, usage: map[string]int64{"a": absent, "b": size(one), "": size(own)}},
	} {
		if st.act != nil {
			st.act()
		} else {
			r := pull(st.cluster, st.repo, st.img, st.parts, st.creds)
			if r.status != st.status {
				t.Fatalf("%s: %d %s; want %d", st.name, r.status, r.body, st.status)
			}
			if st.status == http.StatusForbidden {
				f, ok := s.LastFailure(st.cluster, "upstream.test/"+st.repo+":1")
				if r.errCode() != errOverQuota || !ok || f.Reason != "OverQuota" || !strings.Contains(f.Message, "--image-cluster-quota") || !strings.Contains(f.Message, "image gc") {
					t.Fatalf("%s: %s, the Pod is told %+v (%v); want QUOTA_EXCEEDED and OverQuota naming --image-cluster-quota and image gc", st.name, r.body, f, ok)
				}
			}
		}
		u, err := s.Usage()
		if err != nil {
			t.Fatal(err)
		}
		for c, want := range st.usage {
			if got, ok := u[c]; (want == absent && ok) || (want != absent && got != want) {
				t.Fatalf("%s: Usage()[%q] = %d (present %v), want %d (-1: absent); all %v", st.name, c, got, ok, want, u)
			}
		}
		if c := clusterBytes(t, s); !maps.Equal(c, u) {
			t.Fatalf("%s: socialweb_registry_cluster_bytes is %v, Usage %v", st.name, c, u)
		}
	}
}

// clusterBytes is socialweb_registry_cluster_bytes by cluster.
func clusterBytes(t *testing.T, s *Server) map[string]int64 {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, mf := range mfs {
		if mf.GetName() != "socialweb_registry_cluster_bytes" {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[m.GetLabel()[0].GetValue()] = int64(m.GetGauge().GetValue())
		}
	}
	return out
}

// An image pushed for a cluster is charged to it if it stored the blobs; a store from
// before charges were kept charges the clusters' own images when it is opened; a
// deleted cluster's blobs are nobody's.
func TestPushesAndOlderStoresAreCharged(t *testing.T) {
	x, y, z := oneImageLayout(t, "x"), oneImageLayout(t, "yy"), oneImageLayout(t, "zzz")
	for _, tc := range []struct {
		name  string
		after func(t *testing.T, dir string)
		want  map[string]int64
	}{
		{"as pushed: each blob charged to the cluster that stored it", nil,
			map[string]int64{"a": x.size, "b": y.size, "": z.size}},
		{"a store from before charges: the clusters' own images charged on opening", func(t *testing.T, dir string) {
			if err := os.RemoveAll(filepath.Join(dir, chargesDir)); err != nil {
				t.Fatal(err)
			}
		}, map[string]int64{"a": x.size, "b": y.size, "": z.size}},
		{"a deleted cluster's blobs are charged to nobody", func(t *testing.T, dir string) {
			if err := ForgetCluster(dir, "a"); err != nil {
				t.Fatal(err)
			}
		}, map[string]int64{"b": y.size, "": x.size + z.size}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := &Server{Dir: dir, Logger: testLogger(t)}
			ctx := context.Background()
			for _, push := range []struct {
				cluster string
				img     layoutImage
			}{{"a", x}, {"b", x}, {"b", y}, {"", z}} {
				var err error
				if push.cluster == "" {
					_, err = s.Import(ctx, bytes.NewReader(push.img.tar), "localhost:5000/img:1")
				} else {
					_, err = s.ImportFor(ctx, push.cluster, bytes.NewReader(push.img.tar), "localhost:5000/img:1")
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if tc.after != nil {
				tc.after(t, dir)
			}
			u, err := (&Server{Dir: dir, Logger: testLogger(t)}).Usage()
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(u, tc.want) {
				t.Errorf("Usage = %v, want %v", u, tc.want)
			}
		})
	}
}

type layoutImage struct {
	tar  []byte
	size int64 // of its blobs: manifest, config, layer
}

// oneImageLayout is an OCI layout tarball of one image whose layer holds content.
func oneImageLayout(t *testing.T, content string) layoutImage {
	l := layerTar(t, "file", content)
	c := dockerConfig(l)
	ld := descriptor{MediaType: MediaTypeOCILayer, Digest: sha(l), Size: int64(len(l))}
	cd := descriptor{MediaType: MediaTypeOCIConfig, Digest: sha(c), Size: int64(len(c))}
	m, _ := json.Marshal(manifestDoc{SchemaVersion: 2, MediaType: MediaTypeOCIManifest, Config: &cd, Layers: []descriptor{ld}})
	idx, _ := json.Marshal(manifestDoc{SchemaVersion: 2, MediaType: MediaTypeOCIIndex, Manifests: []descriptor{{MediaType: MediaTypeOCIManifest, Digest: sha(m), Size: int64(len(m))}}})
	var entries []tarEntry
	for _, b := range [][]byte{l, c, m} {
		entries = append(entries, tarEntry{name: "blobs/sha256/" + strings.TrimPrefix(sha(b), "sha256:"), data: b})
	}
	entries = append(entries, tarEntry{name: "oci-layout", data: []byte(`{"imageLayoutVersion":"1.0.0"}`)}, tarEntry{name: "index.json", data: idx})
	return layoutImage{makeTar(t, entries, false), int64(len(l) + len(c) + len(m))}
}
