package buildcache

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rclone/gofakes3"
)

// TestOpenClearsLeftovers reads a directory as a crash could leave it.
func TestOpenClearsLeftovers(t *testing.T) {
	dir := t.TempDir()
	c := newCache(t, Config{Dir: dir})
	b, err := c.open("ci", true)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"whole", "no-sidecar", "short", "wrong-name"} {
		if _, err := b.put(context.Background(), k, nil, strings.NewReader("data of "+k), -1); err != nil {
			t.Fatal(err)
		}
	}
	bdir := filepath.Join(dir, "ci")
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(bdir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(tempPrefix+"123", "half an upload")                                                                        // an upload cut short
	write("."+fileName("whole")+sidecarExt+".456", "{")                                                              // a sidecar cut short
	write(fileName("orphan"), "data whose sidecar never came")                                                       // crash before the sidecar
	os.Remove(filepath.Join(bdir, fileName("no-sidecar")+sidecarExt))                                                // eviction cut short
	write(fileName("short"), "d")                                                                                    // data and sidecar disagree
	os.Rename(filepath.Join(bdir, fileName("wrong-name")+sidecarExt), filepath.Join(bdir, fileName("x")+sidecarExt)) // not its key's file

	c2 := newCache(t, Config{Dir: dir})
	b2, err := c2.open("ci", false)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range b2.objects {
		keys = append(keys, k)
	}
	if !slices.Equal(keys, []string{"whole"}) {
		t.Errorf("objects %q, want whole alone", keys)
	}
	ents, _ := os.ReadDir(bdir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	want := []string{fileName("whole"), fileName("whole") + sidecarExt}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("files %q, want %q", names, want)
	}
	if n, _ := b2.usage(); n != int64(len("data of whole")) {
		t.Errorf("usage %d", n)
	}
}

func TestReserve(t *testing.T) {
	c := newCache(t, Config{Budget: 100})
	b, err := c.open("ci", true)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		reserve int64 // negative: release
		want    gofakes3.ErrorCode
	}{
		{60, gofakes3.ErrNone},
		{41, gofakes3.ErrSlowDown},
		{40, gofakes3.ErrNone},
		{-60, gofakes3.ErrNone},
		{60, gofakes3.ErrNone},
		{1, gofakes3.ErrSlowDown},
	}
	for i, s := range steps {
		if s.reserve < 0 {
			b.release(-s.reserve)
			continue
		}
		if err := b.reserve(s.reserve); !gofakes3.HasErrorCode(err, s.want) {
			t.Errorf("step %d: reserve(%d) = %v, want %q", i, s.reserve, err, s.want)
		}
	}
}

// TestTouchWrites checks that a GET saves the used time at most once a minute.
func TestTouchWrites(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	c := newCache(t, Config{Now: clk.Now})
	b, err := c.open("ci", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.put(context.Background(), "k", nil, strings.NewReader("v"), 1); err != nil {
		t.Fatal(err)
	}
	start := clk.Now()
	steps := []struct {
		after     time.Duration
		wantSaved time.Duration // since start
	}{
		{10 * time.Second, 0},
		{40 * time.Second, 0},
		{15 * time.Second, 65 * time.Second},
		{30 * time.Second, 65 * time.Second},
	}
	for i, s := range steps {
		clk.advance(s.after)
		obj, err := b.get("k", nil, true, true)
		if err != nil {
			t.Fatal(err)
		}
		obj.Contents.Close()
		sc, err := readSidecar(b.sidecarPath("k"))
		if err != nil {
			t.Fatal(err)
		}
		if got := sc.Used.Sub(start); got != s.wantSaved {
			t.Errorf("step %d: sidecar used at +%v, want +%v", i, got, s.wantSaved)
		}
		if !b.objects["k"].used.Equal(clk.Now()) {
			t.Errorf("step %d: used in memory %v, want now", i, b.objects["k"].used)
		}
	}
}
