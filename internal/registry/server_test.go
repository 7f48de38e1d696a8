package registry

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func TestNames(t *testing.T) {
	n := newNames([]string{"10.77.0.1"})
	for _, tc := range []struct {
		ns, path, want, code string
	}{
		{"docker.io", "library/busybox", "docker.io/library/busybox", ""},
		{"docker.io", "busybox", "docker.io/library/busybox", ""},
		{"index.docker.io", "library/busybox", "docker.io/library/busybox", ""},
		{"registry-1.docker.io", "foo/bar", "docker.io/foo/bar", ""},
		{"registry.k8s.io", "pause", "registry.k8s.io/pause", ""},
		{"registry.k8s.io", "coredns/coredns", "registry.k8s.io/coredns/coredns", ""},
		{"Quay.IO:443", "a/b", "quay.io:443/a/b", ""},
		{"", "foo", "foo", ""},
		{"", "library/busybox", "library/busybox", ""},
		{"", "docker.io/library/busybox", "docker.io/library/busybox", ""},
		{"", "docker.io/busybox", "docker.io/library/busybox", ""},
		{"", "registry.k8s.io/pause", "registry.k8s.io/pause", ""},
		{"", "localhost/foo", "foo", ""},
		{"", "localhost:5000/docker.io/library/busybox", "docker.io/library/busybox", ""},
		{"localhost:5000", "foo", "foo", ""},
		{"127.0.0.1:5000", "docker.io/library/busybox", "docker.io/library/busybox", ""},
		{"10.77.0.1:5000", "foo/bar", "foo/bar", ""},
		{"10.77.0.2:5000", "foo/bar", "10.77.0.2:5000/foo/bar", ""},
		{"", "Foo", "", errNameInvalid},
		{"", "foo//bar", "", errNameInvalid},
		{"", "foo/../bar", "", errNameInvalid},
		{"", "_manifests", "", errNameInvalid},
		{"", "", "", errNameInvalid},
		{"docker.io", "a/-b", "", errNameInvalid},
		{"bad host!", "foo", "", errNameInvalid},
		{"", strings.Repeat("a", 256), "", errNameInvalid},
	} {
		got, err := n.repo(tc.ns, tc.path)
		if tc.code != "" {
			if !IsCode(err, tc.code) {
				t.Errorf("repo(%q, %q) = %q, %v; want %s", tc.ns, tc.path, got, err, tc.code)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("repo(%q, %q) = %q, %v; want %q", tc.ns, tc.path, got, err, tc.want)
		}
	}
}

func TestParseRef(t *testing.T) {
	n := newNames(nil)
	d := "sha256:" + strings.Repeat("ab", 32)
	for _, tc := range []struct{ ref, want string }{
		{"busybox", "docker.io/library/busybox:latest"},
		{"busybox:stable", "docker.io/library/busybox:stable"},
		{"docker.io/library/busybox:stable", "docker.io/library/busybox:stable"},
		{"foo/bar:1", "docker.io/foo/bar:1"},
		{"registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.10"},
		{"localhost:5000/foo:1", "foo:1"},
		{"localhost/foo", "foo:latest"},
		{"quay.io:443/a/b:c", "quay.io:443/a/b:c"},
		{"busybox@" + d, "docker.io/library/busybox@" + d},
		{"busybox:1@" + d, "docker.io/library/busybox:1@" + d},
		{"Busybox", "error"},
		{"busybox:", "error"},
		{"busybox@sha256:12", "error"},
		{"busybox:a/b", "error"},
	} {
		r, err := n.parseRef(tc.ref)
		got := r.String()
		if err != nil {
			got = "error"
		}
		if got != tc.want {
			t.Errorf("parseRef(%q) = %q (%v), want %q", tc.ref, got, err, tc.want)
		}
	}
}

func TestRoutes(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		want         route
		ok           bool
	}{
		{"GET", "/v2/", route{kind: "base"}, true},
		{"GET", "/v2", route{kind: "base"}, true},
		{"GET", "/v2/_catalog", route{kind: "catalog"}, true},
		{"GET", "/v2/a/b/c/tags/list", route{"tags", "a/b/c", ""}, true},
		{"GET", "/v2/a/manifests/latest", route{"manifest", "a", "latest"}, true},
		{"GET", "/v2/a/blobs/manifests/x", route{"manifest", "a/blobs", "x"}, true},
		{"GET", "/v2/a/b/blobs/sha256:1", route{"blob", "a/b", "sha256:1"}, true},
		{"POST", "/v2/a/b/blobs/uploads/", route{"upload", "a/b", ""}, true},
		{"POST", "/v2/a/b/blobs/uploads", route{"upload", "a/b", ""}, true},
		{"PATCH", "/v2/a/blobs/uploads/123", route{"upload", "a", "123"}, true},
		{"GET", "/v2/a/tags/list/manifests/x", route{"manifest", "a/tags/list", "x"}, true},
		{"GET", "/v1/a/manifests/x", route{}, false},
		{"GET", "/v2/a/other/x", route{}, false},
	} {
		got, ok := parseRoute(tc.method, tc.path)
		if ok != tc.ok || got != tc.want {
			t.Errorf("parseRoute(%s %s) = %+v, %v; want %+v, %v", tc.method, tc.path, got, ok, tc.want, tc.ok)
		}
	}
}

