package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Layer is one layer of an image manifest in the registry, with the diffID the image's
// config gives it: what a host-side unpacker (internal/layerstore) needs.
type Layer struct {
	Digest    string // of the blob, as the manifest lists it
	DiffID    string // of the uncompressed tar (config rootfs.diff_ids)
	MediaType string
	Size      int64
}

// ImageLayers returns the layers of manifest digest, or of every manifest an index
// lists that the registry holds, each layer once. Foreign (non-distributable) layers are
// left out: the registry does not hold them.
func (s *Server) ImageLayers(digest string) ([]Layer, error) {
	if err := s.init(); err != nil {
		return nil, err
	}
	return s.st.imageLayers(digest, map[string]bool{})
}

func (st *store) imageLayers(digest string, seen map[string]bool) ([]Layer, error) {
	if err := checkDigest(digest); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(st.blobPath(digest))
	if err != nil {
		return nil, fmt.Errorf("reading manifest %s: %w", digest, err)
	}
	m, mt, err := parseManifest(b, "")
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", digest, err)
	}
	if isIndexType(mt) {
		var out []Layer
		for _, d := range m.Manifests {
			if _, err := st.statBlob(d.Digest); err != nil {
				continue // a platform the registry does not hold
			}
			ls, err := st.imageLayers(d.Digest, seen)
			if err != nil {
				return out, err
			}
			out = append(out, ls...)
		}
		return out, nil
	}
	var cfg struct {
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	cb, err := os.ReadFile(st.blobPath(m.Config.Digest))
	if err != nil {
		return nil, fmt.Errorf("manifest %s: reading its config %s: %w", digest, m.Config.Digest, err)
	}
	if err := json.Unmarshal(cb, &cfg); err != nil {
		return nil, fmt.Errorf("manifest %s: its config %s is not an image config: %w", digest, m.Config.Digest, err)
	}
	if len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		return nil, fmt.Errorf("manifest %s lists %d layers but its config %s has %d rootfs.diff_ids", digest, len(m.Layers), m.Config.Digest, len(cfg.RootFS.DiffIDs))
	}
	var out []Layer
	for i, d := range m.Layers {
		if isForeignLayer(d) || seen[d.Digest] {
			continue
		}
		seen[d.Digest] = true
		out = append(out, Layer{Digest: d.Digest, DiffID: cfg.RootFS.DiffIDs[i], MediaType: d.MediaType, Size: d.Size})
	}
	return out, nil
}

// AllLayers returns the layers of every image manifest any shared repository holds (not
// the clusters' own), each once.
// Manifests that cannot be read are skipped; their errors are joined into the error
// returned beside what could be read.
func (s *Server) AllLayers() ([]Layer, error) {
	if err := s.init(); err != nil {
		return nil, err
	}
	root := filepath.Join(s.st.dir, "repositories")
	manifests := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() && p == filepath.Join(root, tenantsDir) {
			return filepath.SkipDir // clusters' own images: not for the layer share (stored)
		}
		if d.Type().IsRegular() && filepath.Base(filepath.Dir(p)) == "sha256" && filepath.Base(filepath.Dir(filepath.Dir(p))) == "revisions" {
			manifests["sha256:"+d.Name()] = true
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing the registry's manifests: %w", err)
	}
	var (
		out  []Layer
		errs []error
		seen = map[string]bool{}
	)
	for d := range manifests {
		ls, err := s.st.imageLayers(d, seen)
		if err != nil {
			errs = append(errs, err)
		}
		out = append(out, ls...)
	}
	return out, errors.Join(errs...)
}

// OpenBlob opens blob digest for reading.
func (s *Server) OpenBlob(digest string) (io.ReadCloser, error) {
	if err := s.init(); err != nil {
		return nil, err
	}
	return s.st.openBlob(digest)
}

// stored tells LayersStored about the layers of manifest digest, just stored in repo.
// A cluster's own images are left out: every node VM reads the unpacked layers (the
// layer share), so only images every cluster may pull are unpacked there; a cluster's
// nodes pull and unpack its own images themselves.
func (s *Server) stored(repo, digest string) {
	if s.LayersStored == nil {
		return
	}
	if _, _, own := splitOverlay(repo); own {
		return
	}
	ls, err := s.st.imageLayers(digest, map[string]bool{})
	if err != nil {
		// Not an image this registry can describe (an artifact, a config that is not an
		// image config): nodes pull it as they always did.
		s.log.Debug("stored manifest's layers not announced", "digest", digest, "err", err)
	}
	if len(ls) > 0 {
		s.LayersStored(ls)
	}
}
