// Package buildcache is the host's build cache: an S3-compatible endpoint, the one GitLab
// Runner's `[runners.cache]` Type "s3" talks to, with one bucket per tenant cluster kept
// on the host's disk under a size budget, least recently used objects evicted first.
//
// The S3 protocol (routing, XML, errors, ranges, conditional requests, and AWS Signature
// V4 by header and by presigned URL) is github.com/rclone/gofakes3, which rclone
// maintains for `rclone serve s3`. It ships only an in-memory store, so this package is
// a gofakes3.Backend over a directory. Weighed and not chosen: versitygw, a whole
// gateway with its own IAM to run and configure, far more than one bucket and one key
// per cluster; MinIO, AGPL; johannesboyne/gofakes3, the original, which has no auth.
//
// Isolation is by construction, not by policy: each cluster gets its own handler
// (Handler), which knows one access key and one bucket, named after the cluster
// (Bucket: "sw-<cluster>", since S3 clients refuse bucket names shorter than 3
// characters and a cluster may be called "ci"). A
// request signed with another cluster's key is refused before it reaches storage, and
// another bucket name is NoSuchBucket: there is nothing else to reach. Object keys never
// become paths: a key is stored as the hex SHA-256 of the key, so "../x" is a file name
// like any other inside the cluster's directory.
//
// On disk, <Dir>/<cluster>/ holds per object a data file <sha256(key)> and a sidecar
// <sha256(key)>.json ({key, size, md5, metadata, modified, used}). Uploads go to a
// temporary file, are synced, and renamed into place; the sidecar is written last and is
// what makes an object exist, so a crash leaves a whole object or none (what it leaves
// half done is cleared when the directory is next read).
//
// The budget (Config.Budget, bytes per cluster) is kept by evicting after each upload:
// while the cluster's objects sum to more than the budget, or number more than
// Config.MaxObjects, the least recently used go; a GET counts as a use. An object larger
// than the whole budget is refused (EntityTooLarge) before it is stored, and uploads in
// flight together may not exceed the budget either (SlowDown), so a cluster uses at most
// twice its budget on disk at any moment.
//
// Multipart uploads are refused (NotImplemented): gofakes3 would buffer their parts in
// memory, outside any budget, and GitLab Runner does not use them; it uploads a cache
// archive with one presigned PUT. Versioning and tagging are not supported either.
package buildcache

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rclone/gofakes3"
)

const (
	// DefaultBudget is a cluster's cache size when Config.Budget is 0.
	DefaultBudget int64 = 5 << 30
	// DefaultMaxObjects is a cluster's object count limit when Config.MaxObjects is 0.
	// Empty objects cost no budget but do cost an inode, a sidecar and a line of the
	// in-memory index each; a cache of archives needs far fewer.
	DefaultMaxObjects = 10000
)

// removedPrefix names a removed cluster's directory while it is being deleted; no
// cluster name starts with '.', so it cannot meet one.
const removedPrefix = ".removed-"

// Config configures a Cache.
type Config struct {
	// Dir holds one directory per cluster, e.g. <state>/buildcache. It is created
	// (0700) if missing. One Cache per Dir: two would not see each other's index.
	Dir string
	// Budget is the most bytes of objects a cluster keeps; 0 is DefaultBudget.
	Budget int64
	// MaxObjects is the most objects a cluster keeps; 0 is DefaultMaxObjects.
	MaxObjects int
	// Now is the clock for objects' modified and used times; nil is time.Now. Request
	// signatures are checked against the real clock whatever this is.
	Now func() time.Time
	// Logger, nil for none.
	Logger *slog.Logger
	// Metrics registers the cache's metrics, if not nil.
	Metrics prometheus.Registerer
	// Key is the host's key each cluster's credentials derive from (LoadOrCreateKey);
	// Access and HandlerFor need it.
	Key []byte
	// Off serves no cluster (the operator turned the cache off): Access says so and
	// HandlerFor refuses, while Remove still deletes what an earlier run kept.
	Off bool
}

// Cache is the build cache of every cluster on the host.
type Cache struct {
	dir        string
	budget     int64
	maxObjects int
	now        func() time.Time
	log        *slog.Logger
	metrics    *metrics
	key        []byte
	off        bool

	mu      sync.Mutex
	buckets map[string]*bucket // by cluster, once opened
}