func TestBase(t *testing.T) {
	_, ts := newTestRegistry(t)
	r := do(t, ts, "GET", "/v2/", nil).expect(t, "GET /v2/", 200)
	if r.header.Get("Docker-Distribution-API-Version") != "registry/2.0" {
		t.Errorf("missing Docker-Distribution-API-Version header: %v", r.header)
	}
	if r := do(t, ts, "GET", "/nope", nil); r.status != 404 {
		t.Errorf("GET /nope: %d, want 404", r.status)
	}
}

// TestBlobPush pushes a blob every way the spec allows and pulls it back.
func TestBlobPush(t *testing.T) {
	_, ts := newTestRegistry(t)
	content := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	d := sha(content)
	for _, tc := range []struct {
		name string
		push func(t *testing.T, name string)
	}{
		{"monolithic POST", func(t *testing.T, name string) {
			do(t, ts, "POST", "/v2/"+name+"/blobs/uploads/?digest="+d, content).expect(t, "POST", 201)
		}},
		{"POST then PUT with body", func(t *testing.T, name string) {
			r := do(t, ts, "POST", "/v2/"+name+"/blobs/uploads/", nil).expect(t, "POST", 202)
			do(t, ts, "PUT", r.header.Get("Location")+"?digest="+d, content, "Content-Type", "application/octet-stream").expect(t, "PUT", 201)
		}},
		{"chunked PATCH", func(t *testing.T, name string) {
			r := do(t, ts, "POST", "/v2/"+name+"/blobs/uploads", nil).expect(t, "POST", 202)
			loc := r.header.Get("Location")
			if r.header.Get("Docker-Upload-UUID") == "" || !strings.Contains(loc, "/blobs/uploads/") {
				t.Fatalf("POST: Location %q, UUID %q", loc, r.header.Get("Docker-Upload-UUID"))
			}
			off := 0
			for _, n := range []int{1000, 30000, len(content) - 31000} {
				chunk := content[off : off+n]
				r = do(t, ts, "PATCH", loc, chunk, "Content-Range", fmt.Sprintf("%d-%d", off, off+n-1)).expect(t, "PATCH", 202)
				off += n
				if got := r.header.Get("Range"); got != fmt.Sprintf("0-%d", off-1) {
					t.Fatalf("PATCH: Range %q, want 0-%d", got, off-1)
				}
				loc = r.header.Get("Location")
			}
			do(t, ts, "GET", loc, nil).expect(t, "upload status", 204)
			do(t, ts, "PUT", loc+"?digest="+d, nil).expect(t, "PUT", 201)
		}},
		{"streamed PATCH without Content-Range", func(t *testing.T, name string) {
			// Through the mirror: the session's Location keeps ?ns=.
			r := do(t, ts, "POST", "/v2/"+name+"/blobs/uploads/?ns=docker.io", nil).expect(t, "POST", 202)
			r = do(t, ts, "PATCH", r.header.Get("Location"), content[:5]).expect(t, "PATCH", 202)
			r = do(t, ts, "PATCH", r.header.Get("Location"), content[5:]).expect(t, "PATCH", 202)
			do(t, ts, "PUT", r.header.Get("Location")+"&digest="+d, nil).expect(t, "PUT", 201)
		}},
		{"mount", func(t *testing.T, name string) {
			do(t, ts, "POST", "/v2/"+name+"/blobs/uploads/?mount="+d+"&from=other", nil).expect(t, "mount", 201)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "push/" + strings.ReplaceAll(strings.ToLower(tc.name), " ", "-")
			do(t, ts, "HEAD", "/v2/"+name+"/blobs/"+d, nil)
			tc.push(t, name)
			r := do(t, ts, "HEAD", "/v2/"+name+"/blobs/"+d, nil).expect(t, "HEAD", 200)
			if r.header.Get("Content-Length") != strconv.Itoa(len(content)) || r.header.Get("Docker-Content-Digest") != d || len(r.body) != 0 {
				t.Errorf("HEAD: headers %v, %d body bytes", r.header, len(r.body))
			}
			r = do(t, ts, "GET", "/v2/"+name+"/blobs/"+d, nil).expect(t, "GET", 200)
			if !bytes.Equal(r.body, content) {
				t.Errorf("GET returned %d bytes that differ from the %d pushed", len(r.body), len(content))
			}
		})
	}
	r := do(t, ts, "GET", "/v2/any/blobs/"+d, nil, "Range", "bytes=16-31").expect(t, "range", 206)
	if !bytes.Equal(r.body, content[16:32]) {
		t.Errorf("Range GET returned %q, want %q", r.body, content[16:32])
	}
}

