package registry

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestNodeHandlerPullsOnly attacks the endpoint nodes are served the way a
// privileged Pod could: every write and the catalog are refused with DENIED,
// pulls still work, and afterwards the tag other tenants pull is unchanged.
func TestNodeHandlerPullsOnly(t *testing.T) {
	s, host := newTestRegistry(t) // the host's own, read-write
	// Pushed by the host under its canonical name; nodes ask as containerd does (?ns=).
	canonical, name := "docker.io/library/busybox", "library/busybox"
	img := makeImage(t, host, canonical, "good", false)
	good := pushManifest(t, host, canonical, "stable", img.manifest, img.mediaType)

	node := httptest.NewServer(s.NodeHandler())
	t.Cleanup(node.Close)
	evil := makeImage(t, host, "scratch/evil", "evil", false) // its blobs exist; only the tag write is the attack

	for _, tc := range []struct {
		name, method, path string
		body               []byte
		hdr                []string
	}{
		{"manifest over the tag", "PUT", "/v2/" + name + "/manifests/stable?ns=docker.io", evil.manifest, []string{"Content-Type", evil.mediaType}},
		{"start an upload", "POST", "/v2/" + name + "/blobs/uploads/?ns=docker.io", nil, nil},
		{"monolithic blob", "POST", "/v2/" + name + "/blobs/uploads/?digest=" + sha([]byte("x")), []byte("x"), nil},
		{"cross-repository mount", "POST", "/v2/" + name + "/blobs/uploads/?mount=" + sha(evil.layer) + "&from=scratch/evil", nil, nil},
		{"patch an upload", "PATCH", "/v2/" + name + "/blobs/uploads/some-session", []byte("x"), nil},
		{"finish an upload", "PUT", "/v2/" + name + "/blobs/uploads/some-session?digest=" + sha([]byte("x")), nil, nil},
		{"delete the tag", "DELETE", "/v2/" + name + "/manifests/stable", nil, nil},
		{"delete by digest", "DELETE", "/v2/" + name + "/manifests/" + good, nil, nil},
		{"delete a blob", "DELETE", "/v2/" + name + "/blobs/" + sha(img.layer), nil, nil},
		{"the catalog", "GET", "/v2/_catalog", nil, nil},
		{"the catalog, paged", "GET", "/v2/_catalog?n=1", nil, nil},
		{"HEAD the catalog", "HEAD", "/v2/_catalog", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, node, tc.method, tc.path, tc.body, tc.hdr...)
			if r.status != http.StatusForbidden {
				t.Fatalf("%s %s: status %d, want 403; body %s", tc.method, tc.path, r.status, r.body)
			}
			if tc.method != "HEAD" {
				if r.errCode() != "DENIED" || !strings.Contains(string(r.body), "socialweb image push") {
					t.Errorf("body %s: want DENIED saying pushes go through `socialweb image push`", r.body)
				}
			}
		})
	}

	for _, tc := range []struct{ name, method, path string }{
		{"base", "GET", "/v2/"},
		{"manifest by tag", "GET", "/v2/" + name + "/manifests/stable?ns=docker.io"},
		{"manifest by digest", "HEAD", "/v2/" + name + "/manifests/" + good + "?ns=docker.io"},
		{"blob", "GET", "/v2/" + name + "/blobs/" + sha(img.layer) + "?ns=docker.io"},
		{"tags", "GET", "/v2/" + name + "/tags/list?ns=docker.io"},
	} {
		t.Run("pull: "+tc.name, func(t *testing.T) {
			do(t, node, tc.method, tc.path, nil, "Accept", img.mediaType).expect(t, tc.method+" "+tc.path, http.StatusOK)
		})
	}

	r := do(t, host, "GET", "/v2/"+canonical+"/manifests/stable", nil, "Accept", img.mediaType).expect(t, "the tag after the attack", http.StatusOK)
	if got := r.header.Get("Docker-Content-Digest"); got != good {
		t.Errorf("%s:stable is %s after the attempts, want %s (unchanged)", canonical, got, good)
	}
}
