// Package pullthrough measures the host registry's pull-through cache against a real
// upstream (Debian's docker-registry in a network namespace, TLS, over a veth), side by
// side in one run: a first pull through the cache, a pull of the same image pushed on
// the host, a second pull (a cache hit), and five cold pulls at once (bytes over the
// upstream link). Nodes are stood in for by HTTP clients on the host that pull the
// way containerd does (manifest, then config and layers, in parallel); the VMs' own
// unpack time is in bench/nodeboot.
//
//	go test -run XXX -bench . -benchtime 1x ./bench/pullthrough   (root; SIZE_MIB=1024 by default)
package pullthrough

import (
	"context"
	"crypto/x509"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	ggcr "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/registry"
)

func BenchmarkPullThrough(b *testing.B) {
	sizeMiB := int64(1024)
	if v, err := strconv.ParseInt(os.Getenv("SIZE_MIB"), 10, 64); err == nil && v > 0 {
		sizeMiB = v
	}
	up := livetest.StartUpstream(b, livetest.UpstreamOptions{})
	ctx := context.Background()
	// Four layers of random (incompressible) bytes, as a large image's layers are.
	img, err := random.Image(sizeMiB<<20/4, 4)
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	if _, err := up.Push(ctx, img, "bench/big:1"); err != nil {
		b.Fatal(err)
	}
	b.Logf("pushed a %d MiB image upstream in %s", sizeMiB, time.Since(t0).Round(time.Millisecond))
	pem, _ := os.ReadFile(up.CAFile)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	newCache := func() (*registry.Server, *httptest.Server) {
		s := &registry.Server{Dir: b.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Upstream: &registry.Upstream{Mirrors: map[string]string{"upstream.test": "https://" + up.Addr}, RootCAs: pool}}
		node := httptest.NewServer(s.NodeHandlerFor("bench"))
		b.Cleanup(node.Close)
		return s, node
	}
	m, _ := img.Manifest()
	for i := 0; i < b.N; i++ {
		// 1. First pull through a cold cache, then 2. the same pull again (a hit).
		s, node := newCache()
		first := pull(b, node.URL, "bench/big", "upstream.test", m)
		hit := pull(b, node.URL, "bench/big", "upstream.test", m)
		// 3. The image pushed on the host (the same bytes, under a local name): what a
		// pull cost before pull-through.
		pushed := pushedPull(b, s, img, m)
		// 4. Five cold pulls at once: bytes over the upstream link.
		s5, node5 := newCache()
		before := upstreamBytes(up)
		var wg sync.WaitGroup
		t5 := time.Now()
		for range 5 {
			wg.Add(1)
			go func() { defer wg.Done(); pull(b, node5.URL, "bench/big", "upstream.test", m) }()
		}
		wg.Wait()
		five := time.Since(t5)
		_ = s5
		over := upstreamBytes(up) - before
		b.Logf("%d MiB image: first pull through the cache %s, pushed image %s (%.2fx), cache hit %s (%.2fx), five cold pulls at once %s; upstream sent %d MiB for the five (%.2f image sizes)",
			sizeMiB, first.Round(time.Millisecond), pushed.Round(time.Millisecond), first.Seconds()/pushed.Seconds(),
			hit.Round(time.Millisecond), first.Seconds()/hit.Seconds(), five.Round(time.Millisecond), over>>20, float64(over)/float64(sizeMiB<<20))
		b.ReportMetric(first.Seconds(), "first-s")
		b.ReportMetric(pushed.Seconds(), "pushed-s")
		b.ReportMetric(hit.Seconds(), "hit-s")
		b.ReportMetric(five.Seconds(), "five-s")
		b.ReportMetric(float64(over)/float64(sizeMiB<<20), "upstream-images-for-five")
	}
}

// pull fetches the manifest, then config and layers in parallel, as containerd does.
func pull(b *testing.B, base, repo, ns string, m *ggcr.Manifest) time.Duration {
	t0 := time.Now()
	get := func(path string) {
		resp, err := http.Get(base + path)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("GET %s: %d after %d bytes", path, resp.StatusCode, n)
		}
	}
	q := ""
	if ns != "" {
		q = "?ns=" + ns
	}
	get("/v2/" + repo + "/manifests/1" + q)
	var wg sync.WaitGroup
	for _, d := range append([]ggcr.Descriptor{m.Config}, m.Layers...) {
		wg.Add(1)
		go func() { defer wg.Done(); get("/v2/" + repo + "/blobs/" + d.Digest.String() + q) }()
	}
	wg.Wait()
	return time.Since(t0)
}

// pushedPull pulls the image from a registry it was pushed to on the host.
func pushedPull(b *testing.B, _ *registry.Server, img ggcr.Image, m *ggcr.Manifest) time.Duration {
	s := &registry.Server{Dir: b.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	host := httptest.NewServer(s.Handler())
	defer host.Close()
	put := func(method, path string, body io.Reader) {
		req, _ := http.NewRequest(method, host.URL+path, body)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			b.Fatalf("%s %s: %d", method, path, resp.StatusCode)
		}
	}
	layers, _ := img.Layers()
	for _, l := range layers {
		d, _ := l.Digest()
		rc, _ := l.Compressed()
		put("POST", "/v2/local/big/blobs/uploads/?digest="+d.String(), rc)
		rc.Close()
	}
	cfg, _ := img.RawConfigFile()
	cd, _ := img.ConfigName()
	put("POST", "/v2/local/big/blobs/uploads/?digest="+cd.String(), bytesReader(cfg))
	raw, _ := img.RawManifest()
	mt, _ := img.MediaType()
	req, _ := http.NewRequest("PUT", host.URL+"/v2/local/big/manifests/1", bytesReader(raw))
	req.Header.Set("Content-Type", string(mt))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusCreated {
		b.Fatalf("pushing the manifest: %v %v", err, resp)
	}
	resp.Body.Close()
	node := httptest.NewServer(s.NodeHandlerFor("bench"))
	defer node.Close()
	return pull(b, node.URL, "local/big", "", m)
}

func bytesReader(b []byte) io.Reader { return &sliceReader{b: b} }

type sliceReader struct{ b []byte }

func (r *sliceReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// upstreamBytes sums the bytes the upstream's access log says it sent.
func upstreamBytes(up *livetest.Upstream) int64 {
	return up.SentBytes()
}