// New opens the cache in cfg.Dir. Clusters' directories are read when first used.
func New(cfg Config) (*Cache, error) {
	if cfg.Dir == "" {
		return nil, errors.New("build cache: no directory")
	}
	if cfg.Budget < 0 {
		return nil, fmt.Errorf("build cache: budget %d is negative", cfg.Budget)
	}
	if cfg.MaxObjects < 0 {
		return nil, fmt.Errorf("build cache: object limit %d is negative", cfg.MaxObjects)
	}
	c := &Cache{
		dir:        cfg.Dir,
		budget:     cfg.Budget,
		maxObjects: cfg.MaxObjects,
		now:        cfg.Now,
		log:        cfg.Logger,
		key:        cfg.Key,
		off:        cfg.Off,
		buckets:    map[string]*bucket{},
	}
	if !c.off && len(c.key) < KeySize {
		return nil, fmt.Errorf("build cache: a key of at least %d bytes is needed (LoadOrCreateKey), got %d", KeySize, len(c.key))
	}
	if c.budget == 0 {
		c.budget = DefaultBudget
	}
	if c.maxObjects == 0 {
		c.maxObjects = DefaultMaxObjects
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("build cache: %w", err)
	}
	c.metrics = m
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return nil, fmt.Errorf("build cache: %w", err)
	}
	// A Remove interrupted by a crash left its renamed directory behind.
	left, err := filepath.Glob(filepath.Join(c.dir, removedPrefix+"*"))
	if err != nil {
		return nil, fmt.Errorf("build cache: %w", err)
	}
	for _, dir := range left {
		if err := os.RemoveAll(dir); err != nil {
			c.log.Warn("build cache: removing a removed cluster's leftovers", "dir", dir, "err", err)
		}
	}
	return c, nil
}

