package nodeimage

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestResolveAgainstHostApt resolves the default spec with the host's apt and checks the
// answer and its cache. It needs apt lists for the default suite (apt-get update).
func TestResolveAgainstHostApt(t *testing.T) {
	needTools(t, "apt-cache", "dpkg-query", "mkfs.ext4")
	spec, err := ParseSpec(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(aptListsDir, aptListName(spec.Mirror)+"_dists_"+spec.Suite+"_InRelease")); err != nil {
		needLive(t, "no apt lists for "+spec.Mirror+" "+spec.Suite+": run apt-get update")
	}
	ctx := context.Background()
	opts := Options{CacheDir: t.TempDir()}

	t0 := time.Now()
	res, err := Resolve(ctx, spec, opts)
	if err != nil {
		t.Fatal(err)
	}
	cold := time.Since(t0)
	t.Logf("resolved in %s: kernel %s %s, busybox %s, %d included packages, tools %v",
		cold.Round(time.Millisecond), res.KernelImage.Name, res.KernelImage.Version, res.Busybox.Version, len(res.Include), res.Tools)
	if !strings.HasPrefix(res.KernelImage.Name, "linux-image-") || res.KernelImage.Name == spec.KernelPackage || res.KernelImage.Version == "" {
		t.Errorf("kernel image %+v: want the linux-image-<abi> package %s depends on", res.KernelImage, spec.KernelPackage)
	}
	for _, p := range spec.IncludePackages() {
		if res.Include[p] == "" {
			t.Errorf("no version for included package %s", p)
		}
	}
	if res.Busybox.Version == "" || res.Tools["debootstrap"] == "" || res.Tools["mkfs.ext4"] == "" || len(res.ReleaseSHA256) != 64 {
		t.Errorf("incomplete resolution: %+v", res)
	}

	t0 = time.Now()
	again, err := Resolve(ctx, spec, opts)
	if err != nil {
		t.Fatal(err)
	}
	warm := time.Since(t0)
	t.Logf("cached resolve: %s", warm.Round(time.Millisecond))
	if !reflect.DeepEqual(res, again) {
		t.Errorf("cached resolution differs:\n%+v\n%+v", res, again)
	}
	if m, _ := filepath.Glob(filepath.Join(opts.CacheDir, "resolve", "*.json")); len(m) != 1 {
		t.Errorf("resolve cache holds %d entries, want 1", len(m))
	}

	// a different spec is a different cache entry, and a bad package name is an error
	spec2 := spec
	spec2.Packages = []string{"socialweb-no-such-package"}
	if _, err := Resolve(ctx, spec2, opts); err == nil || !strings.Contains(err.Error(), "socialweb-no-such-package") {
		t.Errorf("unknown package: err = %v", err)
	}
	spec3 := spec
	spec3.KernelPackage = "linux-image-socialweb-none"
	if _, err := Resolve(ctx, spec3, opts); err == nil || !strings.Contains(err.Error(), "linux-image-socialweb-none") {
		t.Errorf("unknown kernel package: err = %v", err)
	}
}