// TestManifests pushes each manifest media type by tag and pulls it by tag and digest.
func TestManifests(t *testing.T) {
	_, ts := newTestRegistry(t)
	for _, tc := range []struct {
		name   string
		docker bool
		index  string // "" for an image manifest, else the index media type
	}{
		{"oci manifest", false, ""},
		{"docker manifest", true, ""},
		{"oci index", false, MediaTypeOCIIndex},
		{"docker manifest list", true, MediaTypeDockerList},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := "library/" + strings.ReplaceAll(tc.name, " ", "-")
			img := makeImage(t, ts, repo, tc.name, tc.docker)
			m, mt := img.manifest, img.mediaType
			var child string
			if tc.index != "" {
				child = pushManifest(t, ts, "elsewhere", sha(img.manifest), img.manifest, img.mediaType)
				m, _ = json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": tc.index, "manifests": []descriptor{
					{MediaType: img.mediaType, Digest: child, Size: int64(len(img.manifest)), Platform: &platform{"amd64", "linux", ""}},
				}})
				mt = tc.index
			}
			d := pushManifest(t, ts, repo, "v1", m, mt)
			for _, ref := range []string{"v1", d} {
				for _, method := range []string{"HEAD", "GET"} {
					r := do(t, ts, method, "/v2/"+repo+"/manifests/"+ref, nil, "Accept", mt).expect(t, method+" "+ref, 200)
					if r.header.Get("Content-Type") != mt || r.header.Get("Docker-Content-Digest") != d || r.header.Get("Content-Length") != strconv.Itoa(len(m)) {
						t.Errorf("%s %s: Content-Type %q, digest %q, length %q; want %s, %s, %d", method, ref,
							r.header.Get("Content-Type"), r.header.Get("Docker-Content-Digest"), r.header.Get("Content-Length"), mt, d, len(m))
					}
					if method == "GET" && !bytes.Equal(r.body, m) {
						t.Errorf("GET %s: body differs from what was pushed", ref)
					}
				}
			}
			if child != "" {
				// The index links its child into repo, so it is pullable there by digest.
				r := do(t, ts, "GET", "/v2/"+repo+"/manifests/"+child, nil).expect(t, "child by digest", 200)
				if r.header.Get("Content-Type") != img.mediaType {
					t.Errorf("child Content-Type %q, want %q", r.header.Get("Content-Type"), img.mediaType)
				}
			}
		})
	}
}

