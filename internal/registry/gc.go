package registry

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// Garbage collection: the cache is kept under a size budget by removing the
// repositories pulled through that nodes used least recently, then every blob no
// remaining manifest references. Pushed images are the operator's and are never
// removed; neither is anything a node asked for in the last GCGrace (a node may be
// pulling it now: its blobs arrive after its manifest), nor a blob written in the
// last GCGrace (a pull in another process may be about to reference it). A blob
// removed takes its charge with it (charges.go).

// GCGrace protects what was just used or written.
const GCGrace = 10 * time.Minute

// GCResult is what one collection did.
type GCResult struct {
	Before, After     int64    // bytes of blobs
	RemovedRepos      []string // canonical names, "(cluster c)" after an overlay's
	RemovedBlobs      int
	KeptOverBudgetWhy string // why the budget could not be met, if it was not
}

// markUsed records that a node was served a manifest of repo (at most once a minute).
func (s *store) markUsed(repo string) {
	p := filepath.Join(s.dir, "used", filepath.FromSlash(repo))
	if st, err := os.Stat(p); err == nil && time.Since(st.ModTime()) < time.Minute {
		return
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
		now := time.Now()
		if os.Chtimes(p, now, now) != nil {
			os.WriteFile(p, nil, 0o644)
		}
	}
}

func (s *store) lastUsed(repo string) time.Time {
	if st, err := os.Stat(filepath.Join(s.dir, "used", filepath.FromSlash(repo))); err == nil {
		return st.ModTime()
	}
	// Never served since it was stored: its tags' records say when.
	var t time.Time
	filepath.WalkDir(filepath.Join(s.dir, "upstream", filepath.FromSlash(repo), "_tags"), func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil && info.ModTime().After(t) {
				t = info.ModTime()
			}
		}
		return nil
	})
	return t
}

// pulledOnly reports whether every tag of repo came from upstream (none was pushed).
func (s *store) pulledOnly(repo string) bool {
	tags, err := s.tags(repo)
	if err != nil {
		return false
	}
	for _, tag := range tags {
		_, _, digest, err := s.getManifest(repo, tag)
		if err != nil {
			continue
		}
		if _, pulled := s.pulledTag(repo, tag, digest); !pulled {
			return false
		}
	}
	return true
}

// live is every blob some repository other than those in gone references.
func (s *store) live(repos []string, gone map[string]bool) map[string]bool {
	out := map[string]bool{}
	for _, r := range repos {
		if gone[r] {
			continue
		}
		for d := range s.repoRefs(r) {
			out[d] = true
		}
	}
	return out
}

type blobInfo struct {
	size  int64
	mtime time.Time
}

func (s *store) blobs() (map[string]blobInfo, error) {
	out := map[string]blobInfo{}
	root := filepath.Join(s.dir, "blobs", "sha256")
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() {
			out["sha256:"+e.Name()] = blobInfo{info.Size(), info.ModTime()}
		}
	}
	return out, nil
}

