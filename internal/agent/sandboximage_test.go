package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/socialweb-computer/socialweb/internal/guestbuild"
	"github.com/socialweb-computer/socialweb/internal/images"
	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// The archive the node image carries is where the agent looks, and holds the image the
// containerd config names as the sandbox image.
func TestSandboxImageArchiveIsTheNodeImages(t *testing.T) {
	if got := DefaultLayout().SandboxImageArchive; got != guestbuild.GuestSandboxImage {
		t.Errorf("agent looks for the sandbox image at %s, guestbuild puts it at %s", got, guestbuild.GuestSandboxImage)
	}
	if want := DefaultConfig().SandboxImage; !slices.Contains(images.Refs[images.Pause], want) {
		t.Errorf("sandbox image %s is not a name of the pause image guestbuild puts in the node image (%v)", want, images.Refs[images.Pause])
	}
}

// Without an archive the agent neither waits for containerd nor tries again.
func TestImportSandboxImageWithoutArchive(t *testing.T) {
	a := New(Config{Layout: DefaultLayout().Under(t.TempDir()), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a.importSandboxImage(ctx) // no containerd socket either: returns at once
	if ctx.Err() != nil {
		t.Fatal("importSandboxImage waited for containerd with no archive to import")
	}
	if !a.sandboxImported {
		t.Error("a node image without the archive should be done with it, not look again at the kubelet's start")
	}
}

func TestImportImageArchive(t *testing.T) {
	socket := startTestContainerd(t)
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pause, _, err := images.Build(context.Background(), images.Pause, images.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("building the pause image: %v", err)
	}
	for _, tc := range []struct {
		name      string
		archive   string
		wantNames []string
		wantErr   string
	}{
		{"the node image's pause image", pause, images.Refs[images.Pause], ""},
		{"a named image", write("named.tar", ociArchive(t, "socialweb.test/sandbox:1")), []string{"socialweb.test/sandbox:1"}, ""},
		{"an image with no name", write("unnamed.tar", ociArchive(t, "")), nil, "names no image"},
		{"not a tar", write("garbage.tar", []byte("not an OCI layout")), nil, "importing"},
		{"no file", filepath.Join(dir, "missing.tar"), nil, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			names, err := importImageArchive(ctx, socket, tc.archive, "overlayfs")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(names, tc.wantNames) {
				t.Fatalf("imported %v, want %v", names, tc.wantNames)
			}
			checkCRIImage(ctx, t, socket, names[0])
		})
	}
	// The failed imports left no image behind.
	c, err := client.New(socket, client.WithDefaultNamespace(criNamespace))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	imgs, err := c.ImageService().List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, i := range imgs {
		got = append(got, i.Name)
	}
	slices.Sort(got)
	want := append(slices.Clone(images.Refs[images.Pause]), "socialweb.test/sandbox:1")
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("images in namespace %s: %v, want %v", criNamespace, got, want)
	}
}

// checkCRIImage checks that name is in the CRI's namespace with the CRI's labels and
// unpacked for overlayfs: what RunPodSandbox needs to use it without a pull.
func checkCRIImage(ctx context.Context, t *testing.T, socket, name string) {
	t.Helper()
	c, err := client.New(socket, client.WithDefaultNamespace(criNamespace))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	img, err := c.GetImage(ctx, name)
	if err != nil {
		t.Fatalf("image %s in namespace %s: %v", name, criNamespace, err)
	}
	for k, v := range criImageLabels() {
		if got := img.Labels()[k]; got != v {
			t.Errorf("label %s = %q, want %q", k, got, v)
		}
	}
	if ok, err := client.NewImageWithPlatform(c, img.Metadata(), platforms.Default()).IsUnpacked(ctx, "overlayfs"); err != nil || !ok {
		t.Errorf("image %s unpacked for overlayfs: %v, %v; want true", name, ok, err)
	}
}

// startTestContainerd runs the host's containerd (Debian's, from hack/deps) on a private
// root, state and socket, without its CRI plugin, until the test ends.
func startTestContainerd(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		livetest.Skip(t, "containerd needs root")
	}
	bin, err := exec.LookPath("containerd")
	if err != nil {
		livetest.Skip(t, "no containerd on PATH (hack/deps installs Debian's)")
	}
	dir, err := os.MkdirTemp("", "ctrd-")
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "c.sock") // short: a unix socket path has a 108-byte limit
	config := fmt.Sprintf("version = 2\nroot = %q\nstate = %q\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n[grpc]\n  address = %q\n[ttrpc]\n  address = %q\n",
		filepath.Join(dir, "root"), filepath.Join(dir, "state"), socket, socket+".ttrpc")
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	cmd := exec.Command(bin, "--config", filepath.Join(dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	end := make(chan struct{})
	go func() { cmd.Wait(); close(end) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-end:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-end
		}
		os.RemoveAll(dir)
	})
	if err := waitSocket(context.Background(), socket, 30*time.Second, end); err != nil {
		t.Fatalf("%v\ncontainerd said:\n%s", err, log.String())
	}
	return socket
}

// ociArchive is an OCI layout tar of one image of one small layer, named name in its
// index (io.containerd.image.name) unless name is "".
func ociArchive(t *testing.T, name string) []byte {
	t.Helper()
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	body := []byte("sandbox\n")
	tw.WriteHeader(&tar.Header{Name: "hello", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
	tw.Write(body)
	tw.Close()
	blobs := map[digest.Digest][]byte{}
	add := func(mediaType string, b []byte) ocispec.Descriptor {
		d := digest.FromBytes(b)
		blobs[d] = b
		return ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(b))}
	}
	mustJSON := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	layerDesc := add(ocispec.MediaTypeImageLayer, layer.Bytes())
	config := add(ocispec.MediaTypeImageConfig, mustJSON(ocispec.Image{
		Platform: ocispec.Platform{Architecture: runtime.GOARCH, OS: "linux"},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{layerDesc.Digest}},
	}))
	manifest := ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest, Config: config, Layers: []ocispec.Descriptor{layerDesc}}
	manifest.SchemaVersion = 2
	mdesc := add(ocispec.MediaTypeImageManifest, mustJSON(manifest))
	mdesc.Platform = &ocispec.Platform{Architecture: runtime.GOARCH, OS: "linux"}
	if name != "" {
		mdesc.Annotations = map[string]string{"io.containerd.image.name": name}
	}
	index := ocispec.Index{MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{mdesc}}
	index.SchemaVersion = 2

	var out bytes.Buffer
	tw = tar.NewWriter(&out)
	file := func(name string, b []byte) {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg})
		tw.Write(b)
	}
	file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	file("index.json", mustJSON(index))
	for d, b := range blobs {
		file("blobs/sha256/"+d.Encoded(), b)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}
