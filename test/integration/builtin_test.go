package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// TestBuiltinImagesFromADirectory is the package's way of seeding the registry: the
// built-in images written by `image builtin --out DIR` (at packaging) are what
// `serve --builtin-images DIR` loads, as they are, with nothing built at start.
func TestBuiltinImagesFromADirectory(t *testing.T) {
	img := nodeImage(t)
	dir := filepath.Join(t.TempDir(), "images")
	out, errOut, code := run("image", "builtin", "--out", dir)
	if code != 0 {
		t.Fatalf("image builtin --out %s: exit %d\n%s", dir, code, errOut)
	}
	for _, name := range []string{"pause", "busybox"} {
		if st, err := os.Stat(filepath.Join(dir, name+".tar")); err != nil || st.Size() == 0 {
			t.Fatalf("image builtin printed %s but %s.tar is not there: %v", out, name, err)
		}
	}
	d := newDaemon(t, 1, "--node-image", img, "--builtin-images", dir)
	d.start()
	livetest.Eventually(t, 2*time.Minute, 500*time.Millisecond, "both images loaded from "+dir, func() bool {
		b, _ := os.ReadFile(d.logPath)
		loaded := 0
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "image ready in the registry") && strings.Contains(l, dir) {
				loaded++
			}
		}
		return loaded == 2
	})
	list := d.mustCLI("image", "list")
	for _, ref := range []string{"registry.k8s.io/pause:3.10", "docker.io/library/busybox:stable"} {
		name, tag, _ := strings.Cut(ref, ":")
		if !strings.Contains(list, name) || !strings.Contains(list, tag) {
			t.Errorf("image list lacks %s:\n%s", ref, list)
		}
	}

	// A directory without them is an error that says how to make them, and the
	// daemon serves on (nodes of an image that carries its sandbox image need none).
	empty := t.TempDir()
	d2 := newDaemon(t, 1, "--node-image", img, "--builtin-images", empty)
	d2.start()
	livetest.Eventually(t, time.Minute, 500*time.Millisecond, "the missing images reported", func() bool {
		b, _ := os.ReadFile(d2.logPath)
		return strings.Count(string(b), "socialweb image builtin --out "+empty) == 2
	})
}
