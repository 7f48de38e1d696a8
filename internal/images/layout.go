package images

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Media types and annotations written into the layouts.
const (
	mediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	mediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar" // uncompressed: digest == diff_id

	annotationRefName       = "org.opencontainers.image.ref.name"
	annotationContainerName = "io.containerd.image.name"
)

// epoch is the time of every file, tar entry and config "created": fixed, so digests
// depend on the inputs only.
var epoch = time.Unix(0, 0).UTC()

// blob is content written into a layout: held in memory or produced by gen (twice: once
// to hash, once to write), so a large layer never has to sit on disk twice.
type blob struct {
	digest string
	size   int64
	gen    func(io.Writer) error
}

func bytesBlob(b []byte) blob {
	s := sha256.Sum256(b)
	return blob{"sha256:" + hex.EncodeToString(s[:]), int64(len(b)), func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	}}
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

func genBlob(gen func(io.Writer) error) (blob, error) {
	h := sha256.New()
	var c countWriter
	if err := gen(io.MultiWriter(h, &c)); err != nil {
		return blob{}, err
	}
	return blob{"sha256:" + hex.EncodeToString(h.Sum(nil)), c.n, gen}, nil
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

// imageConfig is the part of an OCI image config socialweb's images set.
type imageConfig struct {
	Created      string          `json:"created"`
	Architecture string          `json:"architecture"`
	OS           string          `json:"os"`
	Config       containerConfig `json:"config"`
	RootFS       rootFS          `json:"rootfs"`
	History      []history       `json:"history,omitempty"`
}

type containerConfig struct {
	User       string            `json:"User,omitempty"`
	Env        []string          `json:"Env,omitempty"`
	Entrypoint []string          `json:"Entrypoint,omitempty"`
	Cmd        []string          `json:"Cmd,omitempty"`
	WorkingDir string            `json:"WorkingDir,omitempty"`
	Labels     map[string]string `json:"Labels,omitempty"`
}

type rootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

type history struct {
	Created   string `json:"created"`
	CreatedBy string `json:"created_by"`
	Comment   string `json:"comment,omitempty"`
}

// imageSpec is one image to write as an OCI layout.
type imageSpec struct {
	arch   string
	layers []blob // uncompressed layer tars
	config containerConfig
	// history: one created_by per layer
	history []string
	refs    []string
}

// writeLayout writes img as an OCI image layout tar at dst (via a temp file and rename)
// and returns the manifest's digest. Every byte is a function of img: entries sorted,
// times fixed, JSON from structs.
func writeLayout(dst string, img imageSpec) (string, error) {
	cfg := imageConfig{
		Created: epoch.Format(time.RFC3339), Architecture: img.arch, OS: "linux", Config: img.config,
		RootFS: rootFS{Type: "layers", DiffIDs: []string{}},
	}
	m := manifest{SchemaVersion: 2, MediaType: mediaTypeManifest, Layers: []descriptor{}}
	for i, l := range img.layers {
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, l.digest)
		cfg.History = append(cfg.History, history{Created: cfg.Created, CreatedBy: img.history[i]})
		m.Layers = append(m.Layers, descriptor{MediaType: mediaTypeLayer, Digest: l.digest, Size: l.size})
	}
	cb, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	cblob := bytesBlob(cb)
	m.Config = descriptor{MediaType: mediaTypeConfig, Digest: cblob.digest, Size: cblob.size}
	mb, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	mblob := bytesBlob(mb)
	idx := index{SchemaVersion: 2, MediaType: mediaTypeIndex}
	refs := append([]string(nil), img.refs...)
	sort.Strings(refs)
	for _, r := range refs {
		tag := r[strings.LastIndexByte(r, ':')+1:]
		idx.Manifests = append(idx.Manifests, descriptor{MediaType: mediaTypeManifest, Digest: mblob.digest, Size: mblob.size,
			Annotations: map[string]string{annotationContainerName: r, annotationRefName: tag},
			Platform:    &platform{Architecture: img.arch, OS: "linux"}})
	}
	ib, err := json.Marshal(idx)
	if err != nil {
		return "", err
	}

	blobs := map[string]blob{cblob.digest: cblob, mblob.digest: mblob}
	for _, l := range img.layers {
		blobs[l.digest] = l
	}
	digests := make([]string, 0, len(blobs))
	for d := range blobs {
		digests = append(digests, d)
	}
	sort.Strings(digests)

	tmp, err := os.CreateTemp(filepath.Dir(dst), ".layout-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	tw := tar.NewWriter(tmp)
	err = writeEntry(tw, tarFile{path: "blobs", mode: 0o755, typ: tar.TypeDir})
	if err == nil {
		err = writeEntry(tw, tarFile{path: "blobs/sha256", mode: 0o755, typ: tar.TypeDir})
	}
	for _, d := range digests {
		if err != nil {
			break
		}
		b := blobs[d]
		err = writeEntry(tw, tarFile{path: "blobs/sha256/" + strings.TrimPrefix(d, "sha256:"), mode: 0o644, typ: tar.TypeReg, size: b.size, gen: b.gen})
	}
	if err == nil {
		err = writeEntry(tw, tarFile{path: "index.json", mode: 0o644, typ: tar.TypeReg, data: ib})
	}
	if err == nil {
		err = writeEntry(tw, tarFile{path: "oci-layout", mode: 0o644, typ: tar.TypeReg, data: []byte(`{"imageLayoutVersion":"1.0.0"}`)})
	}
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		return "", fmt.Errorf("images: writing %s: %w", dst, err)
	}
	return mblob.digest, nil
}

