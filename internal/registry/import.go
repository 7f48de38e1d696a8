package registry

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// Annotations naming the images of an OCI image layout.
const (
	AnnotationRefName       = "org.opencontainers.image.ref.name"
	AnnotationContainerName = "io.containerd.image.name"
)

// ImageRef is one tag of the registry (List).
type ImageRef struct {
	Name      string // canonical repository name, e.g. docker.io/library/busybox
	Tag       string
	Digest    string // of the manifest or index the tag points at
	MediaType string // of that manifest or index
	// Size is the bytes of the manifest and every blob and manifest it references
	// (each counted once; for an index, every platform present).
	Size int64
	// Cluster is the only cluster whose nodes see it (pushed for it, or pulled with
	// its credentials); "" is every cluster.
	Cluster string
}

// String is name:tag@digest.
func (r ImageRef) String() string { return r.Name + ":" + r.Tag + "@" + r.Digest }

// staged is one regular file of an imported tarball, copied into the store's uploads
// directory while hashing.
type staged struct {
	path   string
	digest string
	size   int64
}

type importer struct {
	st     *store
	files  map[string]*staged // by cleaned archive path
	links  map[string]string  // archive path -> archive path it points at
	loaded map[string]bool    // digests already in the store or moved there
	by     string             // the cluster it is pushed for, charged for what it stores; "" host-wide
}

// Import loads an image tarball into the store and returns what it tagged, as
// name:tag@digest. The tarball (optionally gzip-compressed) is either an OCI image
// layout (oci-layout, index.json, blobs/sha256/...; `skopeo copy oci-archive:`, `ctr
// images export`, `docker save` since Docker 25) or a docker-save archive (manifest.json,
// <id>.json configs, layer tars), which is converted to OCI manifests: the config keeps its
// bytes and digest, each layer keeps its bytes (media type ...layer.v1.tar, +gzip or +zstd
// by content) and digest.
//
// Names come from the tarball (index.json's io.containerd.image.name annotation, or an
// org.opencontainers.image.ref.name that is a full reference; manifest.json's RepoTags),
// normalized the way containerd does ("busybox" is docker.io/library/busybox:latest). refs,
// when given, replace them; the tarball must then hold exactly one image. Every blob's
// digest is checked before it is stored; an image without a name is an error.
func (s *Server) Import(ctx context.Context, tarball io.Reader, refs ...string) ([]string, error) {
	return s.importTo(ctx, "", tarball, refs)
}

// ImportFor is Import for cluster's nodes alone: the image goes into that cluster's
// overlay, which it reads before the shared images and no other cluster reads. The
// blobs it stores are charged to cluster; the operator's push is never refused for
// its quota.
func (s *Server) ImportFor(ctx context.Context, cluster string, tarball io.Reader, refs ...string) ([]string, error) {
	if !componentRE.MatchString(cluster) || strings.ContainsAny(cluster, "._") {
		return nil, fmt.Errorf("cluster %q is not a cluster name (lower-case letters, digits and -)", cluster)
	}
	return s.importTo(ctx, cluster, tarball, refs)
}

