package buildcache

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/rclone/gofakes3"

	"github.com/socialweb-computer/socialweb/internal/atomicfile"
)

// touchEvery is how often a GET writes an object's used time to its sidecar: the LRU
// order in memory is exact, what a restart finds is at most this old.
const touchEvery = time.Minute

// sidecarExt ends a sidecar's name; a data file's name is the bare hex.
const sidecarExt = ".json"

// tempPrefix starts an upload's temporary file. Every name starting with '.' is a
// temporary (atomicfile's too) and is cleared when the directory is read.
const tempPrefix = ".upload-"

// bucket is one cluster's objects: files in dir, and an index of them in memory.
type bucket struct {
	cluster    string
	bucketName string // Bucket(cluster)
	dir        string
	created    time.Time
	cache      *Cache

	mu       sync.Mutex
	closed   bool // removed: every operation is NoSuchBucket
	objects  map[string]*entry
	bytes    int64 // sum of objects' sizes
	inflight int64 // bytes reserved by uploads not yet in objects
}

// entry is an object in the index; its metadata stays in the sidecar.
type entry struct {
	key      string
	size     int64
	md5      []byte
	modified time.Time
	used     time.Time
	saved    time.Time // the used time the sidecar has
}

// sidecar is an object's description on disk.
type sidecar struct {
	Key      string            `json:"key"`
	Size     int64             `json:"size"`
	MD5      string            `json:"md5"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Modified time.Time         `json:"modified"`
	Used     time.Time         `json:"used"`
}

// fileName is key's name on disk: a key is never a path.
func fileName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

func (b *bucket) dataPath(key string) string { return filepath.Join(b.dir, fileName(key)) }
func (b *bucket) sidecarPath(key string) string {
	return filepath.Join(b.dir, fileName(key)+sidecarExt)
}

// openBucket reads dir (making it if missing) into an index, deleting what an
// interrupted upload, eviction or removal left: temporaries, data without a sidecar,
// and sidecars whose data is missing or the wrong size.
func openBucket(c *Cache, cluster, dir string) (*bucket, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("build cache %s: %w", cluster, err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("build cache %s: %w", cluster, err)
	}
	b := &bucket{cluster: cluster, bucketName: Bucket(cluster), dir: dir, created: c.now(), cache: c, objects: map[string]*entry{}}
	data := map[string]bool{} // data files, true once a sidecar claims one
	var sidecars []string
	for _, e := range ents {
		n := e.Name()
		switch {
		case !e.Type().IsRegular():
			// Not ours; left alone.
		case strings.HasPrefix(n, "."):
			b.removeFile(n)
		case strings.HasSuffix(n, sidecarExt):
			sidecars = append(sidecars, n)
		default:
			data[n] = false
		}
	}
	for _, n := range sidecars {
		hash := strings.TrimSuffix(n, sidecarExt)
		sc, err := readSidecar(filepath.Join(dir, n))
		if err == nil && fileName(sc.Key) != hash {
			err = errors.New("its key is not its name")
		}
		var sum []byte
		if err == nil {
			sum, err = hex.DecodeString(sc.MD5)
			if err == nil && len(sum) != md5.Size {
				err = errors.New("bad md5")
			}
		}
		if err == nil {
			_, claimed := data[hash]
			st, serr := os.Stat(filepath.Join(dir, hash))
			switch {
			case !claimed || serr != nil:
				err = errors.New("no data")
			case st.Size() != sc.Size:
				err = fmt.Errorf("data is %d bytes, not %d", st.Size(), sc.Size)
			}
		}
		if err != nil {
			c.log.Warn("build cache: dropping a broken object", "cluster", cluster, "file", n, "err", err)
			b.removeFile(n)
			continue
		}
		data[hash] = true
		b.objects[sc.Key] = &entry{key: sc.Key, size: sc.Size, md5: sum, modified: sc.Modified, used: sc.Used, saved: sc.Used}
		b.bytes += sc.Size
	}
	for n, claimed := range data {
		if !claimed {
			b.removeFile(n)
		}
	}
	return b, nil
}

func readSidecar(path string) (sidecar, error) {
	var sc sidecar
	raw, err := os.ReadFile(path)
	if err != nil {
		return sc, err
	}
	if err := json.Unmarshal(raw, &sc); err != nil {
		return sc, fmt.Errorf("%s: %w", path, err)
	}
	return sc, nil
}

func writeSidecar(path string, sc sidecar) error {
	raw, err := json.Marshal(sc)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, raw, 0o600)
}

// removeFile deletes name from the bucket's directory; one already gone is fine.
func (b *bucket) removeFile(name string) {
	if err := os.Remove(filepath.Join(b.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		b.cache.log.Warn("build cache: removing a file", "cluster", b.cluster, "file", name, "err", err)
	}
}

func (b *bucket) usage() (int64, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.bytes, len(b.objects)
}

// close makes every later operation NoSuchBucket; an upload in flight is discarded.
func (b *bucket) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.objects = map[string]*entry{}
	b.bytes = 0
}

// reserve holds n bytes of the budget for an upload in flight.
func (b *bucket) reserve(n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inflight+n > b.cache.budget {
		return gofakes3.ErrorMessage(gofakes3.ErrSlowDown, "uploads in flight to this build cache already fill its budget; retry later")
	}
	b.inflight += n
	return nil
}

func (b *bucket) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inflight -= n
}

// quotaWriter reserves budget as an upload of unknown size arrives.
type quotaWriter struct {
	w        io.Writer
	b        *bucket
	reserved *int64
}

func (q *quotaWriter) Write(p []byte) (int, error) {
	if *q.reserved+int64(len(p)) > q.b.cache.budget {
		return 0, tooLarge(q.b.cache.budget)
	}
	if err := q.b.reserve(int64(len(p))); err != nil {
		return 0, err
	}
	*q.reserved += int64(len(p))
	return q.w.Write(p)
}

// errWriter remembers its writer's error, to tell the disk failing from the client.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil {
		e.err = err
	}
	return n, err
}

func tooLarge(budget int64) error {
	return gofakes3.ErrorMessagef(gofakes3.ErrEntityTooLarge, "the object is larger than this build cache's whole budget of %d bytes", budget)
}

// s3Error returns the S3 error in err's chain as itself: gofakes3 recognises its errors
// by type, not through wrapping, and answers anything else as InternalError.
func s3Error(err error) (error, bool) {
	var e gofakes3.Error
	if errors.As(err, &e) {
		return e, true
	}
	return err, false
}

// put stores r as key, then evicts down to the budget. size is -1 when unknown.
func (b *bucket) put(ctx context.Context, key string, meta map[string]string, r io.Reader, size int64) ([]byte, error) {
	budget := b.cache.budget
	if size > budget {
		return nil, tooLarge(budget)
	}
	// A sidecar in JSON could not give back a key that is not UTF-8.
	if !utf8.ValidString(key) {
		return nil, gofakes3.ErrorInvalidArgument("key", key, "An object key must be UTF-8.")
	}
	var reserved int64
	defer func() { b.release(reserved) }()
	if size >= 0 {
		if err := b.reserve(size); err != nil {
			return nil, err
		}
		reserved = size
	}

	tmp, err := os.CreateTemp(b.dir, tempPrefix+"*")
	if err != nil {
		return nil, fmt.Errorf("build cache %s: starting an upload: %w", b.cluster, err)
	}
	tmpGone := false // renamed into place, or removed
	defer func() {
		if !tmpGone {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := md5.New()
	disk := &errWriter{w: tmp}
	var w io.Writer = io.MultiWriter(disk, h)
	src := r
	if size >= 0 {
		// One byte more than announced is read to see the body end where it said, and
		// so that gofakes3's digest checks, which run at EOF, run.
		src = io.LimitReader(r, size+1)
	} else {
		w = &quotaWriter{w: w, b: b, reserved: &reserved}
	}
	n, err := io.Copy(w, src)
	if err != nil {
		if e, ok := s3Error(err); ok {
			return nil, e
		}
		if disk.err != nil {
			return nil, fmt.Errorf("build cache %s: uploading %q: %w", b.cluster, key, err)
		}
		// The client stopped sending: its doing, not an error of the host's.
		tmp.Close()
		os.Remove(tmp.Name())
		tmpGone = true
		b.cache.log.Debug("build cache: upload cut short", "cluster", b.cluster, "key", key, "err", err)
		return nil, gofakes3.ErrIncompleteBody
	}
	if size >= 0 && n != size {
		return nil, gofakes3.ErrIncompleteBody
	}
	if err := tmp.Sync(); err != nil {
		return nil, fmt.Errorf("build cache %s: uploading %q: %w", b.cluster, key, err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("build cache %s: uploading %q: %w", b.cluster, key, err)
	}
	sum := h.Sum(nil)
	now := b.cache.now()

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, gofakes3.BucketNotFound(b.bucketName)
	}
	// Whatever happens below changed the bucket, even a failure (the old object goes).
	defer func() { b.cache.metrics.usage(b.cluster, b.bytes, len(b.objects)) }()
	old := b.objects[key]
	var oldETag string
	if old != nil {
		oldETag = hex.EncodeToString(old.md5)
	}
	if err := gofakes3.CheckWriteConditions(ctx, old != nil, oldETag); err != nil {
		return nil, err
	}
	if old != nil {
		// The object is gone until the new sidecar is in place: old sidecar and new
		// data must never meet, even after a crash.
		b.dropLocked(old)
	}
	if err := os.Rename(tmp.Name(), b.dataPath(key)); err != nil {
		return nil, fmt.Errorf("build cache %s: storing %q: %w", b.cluster, key, err)
	}
	tmpGone = true
	sc := sidecar{Key: key, Size: n, MD5: hex.EncodeToString(sum), Metadata: meta, Modified: now, Used: now}
	if err := writeSidecar(b.sidecarPath(key), sc); err != nil {
		b.removeFile(fileName(key))
		return nil, fmt.Errorf("build cache %s: storing %q: %w", b.cluster, key, err)
	}
	b.objects[key] = &entry{key: key, size: n, md5: sum, modified: now, used: now, saved: now}
	b.bytes += n
	b.inflight -= reserved
	reserved = 0
	b.evictLocked(key)
	return sum, nil
}

// evictLocked deletes the least recently used objects but keep until the bucket is
// within its budget and object limit.
func (b *bucket) evictLocked(keep string) {
	budget, limit := b.cache.budget, b.cache.maxObjects
	fits := func() bool { return b.bytes <= budget && len(b.objects) <= limit }
	if fits() {
		return
	}
	lru := make([]*entry, 0, len(b.objects))
	for _, e := range b.objects {
		if e.key != keep {
			lru = append(lru, e)
		}
	}
	slices.SortFunc(lru, func(x, y *entry) int {
		if c := x.used.Compare(y.used); c != 0 {
			return c
		}
		return strings.Compare(x.key, y.key)
	})
	for _, e := range lru {
		if fits() {
			break
		}
		b.dropLocked(e)
		b.cache.metrics.evicted(b.cluster)
		b.cache.log.Debug("build cache: evicted", "cluster", b.cluster, "key", e.key, "size", e.size, "used", e.used)
	}
}

// dropLocked deletes e, sidecar first: data without a sidecar is no object, and is
// cleared when the directory is next read if its own removal fails.
func (b *bucket) dropLocked(e *entry) {
	b.removeFile(fileName(e.key) + sidecarExt)
	b.removeFile(fileName(e.key))
	delete(b.objects, e.key)
	b.bytes -= e.size
}

// get returns key, with its data open from rng's start when withData (nil: a HEAD,
// whose contents are empty). A touch marks it used.
func (b *bucket) get(key string, rangeReq *gofakes3.ObjectRangeRequest, withData, touch bool) (*gofakes3.Object, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, gofakes3.BucketNotFound(b.bucketName)
	}
	e := b.objects[key]
	if e == nil {
		return nil, gofakes3.KeyNotFound(key)
	}
	rng, err := rangeReq.Range(e.size)
	if err != nil {
		return nil, err
	}
	sc, err := readSidecar(b.sidecarPath(key))
	if err != nil {
		return nil, fmt.Errorf("build cache %s: reading %q: %w", b.cluster, key, err)
	}
	obj := &gofakes3.Object{
		Name:     key,
		Metadata: sc.Metadata,
		Size:     e.size,
		Hash:     e.md5,
		Range:    rng,
		Contents: io.NopCloser(bytes.NewReader(nil)),
	}
	if withData {
		// Opened under the lock, so the file is the one the entry describes; a later
		// overwrite or eviction replaces or unlinks the name, not this open file.
		f, err := os.Open(b.dataPath(key))
		if err != nil {
			return nil, fmt.Errorf("build cache %s: reading %q: %w", b.cluster, key, err)
		}
		var rd io.Reader = f
		if rng != nil {
			if _, err := f.Seek(rng.Start, io.SeekStart); err != nil {
				f.Close()
				return nil, fmt.Errorf("build cache %s: reading %q: %w", b.cluster, key, err)
			}
			rd = io.LimitReader(f, rng.Length)
		}
		obj.Contents = struct {
			io.Reader
			io.Closer
		}{rd, f}
	}
	if touch {
		now := b.cache.now()
		e.used = now
		if now.Sub(e.saved) >= touchEvery {
			sc.Used = now
			if err := writeSidecar(b.sidecarPath(key), sc); err != nil {
				b.cache.log.Warn("build cache: saving an object's use", "cluster", b.cluster, "key", key, "err", err)
			} else {
				e.saved = now
			}
		}
	}
	return obj, nil
}

func (b *bucket) delete(key string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return gofakes3.BucketNotFound(b.bucketName)
	}
	if e := b.objects[key]; e != nil {
		b.dropLocked(e)
		b.cache.metrics.usage(b.cluster, b.bytes, len(b.objects))
	}
	return nil
}

// list answers a ListObjects page: keys after the marker, in order, matching prefix,
// those past its delimiter rolled up into common prefixes.
func (b *bucket) list(prefix *gofakes3.Prefix, page gofakes3.ListBucketPage) (*gofakes3.ObjectList, error) {
	var p gofakes3.Prefix
	if prefix != nil {
		p = *prefix
	}
	// An empty delimiter, which minio-go sends for a recursive listing, is none; to
	// Prefix.Match it would split keys into characters.
	if p.Delimiter == "" {
		p.HasDelimiter = false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, gofakes3.BucketNotFound(b.bucketName)
	}
	keys := make([]string, 0, len(b.objects))
	for k := range b.objects {
		keys = append(keys, k)
	}
	slices.Sort(keys)

	out := gofakes3.NewObjectList()
	var match gofakes3.PrefixMatch
	var count int64
	lastPrefix := ""
	for _, k := range keys {
		if page.Marker != "" && k <= page.Marker {
			continue
		}
		if !p.Match(k, &match) {
			continue
		}
		if match.CommonPrefix {
			// A page that ended on a common prefix has it as its marker; the keys
			// under it were rolled up into it already.
			if match.MatchedPart == lastPrefix || (page.Marker != "" && match.MatchedPart <= page.Marker) {
				continue
			}
		}
		if page.MaxKeys > 0 && count == page.MaxKeys {
			out.IsTruncated = true
			break
		}
		if match.CommonPrefix {
			out.AddPrefix(match.MatchedPart)
			lastPrefix = match.MatchedPart
			out.NextMarker = match.MatchedPart
		} else {
			e := b.objects[k]
			out.Add(&gofakes3.Content{
				Key:          k,
				LastModified: gofakes3.NewContentTime(e.modified),
				ETag:         `"` + hex.EncodeToString(e.md5) + `"`,
				Size:         e.size,
			})
			out.NextMarker = k
		}
		count++
	}
	if !out.IsTruncated {
		out.NextMarker = ""
	}
	return out, nil
}
