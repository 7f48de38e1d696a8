package buildcache

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const mib = 1 << 20

var testKey = []byte("0123456789abcdef0123456789abcdef")

// clock is a fake Config.Now that moves only when told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newCache(t *testing.T, cfg Config) *Cache {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.Key == nil {
		cfg.Key = testKey
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// serve starts cluster's handler with its derived credentials and returns its endpoint
// (host:port).
func serve(t *testing.T, c *Cache, cluster string) string {
	t.Helper()
	h, err := c.HandlerFor(cluster, "uid")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func client(t *testing.T, endpoint, accessKey, secret string) *minio.Client {
	t.Helper()
	mc, err := minio.New(endpoint, &minio.Options{
		Creds:        credentials.NewStaticV4(accessKey, secret, ""),
		Region:       "us-east-1",
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		t.Fatal(err)
	}
	return mc
}

// clusterClient is a client with cluster's own credentials.
func clusterClient(t *testing.T, endpoint, cluster string) *minio.Client {
	ak, sk := Credentials(testKey, cluster, "uid")
	return client(t, endpoint, ak, sk)
}

func randomBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func put(t *testing.T, mc *minio.Client, bucket, key string, data []byte) {
	t.Helper()
	if _, err := mc.PutObject(context.Background(), bucket, key, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
		t.Fatalf("put %q: %v", key, err)
	}
}

func get(t *testing.T, mc *minio.Client, bucket, key string) []byte {
	t.Helper()
	obj, err := mc.GetObject(context.Background(), bucket, key, minio.GetObjectOptions{})
	if err != nil {
		t.Fatalf("get %q: %v", key, err)
	}
	defer obj.Close()
	b, err := io.ReadAll(obj)
	if err != nil {
		t.Fatalf("get %q: %v", key, err)
	}
	return b
}

// code is an S3 client error's code and HTTP status.
func code(err error) (string, int) {
	r := minio.ToErrorResponse(err)
	return r.Code, r.StatusCode
}

func exists(t *testing.T, mc *minio.Client, bucket, key string) bool {
	t.Helper()
	_, err := mc.StatObject(context.Background(), bucket, key, minio.StatObjectOptions{})
	if err == nil {
		return true
	}
	if c, _ := code(err); c != "NoSuchKey" {
		t.Fatalf("stat %q: %v", key, err)
	}
	return false
}

func TestObjects(t *testing.T) {
	ctx := context.Background()
	c := newCache(t, Config{})
	mc := clusterClient(t, serve(t, c, "ci"), "ci")
	data := randomBytes(3*mib+123, 1)

	_, err := mc.PutObject(ctx, Bucket("ci"), "runner/x/cache.zip", bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{
		ContentType:  "application/zip",
		UserMetadata: map[string]string{"Origin": "job-7"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := get(t, mc, Bucket("ci"), "runner/x/cache.zip"); !bytes.Equal(got, data) {
		t.Fatalf("got %d bytes back, not the %d put", len(got), len(data))
	}

	obj, err := mc.GetObject(ctx, Bucket("ci"), "runner/x/cache.zip", func() minio.GetObjectOptions {
		var o minio.GetObjectOptions
		_ = o.SetRange(mib, 2*mib-1)
		return o
	}())
	if err != nil {
		t.Fatal(err)
	}
	part, err := io.ReadAll(obj)
	obj.Close()
	if err != nil || !bytes.Equal(part, data[mib:2*mib]) {
		t.Fatalf("ranged get: %d bytes, %v; want bytes %d..%d", len(part), err, mib, 2*mib-1)
	}

	st, err := mc.StatObject(ctx, Bucket("ci"), "runner/x/cache.zip", minio.StatObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sum := md5.Sum(data)
	if st.Size != int64(len(data)) || st.ETag != hex.EncodeToString(sum[:]) || st.ContentType != "application/zip" || st.UserMetadata["Origin"] != "job-7" {
		t.Errorf("head: size %d etag %s type %q meta %v; want %d %x application/zip Origin=job-7", st.Size, st.ETag, st.ContentType, st.UserMetadata, len(data), sum)
	}

	if bytes, objects := c.Usage("ci"); bytes != int64(len(data)) || objects != 1 {
		t.Errorf("usage %d bytes %d objects, want %d 1", bytes, objects, len(data))
	}

	if err := mc.RemoveObject(ctx, Bucket("ci"), "runner/x/cache.zip", minio.RemoveObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if exists(t, mc, Bucket("ci"), "runner/x/cache.zip") {
		t.Error("deleted object still there")
	}
	if bytes, objects := c.Usage("ci"); bytes != 0 || objects != 0 {
		t.Errorf("usage after delete %d bytes %d objects", bytes, objects)
	}
}

func TestList(t *testing.T) {
	c := newCache(t, Config{})
	mc := clusterClient(t, serve(t, c, "ci"), "ci")
	for _, k := range []string{"a/1", "a/2", "a/b/3", "a/b/4", "ab", "c/5", "d"} {
		put(t, mc, Bucket("ci"), k, []byte(k))
	}
	tests := []struct {
		name      string
		opts      minio.ListObjectsOptions
		want      []string
		wantPages bool
	}{
		{"all", minio.ListObjectsOptions{Recursive: true}, []string{"a/1", "a/2", "a/b/3", "a/b/4", "ab", "c/5", "d"}, false},
		{"top level", minio.ListObjectsOptions{}, []string{"a/", "ab", "c/", "d"}, false},
		{"prefix and delimiter", minio.ListObjectsOptions{Prefix: "a/"}, []string{"a/1", "a/2", "a/b/"}, false},
		{"prefix only", minio.ListObjectsOptions{Prefix: "a", Recursive: true}, []string{"a/1", "a/2", "a/b/3", "a/b/4", "ab"}, false},
		{"no match", minio.ListObjectsOptions{Prefix: "z"}, nil, false},
		{"pages of one", minio.ListObjectsOptions{MaxKeys: 1}, []string{"a/", "ab", "c/", "d"}, true},
		{"pages of two, v1", minio.ListObjectsOptions{MaxKeys: 2, Recursive: true, UseV1: true}, []string{"a/1", "a/2", "a/b/3", "a/b/4", "ab", "c/5", "d"}, true},
		{"start after", minio.ListObjectsOptions{StartAfter: "a/b/3", Recursive: true}, []string{"a/b/4", "ab", "c/5", "d"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for o := range mc.ListObjects(context.Background(), Bucket("ci"), tt.opts) {
				if o.Err != nil {
					t.Fatal(o.Err)
				}
				got = append(got, o.Key)
			}
			// Each page's objects come before its common prefixes.
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestCopyAndDeleteMany(t *testing.T) {
	ctx := context.Background()
	c := newCache(t, Config{})
	mc := clusterClient(t, serve(t, c, "ci"), "ci")
	put(t, mc, Bucket("ci"), "src", []byte("hello"))
	if _, err := mc.CopyObject(ctx, minio.CopyDestOptions{Bucket: Bucket("ci"), Object: "dst"}, minio.CopySrcOptions{Bucket: Bucket("ci"), Object: "src"}); err != nil {
		t.Fatal(err)
	}
	if got := get(t, mc, Bucket("ci"), "dst"); string(got) != "hello" {
		t.Errorf("copy has %q", got)
	}
	if _, err := mc.CopyObject(ctx, minio.CopyDestOptions{Bucket: Bucket("ci"), Object: "dst"}, minio.CopySrcOptions{Bucket: Bucket("other"), Object: "src"}); err == nil {
		t.Error("copying from another bucket succeeded")
	}

	keys := make(chan minio.ObjectInfo, 3)
	for _, k := range []string{"src", "dst", "never-was"} {
		keys <- minio.ObjectInfo{Key: k}
	}
	close(keys)
	for e := range mc.RemoveObjects(ctx, Bucket("ci"), keys, minio.RemoveObjectsOptions{}) {
		t.Errorf("removing %s: %v", e.ObjectName, e.Err)
	}
	if b, n := c.Usage("ci"); b != 0 || n != 0 {
		t.Errorf("usage after deleting all: %d bytes, %d objects", b, n)
	}
}

func TestPresigned(t *testing.T) {
	ctx := context.Background()
	c := newCache(t, Config{})
	mc := clusterClient(t, serve(t, c, "ci"), "ci")
	data := randomBytes(2*mib, 2)

	do := func(method string, u *url.URL, body []byte) (int, []byte) {
		t.Helper()
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}

	putURL, err := mc.PresignedPutObject(ctx, Bucket("ci"), "project/1/default", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if status, body := do(http.MethodPut, putURL, data); status != http.StatusOK {
		t.Fatalf("presigned PUT: %d %s", status, body)
	}
	getURL, err := mc.PresignedGetObject(ctx, Bucket("ci"), "project/1/default", time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	if status, body := do(http.MethodGet, getURL, nil); status != http.StatusOK || !bytes.Equal(body, data) {
		t.Fatalf("presigned GET: %d, %d bytes; want 200 and the %d put", status, len(body), len(data))
	}

	// A presigned URL is for its key and method only.
	other := *getURL
	other.Path = "/" + Bucket("ci") + "/project/2/default"
	if status, _ := do(http.MethodGet, &other, nil); status != http.StatusForbidden {
		t.Errorf("presigned GET URL for another key: %d, want 403", status)
	}
	if status, _ := do(http.MethodPut, getURL, []byte("x")); status != http.StatusForbidden {
		t.Errorf("presigned GET URL used to PUT: %d, want 403", status)
	}
	// Another cluster's presigned URL, pointed at this handler, is refused.
	bURL, err := clusterClient(t, putURL.Host, "other").PresignedPutObject(ctx, Bucket("ci"), "project/1/default", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if status, _ := do(http.MethodPut, bURL, []byte("overwritten")); status != http.StatusForbidden {
		t.Errorf("another cluster's presigned PUT: %d, want 403", status)
	}
	if got := get(t, mc, Bucket("ci"), "project/1/default"); !bytes.Equal(got, data) {
		t.Error("object changed by refused requests")
	}
}

// TestChunkedUpload is an upload of unknown size (no Content-Length), which is held to
// the budget as it arrives.
func TestChunkedUpload(t *testing.T) {
	ctx := context.Background()
	c := newCache(t, Config{Budget: 2 * mib})
	mc := clusterClient(t, serve(t, c, "ci"), "ci")
	tests := []struct {
		name   string
		size   int
		status int
	}{
		{"within budget", mib, http.StatusOK},
		{"over budget", 2*mib + 1, http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, err := mc.PresignedPutObject(ctx, Bucket("ci"), tt.name, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			data := randomBytes(tt.size, 3)
			// A reader that is not a bytes.Reader has no known length: chunked.
			req, err := http.NewRequestWithContext(ctx, http.MethodPut, u.String(), io.MultiReader(bytes.NewReader(data)))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d %s, want %d", resp.StatusCode, body, tt.status)
			}
			if tt.status != http.StatusOK {
				if !strings.Contains(string(body), "EntityTooLarge") {
					t.Errorf("refusal %s, want EntityTooLarge", body)
				}
				if exists(t, mc, Bucket("ci"), tt.name) {
					t.Error("refused object stored")
				}
				return
			}
			if got := get(t, mc, Bucket("ci"), tt.name); !bytes.Equal(got, data) {
				t.Error("chunked upload came back different")
			}
		})
	}
	assertNoTemporaries(t, filepath.Join(c.dir, "ci"))
}

// TestUploadCutShort is a client that goes away halfway through an upload: nothing of
// it stays.
func TestUploadCutShort(t *testing.T) {
	ctx := context.Background()
	var log syncBuffer
	c := newCache(t, Config{Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	end := serve(t, c, "ci")
	mc := clusterClient(t, end, "ci")
	u, err := mc.PresignedPutObject(ctx, Bucket("ci"), "half", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", end)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "PUT %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n", u.RequestURI(), u.Host, mib)
	conn.Write(make([]byte, mib/2))
	conn.Close()

	// The store logs the cut once it has cleaned up after it.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(log.String(), "upload cut short"); {
		if time.Now().After(deadline) {
			t.Fatalf("the upload's end was not seen; log:\n%s", log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ents, err := os.ReadDir(filepath.Join(c.dir, "ci")); err != nil || len(ents) != 0 {
		t.Errorf("files left by a cut upload: %v %v", ents, err)
	}
	if exists(t, mc, Bucket("ci"), "half") {
		t.Error("half an object stored")
	}
	if b, n := c.Usage("ci"); b != 0 || n != 0 {
		t.Errorf("usage %d bytes, %d objects", b, n)
	}
}

func TestIsolation(t *testing.T) {
	ctx := context.Background()
	c := newCache(t, Config{})
	aEnd, bEnd := serve(t, c, "team-a"), serve(t, c, "team-b")
	a := clusterClient(t, aEnd, "team-a")
	put(t, a, Bucket("team-a"), "secret", []byte("a's cache"))
	put(t, clusterClient(t, bEnd, "team-b"), Bucket("team-b"), "b-only", []byte("b's cache"))

	aKey, aSecret := Credentials(testKey, "team-a", "uid")
	refused := []struct {
		name string
		mc   *minio.Client
	}{
		{"another cluster's credentials", clusterClient(t, aEnd, "team-b")},
		{"right key, wrong secret", client(t, aEnd, aKey, aSecret+"0")},
		{"right key, another host key's secret", func() *minio.Client {
			_, s := Credentials([]byte("another host key, 32 bytes long!"), "team-a", "uid")
			return client(t, aEnd, aKey, s)
		}()},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			ops := map[string]error{}
			_, ops["get"] = tt.mc.StatObject(ctx, Bucket("team-a"), "secret", minio.StatObjectOptions{})
			_, ops["list buckets"] = tt.mc.ListBuckets(ctx)
			_, ops["put"] = tt.mc.PutObject(ctx, Bucket("team-a"), "secret", strings.NewReader("x"), 1, minio.PutObjectOptions{})
			ops["delete"] = tt.mc.RemoveObject(ctx, Bucket("team-a"), "secret", minio.RemoveObjectOptions{})
			for op, err := range ops {
				if _, status := code(err); status != http.StatusForbidden {
					t.Errorf("%s: %v (status %d), want 403", op, err, status)
				}
			}
		})
	}
	t.Run("anonymous", func(t *testing.T) {
		for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
			req, _ := http.NewRequestWithContext(ctx, method, "http://"+aEnd+"/"+Bucket("team-a")+"/secret", strings.NewReader("x"))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "AccessDenied") {
				t.Errorf("anonymous %s: %d %s, want 403 AccessDenied", method, resp.StatusCode, body)
			}
		}
	})
	if got := get(t, a, Bucket("team-a"), "secret"); string(got) != "a's cache" {
		t.Errorf("a's object is %q after refused requests", got)
	}

	t.Run("one bucket only", func(t *testing.T) {
		buckets, err := a.ListBuckets(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(buckets) != 1 || buckets[0].Name != Bucket("team-a") {
			t.Errorf("buckets %v, want team-a alone", buckets)
		}
		if ok, err := a.BucketExists(ctx, Bucket("team-b")); ok || err != nil {
			t.Errorf("team-b exists to a: %v %v", ok, err)
		}
		for name, err := range map[string]error{
			"get b's object": getErr(a, Bucket("team-b"), "b-only"),
			"put to b": func() error {
				_, err := a.PutObject(ctx, Bucket("team-b"), "x", strings.NewReader("x"), 1, minio.PutObjectOptions{})
				return err
			}(),
			"list b": func() error {
				for o := range a.ListObjects(ctx, Bucket("team-b"), minio.ListObjectsOptions{}) {
					return o.Err
				}
				return nil
			}(),
		} {
			if c, _ := code(err); c != "NoSuchBucket" {
				t.Errorf("%s: %v, want NoSuchBucket", name, err)
			}
		}
		for _, name := range []string{Bucket("team-b"), "new-bucket", "team-a"} {
			if err := a.MakeBucket(ctx, name, minio.MakeBucketOptions{}); err == nil {
				t.Errorf("a made bucket %s", name)
			}
		}
		if err := a.RemoveBucket(ctx, "team-a"); err == nil {
			t.Error("a removed its bucket")
		}
		if _, err := os.Stat(filepath.Join(c.dir, "new-bucket")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a directory appeared for a bucket a made: %v", err)
		}
	})
}

func TestBudget(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	reg := prometheus.NewRegistry()
	cfg := Config{Dir: dir, Budget: 3 * mib, Now: clk.Now, Metrics: reg}
	c := newCache(t, cfg)
	mc := clusterClient(t, serve(t, c, "ci"), "ci")

	step := func() { clk.advance(2 * time.Minute) }
	for _, k := range []string{"k1", "k2", "k3"} {
		put(t, mc, Bucket("ci"), k, randomBytes(mib, 4))
		step()
	}
	get(t, mc, Bucket("ci"), "k1") // k2 is now the least recently used
	step()
	put(t, mc, Bucket("ci"), "k4", randomBytes(mib, 5))
	step()
	want := map[string]bool{"k1": true, "k2": false, "k3": true, "k4": true}
	for k, w := range want {
		if got := exists(t, mc, Bucket("ci"), k); got != w {
			t.Errorf("%s present %v, want %v", k, got, w)
		}
	}
	if b, n := c.Usage("ci"); b != 3*mib || n != 3 {
		t.Errorf("usage %d bytes, %d objects; want %d, 3", b, n, 3*mib)
	}
	if got := testutil.ToFloat64(c.metrics.evictions.WithLabelValues("ci")); got != 1 {
		t.Errorf("evictions metric %v, want 1", got)
	}
	if got := testutil.ToFloat64(c.metrics.bytes.WithLabelValues("ci")); got != 3*mib {
		t.Errorf("bytes metric %v, want %d", got, 3*mib)
	}

	t.Run("larger than the budget", func(t *testing.T) {
		_, err := mc.PutObject(ctx, Bucket("ci"), "huge", bytes.NewReader(randomBytes(3*mib+1, 6)), 3*mib+1, minio.PutObjectOptions{})
		if err == nil {
			t.Fatal("stored an object larger than the budget")
		}
		// The refusal comes before the body is read, so the client may see the
		// connection go instead of the answer.
		if c, _ := code(err); c != "" && c != "EntityTooLarge" {
			t.Errorf("refused with %v, want EntityTooLarge", err)
		}
		// A client that waits for 100 Continue sees the answer, and sends nothing.
		u, err := mc.PresignedPutObject(ctx, Bucket("ci"), "huge", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, u.String(), bytes.NewReader(make([]byte, 3*mib+1)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Expect", "100-continue")
		hc := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: time.Minute}}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "EntityTooLarge") {
			t.Errorf("presigned PUT over the budget: %d %s, want 400 EntityTooLarge", resp.StatusCode, body)
		}
		if exists(t, mc, Bucket("ci"), "huge") {
			t.Error("refused object is there")
		}
		if b, n := c.Usage("ci"); b != 3*mib || n != 3 {
			t.Errorf("usage %d bytes, %d objects after a refusal; want %d, 3", b, n, 3*mib)
		}
		assertNoTemporaries(t, filepath.Join(dir, "ci"))
	})

	// A restart reads the index back, LRU order included: k3 is the oldest use now.
	get(t, mc, Bucket("ci"), "k4")
	step()
	get(t, mc, Bucket("ci"), "k1")
	step()
	c2 := newCache(t, cfg) // same registry: the metrics are shared, not refused
	if b, n := c2.Usage("ci"); b != 3*mib || n != 3 {
		t.Fatalf("after restart: %d bytes, %d objects", b, n)
	}
	mc2 := clusterClient(t, serve(t, c2, "ci"), "ci")
	put(t, mc2, Bucket("ci"), "k5", randomBytes(mib, 7))
	want = map[string]bool{"k1": true, "k3": false, "k4": true, "k5": true}
	for k, w := range want {
		if got := exists(t, mc2, Bucket("ci"), k); got != w {
			t.Errorf("after restart, %s present %v, want %v", k, got, w)
		}
	}
}

func TestMaxObjects(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	c := newCache(t, Config{MaxObjects: 2, Now: clk.Now})
	mc := clusterClient(t, serve(t, c, "ci"), "ci")
	for _, k := range []string{"e1", "e2", "e3"} {
		put(t, mc, Bucket("ci"), k, nil)
		clk.advance(time.Second)
	}
	if _, n := c.Usage("ci"); n != 2 {
		t.Errorf("%d objects, want 2", n)
	}
	if exists(t, mc, Bucket("ci"), "e1") {
		t.Error("oldest empty object kept past the object limit")
	}
}

// TestKeysStayInside puts keys that would escape as paths and finds them all as flat
// files inside the cluster's directory.
func TestKeysStayInside(t *testing.T) {
	dir := t.TempDir()
	c := newCache(t, Config{Dir: filepath.Join(dir, "cache")})
	mc := clusterClient(t, serve(t, c, "ci"), "ci")
	keys := []string{"../../escape", "../ci2/x", "a/../../b", "..", "./.", "/abs/olute", "x/./y", "%2e%2e/z", `..\win`, "dir/", "\u00e9t\u00e9/.."}
	for i, k := range keys {
		put(t, mc, Bucket("ci"), k, []byte{byte(i)})
	}
	for i, k := range keys {
		if got := get(t, mc, Bucket("ci"), k); !bytes.Equal(got, []byte{byte(i)}) {
			t.Errorf("%q came back as %v", k, got)
		}
	}
	name := regexp.MustCompile(`^[0-9a-f]{64}(\.json)?$`)
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		switch {
		case d.IsDir():
			if rel != "." && rel != "cache" && rel != filepath.Join("cache", "ci") {
				t.Errorf("directory %s", rel)
			}
		case filepath.Dir(rel) != filepath.Join("cache", "ci") || !name.MatchString(d.Name()):
			t.Errorf("file %s", rel)
		default:
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2*len(keys) {
		t.Errorf("%d files for %d objects", len(files), len(keys))
	}
}

func TestRemove(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	c := newCache(t, Config{Metrics: reg})
	end := serve(t, c, "ci")
	mc := clusterClient(t, end, "ci")
	put(t, mc, Bucket("ci"), "k", []byte("v"))
	keep := clusterClient(t, serve(t, c, "keep"), "keep")
	put(t, keep, Bucket("keep"), "k", []byte("v"))

	if err := c.Remove("ci"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(c.dir, "ci")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("directory left: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(c.dir, ".*")); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
	if b, n := c.Usage("ci"); b != 0 || n != 0 {
		t.Errorf("usage of a removed cluster %d, %d", b, n)
	}
	if err := getErr(mc, Bucket("ci"), "k"); err == nil {
		t.Error("old handler still serves a removed cluster")
	} else if c, _ := code(err); c != "NoSuchBucket" {
		t.Errorf("old handler: %v, want NoSuchBucket", err)
	}
	if _, err := mc.PutObject(ctx, Bucket("ci"), "k2", strings.NewReader("v"), 1, minio.PutObjectOptions{}); err == nil {
		t.Error("old handler stores for a removed cluster")
	}
	if _, err := os.Stat(filepath.Join(c.dir, "ci")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("old handler remade the directory: %v", err)
	}
	if n := testutil.CollectAndCount(reg, "socialweb_build_cache_bytes"); n != 1 {
		t.Errorf("%d bytes series, want keep's alone", n)
	}
	if !exists(t, keep, Bucket("keep"), "k") {
		t.Error("another cluster's cache went too")
	}
	// The cluster comes back empty.
	again := clusterClient(t, serve(t, c, "ci"), "ci")
	if exists(t, again, Bucket("ci"), "k") {
		t.Error("a new cluster of the same name has the old one's objects")
	}
	if err := c.Remove("never-was"); err != nil {
		t.Errorf("removing a cluster without a cache: %v", err)
	}
}

func TestMultipartRefused(t *testing.T) {
	c := newCache(t, Config{})
	mc := clusterClient(t, serve(t, c, "ci"), "ci")
	_, err := minio.Core{Client: mc}.NewMultipartUpload(context.Background(), Bucket("ci"), "big", minio.PutObjectOptions{})
	if c, status := code(err); c != "NotImplemented" || status != http.StatusNotImplemented {
		t.Errorf("multipart upload: %v, want NotImplemented", err)
	}
}

func TestHandlerArguments(t *testing.T) {
	c := newCache(t, Config{})
	tests := []struct {
		cluster, key, secret string
	}{
		{"", "k", "s"},
		{"A", "k", "s"},
		{"..", "k", "s"},
		{"a/b", "k", "s"},
		{"-a", "k", "s"},
		{"a-", "k", "s"},
		{".removed-x", "k", "s"},
		{strings.Repeat("a", 64), "k", "s"},
		{"ok", "", "s"},
		{strings.Repeat("a", 61), "k", "s"},
		{"ok", "k", ""},
	}
	for _, tt := range tests {
		if _, err := c.Handler(tt.cluster, tt.key, tt.secret); err == nil {
			t.Errorf("Handler(%q, %q, %q) accepted", tt.cluster, tt.key, tt.secret)
		}
	}
	if _, err := c.Handler(strings.Repeat("a", 60), "k", "s"); err != nil {
		t.Errorf("60-character cluster refused: %v", err)
	}
	if err := c.Remove("../x"); err == nil {
		t.Error("Remove(../x) accepted")
	}
}

// syncBuffer is a log the server's goroutines can write to while a test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// getErr is the error of a whole GET: a GET's error, unlike a HEAD's, has a body that
// names it.
func getErr(mc *minio.Client, bucket, key string) error {
	obj, err := mc.GetObject(context.Background(), bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return err
	}
	defer obj.Close()
	_, err = io.ReadAll(obj)
	return err
}

func assertNoTemporaries(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
}

// The operator's switch and the key: off serves nothing and says so; on needs a key and
// gives each cluster an Access its handler accepts.
func TestOnOffAndAccess(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		newErr  string
		on      bool
		handler string // error HandlerFor gives, "" for none
	}{
		{"on", Config{Key: testKey}, "", true, ""},
		{"on without a key", Config{Key: []byte{}}, "a key of at least 32 bytes is needed", false, ""},
		{"off", Config{Key: testKey, Off: true}, "", false, "the cache is off on this host"},
		{"off needs no key", Config{Key: []byte{}, Off: true}, "", false, "the cache is off on this host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Dir = t.TempDir()
			c, err := New(tt.cfg)
			if tt.newErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.newErr) {
					t.Fatalf("New: %v, want an error saying %q", err, tt.newErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.On() != tt.on {
				t.Errorf("On() = %v, want %v", c.On(), tt.on)
			}
			a, ok := c.Access("ci", "uid", "10.250.1.1:5001")
			if ok != tt.on {
				t.Fatalf("Access ok = %v, want %v", ok, tt.on)
			}
			h, err := c.HandlerFor("ci", "uid")
			if tt.handler != "" {
				if err == nil || !strings.Contains(err.Error(), tt.handler) {
					t.Fatalf("HandlerFor: %v, want an error saying %q", err, tt.handler)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if a.Endpoint != "10.250.1.1:5001" || a.Bucket != Bucket("ci") {
				t.Errorf("Access = %+v, want the endpoint given and bucket %s", a, Bucket("ci"))
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			ctx := context.Background()
			mc := client(t, strings.TrimPrefix(srv.URL, "http://"), a.AccessKey, a.SecretKey)
			if _, err := mc.PutObject(ctx, a.Bucket, "k", bytes.NewReader([]byte("v")), 1, minio.PutObjectOptions{}); err != nil {
				t.Errorf("a PUT with the cluster's Access: %v", err)
			}
			// Another incarnation of the cluster (deleted, made again) is refused.
			b, _ := c.Access("ci", "uid-2", "")
			if _, err := client(t, strings.TrimPrefix(srv.URL, "http://"), b.AccessKey, b.SecretKey).StatObject(ctx, a.Bucket, "k", minio.StatObjectOptions{}); err == nil {
				t.Error("a later cluster of the same name read the object with its own Access")
			}
		})
	}
}