func (s *Server) importTo(ctx context.Context, cluster string, tarball io.Reader, refs []string) ([]string, error) {
	if err := s.init(); err != nil {
		return nil, err
	}
	var want []reference
	for _, ref := range refs {
		r, err := s.names.parseRef(ref)
		if err != nil {
			return nil, err
		}
		if r.Tag == "" {
			return nil, fmt.Errorf("reference %q has no tag", ref)
		}
		want = append(want, r)
	}
	stageDir, err := os.MkdirTemp(s.st.uploadsDir(), "import-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stageDir)
	im := &importer{st: s.st, files: map[string]*staged{}, links: map[string]string{}, loaded: map[string]bool{}, by: cluster}
	if err := im.stage(ctx, tarball, stageDir); err != nil {
		return nil, err
	}

	type target struct {
		desc  descriptor
		names []reference
	}
	var targets []target
	switch {
	case im.lookup("index.json") != nil:
		var idx manifestDoc
		if err := im.readJSON("index.json", &idx); err != nil {
			return nil, err
		}
		for _, d := range idx.Manifests {
			if err := checkDigest(d.Digest); err != nil {
				return nil, fmt.Errorf("index.json: %w", err)
			}
			d, err := im.ingestManifest(ctx, d, false)
			if err != nil {
				return nil, err
			}
			t := target{desc: d}
			n := d.Annotations[AnnotationContainerName]
			if rn := d.Annotations[AnnotationRefName]; n == "" && strings.ContainsAny(rn, "/:") {
				n = rn
			}
			if n != "" && want == nil {
				r, err := s.names.parseRef(n)
				if err != nil {
					return nil, fmt.Errorf("index.json: %w", err)
				}
				t.names = append(t.names, r)
			}
			targets = append(targets, t)
		}
	case im.lookup("manifest.json") != nil:
		var entries []struct {
			Config   string
			RepoTags []string
			Layers   []string
		}
		if err := im.readJSON("manifest.json", &entries); err != nil {
			return nil, err
		}
		for _, e := range entries {
			d, err := im.convertDocker(e.Config, e.Layers)
			if err != nil {
				return nil, err
			}
			t := target{desc: d}
			if want == nil {
				for _, n := range e.RepoTags {
					r, err := s.names.parseRef(n)
					if err != nil {
						return nil, fmt.Errorf("manifest.json: %w", err)
					}
					t.names = append(t.names, r)
				}
			}
			targets = append(targets, t)
		}
	default:
		return nil, errors.New("registry: the tarball is neither an OCI image layout (no index.json) nor a docker-save archive (no manifest.json)")
	}

	// Merge entries for the same digest (index.json lists one per tag).
	byDigest := map[string]int{}
	var merged []target
	for _, t := range targets {
		if i, ok := byDigest[t.desc.Digest]; ok {
			merged[i].names = append(merged[i].names, t.names...)
			continue
		}
		byDigest[t.desc.Digest] = len(merged)
		merged = append(merged, t)
	}
	if len(merged) == 0 {
		return nil, errors.New("registry: the tarball holds no image")
	}
	if want != nil {
		if len(merged) != 1 {
			return nil, fmt.Errorf("registry: the tarball holds %d images; names given to Import can only name a tarball with one", len(merged))
		}
		merged[0].names = want
	}
	for _, t := range merged {
		if len(t.names) == 0 {
			return nil, fmt.Errorf("registry: image %s in the tarball has no name: pass one to import it", t.desc.Digest)
		}
	}
	var out []string
	for _, t := range merged {
		content, err := os.ReadFile(s.st.blobPath(t.desc.Digest))
		if err != nil {
			return nil, err
		}
		for _, n := range t.names {
			if err := ctx.Err(); err != nil {
				return out, err
			}
			tag := n.Tag
			if tag == "" {
				tag = t.desc.Digest
			}
			repo := n.Name
			if cluster != "" {
				repo = overlay(cluster, n.Name)
			}
			d, _, err := s.st.putManifest(repo, tag, content, t.desc.MediaType, true)
			if err != nil {
				return out, fmt.Errorf("registry: tagging %s: %w", n, err)
			}
			s.stored(repo, d)
			out = append(out, reference{Name: n.Name, Tag: n.Tag, Digest: d}.String())
			s.log.Info("image imported", "ref", n.String(), "digest", d, "cluster", cluster)
		}
	}
	return out, nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// stage copies every regular file of the tarball into dir, hashing it on the way.
func (im *importer) stage(ctx context.Context, tarball io.Reader, dir string) error {
	br := bufio.NewReaderSize(ctxReader{ctx, tarball}, 1<<20)
	var src io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("registry: reading gzip tarball: %w", err)
		}
		defer zr.Close()
		src = zr
	}
	tr := tar.NewReader(src)
	for seq := 0; ; seq++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("registry: reading tarball: %w", err)
		}
		name := cleanArchivePath(hdr.Name)
		if name == "" {
			continue
		}
		switch hdr.Typeflag {
		case tar.TypeReg:
			f, err := os.Create(filepath.Join(dir, fmt.Sprint(seq)))
			if err != nil {
				return err
			}
			h := sha256.New()
			n, err := io.Copy(io.MultiWriter(f, h), tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("registry: reading %s from the tarball: %w", hdr.Name, err)
			}
			im.files[name] = &staged{path: f.Name(), digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), size: n}
		case tar.TypeSymlink:
			target := hdr.Linkname
			if !strings.HasPrefix(target, "/") {
				target = path.Join(path.Dir(name), target)
			}
			im.links[name] = cleanArchivePath(target)
		case tar.TypeLink:
			im.links[name] = cleanArchivePath(hdr.Linkname)
		}
	}
	return nil
}

func cleanArchivePath(p string) string {
	p = path.Clean("/" + p)[1:]
	if p == "." {
		return ""
	}
	return p
}

// lookup finds the staged file at archive path p, following links.
func (im *importer) lookup(p string) *staged {
	for range 16 {
		if f := im.files[p]; f != nil {
			return f
		}
		t, ok := im.links[p]
		if !ok {
			return nil
		}
		p = t
	}
	return nil
}

func (im *importer) readJSON(p string, v any) error {
	f := im.lookup(p)
	if f == nil {
		return fmt.Errorf("registry: the tarball has no %s", p)
	}
	if f.size > maxManifestSize*4 {
		return fmt.Errorf("registry: %s in the tarball is too large (%d bytes)", p, f.size)
	}
	b, err := os.ReadFile(f.path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("registry: %s in the tarball: %w", p, err)
	}
	return nil
}