// GC removes least recently used pulled repositories until the blobs fit budget
// (0: remove none, only blobs nothing references), then those blobs. dryRun says what
// it would do.
func (s *Server) GC(budget int64, dryRun bool) (GCResult, error) {
	if err := s.init(); err != nil {
		return GCResult{}, err
	}
	st := s.st
	repos, err := st.catalog()
	if err != nil {
		return GCResult{}, err
	}
	blobs, err := st.blobs()
	if err != nil {
		return GCResult{}, fmt.Errorf("listing blobs: %w", err)
	}
	var res GCResult
	for _, b := range blobs {
		res.Before += b.size
	}
	now := time.Now()
	s.fillMu.Lock()
	filling := map[string]bool{}
	for d := range s.fills {
		filling[d] = true
	}
	s.fillMu.Unlock()
	// What would remain if the repositories in gone went.
	remaining := func(gone map[string]bool) (int64, map[string]bool) {
		live := st.live(repos, gone)
		var total int64
		for d, b := range blobs {
			if live[d] || filling[d] || now.Sub(b.mtime) < GCGrace {
				total += b.size
			}
		}
		return total, live
	}
	type cand struct {
		repo string
		used time.Time
	}
	var cands []cand
	for _, r := range repos {
		if !st.pulledOnly(r) {
			continue
		}
		used := st.lastUsed(r)
		if now.Sub(used) < GCGrace {
			continue
		}
		cands = append(cands, cand{r, used})
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].used.Before(cands[j].used) })
	gone := map[string]bool{}
	total, live := remaining(gone)
	for _, c := range cands {
		if budget <= 0 || total <= budget {
			break
		}
		gone[c.repo] = true
		res.RemovedRepos = append(res.RemovedRepos, displayRepo(c.repo))
		total, live = remaining(gone)
	}
	if budget > 0 && total > budget {
		res.KeptOverBudgetWhy = "what is left is pushed images, images used in the last " + GCGrace.String() + ", or blobs written in that time"
	}
	res.After = total
	if dryRun {
		for d, b := range blobs {
			if !live[d] && !filling[d] && now.Sub(b.mtime) >= GCGrace {
				res.RemovedBlobs++
			}
		}
		return res, nil
	}
	var errs []error
	charges, err := st.charges()
	if err != nil {
		errs = append(errs, err) // the space matters more; a charge left counts nothing
	}
	chargedTo := map[string][]string{}
	for cluster, ds := range charges {
		for d := range ds {
			chargedTo[d] = append(chargedTo[d], cluster)
		}
	}
	for r := range gone {
		for _, d := range []string{filepath.Join(st.dir, "repositories", filepath.FromSlash(r)), filepath.Join(st.dir, "upstream", filepath.FromSlash(r)),
			filepath.Join(st.dir, "used", filepath.FromSlash(r))} {
			if err := os.RemoveAll(d); err != nil {
				errs = append(errs, err)
			}
		}
		st.mu.Lock()
		delete(st.refs, r)
		st.mu.Unlock()
	}
	for d, b := range blobs {
		if live[d] || filling[d] || now.Sub(b.mtime) < GCGrace {
			continue
		}
		// Leaving the cache, its bytes are no longer anyone's. The charge goes first: cut
		// short here, a blob charged to nobody is better than a charge outliving it.
		for _, c := range chargedTo[d] {
			if err := os.Remove(st.chargePath(c, d)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		if err := os.Remove(st.blobPath(d)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		res.RemovedBlobs++
	}
	// Charges of blobs removed some other way, so a cluster that brings one in again
	// is the only one charged. A fresh charge may be for a blob stored since the blobs
	// were listed.
	for d, cs := range chargedTo {
		if _, ok := blobs[d]; ok {
			continue
		}
		for _, c := range cs {
			if info, err := os.Stat(st.chargePath(c, d)); err == nil && now.Sub(info.ModTime()) >= GCGrace {
				if err := os.Remove(st.chargePath(c, d)); err != nil && !errors.Is(err, fs.ErrNotExist) {
					errs = append(errs, err)
				}
			}
		}
	}
	if len(res.RemovedRepos) > 0 || res.RemovedBlobs > 0 {
		s.log.Info("registry garbage collected", "before", res.Before, "after", res.After, "budget", budget, "repositories", res.RemovedRepos, "blobs", res.RemovedBlobs)
	}
	return res, errors.Join(errs...)
}

func displayRepo(r string) string {
	if t, n, ok := splitOverlay(r); ok {
		return n + " (cluster " + t + ")"
	}
	return r
}

// Usage is the bytes each cluster brought into the store, still there: what its
// quota counts (charges.go). "" is the bytes of blobs no cluster is charged for
// (pushed host-wide, stored before charges were kept, or brought in by a cluster since
// deleted). A blob counts once.
func (s *Server) Usage() (map[string]int64, error) {
	if err := s.init(); err != nil {
		return nil, err
	}
	blobs, err := s.st.blobs()
	if err != nil {
		return nil, fmt.Errorf("listing blobs: %w", err)
	}
	charges, err := s.st.charges()
	if err != nil {
		return nil, err
	}
	out := map[string]int64{"": 0}
	charged := map[string]bool{}
	for cluster, ds := range charges {
		var n int64
		for d := range ds {
			if b, ok := blobs[d]; ok {
				n += b.size
				charged[d] = true
			}
		}
		out[cluster] = n
	}
	for d, b := range blobs {
		if !charged[d] {
			out[""] += b.size
		}
	}
	return out, nil
}

// overQuota says why cluster may not bring adding more bytes into the store (at
// least 1: a fetch of unknown size), or "".
func (s *Server) overQuota(cluster string, adding int64) string {
	if s.ClusterQuota <= 0 || cluster == "" || adding <= 0 {
		return ""
	}
	have, err := s.st.charged(cluster)
	if err != nil {
		s.log.Warn("computing what a cluster brought into the image cache; its quota is not applied", "cluster", cluster, "err", err)
		return ""
	}
	if have+adding <= s.ClusterQuota {
		return ""
	}
	what := "at or over its quota"
	if adding > 1 {
		what = fmt.Sprintf("and this image would add %d, over its quota", adding)
	}
	return fmt.Sprintf("cluster %s has brought %d bytes into the host's image cache (images fetched for its nodes, shared ones included, and pushed for it), %s of %d: "+
		"the operator can raise serve --image-cluster-quota, or evict least recently used images with `socialweb image gc --image-cache-size SIZE` (bytes stop counting when they leave the cache)",
		cluster, have, what, s.ClusterQuota)
}
