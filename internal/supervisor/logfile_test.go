package supervisor

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// logFiles maps each file of a log (LOG, LOG.1, ...) in dir to its contents.
func logFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		got[e.Name()] = string(b)
	}
	return got
}

func TestLogFileRotation(t *testing.T) {
	for _, tc := range []struct {
		name     string
		rot      LogRotation
		existing map[string]string // files there before
		writes   []string
		want     map[string]string
	}{
		{"never rotates at max size 0", LogRotation{MaxSize: 0, Keep: 3},
			nil, []string{"aaaa", "bbbb", "cccc"}, map[string]string{"log": "aaaabbbbcccc"}},
		{"up to max size in one file", LogRotation{MaxSize: 8, Keep: 3},
			nil, []string{"aaaa", "bbbb"}, map[string]string{"log": "aaaabbbb"}},
		{"a write past max size begins a new file", LogRotation{MaxSize: 10, Keep: 3},
			nil, []string{"aaaa", "bbbb", "cccc"}, map[string]string{"log": "cccc", "log.1": "aaaabbbb"}},
		{"old files shift, the oldest past keep is dropped", LogRotation{MaxSize: 4, Keep: 2},
			nil, []string{"aaaa", "bbbb", "cccc", "dddd", "eeee"}, map[string]string{"log": "eeee", "log.1": "dddd", "log.2": "cccc"}},
		{"keep 1", LogRotation{MaxSize: 4, Keep: 1},
			nil, []string{"aaaa", "bbbb", "cccc"}, map[string]string{"log": "cccc", "log.1": "bbbb"}},
		{"keep 0 keeps no old file", LogRotation{MaxSize: 4, Keep: 0},
			nil, []string{"aaaa", "bbbb", "cccc"}, map[string]string{"log": "cccc"}},
		{"a write is cut after its last line that fits", LogRotation{MaxSize: 10, Keep: 3},
			nil, []string{"a1\na2\n", "a3\na4\na5\na6\n"}, map[string]string{"log": "a4\na5\na6\n", "log.1": "a1\na2\na3\n"}},
		{"a write of many lines fills file after file", LogRotation{MaxSize: 7, Keep: 3},
			nil, []string{"a1\na2\na3\na4\na5\na6\na7\n"}, map[string]string{"log": "a7\n", "log.1": "a5\na6\n", "log.2": "a3\na4\n", "log.3": "a1\na2\n"}},
		{"a line longer than max size is cut at it", LogRotation{MaxSize: 4, Keep: 2},
			nil, []string{"aa", "bbbbbbbbbb", "cc"}, map[string]string{"log": "bbcc", "log.1": "bbbb", "log.2": "bbbb"}},
		{"reopening appends and counts what is there", LogRotation{MaxSize: 10, Keep: 2},
			map[string]string{"log": "old:aaaa", "log.1": "older"}, []string{"bb", "cc"},
			map[string]string{"log": "cc", "log.1": "old:aaaabb", "log.2": "older"}},
		{"files an earlier larger keep left are removed", LogRotation{MaxSize: 4, Keep: 1},
			map[string]string{"log.1": "1", "log.2": "2", "log.7": "7", "log.x": "not ours", "other.1": "not ours"}, []string{"aaaa", "bbbb"},
			map[string]string{"log": "bbbb", "log.1": "aaaa", "log.x": "not ours", "other.1": "not ours"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, s := range tc.existing {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			w, err := openLogFile(filepath.Join(dir, "log"), tc.rot, quietLog())
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range tc.writes {
				if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", s, n, err)
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if got := logFiles(t, dir); !mapsEqual(got, tc.want) {
				t.Errorf("files = %q, want %q", got, tc.want)
			}
			st, err := os.Stat(filepath.Join(dir, "log"))
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o600 {
				t.Errorf("log mode %v, want 0600", st.Mode().Perm())
			}
		})
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// A failed rotation loses no output and does not fail the write (which would
// stop exec's copy and kill the child with SIGPIPE): the file grows on.
func TestLogFileRotationFailureKeepsWriting(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "log")
	w, err := openLogFile(path, LogRotation{MaxSize: 4, Keep: 1}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// A directory where log.1 would go: the rename fails.
	if err := os.Mkdir(path+".1", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path+".1", "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"aaaa", "bbbb", "cccc"} {
		if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "aaaabbbbcccc" {
		t.Errorf("log = %q, want every write", b)
	}
}

func TestLogRotationValidate(t *testing.T) {
	for _, tc := range []struct {
		rot     LogRotation
		wantErr string
	}{
		{LogRotation{}, ""},
		{LogRotation{MaxSize: 50 << 20, Keep: 3}, ""},
		{LogRotation{MaxSize: 1, Keep: MaxLogKeep}, ""},
		{LogRotation{MaxSize: -1, Keep: 3}, "max size -1: want 0 (never rotate) or more"},
		{LogRotation{Keep: -1}, "keep -1: want 0-100"},
		{LogRotation{Keep: 101}, "keep 101: want 0-100"},
	} {
		err := tc.rot.Validate()
		if (err == nil) != (tc.wantErr == "") || err != nil && err.Error() != tc.wantErr {
			t.Errorf("%+v.Validate() = %v, want %q", tc.rot, err, tc.wantErr)
		}
	}
}

// A supervised process's output goes through the pipe into rotated files, all of
// it, up to the last line it printed before it exited; its next run (and a
// daemon restart) appends to the same log.
func TestSupervisedOutputRotated(t *testing.T) {
	sp := spec(t, "chatty", "-c", `i=1; while [ $i -le 300 ]; do echo "line $i"; i=$((i+1)); done; echo "to stderr" >&2`)
	for run := 1; run <= 2; run++ {
		s := New(quietLog(), Backoff{Initial: time.Hour, Max: time.Hour, Reset: time.Hour}, nil)
		s.SetLogRotation(LogRotation{MaxSize: 1000, Keep: MaxLogKeep})
		s.Start(sp)
		waitFor(t, "the run to exit", func() bool { st, _ := s.State("chatty"); return st.Restarts >= 1 })
		s.Stop("chatty", time.Second)
	}
	files := logFiles(t, filepath.Dir(sp.LogPath))
	var names []string
	for name := range files {
		if strings.HasPrefix(name, "chatty.log") {
			names = append(names, name)
		}
	}
	if len(names) < 5 {
		t.Fatalf("log files %v: want rotation (about 7 KB at 1000 bytes a file)", names)
	}
	// Oldest first: LOG.N ... LOG.1, LOG.
	var all strings.Builder
	for i := len(names) - 1; i >= 1; i-- {
		all.WriteString(files[fmt.Sprintf("%s.%d", filepath.Base(sp.LogPath), i)])
	}
	all.WriteString(files[filepath.Base(sp.LogPath)])
	var want strings.Builder
	for range 2 {
		for i := 1; i <= 300; i++ {
			fmt.Fprintf(&want, "line %d\n", i)
		}
		want.WriteString("to stderr\n")
	}
	if all.String() != want.String() {
		t.Errorf("the logs hold, oldest first:\n%s\nwant both runs' every line", all.String())
	}
	for name, s := range files {
		if strings.HasPrefix(name, "chatty.log") && len(s) > 1000 {
			t.Errorf("%s holds %d bytes, past max size 1000", name, len(s))
		}
	}
}