func TestErrors(t *testing.T) {
	_, ts := newTestRegistry(t)
	img := makeImage(t, ts, "app", "x", false)
	pushManifest(t, ts, "app", "v1", img.manifest, img.mediaType)
	unknown := sha([]byte("nothing"))
	missingLayer, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": MediaTypeOCIManifest,
		"config": descriptor{MediaType: MediaTypeOCIConfig, Digest: sha(img.config), Size: int64(len(img.config))},
		"layers": []descriptor{{MediaType: MediaTypeOCILayer, Digest: unknown, Size: 7}}})
	missingChild, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": MediaTypeOCIIndex,
		"manifests": []descriptor{{MediaType: MediaTypeOCIManifest, Digest: unknown, Size: 7}}})
	upload := func() string {
		return do(t, ts, "POST", "/v2/app/blobs/uploads/", nil).expect(t, "POST", 202).header.Get("Location")
	}
	for _, tc := range []struct {
		name, method, path string
		body               []byte
		hdr                []string
		status             int
		code               string
	}{
		{"unknown tag", "GET", "/v2/app/manifests/v2", nil, nil, 404, errManifestUnknown},
		{"unknown tag HEAD", "HEAD", "/v2/app/manifests/v2", nil, nil, 404, ""},
		{"unknown repo", "GET", "/v2/nope/manifests/v1", nil, nil, 404, errManifestUnknown},
		{"unknown manifest digest", "GET", "/v2/app/manifests/" + unknown, nil, nil, 404, errManifestUnknown},
		{"manifest of another repo", "GET", "/v2/other/manifests/" + sha(img.manifest), nil, nil, 404, errManifestUnknown},
		{"unknown blob", "GET", "/v2/app/blobs/" + unknown, nil, nil, 404, errBlobUnknown},
		{"invalid digest", "GET", "/v2/app/blobs/sha256:xyz", nil, nil, 400, errDigestInvalid},
		{"sha512 digest", "GET", "/v2/app/blobs/sha512:" + strings.Repeat("a", 128), nil, nil, 405, errUnsupported},
		{"invalid name", "GET", "/v2/App/manifests/v1", nil, nil, 400, errNameInvalid},
		{"invalid tag", "GET", "/v2/app/manifests/-v1", nil, nil, 400, errTagInvalid},
		{"tags of unknown repo", "GET", "/v2/nope/tags/list", nil, nil, 404, errNameUnknown},
		{"wrong digest monolithic", "POST", "/v2/app/blobs/uploads/?digest=" + unknown, []byte("something else"), nil, 400, errDigestInvalid},
		{"wrong digest chunked", "PUT", upload() + "?digest=" + unknown, []byte("something else"), nil, 400, errDigestInvalid},
		{"PUT without digest", "PUT", upload(), []byte("x"), nil, 400, errDigestInvalid},
		{"bad Content-Range", "PATCH", upload(), []byte("abc"), []string{"Content-Range", "5-7"}, 416, errRangeInvalid},
		{"short chunk", "PATCH", upload(), []byte("abc"), []string{"Content-Range", "0-9"}, 400, errBlobUploadInvalid},
		{"unknown upload", "PATCH", "/v2/app/blobs/uploads/0123", []byte("abc"), nil, 404, errBlobUploadUnknown},
		{"upload of another repo", "PATCH", strings.Replace(upload(), "/app/", "/other/", 1), []byte("abc"), nil, 404, errBlobUploadUnknown},
		{"manifest digest mismatch", "PUT", "/v2/app/manifests/" + unknown, img.manifest, []string{"Content-Type", MediaTypeOCIManifest}, 400, errDigestInvalid},
		{"manifest missing blob", "PUT", "/v2/app/manifests/v3", missingLayer, []string{"Content-Type", MediaTypeOCIManifest}, 400, errManifestBlobUnknown},
		{"index missing child", "PUT", "/v2/app/manifests/v3", missingChild, []string{"Content-Type", MediaTypeOCIIndex}, 400, errManifestBlobUnknown},
		{"manifest not JSON", "PUT", "/v2/app/manifests/v3", []byte("{"), []string{"Content-Type", MediaTypeOCIManifest}, 400, errManifestInvalid},
		{"manifest type mismatch", "PUT", "/v2/app/manifests/v3", img.manifest, []string{"Content-Type", MediaTypeDockerManifest}, 400, errManifestInvalid},
		{"schema1 manifest", "PUT", "/v2/app/manifests/v3", []byte(`{"schemaVersion":1}`), []string{"Content-Type", "application/vnd.docker.distribution.manifest.v1+prettyjws"}, 400, errManifestInvalid},
		{"delete blob", "DELETE", "/v2/app/blobs/" + sha(img.layer), nil, nil, 405, errUnsupported},
		{"bad pagination", "GET", "/v2/_catalog?n=-1", nil, nil, 400, errPaginationInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, ts, tc.method, tc.path, tc.body, tc.hdr...)
			if r.status != tc.status || r.errCode() != tc.code {
				t.Errorf("%s %s: %d %s (%s); want %d %s", tc.method, tc.path, r.status, r.errCode(), r.body, tc.status, tc.code)
			}
			if tc.status >= 400 && tc.method != "HEAD" && r.header.Get("Content-Type") != "application/json" {
				t.Errorf("error response Content-Type %q", r.header.Get("Content-Type"))
			}
		})
	}
	// Nothing rejected was stored.
	do(t, ts, "HEAD", "/v2/app/blobs/"+sha([]byte("something else")), nil).expect(t, "rejected blob", 404)
	do(t, ts, "GET", "/v2/app/manifests/v3", nil).expect(t, "rejected manifest", 404)
}

