package docs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/socialweb-computer/socialweb/internal/runbook"
)

// TestEveryCommandIsRunOrExcused: each block of commands on a page a newcomer reads
// (docs/notes/ excepted) is either a runbook, which test/integration's TestDocsRunbooks
// runs as written, or marked not run with a reason.
func TestEveryCommandIsRunOrExcused(t *testing.T) {
	runbooks := 0
	for _, page := range pages(t, repoRoot) {
		if exempt(page) {
			continue
		}
		md, err := os.ReadFile(filepath.Join(repoRoot, page))
		if err != nil {
			t.Fatal(err)
		}
		blocks, err := runbook.Parse(page, md)
		if err != nil {
			t.Error(err)
		}
		runbooks += len(runbook.Names(blocks))
	}
	if runbooks == 0 {
		t.Error("no page marks a runbook: README.md's tour should be one")
	}
}
