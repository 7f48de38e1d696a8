package images

import (
	"archive/tar"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
)

// largeLayerMiB is the most data one layer of a Large image holds; a bigger image has
// several layers, as real large images do (containerd fetches them in parallel).
var largeLayerMiB = 256

// LargeRef is the reference of the Large image of sizeMiB.
func LargeRef(sizeMiB int) string { return fmt.Sprintf("socialweb.test/large:%dmib", sizeMiB) }

type largeIn struct {
	Busybox busyboxIn `json:"busybox"`
	SizeMiB int       `json:"sizeMiB"`
	Seed    string    `json:"seed"`
}

// Large builds a test image of busybox plus sizeMiB MiB of pseudo-random data (ChaCha8,
// seeded by the size and layer number: the same every time, and incompressible) in
// /data/part-NNN files, one per layer of at most 256 MiB. It is tagged
// LargeRef(sizeMiB). Data layers are generated twice (to hash, then to write) rather
// than stored in a temp file.
func Large(ctx context.Context, sizeMiB int, opts Options) (tarPath, digest string, err error) {
	if sizeMiB < 1 || sizeMiB > 64<<10 {
		return "", "", fmt.Errorf("images: Large: size %d MiB is out of range (1..65536)", sizeMiB)
	}
	bin, err := busyboxInputs(ctx)
	if err != nil {
		return "", "", err
	}
	in := largeIn{Busybox: bin, SizeMiB: sizeMiB, Seed: fmt.Sprintf("chacha8(size,part), %d MiB layers", largeLayerMiB)}
	image := fmt.Sprintf("large-%dmib", sizeMiB)
	return cached(ctx, image, in, []string{LargeRef(sizeMiB)}, opts, func(ctx context.Context, work string) (imageSpec, error) {
		base, err := busyboxImage(ctx, work, bin, opts)
		if err != nil {
			return imageSpec{}, err
		}
		for part, left := 0, sizeMiB; left > 0; part++ {
			if err := ctx.Err(); err != nil {
				return imageSpec{}, err
			}
			n := min(left, largeLayerMiB)
			left -= n
			layer, err := dataLayer(ctx, sizeMiB, part, int64(n)<<20)
			if err != nil {
				return imageSpec{}, err
			}
			base.layers = append(base.layers, layer)
			base.history = append(base.history, fmt.Sprintf("socialweb images: /data/part-%03d, %d MiB of seeded random data", part, n))
		}
		base.config.Labels = map[string]string{"computer.socialweb.image.source": fmt.Sprintf("images.Large(%d)", sizeMiB)}
		return base, nil
	})
}

// dataLayer is a layer with one file, data/part-NNN, of size pseudo-random bytes.
func dataLayer(ctx context.Context, sizeMiB, part int, size int64) (blob, error) {
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[0:], uint64(sizeMiB))
	binary.LittleEndian.PutUint64(seed[8:], uint64(part))
	copy(seed[16:], "socialweb large")
	gen := func(w io.Writer) error {
		return writeTarFiles(w, []tarFile{
			{path: "data", mode: 0o755, typ: tar.TypeDir},
			{path: fmt.Sprintf("data/part-%03d", part), mode: 0o644, typ: tar.TypeReg, size: size, gen: func(w io.Writer) error {
				_, err := io.CopyN(w, ctxReader{ctx, rand.NewChaCha8(seed)}, size)
				return err
			}},
		})
	}
	return genBlob(gen)
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

func writeTarFiles(w io.Writer, files []tarFile) error {
	tw := tar.NewWriter(w)
	for _, f := range files {
		if err := writeEntry(tw, f); err != nil {
			return err
		}
	}
	return tw.Close()
}
