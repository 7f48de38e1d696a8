package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/socialweb-computer/socialweb/internal/registry/registrytest"
)

// TestContainerdPull pulls images through a private containerd whose only registry
// configuration is a certs.d/_default/hosts.toml naming this registry, the way a node is
// set up: the mirror (?ns=) requests must find what Import stored.
func TestContainerdPull(t *testing.T) {
	dir := t.TempDir()

	// Registry with two imported images, on a loopback port; every request is recorded.
	s := &Server{Dir: filepath.Join(dir, "registry"), Logger: testLogger(t)}
	images := map[string]string{}
	for _, ref := range []string{"docker.io/library/busybox:stable", "registry.k8s.io/pause:3.10"} {
		l := layerTar(t, "hello", "from "+ref)
		cfg := dockerConfig(l)
		m, _ := json.Marshal([]map[string]any{{"Config": "c.json", "RepoTags": []string{ref}, "Layers": []string{"l/layer.tar"}}})
		got, err := s.Import(context.Background(), bytes.NewReader(makeTar(t, []tarEntry{{name: "c.json", data: cfg}, {name: "l/layer.tar", data: l}, {name: "manifest.json", data: m}}, false)))
		if err != nil {
			t.Fatal(err)
		}
		images[ref] = got[0][strings.Index(got[0], "@")+1:]
	}
	var mu sync.Mutex
	var requests []string
	h := s.Handler()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests = append(requests, r.Method+" "+r.URL.RequestURI())
		mu.Unlock()
		h.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	defer srv.Close()

	c := registrytest.Start(t, ln.Addr().String())
	for ref, digest := range images {
		c.Pull(t, ref)
		out, err := c.Run("images", "ls")
		if err != nil || !strings.Contains(out, ref) || !strings.Contains(out, digest) {
			t.Errorf("ctr images ls (want %s %s): %v\n%s", ref, digest, err, out)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	joined := strings.Join(requests, "\n")
	for _, want := range []string{"/v2/library/busybox/manifests/stable?ns=docker.io", "/v2/pause/manifests/3.10?ns=registry.k8s.io"} {
		if !strings.Contains(joined, want) {
			t.Errorf("containerd never asked for %s; requests:\n%s", want, joined)
		}
	}
	t.Logf("requests:\n%s", joined)
}