// tarFile is one entry of a layer or layout tar.
type tarFile struct {
	path string // relative, no leading or trailing slash
	mode int64  // permission bits (and sticky)
	typ  byte   // tar.TypeDir, tar.TypeReg or tar.TypeSymlink
	link string // symlink target
	data []byte // content, or size+gen for generated content
	size int64
	gen  func(io.Writer) error
	// uid and gid of the entry (0 unless a tree on disk says otherwise)
	uid, gid int
}

func writeEntry(tw *tar.Writer, f tarFile) error {
	h := &tar.Header{Typeflag: f.typ, Name: f.path, Mode: f.mode, ModTime: epoch, Linkname: f.link, Uid: f.uid, Gid: f.gid, Format: tar.FormatPAX}
	// USTAR where it can hold the names (ASCII, short), so existing layers keep their bytes.
	if len(f.path) < 100 && len(f.link) < 100 && isASCII(f.path) && isASCII(f.link) {
		h.Format = tar.FormatUSTAR
	}
	switch f.typ {
	case tar.TypeDir:
		h.Name += "/"
	case tar.TypeReg:
		h.Size = f.size
		if f.gen == nil {
			h.Size = int64(len(f.data))
		}
	}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	if f.typ != tar.TypeReg {
		return nil
	}
	if f.gen != nil {
		return f.gen(tw)
	}
	_, err := tw.Write(f.data)
	return err
}

// layerTar returns a reproducible layer tar of files, adding the parent directories
// they need (mode 0755) and sorting entries by path.
func layerTar(files []tarFile) (blob, error) {
	byPath := map[string]tarFile{}
	for _, f := range files {
		byPath[f.path] = f
		for d := path.Dir(f.path); d != "."; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = tarFile{path: d, mode: 0o755, typ: tar.TypeDir}
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	sorted := make([]tarFile, len(paths))
	for i, p := range paths {
		sorted[i] = byPath[p]
	}
	gen := func(w io.Writer) error { return writeTarFiles(w, sorted) }
	if size := totalData(files); size < 64<<20 {
		var buf bytes.Buffer
		if err := gen(&buf); err != nil {
			return blob{}, err
		}
		return bytesBlob(buf.Bytes()), nil
	}
	return genBlob(gen)
}

func totalData(files []tarFile) int64 {
	var n int64
	for _, f := range files {
		n += int64(len(f.data)) + f.size
	}
	return n
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
