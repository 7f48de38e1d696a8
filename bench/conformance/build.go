package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/socialweb-computer/socialweb/internal/filelock"
	"github.com/socialweb-computer/socialweb/internal/guestbuild"
)

// The packages built from the k8s.io/kubernetes module at the version in go.mod.
const (
	e2ePackage     = "k8s.io/kubernetes/test/e2e"
	agnhostPackage = "k8s.io/kubernetes/test/images/agnhost"
	kubectlPackage = "k8s.io/kubernetes/cmd/kubectl"
	nnpPackage     = "k8s.io/kubernetes/test/images/nonewprivs"
	// ginkgoCLI runs e2e.test in parallel processes (-procs); built at the version of
	// the ginkgo library e2e.test links, so the two speak the same protocol.
	ginkgoModule = "github.com/onsi/ginkgo/v2"
	ginkgoCLI    = ginkgoModule + "/ginkgo"
	// The Aggregator test's images: the sample apiserver (the staging module of this
	// Kubernetes version; its main package) and the etcd beside it in the same Pod
	// (etcd's server module is the `etcd` binary; at the version the module graph
	// already selects: kine and k8s.io/kubernetes require it).
	sampleAPIServerModule = "k8s.io/sample-apiserver"
	etcdModule            = "go.etcd.io/etcd/server/v3"
)

// binRecipe changes whenever goBuild builds differently, so older cached builds are not
// reused.
const binRecipe = 5

// goBuild builds the e2e suite, kubectl and the test images' programs with a copy of
// this module's go.mod and go.sum (-modfile), so the repository's own files are never
// edited: e2e imports modules (ginkgo, gomega...) that socialweb itself does not require.
type goBuild struct {
	goCmd     string // the go command
	moduleDir string // root of this module (its go.mod)
	cacheDir  string // <socialweb cache>/conformance
	log       *slog.Logger
}

// binaries are a cached build.
type binaries struct {
	KubeVersion string `json:"kubeVersion"`
	GoVersion   string `json:"goVersion"`
	Key         string `json:"key"`
	E2E         string `json:"e2e"`
	Agnhost     string `json:"agnhost"`
	Kubectl     string `json:"kubectl"`
	NNP         string `json:"nnp"` // the nonewprivs image's program
	Ginkgo      string `json:"ginkgo"`
	// The sample-apiserver and etcd images' programs, and etcd's module version.
	SampleAPIServer string `json:"sampleAPIServer"`
	Etcd            string `json:"etcd"`
	EtcdVersion     string `json:"etcdVersion"`
	// Seconds each took to build (when this run built them).
	Took map[string]float64 `json:"took,omitempty"`
}

// pinnedEnv is the part of the builds' environment that changes their output: static
// (agnhost runs on the test image's libc, not the host's), this architecture, no
// workspace, and the local toolchain only.
func pinnedEnv() []string {
	return []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=" + runtime.GOARCH, "GOFLAGS=-buildvcs=false", "GOWORK=off", "GOTOOLCHAIN=local", "GOEXPERIMENT="}
}

// goEnv is the caller's environment (PATH, HOME, GOCACHE, GOPROXY...) with pinnedEnv
// in place of any of its variables.
func goEnv() []string {
	pinned := map[string]bool{}
	for _, kv := range pinnedEnv() {
		k, _, _ := strings.Cut(kv, "=")
		pinned[k] = true
	}
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !pinned[k] {
			env = append(env, kv)
		}
	}
	return append(env, pinnedEnv()...)
}

func (b goBuild) goRun(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, b.goCmd, args...)
	cmd.Dir, cmd.Env = b.moduleDir, goEnv()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, tail(out.String(), 30))
	}
	return out.String(), nil
}