// ingestBlob makes sure blob d (at blobs/sha256/<hex> in an OCI layout) is in the store,
// checking the layout's content against its name. It reports whether the blob is there.
func (im *importer) ingestBlob(d descriptor) (bool, error) {
	if im.loaded[d.Digest] {
		return true, nil
	}
	f := im.lookup("blobs/sha256/" + strings.TrimPrefix(d.Digest, "sha256:"))
	if f == nil {
		if _, err := im.st.statBlob(d.Digest); err != nil {
			return false, nil
		}
		im.loaded[d.Digest] = true
		return true, nil
	}
	if f.digest != d.Digest {
		return false, errf(errDigestInvalid, "the tarball's blob %s has content with digest %s", d.Digest, f.digest)
	}
	if d.Size != 0 && d.Size != f.size {
		return false, errf(errSizeInvalid, "the tarball's blob %s has %d bytes, its descriptor says %d", d.Digest, f.size, d.Size)
	}
	if err := im.st.commitPath(f.path, d.Digest, im.by); err != nil {
		return false, err
	}
	// Another archive path may link to the same file; serve it from the store from now on.
	f.path = im.st.blobPath(d.Digest)
	im.loaded[d.Digest] = true
	return true, nil
}

// ingestManifest stores manifest or index d of an OCI layout and everything it references,
// returning d with its media type settled. Manifests an index references but the layout
// lacks are skipped (a single-platform export of a multi-platform image); a missing config
// or layer is an error.
func (im *importer) ingestManifest(ctx context.Context, d descriptor, child bool) (descriptor, error) {
	if err := ctx.Err(); err != nil {
		return d, err
	}
	var content []byte
	if f := im.lookup("blobs/sha256/" + strings.TrimPrefix(d.Digest, "sha256:")); f != nil {
		if f.size > maxManifestSize {
			return d, errf(errSizeInvalid, "manifest %s is %d bytes", d.Digest, f.size)
		}
		b, err := os.ReadFile(f.path)
		if err != nil {
			return d, err
		}
		content = b
	} else if b, err := os.ReadFile(im.st.blobPath(d.Digest)); err == nil {
		content = b
	} else if child {
		return d, errf(errManifestUnknown, "manifest %s is not in the tarball", d.Digest)
	} else {
		return d, fmt.Errorf("registry: index.json lists %s, which the tarball does not hold", d.Digest)
	}
	if d.Size != 0 && d.Size != int64(len(content)) {
		return d, errf(errSizeInvalid, "manifest %s has %d bytes, its descriptor says %d", d.Digest, len(content), d.Size)
	}
	ct := d.MediaType
	if !isManifestType(ct) {
		ct = ""
	}
	m, mt, err := parseManifest(content, ct)
	if err != nil {
		return d, fmt.Errorf("registry: manifest %s: %w", d.Digest, err)
	}
	d.MediaType = mt
	if isIndexType(mt) {
		for _, c := range m.Manifests {
			if _, err := im.ingestManifest(ctx, c, true); IsCode(err, errManifestUnknown) {
				im.st.log.Debug("import: index references a manifest the tarball lacks; skipped", "index", d.Digest, "manifest", c.Digest)
			} else if err != nil {
				return d, err
			}
		}
	} else {
		for _, b := range append([]descriptor{*m.Config}, m.Layers...) {
			if isForeignLayer(b) {
				continue
			}
			ok, err := im.ingestBlob(b)
			if err != nil {
				return d, err
			}
			if !ok {
				return d, fmt.Errorf("registry: manifest %s references blob %s, which is neither in the tarball nor in the registry", d.Digest, b.Digest)
			}
		}
	}
	if ok, err := im.ingestBlob(descriptor{Digest: d.Digest, Size: int64(len(content))}); err != nil {
		return d, err
	} else if !ok {
		return d, fmt.Errorf("registry: manifest %s vanished", d.Digest)
	}
	return d, nil
}

