package registry

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// waitFills waits until no blob is being fetched (a fill commits after its last byte
// reached the node).
func waitFills(t *testing.T, s *Server) {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.fillMu.Lock()
		n := len(s.fills)
		s.fillMu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d fills still running", n)
		}
	}
}

// age makes everything in the store look last used and written an hour ago.
func age(t *testing.T, dir string) {
	old := time.Now().Add(-time.Hour)
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			os.Chtimes(p, old, old)
		}
		return nil
	})
}

// GC keeps the budget by removing the least recently used pulled images, never a
// pushed one nor one a node used within GCGrace, and then every blob nothing
// references.
func TestGCKeepsTheBudget(t *testing.T) {
	u := newUpstream(t)
	one, _ := u.publish(t, "team/one", "1", "one")
	two, _ := u.publish(t, "team/two", "1", "two")
	s, _ := u.cache(t, nil)
	node := httptest.NewServer(s.NodeHandlerFor("a"))
	t.Cleanup(node.Close)
	host := httptestServer(t, s)
	pull := func(repo string, img testImage) {
		do(t, node, "GET", "/v2/"+repo+"/manifests/1?ns=upstream.test", nil).expect(t, "manifest", http.StatusOK)
		for _, b := range [][]byte{img.config, img.layer} {
			do(t, node, "GET", "/v2/"+repo+"/blobs/"+sha(b)+"?ns=upstream.test", nil).expect(t, "blob", http.StatusOK)
		}
	}
	pull("team/one", one)
	pull("team/two", two)
	mine := makeImage(t, host, "localhost:5000/mine", "pushed", false)
	pushManifest(t, host, "localhost:5000/mine", "1", mine.manifest, mine.mediaType)
	waitFills(t, s)
	age(t, s.Dir)
	// team/two was used just now: within the grace.
	pull("team/two", two)

	res, err := s.GC(1, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.RemovedRepos) != 1 || res.RemovedRepos[0] != "upstream.test/team/one" || res.KeptOverBudgetWhy == "" {
		t.Fatalf("dry run: %+v; want only team/one removed (team/two in use, mine pushed) and the budget missed, saying why", res)
	}
	if _, err := s.st.statBlob(sha(one.layer)); err != nil {
		t.Fatal("a dry run removed a blob")
	}
	res, err = s.GC(1, false)
	if err != nil {
		t.Fatal(err)
	}
	if res.RemovedBlobs != 3 || res.After >= res.Before {
		t.Errorf("GC: %+v; want team/one's manifest, config and layer removed", res)
	}
	for _, b := range [][]byte{one.layer, one.config, one.manifest} {
		if _, err := s.st.statBlob(sha(b)); err == nil {
			t.Errorf("blob %s of the removed image is still there", sha(b))
		}
	}
	for _, b := range [][]byte{two.layer, mine.layer} {
		if _, err := s.st.statBlob(sha(b)); err != nil {
			t.Errorf("blob %s of a kept image is gone", sha(b))
		}
	}
	do(t, host, "GET", "/v2/localhost:5000/mine/manifests/1", nil).expect(t, "the pushed image after GC", http.StatusOK)
	// The removed image is pulled again on demand.
	pull("team/one", one)

	// No budget: only what nothing references goes.
	res, err = s.GC(0, false)
	if err != nil || len(res.RemovedRepos) != 0 {
		t.Errorf("GC(0): %+v %v; want no repository removed", res, err)
	}
}