// modfile returns the path of a go.mod copy that also requires what the e2e suite,
// agnhost, kubectl, the ginkgo CLI, sample-apiserver and etcd import at kver, made with
// `go get -modfile` once per content of go.mod and go.sum (and kept, so later runs need
// no network).
func (b goBuild) modfile(ctx context.Context, kver, goVersion string) (string, error) {
	mod, err := os.ReadFile(filepath.Join(b.moduleDir, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("reading go.mod: %w", err)
	}
	sum, err := os.ReadFile(filepath.Join(b.moduleDir, "go.sum"))
	if err != nil {
		return "", fmt.Errorf("reading go.sum: %w", err)
	}
	dir := filepath.Join(b.cacheDir, "mod-"+hash(fmt.Sprint(binRecipe), string(mod), string(sum), kver, goVersion)[:16])
	file := filepath.Join(dir, "go.mod")
	done := filepath.Join(dir, "done")
	if _, err := os.Stat(done); err == nil {
		return file, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("modfile: %w", err)
	}
	unlock, err := filelock.Wait(ctx, filepath.Join(dir, ".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(done); err == nil {
		return file, nil
	}
	if err := os.WriteFile(file, mod, 0o644); err != nil {
		return "", fmt.Errorf("modfile: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		return "", fmt.Errorf("modfile: %w", err)
	}
	t0 := time.Now()
	b.log.Info("adding the e2e suite's dependencies to a copy of go.mod", "modfile", file, "kubernetes", kver)
	// The packages at the version go.mod has, so k8s.io/kubernetes is not moved; go get
	// adds requirements for the modules their imports need.
	// -t: the suite's specs are imported by e2e_test.go, a test file of the package.
	if _, err := b.goRun(ctx, "get", "-t", "-modfile="+file, e2ePackage+"@"+kver, agnhostPackage+"@"+kver, kubectlPackage+"@"+kver); err != nil {
		return "", err
	}
	// The ginkgo CLI at the version the suite requires (no @latest: that could move it).
	gv, err := b.goRun(ctx, "list", "-modfile="+file, "-m", "-f", "{{.Version}}", ginkgoModule)
	if err != nil {
		return "", err
	}
	if _, err := b.goRun(ctx, "get", "-modfile="+file, ginkgoCLI+"@"+strings.TrimSpace(gv)); err != nil {
		return "", err
	}
	// The sample apiserver of this Kubernetes (go.mod replaces the staging modules with
	// their release, so this is the version that is built), and etcd's server at the
	// version the graph already has, so neither moves anything e2e.test links.
	sver, err := stagingVersion(kver)
	if err != nil {
		return "", err
	}
	ev, err := b.goRun(ctx, "list", "-modfile="+file, "-m", "-f", "{{.Version}}", etcdModule)
	if err != nil {
		return "", err
	}
	if _, err := b.goRun(ctx, "get", "-modfile="+file, sampleAPIServerModule+"@"+sver, etcdModule+"@"+strings.TrimSpace(ev)); err != nil {
		return "", err
	}
	if got, err := b.moduleVersion(ctx, file, sampleAPIServerModule); err != nil || got != sver {
		return "", fmt.Errorf("modfile %s: %s resolves to %q, want %s (%v)", file, sampleAPIServerModule, got, sver, err)
	}
	if got, err := b.goRun(ctx, "list", "-modfile="+file, "-m", "-f", "{{.Version}}", "k8s.io/kubernetes"); err != nil || strings.TrimSpace(got) != kver {
		return "", fmt.Errorf("modfile %s: go get moved k8s.io/kubernetes from %s to %q (%v)", file, kver, strings.TrimSpace(got), err)
	}
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		return "", fmt.Errorf("modfile: %w", err)
	}
	b.log.Info("modfile ready", "modfile", file, "took", time.Since(t0).Round(time.Millisecond))
	return file, nil
}

// moduleVersion is the version of module the modfile builds: its replacement's when go.mod
// replaces it.
func (b goBuild) moduleVersion(ctx context.Context, file, module string) (string, error) {
	out, err := b.goRun(ctx, "list", "-modfile="+file, "-m", "-f", "{{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}", module)
	return strings.TrimSpace(out), err
}

// stagingVersion is the version of the k8s.io staging modules (k8s.io/apiserver,
// k8s.io/sample-apiserver...) released with Kubernetes kver: v1.37.2 -> v0.37.2.
func stagingVersion(kver string) (string, error) {
	rest, ok := strings.CutPrefix(kver, "v1.")
	if !ok || rest == "" {
		return "", fmt.Errorf("kubernetes version %q: want v1.MINOR.PATCH", kver)
	}
	return "v0." + rest, nil
}

// build returns the binaries of buildSteps at the k8s.io/kubernetes version in go.mod,
// building them unless the cache holds a build of the same inputs (the Kubernetes
// version, the Go version, the modfile and its go.sum, each step's package and flags,
// the environment and this recipe).
func (b goBuild) build(ctx context.Context) (binaries, error) {
	out, err := b.goRun(ctx, "list", "-m", "-f", "{{.Version}}", "k8s.io/kubernetes")
	if err != nil {
		return binaries{}, err
	}
	kver := strings.TrimSpace(out)
	gv, err := b.goRun(ctx, "env", "GOVERSION")
	if err != nil {
		return binaries{}, err
	}
	goVersion := strings.TrimSpace(gv)
	file, err := b.modfile(ctx, kver, goVersion)
	if err != nil {
		return binaries{}, err
	}
	mod, err := os.ReadFile(file)
	if err != nil {
		return binaries{}, fmt.Errorf("reading %s: %w", file, err)
	}
	sum, err := os.ReadFile(strings.TrimSuffix(file, ".mod") + ".sum")
	if err != nil {
		return binaries{}, fmt.Errorf("reading the modfile's go.sum: %w", err)
	}
	ld, err := guestbuild.VersionLDFlags(kver)
	if err != nil {
		return binaries{}, err
	}
	ldflags := "-s -w " + ld
	ev, err := b.moduleVersion(ctx, file, etcdModule)
	if err != nil {
		return binaries{}, err
	}
	steps := buildSteps(ldflags)
	// Every input of the output: the steps carry each binary's package and flags.
	key := hash(fmt.Sprint(binRecipe), kver, goVersion, runtime.GOARCH, string(mod), string(sum), fmt.Sprint(steps), strings.Join(pinnedEnv(), " "))[:16]
	dir := filepath.Join(b.cacheDir, "bin-"+kver+"-"+key)
	rec := filepath.Join(dir, "build.json")
	res := binaries{KubeVersion: kver, GoVersion: goVersion, Key: key,
		E2E: filepath.Join(dir, "e2e.test"), Agnhost: filepath.Join(dir, "agnhost"), Kubectl: filepath.Join(dir, "kubectl"),
		NNP: filepath.Join(dir, "nnp"), Ginkgo: filepath.Join(dir, "ginkgo"),
		SampleAPIServer: filepath.Join(dir, "sample-apiserver"), Etcd: filepath.Join(dir, "etcd"), EtcdVersion: ev}
	if complete(rec, res) {
		b.log.Info("e2e binaries cached", "dir", dir, "kubernetes", kver, "go", goVersion)
		return res, nil
	}
	if err := os.MkdirAll(b.cacheDir, 0o755); err != nil {
		return res, fmt.Errorf("cache: %w", err)
	}
	unlock, err := filelock.Wait(ctx, dir+".lock")
	if err != nil {
		return res, err
	}
	defer unlock()
	if complete(rec, res) {
		return res, nil
	}
	tmp, err := os.MkdirTemp(b.cacheDir, ".build-")
	if err != nil {
		return res, fmt.Errorf("cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	res.Took = map[string]float64{}
	b.log.Info("building the e2e binaries; with a cold Go build cache the suite compiles for tens of minutes on 2 cores", "dir", dir)
	for _, s := range steps {
		t0 := time.Now()
		b.log.Info("building", "binary", s.name, "kubernetes", kver, "go", goVersion)
		if _, err := b.goRun(ctx, s.args(file, filepath.Join(tmp, s.name))...); err != nil {
			return res, fmt.Errorf("building %s: %w", s.name, err)
		}
		res.Took[s.name] = time.Since(t0).Seconds()
		b.log.Info("built", "binary", s.name, "took", time.Since(t0).Round(time.Second))
		// Programs of test images run on the image's libc, or on none.
		if s.static {
			if err := guestbuild.CheckStatic(filepath.Join(tmp, s.name)); err != nil {
				return res, err
			}
		}
	}
	rb, _ := json.MarshalIndent(res, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "build.json"), append(rb, '\n'), 0o644); err != nil {
		return res, fmt.Errorf("cache: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return res, fmt.Errorf("cache: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return res, fmt.Errorf("cache: %w", err)
	}
	return res, nil
}

// buildStep is one binary: `go test -c` of a package's tests or `go build` of a main
// package, with ldflags. Its fields are part of the cache key.
type buildStep struct {
	name    string // the output's file name
	pkg     string
	test    bool
	ldflags string
	static  bool // runs in a test image: checked to need no libc
}

func (s buildStep) args(modfile, out string) []string {
	if s.test {
		return []string{"test", "-c", "-vet=off", "-modfile=" + modfile, "-ldflags", s.ldflags, "-o", out, s.pkg}
	}
	return []string{"build", "-modfile=" + modfile, "-ldflags", s.ldflags, "-o", out, s.pkg}
}

// buildSteps are the binaries build makes, in order; kubeLD are the linker flags of the
// Kubernetes programs (their version).
func buildSteps(kubeLD string) []buildStep {
	return []buildStep{
		// e2e.test first: it compiles nearly everything the others need.
		{name: "e2e.test", pkg: e2ePackage, test: true, ldflags: kubeLD},
		{name: "agnhost", pkg: agnhostPackage, ldflags: kubeLD, static: true},
		{name: "kubectl", pkg: kubectlPackage, ldflags: kubeLD},
		{name: "nnp", pkg: nnpPackage, ldflags: kubeLD, static: true},
		{name: "ginkgo", pkg: ginkgoCLI, ldflags: "-s -w"},
		// The sample apiserver reports this Kubernetes' version, as a staging build does.
		{name: "sample-apiserver", pkg: sampleAPIServerModule, ldflags: kubeLD, static: true},
		{name: "etcd", pkg: etcdModule, ldflags: "-s -w", static: true},
	}
}

// complete says whether a cached build's record and binaries are all there.
func complete(rec string, res binaries) bool {
	var got binaries
	b, err := os.ReadFile(rec)
	if err != nil || json.Unmarshal(b, &got) != nil || got.Key != res.Key {
		return false
	}
	for _, p := range []string{res.E2E, res.Agnhost, res.Kubectl, res.NNP, res.Ginkgo, res.SampleAPIServer, res.Etcd} {
		if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

func hash(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s\n", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// moduleRoot finds the directory of this module's go.mod from the working directory up.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(data, []byte("module "+guestbuild.ModulePath+"\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("run from inside the %s source tree (its go.mod pins the Kubernetes version built)", guestbuild.ModulePath)
		}
		dir = parent
	}
}

// kubernetesDir is the module cache directory of k8s.io/kubernetes (the agnhost image
// takes porter's test certificate from it).
func (b goBuild) kubernetesDir(ctx context.Context) (string, error) {
	out, err := b.goRun(ctx, "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(out), nil
}
