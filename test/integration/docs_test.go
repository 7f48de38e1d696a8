package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/runbook"
)

// TestDocsRunbooks runs, as written, every runbook the docs mark (`<!-- runbook: NAME -->`
// before a code block; see internal/runbook): each one's blocks in document order, as one
// bash -euo pipefail script from the checkout's root, with its own state dir. A command
// that fails, or a runbook the table below does not know, fails the test; so does a
// process, VM or network the script leaves behind.
func TestDocsRunbooks(t *testing.T) {
	nodeImage(t) // skips where nodes cannot run; built (or reused) here, not in the script
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []runbook.Block
	for _, f := range docFiles(t, root) {
		md, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		bs, err := runbook.Parse(f, md)
		if err != nil {
			t.Fatalf("the docs' runbook markers: %v", err)
		}
		blocks = append(blocks, bs...)
	}
	// Each runbook the docs hold: how long it may take here (TCG included), where it
	// runs, and what it expects to find.
	known := map[string]runbookSetup{
		"install": {limit: 20 * time.Minute, inCheckout: true}, // operator guide: from source
		"demo":    {limit: 30 * time.Minute, inCheckout: true}, // README: the main job, hack/demo
		"tour":    {limit: 30 * time.Minute, inCheckout: true}, // README: the five-minute tour
		"backup":  {limit: 10 * time.Minute, cluster: "ci"},    // operator guide: backup, restore
	}
	names := runbook.Names(blocks)
	if len(names) == 0 {
		t.Fatal("the docs mark no runbook: README.md's tour should be one")
	}
	if out, err := exec.Command(filepath.Join(root, "hack/kubectl")).CombinedOutput(); err != nil {
		t.Fatalf("hack/kubectl: %v\n%s", err, out)
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			setup, ok := known[name]
			if !ok {
				t.Fatalf("runbook %q is not in TestDocsRunbooks' table: add it, with how long it may take", name)
			}
			setup.root = root
			runRunbook(t, name, runbook.Script(blocks, name), setup)
		})
	}
}

// runbookSetup is where and how a runbook runs.
type runbookSetup struct {
	limit time.Duration
	// inCheckout runs it from the checkout's root (its commands name bin/ and hack/);
	// else from an empty directory, with socialweb and kubectl on PATH.
	inCheckout bool
	// cluster, if set, is a cluster a daemon serves, Ready, before the script starts
	// (pages that assume an installed service).
	cluster string
	root    string
}

// docFiles are the pages whose commands must be marked: README.md and docs/*.md
// (docs/notes/ is history, not instructions).
func docFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md"}
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pages {
		files = append(files, filepath.Join("docs", filepath.Base(p)))
	}
	return files
}

func runRunbook(t *testing.T, name, script string, setup runbookSetup) {
	root := setup.root
	state := filepath.Join(stateTempDir(t), "state")
	ownState := true
	if setup.cluster != "" {
		d := newDaemon(t, 10)
		d.start()
		d.mustCLI("cluster", "create", setup.cluster, "--wait")
		state, ownState = d.stateDir, false
	}
	dir := root
	if !setup.inCheckout {
		dir = t.TempDir()
	}
	// socialweb and kubectl on PATH, as the package and a kubectl install put them.
	path := t.TempDir()
	for cmd, target := range map[string]string{"socialweb": binary, "kubectl": filepath.Join(root, "bin", "kubectl")} {
		if err := os.Symlink(target, filepath.Join(path, cmd)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), setup.limit)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	// The state dir is the runbook's own (or its daemon's), through the env twin of
	// --state-dir, so the commands read as a newcomer types them and touch nothing of
	// the host's.
	cmd.Env = append(os.Environ(), "SOCIALWEB_STATE_DIR="+state, "PATH="+path+":"+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = time.Minute
	t.Cleanup(func() {
		// A failed script may leave its background serve: stop its group, then what
		// the daemon left (node VMs, networks).
		if cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
			livetest.Eventually(t, time.Minute, 200*time.Millisecond, "the runbook's processes to exit", func() bool {
				return syscall.Kill(-cmd.Process.Pid, 0) != nil
			})
		}
		if _, err := os.Stat(state); err == nil && ownState {
			if _, errOut, code := run("down", "--state-dir", state); code != 0 {
				t.Errorf("cleanup: socialweb down: %s", errOut)
			}
		}
		if ownState {
			assertNoProcessesLeft(t, state)
		}
	})
	before := gitStatus(t, root)
	t0 := time.Now()
	err := cmd.Run()
	if err != nil || t.Failed() {
		t.Logf("runbook %s (script):\n%s", name, script)
		t.Logf("its output (tail):\n%s", tail(out.String(), 80))
		if b, rerr := os.ReadFile("/tmp/socialweb.log"); rerr == nil && name == "tour" {
			t.Logf("/tmp/socialweb.log (tail):\n%s", tail(string(b), 30))
		}
	}
	if ctx.Err() != nil {
		t.Fatalf("runbook %s did not finish within %s", name, setup.limit)
	}
	if err != nil {
		t.Fatalf("runbook %s: %v", name, err)
	}
	t.Logf("runbook %s ran in %s", name, time.Since(t0).Round(time.Second))
	// A runbook cleans up after itself (bin/ is ignored: its builds stay).
	if after := gitStatus(t, root); after != before {
		t.Errorf("runbook %s changed the checkout: git status was\n%s\nand is\n%s", name, before, after)
	}
}

func gitStatus(t *testing.T, root string) string {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "status", "--porcelain").Output()
	if err != nil {
		livetest.Skip(t, "the checkout's git status: "+err.Error())
	}
	return strings.TrimSpace(string(out))
}
