package registry

import (
	"encoding/json"
	"strings"
)

// Media types of manifests and configs the registry stores and serves.
const (
	MediaTypeOCIManifest    = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeOCIIndex       = "application/vnd.oci.image.index.v1+json"
	MediaTypeOCIConfig      = "application/vnd.oci.image.config.v1+json"
	MediaTypeOCILayer       = "application/vnd.oci.image.layer.v1.tar"
	MediaTypeOCILayerGzip   = "application/vnd.oci.image.layer.v1.tar+gzip"
	MediaTypeOCILayerZstd   = "application/vnd.oci.image.layer.v1.tar+zstd"
	MediaTypeDockerManifest = "application/vnd.docker.distribution.manifest.v2+json"
	MediaTypeDockerList     = "application/vnd.docker.distribution.manifest.list.v2+json"
	MediaTypeDockerConfig   = "application/vnd.docker.container.image.v1+json"
)

// maxManifestSize bounds manifest uploads (the limit distribution and containerd use).
const maxManifestSize = 4 << 20

func isManifestType(mt string) bool {
	switch mt {
	case MediaTypeOCIManifest, MediaTypeOCIIndex, MediaTypeDockerManifest, MediaTypeDockerList:
		return true
	}
	return false
}

func isIndexType(mt string) bool { return mt == MediaTypeOCIIndex || mt == MediaTypeDockerList }

// isForeignLayer reports whether d is a layer a registry need not hold: Docker's foreign
// (Windows base) layers, OCI non-distributable layers, or anything with URLs.
func isForeignLayer(d descriptor) bool {
	return len(d.URLs) > 0 || strings.Contains(d.MediaType, "foreign") || strings.Contains(d.MediaType, "nondistributable")
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	URLs        []string          `json:"urls,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Variant      string `json:"variant,omitempty"`
}

// manifestDoc is the part of a manifest or index the registry reads: enough to find the
// blobs and manifests it references.
type manifestDoc struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType,omitempty"`
	Config        *descriptor  `json:"config,omitempty"`
	Layers        []descriptor `json:"layers,omitempty"`
	Manifests     []descriptor `json:"manifests,omitempty"`
	Subject       *descriptor  `json:"subject,omitempty"`
}

// parseManifest parses content and settles its media type: contentType (the upload's
// Content-Type) when it is a manifest type, else the document's own mediaType, else the
// OCI type its shape says. A document whose mediaType disagrees with contentType is
// invalid.
func parseManifest(content []byte, contentType string) (manifestDoc, string, error) {
	var m manifestDoc
	if err := json.Unmarshal(content, &m); err != nil {
		return m, "", errf(errManifestInvalid, "manifest is not valid JSON: %v", err)
	}
	if m.SchemaVersion != 2 {
		return m, "", errf(errManifestInvalid, "schemaVersion %d is not supported (want 2)", m.SchemaVersion)
	}
	if i := strings.IndexByte(contentType, ';'); i >= 0 {
		contentType = strings.TrimSpace(contentType[:i])
	}
	mt := ""
	switch {
	case isManifestType(contentType):
		mt = contentType
		if m.MediaType != "" && m.MediaType != mt {
			return m, "", errf(errManifestInvalid, "Content-Type %s but the manifest says mediaType %s", contentType, m.MediaType)
		}
	case m.MediaType != "":
		mt = m.MediaType
	case m.Manifests != nil:
		mt = MediaTypeOCIIndex
	case m.Config != nil:
		mt = MediaTypeOCIManifest
	}
	if !isManifestType(mt) {
		return m, "", errf(errManifestInvalid, "unsupported manifest media type %q (Content-Type %q)", mt, contentType)
	}
	if isIndexType(mt) {
		for _, d := range m.Manifests {
			if !digestRE.MatchString(d.Digest) {
				return m, "", errf(errManifestInvalid, "index entry has invalid digest %q", d.Digest)
			}
		}
		return m, mt, nil
	}
	if m.Config == nil || !digestRE.MatchString(m.Config.Digest) {
		return m, "", errf(errManifestInvalid, "image manifest has no valid config descriptor")
	}
	for _, d := range m.Layers {
		if !digestRE.MatchString(d.Digest) {
			return m, "", errf(errManifestInvalid, "layer has invalid digest %q", d.Digest)
		}
	}
	return m, mt, nil
}
