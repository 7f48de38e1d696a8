package images

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"

	"github.com/socialweb-computer/socialweb/internal/nodeimage"
)

// DebianSpec is an image made on the host from Debian packages and host files, the way
// Builder makes the CI builder image: a debootstrap --variant=minbase base, one layer per
// PackageLayer, then one layer of Files (or, Scratch, the Files layer alone). It is for images that upstream builds FROM
// alpine or debian and that nodes here cannot pull (the e2e test images).
type DebianSpec struct {
	// Name names the build in the cache (<Name>-<fingerprint>.tar) and in progress lines.
	Name string
	// Refs are the references the layout's index tags the image with.
	Refs []string
	// Suite is the Debian suite; BuilderSuite if empty.
	Suite string
	// Scratch leaves Debian out: the image is the Files layer alone (static programs
	// that need no userland). Layers must then be empty.
	Scratch bool
	// Layers are installed in order, each its own image layer.
	Layers []PackageLayer
	// Files are put into the last layer, over what the packages installed.
	Files []File
	// The image config.
	User       string
	Env        []string // defaultEnv (PATH) if empty
	Entrypoint []string
	Cmd        []string
	WorkingDir string
	Labels     map[string]string
}

// PackageLayer is one image layer: Debian packages (apt-get install
// --no-install-recommends in a chroot), then Script (sh -e in the chroot) if any.
type PackageLayer struct {
	Name     string
	Packages []string
	Script   string
}

// File is one entry of a DebianSpec's file layer: the content of HostPath, or Data, or a
// symlink to Link, or a directory (Dir). Path is relative to the image root.
type File struct {
	Path     string
	HostPath string
	Data     []byte
	Link     string
	Dir      bool
	Mode     int64 // permission bits; 0755 for directories and 0644 for files if 0
}

// debianRecipe changes whenever Debian makes images differently.
const debianRecipe = 1

// debianIn is everything a Debian image depends on: the fingerprint is made of it.
type debianIn struct {
	Recipe     int               `json:"recipe"`
	Scratch    bool              `json:"scratch,omitempty"`
	Suite      string            `json:"suite"`
	Mirror     string            `json:"mirror"`
	Debootstap string            `json:"debootstrap"`
	Layers     []builderLayer    `json:"layers"`
	Versions   map[string]string `json:"versions"` // apt candidate of every named package
	Files      []fileIn          `json:"files"`
	Config     containerConfig   `json:"config"`
	Excluded   []string          `json:"excluded"`
}

type fileIn struct {
	Path   string `json:"path"`
	Mode   int64  `json:"mode"`
	SHA256 string `json:"sha256,omitempty"`
	Link   string `json:"link,omitempty"`
	Dir    bool   `json:"dir,omitempty"`
}

var debianNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

func (s DebianSpec) check() error {
	if !debianNameRE.MatchString(s.Name) {
		return fmt.Errorf("images: Debian image name %q: want lower-case letters, digits, '.', '_' or '-'", s.Name)
	}
	if len(s.Refs) == 0 {
		return fmt.Errorf("images: Debian image %s has no references", s.Name)
	}
	if s.Scratch && (len(s.Layers) > 0 || len(s.Files) == 0) {
		return fmt.Errorf("images: %s: a scratch image has Files and no package Layers", s.Name)
	}
	for _, f := range s.Files {
		clean := path.Clean(f.Path)
		if f.Path == "" || clean != f.Path || strings.HasPrefix(clean, "/") || strings.HasPrefix(clean, "../") || clean == ".." {
			return fmt.Errorf("images: %s: file path %q must be relative and clean", s.Name, f.Path)
		}
		kinds := 0
		for _, set := range []bool{f.HostPath != "", f.Data != nil, f.Link != "", f.Dir} {
			if set {
				kinds++
			}
		}
		if kinds != 1 {
			return fmt.Errorf("images: %s: file %s must have exactly one of HostPath, Data, Link, Dir", s.Name, f.Path)
		}
	}
	return nil
}

func (f File) mode() int64 {
	switch {
	case f.Mode != 0:
		return f.Mode
	case f.Dir || f.Link != "":
		return 0o755
	}
	return 0o644
}

// content is the file's bytes (read from HostPath if set).
func (f File) content() ([]byte, error) {
	if f.HostPath == "" {
		return f.Data, nil
	}
	b, err := os.ReadFile(f.HostPath)
	if err != nil {
		return nil, fmt.Errorf("images: file %s: %w", f.Path, err)
	}
	return b, nil
}