// clusterRE is a DNS label short enough that Bucket's name stays within S3's 63
// characters: nothing in it can name a parent or another directory.
var clusterRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,58}[a-z0-9])?$`)

func validCluster(cluster string) error {
	if !clusterRE.MatchString(cluster) {
		return fmt.Errorf("build cache: %q is not a cluster name (1 to 60 lower-case letters, digits and '-', starting and ending with a letter or digit)", cluster)
	}
	return nil
}

// Bucket is the name of cluster's bucket, the only one its handler serves: what a
// runner's `[runners.cache.s3] BucketName` must be.
func Bucket(cluster string) string { return "sw-" + cluster }

// Handler serves cluster's cache over S3: one bucket, Bucket(cluster), made on first
// use, reached only with requests signed by accessKey and secret (see Credentials), at
// path-style URLs /<bucket>/<key>. Every cluster needs its own
// handler; one made before Remove(cluster) answers NoSuchBucket ever after.
func (c *Cache) Handler(cluster, accessKey, secret string) (http.Handler, error) {
	if err := validCluster(cluster); err != nil {
		return nil, err
	}
	// gofakes3 lets every request in when it has no key at all.
	if accessKey == "" || secret == "" {
		return nil, fmt.Errorf("build cache %s: an access key and a secret are required", cluster)
	}
	b, err := c.open(cluster, true)
	if err != nil {
		return nil, err
	}
	// Auto-bucket stays at its default, off: gofakes3.WithAutoBucket turns it on
	// whatever its argument.
	s3 := gofakes3.New(&backend{b: b},
		gofakes3.WithV4Auth(map[string]string{accessKey: secret}),
		gofakes3.WithHostBucket(false),
		gofakes3.WithLogger(s3Log{c.log.With("cluster", cluster)}),
	)
	srv := s3.Server()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.metrics.request(cluster, r.Method)
		// The only POST served is a multi-object delete, whose XML gofakes3 limits to
		// MaxXMLBodySize; a browser-form upload would otherwise spool up to 5 GB to
		// the host's temporary directory, outside the budget, before it is refused.
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, gofakes3.MaxXMLBodySize)
		}
		srv.ServeHTTP(w, r)
	}), nil
}

// Access is what a GitLab Runner's [runners.cache.s3] needs to use one cluster's cache.
type Access struct {
	// Endpoint is host:port, plain HTTP, where the cluster's job Pods reach the cache
	// (ServerAddress: the runner presigns URLs there and the job's helper uses them).
	Endpoint  string
	Bucket    string
	AccessKey string
	SecretKey string
}

// On says whether the cache serves clusters.
func (c *Cache) On() bool { return !c.off }

// Access is cluster's (incarnation uid) access at endpoint; false when the cache is off.
func (c *Cache) Access(cluster, uid, endpoint string) (Access, bool) {
	if c.off {
		return Access{}, false
	}
	ak, sk := Credentials(c.key, cluster, uid)
	return Access{Endpoint: endpoint, Bucket: Bucket(cluster), AccessKey: ak, SecretKey: sk}, true
}

// HandlerFor is Handler with cluster's own credentials (incarnation uid); an error
// when the cache is off.
func (c *Cache) HandlerFor(cluster, uid string) (http.Handler, error) {
	if c.off {
		return nil, fmt.Errorf("build cache %s: the cache is off on this host (serve --build-cache=false)", cluster)
	}
	ak, sk := Credentials(c.key, cluster, uid)
	return c.Handler(cluster, ak, sk)
}

// Usage is what cluster's cache holds: the bytes of its objects, and how many.
func (c *Cache) Usage(cluster string) (bytes int64, objects int) {
	if validCluster(cluster) != nil {
		return 0, 0
	}
	b, err := c.open(cluster, false)
	if err != nil {
		c.log.Warn("build cache: reading usage", "cluster", cluster, "err", err)
		return 0, 0
	}
	if b == nil {
		return 0, 0
	}
	return b.usage()
}

// Remove deletes cluster's cache, objects and directory, as the cluster goes. Handlers
// made for it before answer NoSuchBucket from now on.
func (c *Cache) Remove(cluster string) error {
	if err := validCluster(cluster); err != nil {
		return err
	}
	trash, err := c.detach(cluster)
	if err != nil || trash == "" {
		return err
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("build cache %s: removing: %w", cluster, err)
	}
	return nil
}

// detach forgets cluster and renames its directory out of the way, so that a new
// bucket of the same name (Handler again) starts empty while the old one is deleted.
// It returns the renamed directory, or "" if there was none.
func (c *Cache) detach(cluster string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b := c.buckets[cluster]; b != nil {
		b.close()
		delete(c.buckets, cluster)
	}
	c.metrics.forget(cluster)
	var suffix [8]byte
	_, _ = rand.Read(suffix[:])
	trash := filepath.Join(c.dir, removedPrefix+cluster+"-"+hex.EncodeToString(suffix[:]))
	if err := os.Rename(filepath.Join(c.dir, cluster), trash); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("build cache %s: removing: %w", cluster, err)
	}
	return trash, nil
}

// open returns cluster's bucket, reading its directory the first time. Without create,
// a cluster with no directory is nil.
func (c *Cache) open(cluster string, create bool) (*bucket, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b := c.buckets[cluster]; b != nil {
		return b, nil
	}
	dir := filepath.Join(c.dir, cluster)
	if !create {
		if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
	}
	b, err := openBucket(c, cluster, dir)
	if err != nil {
		return nil, err
	}
	c.buckets[cluster] = b
	bytes, objects := b.usage()
	c.metrics.usage(cluster, bytes, objects)
	return b, nil
}

// s3Log passes gofakes3's errors on; its warnings (refused signatures, which any
// client can cause at will) only at debug level, and its chatty info not at all.
type s3Log struct{ log *slog.Logger }

func (l s3Log) Print(level gofakes3.LogLevel, v ...any) {
	switch level {
	case gofakes3.LogErr:
		l.log.Error("build cache: s3: " + strings.TrimSpace(fmt.Sprintln(v...)))
	case gofakes3.LogWarn:
		l.log.Debug("build cache: s3: " + strings.TrimSpace(fmt.Sprintln(v...)))
	}
}

// The keys of Access in a Secret's data (the management API's <cluster>-build-cache,
// which `cluster runner-credential` reads).
const (
	secretEndpoint  = "endpoint"
	secretBucket    = "bucket"
	secretAccessKey = "accessKey"
	secretSecretKey = "secretKey"
)

// SecretData is a as a Secret's data.
func (a Access) SecretData() map[string][]byte {
	return map[string][]byte{
		secretEndpoint: []byte(a.Endpoint), secretBucket: []byte(a.Bucket),
		secretAccessKey: []byte(a.AccessKey), secretSecretKey: []byte(a.SecretKey),
	}
}

// AccessFromSecret reads what SecretData wrote; a key missing is an error.
func AccessFromSecret(data map[string][]byte) (Access, error) {
	a := Access{Endpoint: string(data[secretEndpoint]), Bucket: string(data[secretBucket]),
		AccessKey: string(data[secretAccessKey]), SecretKey: string(data[secretSecretKey])}
	if a.Endpoint == "" || a.Bucket == "" || a.AccessKey == "" || a.SecretKey == "" {
		return Access{}, fmt.Errorf("build cache access: want %s, %s, %s and %s, got only %d of them filled",
			secretEndpoint, secretBucket, secretAccessKey, secretSecretKey, len(slices.DeleteFunc(
				[]string{a.Endpoint, a.Bucket, a.AccessKey, a.SecretKey}, func(s string) bool { return s == "" })))
	}
	return a, nil
}
