package logrotate

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func files(t *testing.T, dir string) map[string]string {
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

func TestShift(t *testing.T) {
	for _, tc := range []struct {
		name   string
		keep   int
		before map[string]string
		want   map[string]string
	}{
		{"first rotation", 3, map[string]string{"log": "a"}, map[string]string{"log.1": "a"}},
		{"shifts the kept", 3, map[string]string{"log": "c", "log.1": "b", "log.2": "a"},
			map[string]string{"log.1": "c", "log.2": "b", "log.3": "a"}},
		{"drops past keep", 2, map[string]string{"log": "c", "log.1": "b", "log.2": "a"},
			map[string]string{"log.1": "c", "log.2": "b"}},
		{"drops what a larger keep left", 1, map[string]string{"log": "c", "log.1": "b", "log.5": "x"},
			map[string]string{"log.1": "c"}},
		{"keep 0 keeps nothing", 0, map[string]string{"log": "c", "log.1": "b"}, map[string]string{}},
		{"leaves other files", 1, map[string]string{"log": "c", "logx": "y", "log.old": "z"},
			map[string]string{"log.1": "c", "logx": "y", "log.old": "z"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for n, s := range tc.before {
				if err := os.WriteFile(filepath.Join(dir, n), []byte(s), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := Shift(filepath.Join(dir, "log"), tc.keep); err != nil {
				t.Fatal(err)
			}
			if got := files(t, dir); !maps.Equal(got, tc.want) {
				t.Errorf("after Shift: %v, want %v", got, tc.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		r       Rotation
		wantErr string
	}{
		{Rotation{MaxSize: 0, Keep: 0}, ""},
		{Rotation{MaxSize: 1 << 20, Keep: MaxKeep}, ""},
		{Rotation{MaxSize: -1, Keep: 1}, "max size -1: want 0 (never rotate) or more"},
		{Rotation{MaxSize: 1, Keep: MaxKeep + 1}, fmt.Sprintf("keep %d: want 0-%d", MaxKeep+1, MaxKeep)},
	} {
		err := tc.r.Validate()
		if (err == nil) != (tc.wantErr == "") || err != nil && err.Error() != tc.wantErr {
			t.Errorf("%+v.Validate() = %v, want %q", tc.r, err, tc.wantErr)
		}
	}
}

const childEnv = "LOGROTATE_TEST_CHILD"

// TestMain runs a chatty child when asked: it rotates its own stdout and stderr
// while it writes, as a control plane does.
func TestMain(m *testing.M) {
	if path := os.Getenv(childEnv); path != "" {
		ctx, cancel := context.WithCancel(context.Background())
		go Stdio(ctx, path, Rotation{MaxSize: 2000, Keep: MaxKeep}, 5*time.Millisecond, slog.New(slog.DiscardHandler))
		for i := 1; i <= 1000; i++ {
			fmt.Fprintf(os.Stdout, "line %d\n", i)
			time.Sleep(100 * time.Microsecond)
		}
		fmt.Fprintln(os.Stderr, "to stderr")
		cancel()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A process that rotates its own stdout and stderr loses no line, and no file
// grows far past the size (one interval's writes).
func TestStdio(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cp.log")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+path)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Run(); err != nil {
		t.Fatalf("child: %v", err)
	}
	f.Close()
	got := files(t, dir)
	names := slices.Collect(maps.Keys(got))
	if len(names) < 3 {
		t.Fatalf("files %v: want rotation (about 9 KB at 2000 bytes a file)", names)
	}
	var all strings.Builder
	for i := len(names) - 1; i >= 1; i-- {
		all.WriteString(got[fmt.Sprintf("cp.log.%d", i)])
	}
	all.WriteString(got["cp.log"])
	var want strings.Builder
	for i := 1; i <= 1000; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	want.WriteString("to stderr\n")
	if all.String() != want.String() {
		t.Errorf("the logs hold, oldest first:\n%s\nwant every line once, in order", all.String())
	}
}

// On a terminal (fd 1 not the log), Stdio does nothing.
func TestStdioNotTheLog(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "other.log")
	if err := os.WriteFile(path, []byte(strings.Repeat("x", 100)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	Stdio(ctx, path, Rotation{MaxSize: 10, Keep: 1}, time.Millisecond, slog.New(slog.DiscardHandler))
	if got := files(t, dir); len(got) != 1 || got["other.log"] == "" {
		t.Errorf("Stdio touched a log that is not fd 1: %v", got)
	}
}
