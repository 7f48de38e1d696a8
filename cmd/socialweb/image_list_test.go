package main

import (
	"bytes"
	"testing"

	"github.com/socialweb-computer/socialweb/internal/registry"
)

var testRefs = []registry.ImageRef{
	{Name: "docker.io/library/app", Tag: "1", Digest: "sha256:aa", MediaType: "application/vnd.oci.image.index.v1+json", Size: 1234, Cluster: "ci"},
	{Name: "docker.io/library/busybox", Tag: "stable", Digest: "sha256:bb", MediaType: "application/vnd.oci.image.manifest.v1+json", Size: 2048},
}

func TestWriteImageTable(t *testing.T) {
	tests := []struct {
		name string
		wide bool
		want string
	}{
		{"default", false,
			"NAME                        TAG      DIGEST      SIZE   SEEN BY\n" +
				"docker.io/library/app       1        sha256:aa   1234   cluster ci\n" +
				"docker.io/library/busybox   stable   sha256:bb   2048   every cluster\n"},
		{"wide", true,
			"NAME                        TAG      DIGEST      SIZE   SEEN BY         MEDIA TYPE\n" +
				"docker.io/library/app       1        sha256:aa   1234   cluster ci      application/vnd.oci.image.index.v1+json\n" +
				"docker.io/library/busybox   stable   sha256:bb   2048   every cluster   application/vnd.oci.image.manifest.v1+json\n"},
	}
	for _, tt := range tests {
		var b bytes.Buffer
		if err := writeImageTable(&b, testRefs, tt.wide); err != nil {
			t.Fatal(err)
		}
		if b.String() != tt.want {
			t.Errorf("%s:\n%s\nwant:\n%s", tt.name, b.String(), tt.want)
		}
	}
}

// The records' field names are what scripts read: a change here breaks them.
func TestImageRecords(t *testing.T) {
	tests := []struct {
		name string
		refs []registry.ImageRef
		o    output
		want string
	}{
		{"no images", nil, outputJSON, "[]\n"},
		{"json", testRefs[1:], outputJSON, `[
  {
    "name": "docker.io/library/busybox",
    "tag": "stable",
    "digest": "sha256:bb",
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "size": 2048,
    "cluster": ""
  }
]
`},
		{"yaml", testRefs[:1], outputYAML, `- cluster: ci
  digest: sha256:aa
  mediaType: application/vnd.oci.image.index.v1+json
  name: docker.io/library/app
  size: 1234
  tag: "1"
`},
	}
	for _, tt := range tests {
		var b bytes.Buffer
		if err := writeObject(&b, tt.o, imageRecords(tt.refs)); err != nil {
			t.Fatal(err)
		}
		if b.String() != tt.want {
			t.Errorf("%s:\n%s\nwant:\n%s", tt.name, b.String(), tt.want)
		}
	}
}
