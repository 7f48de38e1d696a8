package integration

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// gitRepoOfModule makes a bare git repository, <root>/<name>.git, of a Go module's
// source as the Go module proxy serves it (`go mod download -json`): a real project
// nobody here wrote, with its own tests, and no registry or internet needed by the node.
func gitRepoOfModule(t *testing.T, ctx context.Context, module, version, name string) (root string) {
	t.Helper()
	for _, tool := range []string{"git", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			livetest.Skip(t, "needs "+tool+" on the host: the job's project comes from the module proxy into a git repository")
		}
	}
	gitCmd := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = dir
		// Fixed identity and dates: the commit is the same every run.
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=socialweb test", "GIT_AUTHOR_EMAIL=test@socialweb.invalid",
			"GIT_COMMITTER_NAME=socialweb test", "GIT_COMMITTER_EMAIL=test@socialweb.invalid",
			"GIT_AUTHOR_DATE=2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE=2000-01-01T00:00:00Z", "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	tmp := t.TempDir()
	dl := exec.CommandContext(ctx, "go", "mod", "download", "-json", module+"@"+version)
	dl.Dir, dl.Env = tmp, append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := dl.Output()
	if err != nil {
		t.Fatalf("go mod download %s@%s: %v\n%s", module, version, err, out)
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download %s@%s: %q (%v)", module, version, out, err)
	}
	src := filepath.Join(tmp, name)
	// The module cache is read-only; the work tree is a writable copy.
	if out, err := exec.CommandContext(ctx, "cp", "-R", mod.Dir, src).CombinedOutput(); err != nil {
		t.Fatalf("copying %s: %v\n%s", mod.Dir, err, out)
	}
	if out, err := exec.CommandContext(ctx, "chmod", "-R", "u+w", src).CombinedOutput(); err != nil {
		t.Fatalf("chmod %s: %v\n%s", src, err, out)
	}
	gitCmd(src, "init", "-q", "-b", "main")
	gitCmd(src, "add", "-A")
	gitCmd(src, "commit", "-q", "-m", module+" "+version+" from the Go module proxy")
	root = filepath.Join(tmp, "repos")
	gitCmd(tmp, "clone", "-q", "--bare", src, filepath.Join(root, name+".git"))
	return root
}

// serveGit serves the repositories under root over git's smart HTTP protocol (git
// http-backend as a CGI program, as a git server does) on addr (host:port), until the
// test ends. It returns the base URL.
func serveGit(t *testing.T, addr, root string) string {
	t.Helper()
	execPath, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatalf("git --exec-path: %v", err)
	}
	backend := filepath.Join(strings.TrimSpace(string(execPath)), "git-http-backend")
	if _, err := os.Stat(backend); err != nil {
		livetest.Skip(t, "needs git-http-backend: "+err.Error())
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("git server: %v", err)
	}
	srv := &http.Server{
		Handler:           &cgi.Handler{Path: backend, Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}},
		ReadHeaderTimeout: 30 * time.Second,
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}