// TestMirror checks containerd's mirror requests (?ns=) find images stored under their
// canonical names, however they were pushed.
func TestMirror(t *testing.T) {
	_, ts := newTestRegistry(t)
	// Pushed through this registry's own name, the way `socialweb image push` or crane would.
	bb := makeImage(t, ts, "docker.io/library/busybox", "busybox", false)
	bbd := pushManifest(t, ts, "docker.io/library/busybox", "stable", bb.manifest, bb.mediaType)
	// Pushed the way containerd would push to a mirror of registry.k8s.io.
	pause := makeImage(t, ts, "pause", "pause", true)
	r := do(t, ts, "PUT", "/v2/pause/manifests/3.10?ns=registry.k8s.io", pause.manifest, "Content-Type", pause.mediaType).expect(t, "push pause", 201)
	paused := r.header.Get("Docker-Content-Digest")
	local := makeImage(t, ts, "foo", "foo", false)
	locald := pushManifest(t, ts, "foo", "1", local.manifest, local.mediaType)

	for _, tc := range []struct {
		path, digest string // digest "" means MANIFEST_UNKNOWN
	}{
		{"/v2/library/busybox/manifests/stable?ns=docker.io", bbd},
		{"/v2/busybox/manifests/stable?ns=docker.io", bbd},
		{"/v2/library/busybox/manifests/stable?ns=index.docker.io", bbd},
		{"/v2/library/busybox/manifests/" + bbd + "?ns=docker.io", bbd},
		{"/v2/docker.io/library/busybox/manifests/stable", bbd},
		{"/v2/pause/manifests/3.10?ns=registry.k8s.io", paused},
		{"/v2/registry.k8s.io/pause/manifests/3.10", paused},
		{"/v2/foo/manifests/1", locald},
		{"/v2/foo/manifests/1?ns=localhost:5000", locald},
		{"/v2/foo/manifests/1?ns=127.0.0.1:5000", locald},
		{"/v2/library/busybox/manifests/stable", ""},            // local library/busybox is another repository
		{"/v2/library/busybox/manifests/stable?ns=quay.io", ""}, // so is quay.io's
		{"/v2/pause/manifests/3.10", ""},
		{"/v2/pause/manifests/3.10?ns=docker.io", ""},
		{"/v2/foo/manifests/1?ns=docker.io", ""},
	} {
		r := do(t, ts, "GET", tc.path, nil)
		if tc.digest == "" {
			if r.status != 404 || r.errCode() != errManifestUnknown {
				t.Errorf("GET %s: %d %s, want 404 MANIFEST_UNKNOWN", tc.path, r.status, r.errCode())
			}
			continue
		}
		if r.status != 200 || r.header.Get("Docker-Content-Digest") != tc.digest {
			t.Errorf("GET %s: %d %q, want 200 %s", tc.path, r.status, r.header.Get("Docker-Content-Digest"), tc.digest)
		}
	}
	// Blobs are fetched with the same ns.
	for _, p := range []string{"/v2/library/busybox/blobs/" + sha(bb.layer) + "?ns=docker.io", "/v2/pause/blobs/" + sha(pause.config) + "?ns=registry.k8s.io"} {
		do(t, ts, "GET", p, nil).expect(t, p, 200)
	}
}

