package registry

import (
	"encoding/json"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
)

// TestLayersStored: every stored image manifest announces its layers with the diffIDs
// its config gives them; an index announces its platforms' layers.
func TestLayersStored(t *testing.T) {
	tests := []struct {
		name string
		push func(t *testing.T, s *Server, ts *httptest.Server) (want []string)
	}{
		{"OCI manifest by tag", func(t *testing.T, s *Server, ts *httptest.Server) []string {
			img := makeImage(t, ts, "app", "one", false)
			pushManifest(t, ts, "app", "1", img.manifest, img.mediaType)
			return []string{sha(img.layer) + "=" + sha(img.layer)}
		}},
		{"Docker manifest by digest", func(t *testing.T, s *Server, ts *httptest.Server) []string {
			img := makeImage(t, ts, "app", "two", true)
			pushManifest(t, ts, "app", sha(img.manifest), img.manifest, img.mediaType)
			return []string{sha(img.layer) + "=" + sha(img.layer)}
		}},
		{"index of two platforms", func(t *testing.T, s *Server, ts *httptest.Server) []string {
			a := makeImage(t, ts, "multi", "amd", false)
			b := makeImage(t, ts, "multi", "arm", false)
			pushManifest(t, ts, "multi", sha(a.manifest), a.manifest, a.mediaType)
			pushManifest(t, ts, "multi", sha(b.manifest), b.manifest, b.mediaType)
			idx, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": MediaTypeOCIIndex, "manifests": []descriptor{
				{MediaType: MediaTypeOCIManifest, Digest: sha(a.manifest), Size: int64(len(a.manifest))},
				{MediaType: MediaTypeOCIManifest, Digest: sha(b.manifest), Size: int64(len(b.manifest))},
			}})
			pushManifest(t, ts, "multi", "latest", idx, MediaTypeOCIIndex)
			la, lb := sha(a.layer)+"="+sha(a.layer), sha(b.layer)+"="+sha(b.layer)
			return []string{la, lb, la, lb} // each child on its own, then the index
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, hs := newTestRegistry(t)
			var (
				mu  sync.Mutex
				got []string
			)
			s.LayersStored = func(ls []Layer) {
				mu.Lock()
				defer mu.Unlock()
				for _, l := range ls {
					got = append(got, l.Digest+"="+l.DiffID)
				}
			}
			want := tt.push(t, s, hs)
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(got, want) {
				t.Errorf("announced %v, want %v", got, want)
			}
			all, err := s.AllLayers()
			if err != nil {
				t.Fatal(err)
			}
			if len(all) != len(slices.Compact(slices.Sorted(slices.Values(want)))) {
				t.Errorf("AllLayers: %d layers, want %d (each once)", len(all), len(slices.Compact(slices.Sorted(slices.Values(want)))))
			}
		})
	}
}