func (s DebianSpec) config() containerConfig {
	env := s.Env
	if len(env) == 0 {
		env = defaultEnv
	}
	return containerConfig{User: s.User, Env: env, Entrypoint: s.Entrypoint, Cmd: s.Cmd, WorkingDir: s.WorkingDir, Labels: s.Labels}
}

func debianInputs(ctx context.Context, s DebianSpec) (debianIn, error) {
	suite := s.Suite
	if suite == "" {
		suite = BuilderSuite
	}
	in := debianIn{Recipe: debianRecipe, Scratch: s.Scratch, Config: s.config()}
	if !s.Scratch {
		in.Suite, in.Mirror, in.Excluded = suite, nodeimage.HostMirror(suite), builderExcluded()
		out, err := run(ctx, "", "debootstrap", "--version")
		if err != nil {
			return in, err
		}
		in.Debootstap = strings.TrimSpace(string(out))
	}
	var pkgs []string
	for _, l := range s.Layers {
		in.Layers = append(in.Layers, builderLayer{Name: l.Name, Packages: l.Packages, Script: l.Script})
		pkgs = append(pkgs, l.Packages...)
	}
	in.Versions = map[string]string{}
	var err error
	if len(pkgs) > 0 {
		if in.Versions, err = aptCandidates(ctx, pkgs); err != nil {
			return in, err
		}
	}
	for _, f := range s.Files {
		fi := fileIn{Path: f.Path, Mode: f.mode(), Link: f.Link, Dir: f.Dir}
		if !f.Dir && f.Link == "" {
			b, err := f.content()
			if err != nil {
				return in, err
			}
			sum := sha256.Sum256(b)
			fi.SHA256 = hex.EncodeToString(sum[:])
		}
		in.Files = append(in.Files, fi)
	}
	sort.Slice(in.Files, func(i, j int) bool { return in.Files[i].Path < in.Files[j].Path })
	return in, nil
}

// Debian returns the OCI layout tar of the image s describes and its manifest digest,
// building it unless the cache holds one with the same fingerprint: the recipe, suite,
// mirror, debootstrap version, layers and scripts, apt's candidate version of every
// package, each file's path, mode and content digest, the image config, architecture
// and references. Building needs root and the Debian mirror; it takes minutes.
func Debian(ctx context.Context, s DebianSpec, opts Options) (tarPath, digest string, err error) {
	if err := s.check(); err != nil {
		return "", "", err
	}
	in, err := debianInputs(ctx, s)
	if err != nil {
		return "", "", err
	}
	return cached(ctx, s.Name, in, s.Refs, opts, func(ctx context.Context, work string) (imageSpec, error) {
		var spec imageSpec
		if !s.Scratch {
			var err error
			if spec, err = debianLayers(ctx, work, s.Name, in.Suite, in.Mirror, in.Layers, in.Excluded, opts); err != nil {
				return imageSpec{}, err
			}
		}
		if len(s.Files) > 0 {
			files, err := s.tarFiles(in)
			if err != nil {
				return imageSpec{}, err
			}
			layer, err := layerTar(files)
			if err != nil {
				return imageSpec{}, err
			}
			var names []string
			for _, f := range in.Files {
				names = append(names, "/"+f.Path)
			}
			spec.layers = append(spec.layers, layer)
			spec.history = append(spec.history, "socialweb images: files "+strings.Join(names, " "))
		}
		spec.config = in.Config
		return spec, nil
	})
}

// tarFiles are s.Files as layer entries, each file's content checked against the digest
// the fingerprint was made of (a file changed since then would be cached under the
// wrong fingerprint).
func (s DebianSpec) tarFiles(in debianIn) ([]tarFile, error) {
	want := map[string]string{}
	for _, f := range in.Files {
		want[f.Path] = f.SHA256
	}
	var out []tarFile
	for _, f := range s.Files {
		t := tarFile{path: f.Path, mode: f.mode()}
		switch {
		case f.Dir:
			t.typ = tar.TypeDir
		case f.Link != "":
			t.typ, t.link = tar.TypeSymlink, f.Link
		default:
			b, err := f.content()
			if err != nil {
				return nil, err
			}
			if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != want[f.Path] {
				return nil, fmt.Errorf("images: %s: %s changed during the build", s.Name, f.Path)
			}
			t.typ, t.data = tar.TypeReg, b
		}
		out = append(out, t)
	}
	return out, nil
}
