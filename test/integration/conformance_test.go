package integration

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// conformanceCI is the short DNS and Services subset of the Kubernetes conformance suite
// that CI runs (issue 14); bench/conformance.sh runs the whole of it. Each entry is a
// regular expression matching exactly one conformance test's name.
var conformanceCI = []string{
	`DNS should provide DNS for the cluster `,
	`DNS should provide DNS for services `,
	`Services should serve a basic endpoint from pods `,
}

// TestConformanceDNSAndServices runs conformanceCI with bench/conformance against a fresh
// daemon and cluster with one node kept up: e2e.test and the test images (agnhost from Go
// modules and Debian packages) are built or taken from the cache, pushed into the host
// registry, and every selected test must pass.
func TestConformanceDNSAndServices(t *testing.T) {
	img := nodeImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Minute)
	defer cancel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bench := filepath.Join(t.TempDir(), "conformance")
	build := exec.CommandContext(ctx, "go", "build", "-o", bench, "./bench/conformance")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building bench/conformance: %v\n%s", err, out)
	}
	focus := ""
	for i, re := range conformanceCI {
		if i > 0 {
			focus += "|"
		}
		focus += re
	}
	out := t.TempDir()
	cmd := exec.CommandContext(ctx, bench, "-mode", "nodes", "-nodes", "1", "-focus", focus,
		"-bin", binary, "-image", img, "-out", out, "-timeout", "40m")
	cmd.Dir = root
	t0 := time.Now()
	b, err := cmd.CombinedOutput()
	t.Logf("bench/conformance (%s):\n%s", time.Since(t0).Round(time.Second), tail(string(b), 40))
	if err != nil {
		t.Fatalf("bench/conformance did not run: %v (report and logs in %s)", err, out)
	}
	m := regexp.MustCompile(`(?m)^conformance: (\d+) passed, (\d+) failed`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatalf("no `conformance: N passed, M failed` line in the output")
	}
	passed, _ := strconv.Atoi(m[1])
	failed, _ := strconv.Atoi(m[2])
	if failed != 0 || passed != len(conformanceCI) {
		t.Errorf("conformance: %d passed, %d failed; want all %d of the CI subset to pass", passed, failed, len(conformanceCI))
	}
}
