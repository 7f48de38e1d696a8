package registry

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

type tlogWriter struct{ t testing.TB }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// newTestRegistry serves a registry over a fresh directory on a loopback httptest server.
func newTestRegistry(t testing.TB) (*Server, *httptest.Server) {
	t.Helper()
	s := &Server{Dir: t.TempDir(), Logger: testLogger(t)}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return s, ts
}

func httptestServer(t testing.TB, s *Server) *httptest.Server {
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return ts
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request to ts; path may carry a query.
func do(t testing.TB, ts *httptest.Server, method, path string, body []byte, hdr ...string) resp {
	t.Helper()
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, ts.URL+path, r)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := ts.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp{res.StatusCode, res.Header, b}
}

// errCode returns the first OCI error code of a response body.
func (r resp) errCode() string {
	var e errorBody
	if json.Unmarshal(r.body, &e) != nil || len(e.Errors) == 0 {
		return ""
	}
	return e.Errors[0].Code
}

func (r resp) expect(t testing.TB, what string, status int) resp {
	t.Helper()
	if r.status != status {
		t.Fatalf("%s: status %d, want %d; body %s", what, r.status, status, r.body)
	}
	return r
}

// pushBlob uploads b monolithically to name.
func pushBlob(t testing.TB, ts *httptest.Server, name string, b []byte) string {
	t.Helper()
	d := sha(b)
	do(t, ts, "POST", "/v2/"+name+"/blobs/uploads/?digest="+d, b).expect(t, "push blob", http.StatusCreated)
	return d
}

type testImage struct {
	config, layer, manifest []byte
	mediaType               string
}

// makeImage pushes a config and a layer to name and returns an OCI (or Docker) manifest
// for them, not yet pushed.
func makeImage(t testing.TB, ts *httptest.Server, name, seed string, docker bool) testImage {
	t.Helper()
	layer := []byte("layer content " + seed)
	config := []byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":["` + sha(layer) + `"]},"config":{"Cmd":["` + seed + `"]}}`)
	pushBlob(t, ts, name, layer)
	pushBlob(t, ts, name, config)
	mt, cmt, lmt := MediaTypeOCIManifest, MediaTypeOCIConfig, MediaTypeOCILayer
	if docker {
		mt, cmt, lmt = MediaTypeDockerManifest, MediaTypeDockerConfig, "application/vnd.docker.image.rootfs.diff.tar"
	}
	m, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": mt,
		"config": descriptor{MediaType: cmt, Digest: sha(config), Size: int64(len(config))},
		"layers": []descriptor{{MediaType: lmt, Digest: sha(layer), Size: int64(len(layer))}},
	})
	return testImage{config, layer, m, mt}
}

func pushManifest(t testing.TB, ts *httptest.Server, name, ref string, m []byte, mt string) string {
	t.Helper()
	r := do(t, ts, "PUT", "/v2/"+name+"/manifests/"+ref, m, "Content-Type", mt).expect(t, "push manifest "+name+":"+ref, http.StatusCreated)
	if got := r.header.Get("Docker-Content-Digest"); got != sha(m) {
		t.Fatalf("push manifest: Docker-Content-Digest %q, want %s", got, sha(m))
	}
	return sha(m)
}
