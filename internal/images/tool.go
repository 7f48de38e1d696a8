package images

import (
	"archive/tar"
	"bytes"
	"fmt"
	"time"
)

// ToolLayer is an uncompressed layer (a tar) that adds one program at
// /usr/local/bin/name, for an image built on top of another (the build cache's test
// and bench add cachetool this way).
func ToolLayer(name string, program []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "usr/local/", Mode: 0o755, Typeflag: tar.TypeDir, ModTime: time.Unix(0, 0)},
		{Name: "usr/local/bin/", Mode: 0o755, Typeflag: tar.TypeDir, ModTime: time.Unix(0, 0)},
		{Name: "usr/local/bin/" + name, Mode: 0o755, Size: int64(len(program)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)},
	} {
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("the layer of %s: %w", name, err)
		}
	}
	if _, err := tw.Write(program); err != nil {
		return nil, fmt.Errorf("the layer of %s: %w", name, err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("the layer of %s: %w", name, err)
	}
	return buf.Bytes(), nil
}
