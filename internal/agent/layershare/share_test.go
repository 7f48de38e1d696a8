package layershare

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
)

const (
	digestA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	digestB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	diffA   = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
)

// writeLayer makes <root>/sha256/<hex>/ with ready.json (raw, as given) and,
// if fs, an fs/ directory.
func writeLayer(t *testing.T, root, digest, ready string, fs bool) string {
	t.Helper()
	dir := filepath.Join(root, "sha256", strings.TrimPrefix(digest, "sha256:"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if ready != "" {
		if err := os.WriteFile(filepath.Join(dir, "ready.json"), []byte(ready), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if fs {
		if err := os.Mkdir(filepath.Join(dir, "fs"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func readyJSON(t *testing.T, digest, diffID string) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"digest": digest, "diffID": diffID, "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
		"size": 123, "unpackedBytes": 456, "files": 7, "preparedAt": "2026-12-01T19:00:00Z"})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestDecide(t *testing.T) {
	root := t.TempDir()
	ready := writeLayer(t, root, digestA, readyJSON(t, digestA, diffA), true)
	// Each case below gets its own digest: the share's directory for it holds
	// what the case names.
	bad := func(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }
	writeLayer(t, root, bad('c'), `{"digest": "sha256:cc`, true)                                   // truncated
	writeLayer(t, root, bad('d'), readyJSON(t, digestB, diffA), true)                              // names another layer
	writeLayer(t, root, bad('e'), readyJSON(t, bad('e'), diffA), false)                            // no fs/
	writeLayer(t, root, bad('f'), "", true)                                                        // fs/ but no ready.json yet
	writeLayer(t, root, bad('9'), `{"digest": 42}`, true)                                          // wrong type
	writeLayer(t, root, bad('8'), readyJSON(t, bad('8'), "sha256:"+strings.Repeat("2", 64)), true) // other diffID
	labels := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	const ref = snapshots.LabelSnapshotRef
	tests := []struct {
		name       string
		share      Share
		labels     map[string]string
		wantShared bool
		wantTarget string
		reason     string
	}{
		{name: "layer ready", share: Share{root}, labels: labels(ref, "chain1", LabelLayerDigest, digestA, snapshots.LabelSnapshotDiffID, diffA),
			wantShared: true, wantTarget: "chain1"},
		{name: "layer ready, no diffID label", share: Share{root}, labels: labels(ref, "chain1", LabelLayerDigest, digestA),
			wantShared: true, wantTarget: "chain1"},
		{name: "share absent", share: Share{}, labels: labels(ref, "chain1", LabelLayerDigest, digestA),
			wantTarget: "chain1", reason: "no layer share"},
		{name: "not a layer extraction (a container's rootfs)", share: Share{root}, labels: labels(LabelLayerDigest, digestA),
			reason: "not a layer extraction"},
		{name: "no digest label (annotations off)", share: Share{root}, labels: labels(ref, "chain1"),
			wantTarget: "chain1", reason: "no layer digest label"},
		{name: "layer not in the share", share: Share{root}, labels: labels(ref, "chain1", LabelLayerDigest, digestB),
			wantTarget: "chain1", reason: "not in the layer share"},
		{name: "ready.json missing (still being prepared)", share: Share{root}, labels: labels(ref, "c", LabelLayerDigest, bad('f')),
			wantTarget: "c", reason: "not in the layer share"},
		{name: "ready.json truncated", share: Share{root}, labels: labels(ref, "c", LabelLayerDigest, bad('c')),
			wantTarget: "c", reason: "ready.json: unexpected end of JSON input"},
		{name: "ready.json of the wrong shape", share: Share{root}, labels: labels(ref, "c", LabelLayerDigest, bad('9')),
			wantTarget: "c", reason: "cannot unmarshal number"},
		{name: "ready.json names another digest", share: Share{root}, labels: labels(ref, "c", LabelLayerDigest, bad('d')),
			wantTarget: "c", reason: `names digest "` + digestB + `"`},
		{name: "diffID mismatch", share: Share{root}, labels: labels(ref, "c", LabelLayerDigest, bad('8'), snapshots.LabelSnapshotDiffID, diffA),
			wantTarget: "c", reason: "the image wants " + `"` + diffA + `"`},
		{name: "no fs directory", share: Share{root}, labels: labels(ref, "c", LabelLayerDigest, bad('e')),
			wantTarget: "c", reason: "layer filesystem"},
		{name: "not a sha256 digest", share: Share{root}, labels: labels(ref, "c", LabelLayerDigest, "sha512:abc"),
			wantTarget: "c", reason: "is not sha256:<64 hex>"},
		{name: "path escape refused", share: Share{root}, labels: labels(ref, "c", LabelLayerDigest, "sha256:../../etc"),
			wantTarget: "c", reason: "is not sha256:<64 hex>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := tt.share.Decide(tt.labels)
			if d.Shared != tt.wantShared || d.Target != tt.wantTarget {
				t.Fatalf("Decide = %+v, want shared %v target %q", d, tt.wantShared, tt.wantTarget)
			}
			if tt.wantShared {
				if d.Layer.FS != filepath.Join(ready, "fs") || d.Layer.DiffID != diffA || d.Layer.UnpackedBytes != 456 || d.Layer.Files != 7 {
					t.Errorf("layer = %+v", d.Layer)
				}
				return
			}
			if !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("reason %q, want it to contain %q", d.Reason, tt.reason)
			}
		})
	}
}

func TestSharedName(t *testing.T) {
	a, b := sharedName("sha256:c", ""), sharedName("sha256:c", "k8s.io/3/sha256:p")
	if a == b || a != sharedName("sha256:c", "") || !strings.HasPrefix(a, "socialweb-shared/sha256:c/") {
		t.Errorf("sharedName: %q, %q", a, b)
	}
}