func TestCatalogAndTags(t *testing.T) {
	_, ts := newTestRegistry(t)
	img := makeImage(t, ts, "x", "x", false)
	for _, ref := range []string{"docker.io/library/busybox:stable", "docker.io/library/busybox:latest", "docker.io/library/busybox:1.35",
		"registry.k8s.io/pause:3.10", "foo:1", "a/b/c:2"} {
		name, tag, _ := strings.Cut(ref, ":")
		pushManifest(t, ts, name, tag, img.manifest, img.mediaType)
	}
	var cat struct{ Repositories []string }
	json.Unmarshal(do(t, ts, "GET", "/v2/_catalog", nil).expect(t, "catalog", 200).body, &cat)
	want := []string{"a/b/c", "docker.io/library/busybox", "foo", "registry.k8s.io/pause"}
	if !reflect.DeepEqual(cat.Repositories, want) {
		t.Errorf("catalog %v, want %v", cat.Repositories, want)
	}
	r := do(t, ts, "GET", "/v2/_catalog?n=2", nil).expect(t, "catalog page", 200)
	json.Unmarshal(r.body, &cat)
	if !reflect.DeepEqual(cat.Repositories, want[:2]) || !strings.Contains(r.header.Get("Link"), "last=docker.io%2Flibrary%2Fbusybox") {
		t.Errorf("catalog?n=2: %v, Link %q", cat.Repositories, r.header.Get("Link"))
	}
	json.Unmarshal(do(t, ts, "GET", "/v2/_catalog?n=2&last=docker.io/library/busybox", nil).expect(t, "catalog page 2", 200).body, &cat)
	if !reflect.DeepEqual(cat.Repositories, want[2:]) {
		t.Errorf("catalog page 2: %v, want %v", cat.Repositories, want[2:])
	}
	for _, tc := range []struct {
		path string
		tags []string
	}{
		{"/v2/library/busybox/tags/list?ns=docker.io", []string{"1.35", "latest", "stable"}},
		{"/v2/docker.io/library/busybox/tags/list", []string{"1.35", "latest", "stable"}},
		{"/v2/library/busybox/tags/list?ns=docker.io&n=1&last=1.35", []string{"latest"}},
		{"/v2/pause/tags/list?ns=registry.k8s.io", []string{"3.10"}},
		{"/v2/a/b/c/tags/list", []string{"2"}},
	} {
		var tl struct {
			Name string
			Tags []string
		}
		json.Unmarshal(do(t, ts, "GET", tc.path, nil).expect(t, tc.path, 200).body, &tl)
		if !reflect.DeepEqual(tl.Tags, tc.tags) {
			t.Errorf("GET %s: tags %v, want %v", tc.path, tl.Tags, tc.tags)
		}
	}
}

