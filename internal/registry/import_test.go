package registry

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
)

type tarEntry struct {
	name, link string // link: symlink target
	data       []byte
}

func makeTar(t testing.TB, entries []tarEntry, gz bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w = &buf
	var zw *gzip.Writer
	tw := tar.NewWriter(w)
	if gz {
		zw = gzip.NewWriter(w)
		tw = tar.NewWriter(zw)
	}
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), Typeflag: tar.TypeReg}
		if e.link != "" {
			h = &tar.Header{Name: e.name, Mode: 0o777, Linkname: e.link, Typeflag: tar.TypeSymlink}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(e.data)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		zw.Close()
	}
	return buf.Bytes()
}

// layerTar is a small uncompressed filesystem layer.
func layerTar(t testing.TB, file, content string) []byte {
	return makeTar(t, []tarEntry{{name: file, data: []byte(content)}}, false)
}

func dockerConfig(layers ...[]byte) []byte {
	var ids []string
	for _, l := range layers {
		ids = append(ids, sha(l))
	}
	b, _ := json.Marshal(map[string]any{"architecture": "amd64", "os": "linux", "config": map[string]any{"Cmd": []string{"sh"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": ids}})
	return b
}

func gzipBytes(b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

// pullImage fetches name:ref through the mirror path form (?ns=) when ns is set and
// returns the manifest, its digest and every blob it references.
func pullImage(t *testing.T, s *Server, path, ns, ref string) (manifestDoc, string, map[string][]byte) {
	t.Helper()
	ts := httptestServer(t, s)
	q := ""
	if ns != "" {
		q = "?ns=" + ns
	}
	r := do(t, ts, "GET", "/v2/"+path+"/manifests/"+ref+q, nil).expect(t, "pull "+path+":"+ref, 200)
	var m manifestDoc
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatal(err)
	}
	blobs := map[string][]byte{}
	for _, d := range append([]descriptor{*m.Config}, m.Layers...) {
		b := do(t, ts, "GET", "/v2/"+path+"/blobs/"+d.Digest+q, nil).expect(t, "pull blob", 200).body
		if sha(b) != d.Digest || int64(len(b)) != d.Size {
			t.Fatalf("blob %s: got %d bytes with digest %s, descriptor says %d", d.Digest, len(b), sha(b), d.Size)
		}
		blobs[d.Digest] = b
	}
	return m, r.header.Get("Docker-Content-Digest"), blobs
}

func TestImportDockerSave(t *testing.T) {
	l1 := layerTar(t, "bin/hello", "hello")
	l2 := layerTar(t, "etc/motd", "hi")
	l2gz := gzipBytes(l2)
	cfg := dockerConfig(l1, l2)
	manifest := func(tags ...string) []byte {
		b, _ := json.Marshal([]map[string]any{{"Config": "abc.json", "RepoTags": tags, "Layers": []string{"l1/layer.tar", "l2/layer.tar"}}})
		return b
	}
	for _, tc := range []struct {
		name     string
		entries  []tarEntry
		gz       bool
		refs     []string
		want     []string // name:tag
		l2type   string
		l2digest string
		err      string
	}{
		{
			name: "RepoTags",
			entries: []tarEntry{{name: "abc.json", data: cfg}, {name: "l1/layer.tar", data: l1}, {name: "l2/layer.tar", data: l2},
				{name: "manifest.json", data: manifest("busybox:latest", "busybox:stable")}},
			want: []string{"docker.io/library/busybox:latest", "docker.io/library/busybox:stable"}, l2type: MediaTypeOCILayer, l2digest: sha(l2),
		},
		{
			name: "manifest first, symlinked layer, gzip tarball, refs",
			entries: []tarEntry{{name: "manifest.json", data: manifest()}, {name: "./abc.json", data: cfg}, {name: "l0/layer.tar", data: l1},
				{name: "l1/layer.tar", link: "../l0/layer.tar"}, {name: "l2/layer.tar", data: l2}},
			gz: true, refs: []string{"registry.k8s.io/pause:3.10"},
			want: []string{"registry.k8s.io/pause:3.10"}, l2type: MediaTypeOCILayer, l2digest: sha(l2),
		},
		{
			name: "gzip layer",
			entries: []tarEntry{{name: "abc.json", data: cfg}, {name: "l1/layer.tar", data: l1}, {name: "l2/layer.tar", data: l2gz},
				{name: "manifest.json", data: manifest("localhost:5000/foo:1")}},
			want: []string{"foo:1"}, l2type: MediaTypeOCILayerGzip, l2digest: sha(l2gz),
		},
		{
			name:    "no name",
			entries: []tarEntry{{name: "abc.json", data: cfg}, {name: "l1/layer.tar", data: l1}, {name: "l2/layer.tar", data: l2}, {name: "manifest.json", data: manifest()}},
			err:     "has no name",
		},
		{
			name: "layer does not match diff_id",
			entries: []tarEntry{{name: "abc.json", data: cfg}, {name: "l1/layer.tar", data: l2}, {name: "l2/layer.tar", data: l2},
				{name: "manifest.json", data: manifest("x:1")}},
			err: "diff_id",
		},
		{
			name:    "missing layer",
			entries: []tarEntry{{name: "abc.json", data: cfg}, {name: "l1/layer.tar", data: l1}, {name: "manifest.json", data: manifest("x:1")}},
			err:     "does not hold",
		},
		{
			name:    "not an image",
			entries: []tarEntry{{name: "hello.txt", data: []byte("hi")}},
			err:     "neither",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{Dir: t.TempDir(), Logger: testLogger(t)}
			got, err := s.Import(context.Background(), bytes.NewReader(makeTar(t, tc.entries, tc.gz)), tc.refs...)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Import: %v, %v; want error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("Import = %v, want %v", got, tc.want)
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(got[i], w+"@sha256:") {
					t.Errorf("Import[%d] = %q, want %s@...", i, got[i], w)
				}
			}
			// Pull the first ref back through the path containerd would use.
			name, tag, _ := strings.Cut(tc.want[0], ":")
			path, ns := name, ""
			if first, rest, ok := strings.Cut(name, "/"); ok && looksLikeDomain(first) {
				ns, path = first, rest
			}
			m, d, blobs := pullImage(t, s, path, ns, tag)
			if !strings.HasSuffix(got[0], "@"+d) {
				t.Errorf("Import said %s, registry serves %s", got[0], d)
			}
			if m.MediaType != MediaTypeOCIManifest || m.Config.MediaType != MediaTypeOCIConfig || m.Config.Digest != sha(cfg) {
				t.Errorf("manifest %s with config %+v; want an OCI manifest with config %s", m.MediaType, m.Config, sha(cfg))
			}
			if len(m.Layers) != 2 || m.Layers[0].Digest != sha(l1) || m.Layers[0].MediaType != MediaTypeOCILayer ||
				m.Layers[1].Digest != tc.l2digest || m.Layers[1].MediaType != tc.l2type {
				t.Errorf("layers %+v", m.Layers)
			}
			if !bytes.Equal(blobs[sha(cfg)], cfg) || !bytes.Equal(blobs[sha(l1)], l1) {
				t.Errorf("config or layer content differs from the tarball's")
			}
		})
	}
}

// ociLayout builds an OCI image layout's entries for images, each a manifest with one
// layer, listed in index.json with the given annotations.
func ociLayout(t testing.TB, images []map[string]string) ([]tarEntry, []string) {
	var entries []tarEntry
	var index []descriptor
	var digests []string
	blob := func(b []byte) descriptor {
		entries = append(entries, tarEntry{name: "blobs/sha256/" + strings.TrimPrefix(sha(b), "sha256:"), data: b})
		return descriptor{Digest: sha(b), Size: int64(len(b))}
	}
	for i, ann := range images {
		l := layerTar(t, "file", strings.Repeat("x", i+1))
		ld := blob(l)
		ld.MediaType = MediaTypeOCILayer
		cd := blob(dockerConfig(l))
		cd.MediaType = MediaTypeOCIConfig
		m, _ := json.Marshal(manifestDoc{SchemaVersion: 2, MediaType: MediaTypeOCIManifest, Config: &cd, Layers: []descriptor{ld}})
		md := blob(m)
		md.MediaType = MediaTypeOCIManifest
		md.Annotations = ann
		index = append(index, md)
		digests = append(digests, md.Digest)
	}
	idx, _ := json.Marshal(manifestDoc{SchemaVersion: 2, MediaType: MediaTypeOCIIndex, Manifests: index})
	entries = append(entries, tarEntry{name: "oci-layout", data: []byte(`{"imageLayoutVersion":"1.0.0"}`)}, tarEntry{name: "index.json", data: idx})
	return entries, digests
}

func TestImportOCILayout(t *testing.T) {
	ctx := context.Background()
	named := map[string]string{AnnotationContainerName: "docker.io/library/busybox:stable", AnnotationRefName: "stable"}
	for _, tc := range []struct {
		name   string
		images []map[string]string
		refs   []string
		mutate func([]tarEntry) []tarEntry
		want   []string // name:tag of each result, in order
		err    string
	}{
		{name: "containerd name", images: []map[string]string{named}, want: []string{"docker.io/library/busybox:stable"}},
		{name: "full ref.name", images: []map[string]string{{AnnotationRefName: "registry.k8s.io/pause:3.10"}}, want: []string{"registry.k8s.io/pause:3.10"}},
		{name: "tag-only ref.name with refs", images: []map[string]string{{AnnotationRefName: "3.10"}}, refs: []string{"registry.k8s.io/pause:3.10", "localhost/pause:x"},
			want: []string{"registry.k8s.io/pause:3.10", "pause:x"}},
		{name: "two images", images: []map[string]string{named, {AnnotationContainerName: "foo:1"}},
			want: []string{"docker.io/library/busybox:stable", "docker.io/library/foo:1"}},
		{name: "tag-only ref.name", images: []map[string]string{{AnnotationRefName: "3.10"}}, err: "has no name"},
		{name: "refs for two images", images: []map[string]string{named, named}, refs: []string{"x:1"}, err: "holds 2 images"},
		{name: "corrupt blob", images: []map[string]string{named}, err: errDigestInvalid, mutate: func(e []tarEntry) []tarEntry {
			e[0].data = []byte("tampered")
			return e
		}},
		{name: "missing blob", images: []map[string]string{named}, err: "neither in the tarball", mutate: func(e []tarEntry) []tarEntry {
			return e[1:]
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{Dir: t.TempDir(), Logger: testLogger(t)}
			entries, digests := ociLayout(t, tc.images)
			if tc.mutate != nil {
				entries = tc.mutate(entries)
			}
			got, err := s.Import(ctx, bytes.NewReader(makeTar(t, entries, false)), tc.refs...)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Import: %v, %v; want error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for i, w := range tc.want {
				d := digests[0]
				if len(digests) == len(tc.want) {
					d = digests[i]
				}
				want = append(want, w+"@"+d)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("Import = %v, want %v", got, want)
			}
			list, err := s.List()
			if err != nil || len(list) != len(want) {
				t.Fatalf("List = %v, %v", list, err)
			}
			for _, r := range list {
				if !slices.Contains(want, r.String()) {
					t.Errorf("List has %v, not among %v", r, want)
				}
			}
		})
	}
}

// TestImportIndex imports a multi-platform index whose layout holds only one platform (what
// a single-platform export writes): the present platform is pullable by the index's tag.
func TestImportIndex(t *testing.T) {
	s := &Server{Dir: t.TempDir(), Logger: testLogger(t)}
	entries, digests := ociLayout(t, []map[string]string{nil})
	var idx manifestDoc
	json.Unmarshal(entries[len(entries)-1].data, &idx)
	child := idx.Manifests[0]
	child.Platform = &platform{"amd64", "linux", ""}
	missing := descriptor{MediaType: MediaTypeOCIManifest, Digest: sha([]byte("arm64 manifest")), Size: 14, Platform: &platform{"arm64", "linux", ""}}
	multi, _ := json.Marshal(manifestDoc{SchemaVersion: 2, MediaType: MediaTypeOCIIndex, Manifests: []descriptor{child, missing}})
	top, _ := json.Marshal(manifestDoc{SchemaVersion: 2, Manifests: []descriptor{{MediaType: MediaTypeOCIIndex, Digest: sha(multi), Size: int64(len(multi)),
		Annotations: map[string]string{AnnotationContainerName: "registry.k8s.io/pause:3.10"}}}})
	entries = append(entries[:len(entries)-1],
		tarEntry{name: "blobs/sha256/" + strings.TrimPrefix(sha(multi), "sha256:"), data: multi},
		tarEntry{name: "index.json", data: top})
	got, err := s.Import(context.Background(), bytes.NewReader(makeTar(t, entries, false)))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"registry.k8s.io/pause:3.10@" + sha(multi)}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Import = %v, want %v", got, want)
	}
	ts := httptestServer(t, s)
	r := do(t, ts, "GET", "/v2/pause/manifests/3.10?ns=registry.k8s.io", nil).expect(t, "index", 200)
	if r.header.Get("Content-Type") != MediaTypeOCIIndex || !bytes.Equal(r.body, multi) {
		t.Errorf("index: Content-Type %q, body %s", r.header.Get("Content-Type"), r.body)
	}
	pullImage(t, s, "pause", "registry.k8s.io", digests[0])
	do(t, ts, "GET", "/v2/pause/manifests/"+missing.Digest+"?ns=registry.k8s.io", nil).expect(t, "missing platform", 404)
}
