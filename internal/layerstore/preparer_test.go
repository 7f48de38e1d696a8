package layerstore

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/socialweb-computer/socialweb/internal/registry"
)

type testLayer struct {
	raw, blob []byte
}

func newTestLayer(t *testing.T, seed string) testLayer {
	raw := makeTar(t, []entry{{name: seed + "/", typ: tar.TypeDir}, {name: seed + "/file", typ: tar.TypeReg, body: "content of " + seed}})
	return testLayer{raw: raw, blob: compress(t, "gzip", raw)}
}

func push(t *testing.T, ts *httptest.Server, path string, body []byte, ct string, want int) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, ts.URL+path, bytes.NewReader(body))
	if ct != "" {
		req.Method = http.MethodPut
		req.Header.Set("Content-Type", ct)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		t.Fatalf("%s %s: %d %s, want %d", req.Method, path, resp.StatusCode, b, want)
	}
}

// pushImage pushes an image of the layers to ts as name:tag; badDiffID gives the config a
// wrong diffID for the last layer.
func pushImage(t *testing.T, ts *httptest.Server, name, tag string, badDiffID bool, ls ...testLayer) {
	t.Helper()
	var diffIDs []string
	var descs []map[string]any
	for i, l := range ls {
		push(t, ts, "/v2/"+name+"/blobs/uploads/?digest="+sum(l.blob), l.blob, "", http.StatusCreated)
		d := sum(l.raw)
		if badDiffID && i == len(ls)-1 {
			d = sum([]byte("not this"))
		}
		diffIDs = append(diffIDs, d)
		descs = append(descs, map[string]any{"mediaType": registry.MediaTypeOCILayerGzip, "digest": sum(l.blob), "size": len(l.blob)})
	}
	cfg, _ := json.Marshal(map[string]any{"architecture": "amd64", "os": "linux", "rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs}})
	push(t, ts, "/v2/"+name+"/blobs/uploads/?digest="+sum(cfg), cfg, "", http.StatusCreated)
	m, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": registry.MediaTypeOCIManifest,
		"config": map[string]any{"mediaType": registry.MediaTypeOCIConfig, "digest": sum(cfg), "size": len(cfg)}, "layers": descs})
	push(t, ts, "/v2/"+name+"/manifests/"+tag, m, registry.MediaTypeOCIManifest, http.StatusCreated)
}

type harness struct {
	rs    *registry.Server
	ts    *httptest.Server
	store *Store
	p     *Preparer
	reg   *prometheus.Registry
}

