package filelock

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// A second Wait blocks while the first holds the lock, and gets it once released.
func TestWaitExcludes(t *testing.T) {
	file := filepath.Join(t.TempDir(), ".lock")
	unlock, err := Wait(context.Background(), file)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	if _, err := Wait(ctx, file); err == nil {
		t.Fatal("a second Wait took a held lock")
	}
	unlock()
	unlock2, err := Wait(context.Background(), file)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	unlock2()
}
