package registry

import (
	"context"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// The pull-through cache against a real registry (distribution, Debian's
// docker-registry) over TLS from a test CA, mapped in as upstream.test by a mirror:
// a first pull fetches once, later pulls make no upstream request, and with upstream
// stopped the cached image is still served while an uncached one says why it is not.
func TestPullThroughARealRegistry(t *testing.T) {
	up := livetest.StartUpstream(t, livetest.UpstreamOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	img, err := random.Image(64<<10, 2)
	if err != nil {
		t.Fatal(err)
	}
	digest, err := up.Push(ctx, img, "team/app:1")
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(up.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	s := &Server{Dir: t.TempDir(), Logger: testLogger(t), Upstream: &Upstream{
		Mirrors: map[string]string{"upstream.test": "https://" + up.Addr}, RootCAs: pool, TagTTL: time.Hour, Timeout: 5 * time.Second}}
	node := httptest.NewServer(s.NodeHandler())
	t.Cleanup(node.Close)

	m, _ := img.Manifest()
	pull := func(round int) {
		r := do(t, node, "GET", "/v2/team/app/manifests/1?ns=upstream.test", nil, "Accept", manifestAccept).expect(t, "manifest", http.StatusOK)
		if got := r.header.Get("Docker-Content-Digest"); got != digest {
			t.Fatalf("round %d: manifest %s, want %s", round, got, digest)
		}
		for _, l := range append(m.Layers, m.Config) {
			r := do(t, node, "GET", "/v2/team/app/blobs/"+l.Digest.String()+"?ns=upstream.test", nil).expect(t, "blob", http.StatusOK)
			if sha(r.body) != l.Digest.String() {
				t.Fatalf("round %d: blob %s arrived as %s", round, l.Digest, sha(r.body))
			}
		}
	}
	pull(1)
	manifests, blobs := up.Requests("GET", "/team/app/manifests/"), up.Requests("GET", "/team/app/blobs/")
	if manifests != 1 || blobs != 3 {
		t.Fatalf("first pull: upstream logged %d manifest and %d blob GETs, want 1 and 3\n%s", manifests, blobs, up.Log())
	}
	pull(2)
	pull(3)
	if m2, b2 := up.Requests("GET", "/team/app/manifests/"), up.Requests("GET", "/team/app/blobs/"); m2 != manifests || b2 != blobs {
		t.Errorf("later pulls reached upstream: %d manifest and %d blob GETs in all, want %d and %d", m2, b2, manifests, blobs)
	}

	up.Stop()
	pull(4)
	r := do(t, node, "GET", "/v2/team/never/manifests/1?ns=upstream.test", nil).expect(t, "uncached, upstream stopped", http.StatusServiceUnavailable)
	if !strings.Contains(string(r.body), "could not be reached") {
		t.Errorf("uncached pull with upstream stopped: %s; want it to say upstream could not be reached", r.body)
	}
}
