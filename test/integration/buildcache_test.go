package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/socialweb-computer/socialweb/internal/images"
	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// cacheToolImage is the image job Pods run cachetool from (busybox and
// /usr/local/bin/cachetool).
const cacheToolImage = "socialweb.test/cachetool:1"

// runnerCache is the [runners.cache] of a runner template, as GitLab Runner reads it.
type runnerCache struct {
	Type   string
	Shared bool
	S3     struct {
		ServerAddress, AccessKey, SecretKey, BucketName, BucketLocation string
		Insecure                                                        bool
	} `toml:"s3"`
}

// TestBuildCache is GitLab's `cache:` across fresh nodes, as a CI admin wires it: the
// template `cluster runner-credential` writes carries [runners.cache] (S3 on the
// cluster's gateway, its own keys). Job 1 uploads a cache archive to a URL presigned with
// those keys, as the runner's helper does, on a node that is then destroyed (one node per
// job); job 2, on a new node, downloads it byte for byte. Another tenant's keys open
// nothing of it; past the budget the least recently used archive goes; the metrics count
// it; deleting the cluster deletes its cache.
func TestBuildCache(t *testing.T) {
	img := nodeImage(t)
	metrics := fmt.Sprintf("127.0.0.1:%d", livetest.FreePort(t))
	const budget = 20 << 20
	d := newDaemon(t, 2, "--node-image", img, "--metrics-address", metrics, "--build-cache-budget", "20Mi")
	d.start()
	ctx := ctxT(t, 20*time.Minute)
	pushCacheTool(t, ctx, d)
	d.mustCLI("cluster", "create", "cache", "--wait", "--fresh-node-per-job", "--max-nodes", "2", "--node-disk", "3Gi")
	d.mustCLI("cluster", "create", "other", "--wait")

	mine, theirs := templateCache(t, d, "cache"), templateCache(t, d, "other")
	if mine.Type != "s3" || !mine.Shared || !mine.S3.Insecure || mine.S3.BucketLocation == "" ||
		!regexp.MustCompile(`^10\.250\.[0-9]+\.1:5001$`).MatchString(mine.S3.ServerAddress) {
		t.Fatalf("the template's [runners.cache] = %+v; want Type s3, Shared, plain HTTP on the cluster's gateway port 5001 and a BucketLocation", mine)
	}
	if mine.S3.ServerAddress == theirs.S3.ServerAddress || mine.S3.SecretKey == theirs.S3.SecretKey || mine.S3.BucketName == theirs.S3.BucketName {
		t.Fatalf("two clusters share a cache address, key or bucket: %+v and %+v", mine.S3, theirs.S3)
	}
	runner := s3Client(t, mine.S3.ServerAddress, mine)
	const key = "runner/abc/project/1/default-protected"
	putURL, err := runner.PresignedPutObject(ctx, mine.S3.BucketName, key, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	getURL, err := runner.PresignedGetObject(ctx, mine.S3.BucketName, key, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}

	_, k := d.tenant("cache")
	job := func(name, script string) (node, log string) {
		t.Helper()
		grace := int64(1)
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"job.runner.gitlab.com/pod": name}},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &grace,
				Containers: []corev1.Container{{Name: "build", Image: cacheToolImage, Command: []string{"sh", "-c", script},
					Env: []corev1.EnvVar{{Name: "PUT_URL", Value: putURL.String()}, {Name: "GET_URL", Value: getURL.String()}}}},
			},
		}
		if _, err := k.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		livetest.Eventually(t, 8*time.Minute, time.Second, "job "+name+" to print done", func() bool {
			got, err := k.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("job %s: %v", name, err)
			}
			node = got.Spec.NodeName
			b, _ := k.CoreV1().Pods("default").GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
			log = string(b)
			if got.Status.Phase == corev1.PodFailed || got.Status.Phase == corev1.PodSucceeded {
				t.Fatalf("job %s ended before it printed done: %s; log:\n%s", name, got.Status.Phase, log)
			}
			return got.Status.Phase == corev1.PodRunning && strings.Contains(log, "done")
		})
		// The runner deletes a job's Pod when it ends; with a node per job the node goes too.
		if err := k.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return node, log
	}

	first, log1 := job("job-1", `dd if=/dev/urandom of=/tmp/cache.zip bs=1M count=8 2>/dev/null && /usr/local/bin/cachetool put "$PUT_URL" /tmp/cache.zip && echo done; exec sleep 3600`)
	put := shaLine(t, "put", log1)
	t.Logf("job 1 on %s saved its cache: %s", first, put)
	livetest.Eventually(t, 2*time.Minute, time.Second, "job 1's node to be gone", func() bool {
		_, err := k.CoreV1().Nodes().Get(ctx, first, metav1.GetOptions{})
		return apierrors.IsNotFound(err) && len(qemusOf(d.stateDir)) == 0
	})
	second, log2 := job("job-2", `/usr/local/bin/cachetool get "$GET_URL" /tmp/cache.zip && echo done; exec sleep 3600`)
	got := shaLine(t, "get", log2)
	t.Logf("job 2 on %s restored it: %s", second, got)
	if second == first || second == "" {
		t.Errorf("job 2 ran on %q, job 1 on %q: want a new node", second, first)
	}
	if got != put {
		t.Fatalf("job 2 restored %q, job 1 saved %q: want the same bytes", got, put)
	}

	// Another tenant's keys: refused at this cluster's address, and at its own the
	// bucket does not exist.
	for _, tc := range []struct {
		what, endpoint string
	}{{"at this cluster's address", mine.S3.ServerAddress}, {"at its own address", theirs.S3.ServerAddress}} {
		_, err := s3Client(t, tc.endpoint, theirs).StatObject(ctx, mine.S3.BucketName, key, minio.StatObjectOptions{})
		if err == nil {
			t.Errorf("cluster other's keys %s read cluster cache's archive", tc.what)
		} else {
			t.Logf("cluster other's keys %s: %v", tc.what, err)
		}
	}

	// Over the budget the least recently used goes: job 2's read made the archive the most
	// recent, so two more 8 MiB objects (24 MiB > 20 MiB) push it out after the first.
	filler := make([]byte, 8<<20)
	for i, name := range []string{"filler-1", "filler-2"} {
		if _, err := rand.Read(filler); err != nil {
			t.Fatal(err)
		}
		if _, err := runner.PutObject(ctx, mine.S3.BucketName, name, bytes.NewReader(filler), int64(len(filler)), minio.PutObjectOptions{}); err != nil {
			t.Fatalf("uploading %s: %v", name, err)
		}
		if i == 0 {
			if _, err := runner.StatObject(ctx, mine.S3.BucketName, key, minio.StatObjectOptions{}); err != nil {
				t.Fatalf("the archive went at 16 MiB of a %d MiB budget: %v", budget>>20, err)
			}
		}
	}
	if _, err := runner.StatObject(ctx, mine.S3.BucketName, key, minio.StatObjectOptions{}); minio.ToErrorResponse(err).Code != "NoSuchKey" {
		t.Errorf("the least recently used archive after 24 MiB in a 20 MiB budget: %v, want NoSuchKey", err)
	}
	for _, name := range []string{"filler-1", "filler-2"} {
		if _, err := runner.StatObject(ctx, mine.S3.BucketName, name, minio.StatObjectOptions{}); err != nil {
			t.Errorf("%s went, want only the least recently used gone: %v", name, err)
		}
	}
	body := scrape(t, metrics)
	for _, want := range []string{
		`socialweb_build_cache_bytes{cluster="cache"} 1.6777216e+07`,
		`socialweb_build_cache_evictions_total{cluster="cache"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(body, "socialweb_build_cache"))
		}
	}

	// The cluster goes, its cache with it.
	d.mustCLI("cluster", "delete", "cache", "--wait")
	if _, err := os.Stat(filepath.Join(d.stateDir, "buildcache", "cache")); !os.IsNotExist(err) {
		t.Errorf("the deleted cluster's cache directory: %v, want it gone", err)
	}
}

// TestBuildCacheOff is the operator's switch: serve --build-cache=false writes no
// [runners.cache] into a runner's template and says so.
func TestBuildCacheOff(t *testing.T) {
	d := newDaemon(t, 1, "--build-cache=false")
	d.start()
	d.mustCLI("cluster", "create", "nocache", "--wait")
	out := t.TempDir()
	_, errOut, code := d.cli("cluster", "runner-credential", "nocache", "--out", out)
	if code != 0 {
		t.Fatalf("runner-credential: exit %d: %s", code, errOut)
	}
	tmpl, err := os.ReadFile(filepath.Join(out, "config.template.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(tmpl), "[runners.cache]\n") || !strings.Contains(errOut, "no build cache") {
		t.Errorf("with the cache off the template has [runners.cache] or the command does not say so (stderr %q):\n%s", errOut, tmpl)
	}
}

// templateCache is the [runners.cache] of cluster's runner template.
func templateCache(t *testing.T, d *daemon, cluster string) runnerCache {
	t.Helper()
	out := t.TempDir()
	d.mustCLI("cluster", "runner-credential", cluster, "--out", out)
	var doc struct {
		Runners []struct {
			Cache *runnerCache `toml:"cache"`
		} `toml:"runners"`
	}
	if _, err := toml.DecodeFile(filepath.Join(out, "config.template.toml"), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Runners) != 1 || doc.Runners[0].Cache == nil {
		t.Fatalf("cluster %s's runner template has no [runners.cache]", cluster)
	}
	return *doc.Runners[0].Cache
}

// s3Client is the S3 client GitLab Runner makes from [runners.cache.s3] (minio-go),
// pointed at endpoint.
func s3Client(t *testing.T, endpoint string, c runnerCache) *minio.Client {
	t.Helper()
	mc, err := minio.New(endpoint, &minio.Options{
		Creds: credentials.NewStaticV4(c.S3.AccessKey, c.S3.SecretKey, ""), Secure: !c.S3.Insecure, Region: c.S3.BucketLocation,
	})
	if err != nil {
		t.Fatal(err)
	}
	return mc
}

// shaLine is cachetool's "<op> sha256 <hex> bytes <n>" line in a job's log.
func shaLine(t *testing.T, op, log string) string {
	t.Helper()
	m := regexp.MustCompile(op + ` sha256 ([0-9a-f]{64}) bytes ([0-9]+)`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("no %q line from cachetool in the job's log:\n%s", op, log)
	}
	if m[2] != fmt.Sprint(8<<20) {
		t.Fatalf("cachetool %s moved %s bytes, want %d", op, m[2], 8<<20)
	}
	return m[1]
}

func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// pushCacheTool builds cachetool (static), adds it to the busybox image and pushes that
// to the host registry as cacheToolImage.
func pushCacheTool(t *testing.T, ctx context.Context, d *daemon) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "cachetool")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", bin, "./cachetool")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building cachetool: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	layer, err := images.ToolLayer("cachetool", data)
	if err != nil {
		t.Fatal(err)
	}
	im, err := mutate.AppendLayers(busyboxImage(t, ctx), static.NewLayer(layer, types.OCIUncompressedLayer))
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewTag(cacheToolImage)
	if err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(t.TempDir(), "cachetool.tar")
	if err := tarball.WriteToFile(tarPath, ref, im); err != nil {
		t.Fatal(err)
	}
	d.mustCLI("image", "push", tarPath)
	sum := sha256.Sum256(data)
	t.Logf("cachetool (%d bytes, sha256 %s) pushed as %s", len(data), hex.EncodeToString(sum[:8]), cacheToolImage)
}