// convertDocker turns one docker-save image (config path, layer paths) into an OCI image
// manifest in the store and returns its descriptor.
func (im *importer) convertDocker(configPath string, layerPaths []string) (descriptor, error) {
	cf := im.lookup(cleanArchivePath(configPath))
	if cf == nil {
		return descriptor{}, fmt.Errorf("registry: manifest.json names config %s, which the tarball does not hold", configPath)
	}
	var cfg struct {
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := im.readJSON(cleanArchivePath(configPath), &cfg); err != nil {
		return descriptor{}, err
	}
	if len(cfg.RootFS.DiffIDs) != len(layerPaths) {
		return descriptor{}, fmt.Errorf("registry: config %s lists %d diff_ids but manifest.json %d layers", configPath, len(cfg.RootFS.DiffIDs), len(layerPaths))
	}
	m := struct {
		SchemaVersion int          `json:"schemaVersion"`
		MediaType     string       `json:"mediaType"`
		Config        descriptor   `json:"config"`
		Layers        []descriptor `json:"layers"`
	}{SchemaVersion: 2, MediaType: MediaTypeOCIManifest, Layers: []descriptor{}}
	commit := func(f *staged) error {
		if im.loaded[f.digest] {
			return nil
		}
		if err := im.st.commitPath(f.path, f.digest, im.by); err != nil {
			return err
		}
		f.path = im.st.blobPath(f.digest)
		im.loaded[f.digest] = true
		return nil
	}
	for i, lp := range layerPaths {
		lf := im.lookup(cleanArchivePath(lp))
		if lf == nil {
			return descriptor{}, fmt.Errorf("registry: manifest.json names layer %s, which the tarball does not hold", lp)
		}
		mt, err := layerMediaType(lf.path)
		if err != nil {
			return descriptor{}, err
		}
		if mt == MediaTypeOCILayer && lf.digest != cfg.RootFS.DiffIDs[i] {
			return descriptor{}, fmt.Errorf("registry: layer %s has digest %s but the config's diff_id is %s", lp, lf.digest, cfg.RootFS.DiffIDs[i])
		}
		if err := commit(lf); err != nil {
			return descriptor{}, err
		}
		m.Layers = append(m.Layers, descriptor{MediaType: mt, Digest: lf.digest, Size: lf.size})
	}
	if err := commit(cf); err != nil {
		return descriptor{}, err
	}
	m.Config = descriptor{MediaType: MediaTypeOCIConfig, Digest: cf.digest, Size: cf.size}
	content, err := json.Marshal(m)
	if err != nil {
		return descriptor{}, err
	}
	digest, _, err := im.st.writeBlob(bytes.NewReader(content), "", im.by)
	if err != nil {
		return descriptor{}, err
	}
	return descriptor{MediaType: MediaTypeOCIManifest, Digest: digest, Size: int64(len(content))}, nil
}

// layerMediaType tells an uncompressed layer tar from a gzip or zstd one by its first bytes.
func layerMediaType(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var b [4]byte
	n, _ := io.ReadFull(f, b[:])
	switch {
	case n >= 2 && b[0] == 0x1f && b[1] == 0x8b:
		return MediaTypeOCILayerGzip, nil
	case n == 4 && b == [4]byte{0x28, 0xb5, 0x2f, 0xfd}:
		return MediaTypeOCILayerZstd, nil
	}
	return MediaTypeOCILayer, nil
}

// List returns every tag in the registry, sorted by name and tag.
func (s *Server) List() ([]ImageRef, error) {
	if err := s.init(); err != nil {
		return nil, err
	}
	repos, err := s.st.catalog()
	if err != nil {
		return nil, err
	}
	var out []ImageRef
	for _, name := range repos {
		tags, err := s.st.tags(name)
		if err != nil {
			return nil, err
		}
		for _, tag := range tags {
			_, mt, digest, err := s.st.getManifest(name, tag)
			if err != nil {
				s.log.Warn("registry: broken tag", "name", name, "tag", tag, "error", err)
				continue
			}
			seen := map[string]bool{}
			size, err := s.st.reachableSize(digest, seen)
			if err != nil {
				return nil, err
			}
			cluster, canonical, _ := splitOverlay(name)
			out = append(out, ImageRef{Name: canonical, Cluster: cluster, Tag: tag, Digest: digest, MediaType: mt, Size: size})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		if out[i].Cluster != out[j].Cluster {
			return out[i].Cluster < out[j].Cluster
		}
		return out[i].Tag < out[j].Tag
	})
	return out, nil
}

// reachableSize adds up manifest digest and the blobs and manifests it references that are
// present, skipping those in seen.
func (st *store) reachableSize(digest string, seen map[string]bool) (int64, error) {
	if seen[digest] {
		return 0, nil
	}
	seen[digest] = true
	content, err := os.ReadFile(st.blobPath(digest))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	total := int64(len(content))
	m, mt, err := parseManifest(content, "")
	if err != nil {
		return total, nil
	}
	if isIndexType(mt) {
		for _, c := range m.Manifests {
			n, err := st.reachableSize(c.Digest, seen)
			if err != nil {
				return 0, err
			}
			total += n
		}
		return total, nil
	}
	for _, b := range append([]descriptor{*m.Config}, m.Layers...) {
		if seen[b.Digest] {
			continue
		}
		seen[b.Digest] = true
		if n, err := st.statBlob(b.Digest); err == nil {
			total += n
		}
	}
	return total, nil
}