func newHarness(t *testing.T, watch bool) *harness {
	t.Helper()
	dir := t.TempDir()
	h := &harness{rs: &registry.Server{Dir: dir + "/registry", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, reg: prometheus.NewRegistry()}
	var err error
	if h.store, err = Open(dir + "/layers"); err != nil {
		t.Fatal(err)
	}
	if h.p, err = NewPreparer(h.store, h.rs, PreparerConfig{Workers: 2, Metrics: h.reg}); err != nil {
		t.Fatal(err)
	}
	if watch {
		h.p.Watch(h.rs)
	}
	h.ts = httptest.NewServer(h.rs.Handler())
	t.Cleanup(h.ts.Close)
	return h
}

func (h *harness) start(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h.p.Start(ctx)
}

func (h *harness) wait(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.p.Wait(ctx); err != nil {
		t.Fatalf("layers still preparing: %v", err)
	}
}

func (h *harness) counts() string {
	return fmt.Sprintf("prepared=%v failed=%v layers=%v", testutil.ToFloat64(h.p.m.prepared), testutil.ToFloat64(h.p.m.failed),
		testutil.CollectAndCount(h.p.m.store))
}

// TestPushPrepares: pushing an image prepares its layers, a layer shared by several
// images is unpacked once, and a layer whose diffID does not match is counted as failed
// and left absent.
func TestPushPrepares(t *testing.T) {
	needRoot(t)
	l1, l2, l3 := newTestLayer(t, "one"), newTestLayer(t, "two"), newTestLayer(t, "three")
	tests := []struct {
		name       string
		run        func(t *testing.T, h *harness)
		ready      []testLayer
		absent     []testLayer
		prepared   float64
		failed     float64
		storeBytes float64
	}{
		{"one image", func(t *testing.T, h *harness) {
			pushImage(t, h.ts, "app", "1", false, l1, l2)
		}, []testLayer{l1, l2}, nil, 2, 0, float64(len("content of one") + len("content of two"))},
		{"a shared layer is prepared once", func(t *testing.T, h *harness) {
			pushImage(t, h.ts, "app", "1", false, l1, l2)
			pushImage(t, h.ts, "other", "1", false, l1, l3)
			pushImage(t, h.ts, "app", "2", false, l1, l2)
		}, []testLayer{l1, l2, l3}, nil, 3, 0, float64(len("content of one") + len("content of two") + len("content of three"))},
		{"the same image pushed under ten names", func(t *testing.T, h *harness) {
			for i := range 10 {
				pushImage(t, h.ts, fmt.Sprintf("copy%d", i), "1", false, l1)
			}
		}, []testLayer{l1}, nil, 1, 0, float64(len("content of one"))},
		{"diffID mismatch", func(t *testing.T, h *harness) {
			pushImage(t, h.ts, "bad", "1", true, l1, l2)
		}, []testLayer{l1}, []testLayer{l2}, 1, 1, float64(len("content of one"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, true)
			h.start(t)
			tt.run(t, h)
			h.wait(t)
			for _, l := range tt.ready {
				if !h.store.Has(sum(l.blob)) {
					t.Errorf("layer %s is not ready", sum(l.blob))
				}
			}
			for _, l := range tt.absent {
				if h.store.Has(sum(l.blob)) {
					t.Errorf("layer %s is ready, want absent", sum(l.blob))
				}
			}
			if got := testutil.ToFloat64(h.p.m.prepared); got != tt.prepared {
				t.Errorf("prepared %v layers, want %v (%s)", got, tt.prepared, h.counts())
			}
			if got := testutil.ToFloat64(h.p.m.failed); got != tt.failed {
				t.Errorf("%v failures, want %v", got, tt.failed)
			}
			mfs, _ := h.reg.Gather()
			for _, mf := range mfs {
				if mf.GetName() == "socialweb_layer_store_bytes" && mf.Metric[0].GetGauge().GetValue() != tt.storeBytes {
					t.Errorf("store bytes %v, want %v", mf.Metric[0].GetGauge().GetValue(), tt.storeBytes)
				}
			}
		})
	}
}

// TestCatchUp: images already in the registry when the daemon starts get their missing
// layers prepared, and the ones present are not done again.
func TestCatchUp(t *testing.T) {
	needRoot(t)
	l1, l2 := newTestLayer(t, "one"), newTestLayer(t, "two")
	h := newHarness(t, false) // pushed with no preparer watching
	pushImage(t, h.ts, "app", "1", false, l1, l2)
	if h.store.Has(sum(l1.blob)) {
		t.Fatal("prepared without a watcher")
	}
	if _, err := h.store.Prepare(context.Background(), Layer{Digest: sum(l1.blob), DiffID: sum(l1.raw), MediaType: registry.MediaTypeOCILayerGzip}, bytes.NewReader(l1.blob)); err != nil {
		t.Fatal(err)
	}
	h.start(t)
	n, err := h.p.CatchUp(h.rs)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("CatchUp queued %d layers, want 1 (the other is present)", n)
	}
	h.wait(t)
	if !h.store.Has(sum(l2.blob)) {
		t.Error("the missing layer was not prepared")
	}
	if n, _ := h.p.CatchUp(h.rs); n != 0 {
		t.Errorf("a second CatchUp queued %d layers, want 0", n)
	}
}
