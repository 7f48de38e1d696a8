package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/images"
)

// TestImagePushAndList: an image built locally is loaded into the host
// registry by the CLI and listed under the name nodes will pull.
func TestImagePushAndList(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tarPath, digest, err := images.Build(ctx, images.Busybox, images.Options{CacheDir: t.TempDir()})
	if err != nil {
		t.Fatalf("building busybox: %v", err)
	}
	state := t.TempDir()
	out, errOut, code := run("image", "push", tarPath, "--state-dir", state)
	if code != 0 || !strings.Contains(out, "docker.io/library/busybox:stable@"+digest) {
		t.Fatalf("image push: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, _, code = run("image", "list", "--state-dir", state)
	if code != 0 || !strings.Contains(out, "docker.io/library/busybox") || !strings.Contains(out, digest) {
		t.Errorf("image list:\n%s", out)
	}
	if _, errOut, code := run("image", "push", "/nonexistent.tar", "--state-dir", state); code == 0 || !strings.Contains(errOut, "/nonexistent.tar") {
		t.Errorf("push of a missing file: exit %d %q", code, errOut)
	}
}