func TestDeleteAndPersistence(t *testing.T) {
	s, ts := newTestRegistry(t)
	img := makeImage(t, ts, "app", "x", false)
	d := pushManifest(t, ts, "app", "v1", img.manifest, img.mediaType)
	pushManifest(t, ts, "app", "v2", img.manifest, img.mediaType)
	pushManifest(t, ts, "app", "v3", img.manifest, img.mediaType)
	do(t, ts, "DELETE", "/v2/app/manifests/v1", nil).expect(t, "delete tag", 202)
	do(t, ts, "GET", "/v2/app/manifests/v1", nil).expect(t, "deleted tag", 404)
	do(t, ts, "GET", "/v2/app/manifests/v2", nil).expect(t, "other tag", 200)

	// A second server over the same directory sees the same state.
	s2 := &Server{Dir: s.Dir, Logger: testLogger(t)}
	refs, err := s2.List()
	if err != nil {
		t.Fatal(err)
	}
	size := int64(len(img.manifest) + len(img.config) + len(img.layer))
	want := []ImageRef{{"app", "v2", d, MediaTypeOCIManifest, size, ""}, {"app", "v3", d, MediaTypeOCIManifest, size, ""}}
	if !reflect.DeepEqual(refs, want) {
		t.Errorf("List = %+v, want %+v", refs, want)
	}
	do(t, ts, "DELETE", "/v2/app/manifests/"+d, nil).expect(t, "delete manifest", 202)
	do(t, ts, "GET", "/v2/app/manifests/v2", nil).expect(t, "tag of deleted manifest", 404)
	do(t, ts, "GET", "/v2/app/blobs/"+sha(img.layer), nil).expect(t, "blob of deleted manifest", 200)
}

// TestConcurrent pulls one image from many goroutines while others push blobs and retag.
func TestConcurrent(t *testing.T) {
	_, ts := newTestRegistry(t)
	big := bytes.Repeat([]byte("concurrent"), 100_000) // 1 MB
	bigd := pushBlob(t, ts, "app", big)
	img := makeImage(t, ts, "app", "x", false)
	d := pushManifest(t, ts, "app", "v1", img.manifest, img.mediaType)

	var wg sync.WaitGroup
	errs := make(chan string, 100)
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 5 {
				switch {
				case i%4 == 3: // pushers: the same blob and tag again, and new blobs
					b := []byte(fmt.Sprintf("blob %d %d", i, j))
					if r := do(t, ts, "POST", "/v2/app/blobs/uploads/?digest="+sha(b), b); r.status != 201 {
						errs <- fmt.Sprintf("push: %d %s", r.status, r.body)
					}
					if r := do(t, ts, "POST", "/v2/app/blobs/uploads/?digest="+bigd, big); r.status != 201 {
						errs <- fmt.Sprintf("push again: %d %s", r.status, r.body)
					}
					if r := do(t, ts, "PUT", "/v2/app/manifests/v1", img.manifest, "Content-Type", img.mediaType); r.status != 201 {
						errs <- fmt.Sprintf("retag: %d %s", r.status, r.body)
					}
				default:
					r := do(t, ts, "GET", "/v2/app/manifests/v1", nil)
					if r.status != 200 || r.header.Get("Docker-Content-Digest") != d {
						errs <- fmt.Sprintf("pull manifest: %d %s", r.status, r.body)
					}
					r = do(t, ts, "GET", "/v2/app/blobs/"+bigd, nil)
					if r.status != 200 || !bytes.Equal(r.body, big) {
						errs <- fmt.Sprintf("pull blob: %d, %d bytes", r.status, len(r.body))
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
