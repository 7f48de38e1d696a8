package images

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/registry"
	"github.com/socialweb-computer/socialweb/internal/registry/registrytest"
)

type tlogWriter struct{ t testing.TB }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testOpts(t testing.TB, dir string) Options {
	return Options{CacheDir: dir, Logger: slog.New(slog.NewTextHandler(tlogWriter{t}, nil))}
}

// sharedCache is one cache directory for the tests that need busybox, so the package is
// downloaded once per test run; TestMain removes it.
var (
	sharedOnce sync.Once
	sharedDir  string
)

func sharedCache() string {
	sharedOnce.Do(func() {
		d, err := os.MkdirTemp("", "socialweb-images-test-")
		if err != nil {
			panic(err)
		}
		sharedDir = d
	})
	return sharedDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedDir != "" {
		os.RemoveAll(sharedDir)
	}
	os.Exit(code)
}

// needBusybox skips (or fails under SOCIALWEB_REQUIRE_LIVE=1) when apt cannot provide
// busybox-static.
func needBusybox(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"apt-cache", "apt-get", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			livetest.Skip(t, "the busybox image needs "+tool+" (apt)")
		}
	}
	if _, err := busyboxInputs(context.Background()); err != nil {
		livetest.Skip(t, err.Error())
	}
}

type ociImage struct {
	manifest struct {
		MediaType string       `json:"mediaType"`
		Config    descriptor   `json:"config"`
		Layers    []descriptor `json:"layers"`
	}
	digest string
	config imageConfig
	layers [][]byte
}

// importAndPull imports layout into a fresh registry and pulls ref back over HTTP the way
// containerd's mirror requests do (?ns=), checking every digest on the way.
func importAndPull(t *testing.T, layout, ref string) ociImage {
	t.Helper()
	s := &registry.Server{Dir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(tlogWriter{t}, nil))}
	f, err := os.Open(layout)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := s.Import(context.Background(), f)
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	t.Logf("imported %v", got)
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	name, tag, _ := strings.Cut(ref, ":")
	ns, path, _ := strings.Cut(name, "/")
	get := func(p string) ([]byte, http.Header) {
		res, err := http.Get(ts.URL + "/v2/" + path + p + "?ns=" + ns)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", p, res.StatusCode, b)
		}
		return b, res.Header
	}
	var img ociImage
	mb, h := get("/manifests/" + tag)
	img.digest = h.Get("Docker-Content-Digest")
	if err := json.Unmarshal(mb, &img.manifest); err != nil {
		t.Fatal(err)
	}
	if h.Get("Content-Type") != mediaTypeManifest || img.manifest.MediaType != mediaTypeManifest {
		t.Errorf("manifest Content-Type %q, mediaType %q", h.Get("Content-Type"), img.manifest.MediaType)
	}
	blob := func(d descriptor) []byte {
		b, _ := get("/blobs/" + d.Digest)
		if sha := bytesBlob(b).digest; sha != d.Digest || int64(len(b)) != d.Size {
			t.Fatalf("blob %s: %d bytes with digest %s", d.Digest, len(b), sha)
		}
		return b
	}
	if err := json.Unmarshal(blob(img.manifest.Config), &img.config); err != nil {
		t.Fatal(err)
	}
	for i, l := range img.manifest.Layers {
		if l.MediaType != mediaTypeLayer || img.config.RootFS.DiffIDs[i] != l.Digest {
			t.Errorf("layer %d: %s %s, diff_id %s", i, l.MediaType, l.Digest, img.config.RootFS.DiffIDs[i])
		}
		img.layers = append(img.layers, blob(l))
	}
	return img
}

type entry struct {
	hdr  *tar.Header
	data []byte
}

func readLayer(t *testing.T, b []byte) ([]string, map[string]entry) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var order []string
	m := map[string]entry{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		order = append(order, h.Name)
		m[strings.TrimSuffix(h.Name, "/")] = entry{h, data}
		if !h.ModTime.Equal(epoch) || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: mtime %v uid %d gid %d; want epoch, 0, 0", h.Name, h.ModTime, h.Uid, h.Gid)
		}
	}
	return order, m
}

func TestLayerTar(t *testing.T) {
	files := []tarFile{
		{path: "usr/bin/env", mode: 0o777, typ: tar.TypeSymlink, link: "/bin/busybox"},
		{path: "bin/busybox", mode: 0o755, typ: tar.TypeReg, data: []byte("binary")},
		{path: "bin/sh", mode: 0o777, typ: tar.TypeSymlink, link: "busybox"},
		{path: "tmp", mode: 0o1777, typ: tar.TypeDir},
	}
	a, err := layerTar(files)
	if err != nil {
		t.Fatal(err)
	}
	rev := append([]tarFile(nil), files...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	b, _ := layerTar(rev)
	if a.digest != b.digest {
		t.Errorf("file order changed the layer digest: %s vs %s", a.digest, b.digest)
	}
	var buf bytes.Buffer
	a.gen(&buf)
	order, m := readLayer(t, buf.Bytes())
	want := []string{"bin/", "bin/busybox", "bin/sh", "tmp/", "usr/", "usr/bin/", "usr/bin/env"}
	if !reflect.DeepEqual(order, want) {
		t.Errorf("entries %v, want %v", order, want)
	}
	if m["tmp"].hdr.Mode != 0o1777 || m["bin/sh"].hdr.Linkname != "busybox" || string(m["bin/busybox"].data) != "binary" {
		t.Errorf("tmp mode %o, sh -> %q, busybox %q", m["tmp"].hdr.Mode, m["bin/sh"].hdr.Linkname, m["bin/busybox"].data)
	}

	// The whole layout is reproducible too, and a different input changes it.
	dir := t.TempDir()
	spec := imageSpec{arch: "amd64", layers: []blob{a}, history: []string{"x"}, config: containerConfig{Cmd: []string{"sh"}}, refs: []string{"x.test/a:1", "x.test/a:2"}}
	d1, err := writeLayout(filepath.Join(dir, "1.tar"), spec)
	if err != nil {
		t.Fatal(err)
	}
	spec.refs = []string{"x.test/a:2", "x.test/a:1"}
	d2, _ := writeLayout(filepath.Join(dir, "2.tar"), spec)
	spec.config.Cmd = []string{"ls"}
	d3, _ := writeLayout(filepath.Join(dir, "3.tar"), spec)
	t1, _ := os.ReadFile(filepath.Join(dir, "1.tar"))
	t2, _ := os.ReadFile(filepath.Join(dir, "2.tar"))
	if d1 != d2 || !bytes.Equal(t1, t2) {
		t.Errorf("same image wrote different layouts: %s vs %s", d1, d2)
	}
	if d3 == d1 {
		t.Errorf("a different Cmd kept the digest %s", d1)
	}
}

func TestPause(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		livetest.Skip(t, "the pause image needs the go command")
	}
	ctx := context.Background()
	start := time.Now()
	opts := testOpts(t, t.TempDir())
	tarPath, digest, err := Build(ctx, "registry.k8s.io/pause:3.10", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pause %s built in %v", digest, time.Since(start))

	// Cached: same answer, file untouched.
	st1, _ := os.Stat(tarPath)
	p2, d2, err := Build(ctx, Pause, opts)
	if st2, _ := os.Stat(p2); err != nil || p2 != tarPath || d2 != digest || !st2.ModTime().Equal(st1.ModTime()) {
		t.Errorf("second Build: %s %s %v; want the cached %s %s", p2, d2, err, tarPath, digest)
	}
	// Reproducible: a build from scratch in another cache gives the same digest.
	p3, d3, err := Build(ctx, Pause, Options{CacheDir: t.TempDir(), Rebuild: true, Logger: opts.Logger})
	if err != nil || d3 != digest {
		t.Errorf("rebuild: %s %v; want digest %s", d3, err, digest)
	}
	if b1, _ := os.ReadFile(tarPath); true {
		if b3, _ := os.ReadFile(p3); !bytes.Equal(b1, b3) {
			t.Errorf("rebuilt layout tar differs")
		}
	}

	img := importAndPull(t, tarPath, "registry.k8s.io/pause:3.10")
	if img.digest != digest {
		t.Errorf("registry serves %s, Build said %s", img.digest, digest)
	}
	c := img.config.Config
	if !reflect.DeepEqual(c.Entrypoint, []string{"/pause"}) || c.Cmd != nil || c.User != "65535:65535" || img.config.OS != "linux" || img.config.Architecture == "" {
		t.Errorf("config %+v", img.config)
	}
	if len(img.layers) != 1 {
		t.Fatalf("%d layers, want 1", len(img.layers))
	}
	order, files := readLayer(t, img.layers[0])
	if !reflect.DeepEqual(order, []string{"pause"}) || files["pause"].hdr.Mode != 0o755 {
		t.Fatalf("layer entries %v", order)
	}
	bin := filepath.Join(t.TempDir(), "pause")
	os.WriteFile(bin, files["pause"].data, 0o755)
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("/pause has an ELF interpreter: not static")
		}
	}
	ef.Close()

	// It exits 0 on SIGTERM and SIGINT and not before.
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cmd := exec.Command(bin)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			t.Fatalf("pause exited on its own: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		cmd.Process.Signal(sig)
		select {
		case err := <-done:
			if err != nil || !strings.Contains(stderr.String(), "Shutting down") {
				t.Errorf("after %v: %v, stderr %q", sig, err, stderr.String())
			}
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			t.Errorf("pause ignored %v", sig)
		}
	}
	t.Logf("pause: %d bytes binary, layout %s", len(files["pause"].data), tarPath)
}

// TestPauseReaps runs pause as PID 1 of a new PID namespace, orphans a child into it, and
// checks the child does not stay a zombie.
func TestPauseReaps(t *testing.T) {
	if os.Geteuid() != 0 {
		livetest.Skip(t, "needs root for a PID namespace")
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		livetest.Skip(t, "needs nsenter (util-linux)")
	}
	if _, err := exec.LookPath("go"); err != nil {
		livetest.Skip(t, "the pause image needs the go command")
	}
	tarPath, _, err := Build(context.Background(), Pause, testOpts(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	bin := extractFromLayout(t, tarPath, "pause")
	cmd := exec.Command(bin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	if err := cmd.Start(); err != nil {
		livetest.Skip(t, "cannot create a PID namespace: "+err.Error())
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	pid := cmd.Process.Pid
	time.Sleep(100 * time.Millisecond)
	// sh runs inside the namespace, starts sleep in the background and exits: sleep is
	// reparented to pause, which must collect it when it exits.
	out, err := exec.Command("nsenter", "-t", strconv.Itoa(pid), "-p", "--", "sh", "-c", "sleep 1 >/dev/null 2>&1 & echo $!").CombinedOutput()
	if err != nil {
		t.Fatalf("nsenter: %v: %s", err, out)
	}
	sawChild := false
	deadline := time.Now().Add(3 * time.Second)
	for {
		children := childrenOf(pid)
		if len(children) > 0 {
			sawChild = true
		}
		if sawChild && len(children) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("children of pause after 3s: %v (saw a child: %v)", children, sawChild)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// pause itself is still there, and stops on SIGTERM.
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("pause as PID 1 after SIGTERM: %v", err)
	}
}

// childrenOf lists "pid:state" of the processes whose parent is pid.
func childrenOf(pid int) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, e.Name()+":"+f[0])
		}
	}
	return out
}

// extractFromLayout returns a file of the first layer of the only image of a layout tar.
func extractFromLayout(t *testing.T, layout, file string) string {
	t.Helper()
	f, err := os.Open(layout)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blobs := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		blobs[h.Name] = b
	}
	var idx index
	var m manifest
	json.Unmarshal(blobs["index.json"], &idx)
	json.Unmarshal(blobs["blobs/sha256/"+strings.TrimPrefix(idx.Manifests[0].Digest, "sha256:")], &m)
	tr = tar.NewReader(bytes.NewReader(blobs["blobs/sha256/"+strings.TrimPrefix(m.Layers[0].Digest, "sha256:")]))
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s not in the layer: %v", file, err)
		}
		if h.Name == file {
			p := filepath.Join(t.TempDir(), filepath.Base(file))
			b, _ := io.ReadAll(tr)
			if err := os.WriteFile(p, b, 0o755); err != nil {
				t.Fatal(err)
			}
			return p
		}
	}
}

func TestBusybox(t *testing.T) {
	needBusybox(t)
	ctx := context.Background()
	opts := testOpts(t, sharedCache())
	start := time.Now()
	tarPath, digest, err := Build(ctx, Busybox, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("busybox %s built in %v", digest, time.Since(start))
	opts.Rebuild = true
	_, d2, err := Build(ctx, "docker.io/library/busybox:stable", opts)
	if err != nil || d2 != digest {
		t.Errorf("rebuild: %s %v; want the same digest %s", d2, err, digest)
	}

	for _, ref := range Refs[Busybox] {
		img := importAndPull(t, tarPath, ref)
		if img.digest != digest {
			t.Errorf("%s: registry serves %s, Build said %s", ref, img.digest, digest)
		}
		c := img.config.Config
		if !reflect.DeepEqual(c.Cmd, []string{"sh"}) || c.Entrypoint != nil || !reflect.DeepEqual(c.Env, defaultEnv) {
			t.Errorf("config %+v", c)
		}
		if len(img.layers) != 1 {
			t.Fatalf("%d layers", len(img.layers))
		}
		_, files := readLayer(t, img.layers[0])
		bb := files["bin/busybox"]
		if bb.hdr == nil || bb.hdr.Typeflag != tar.TypeReg || bb.hdr.Mode != 0o755 || len(bb.data) < 500_000 || !bytes.HasPrefix(bb.data, []byte("\x7fELF")) {
			t.Fatalf("bin/busybox: %+v, %d bytes", bb.hdr, len(bb.data))
		}
		for _, tc := range []struct{ path, link string }{{"bin/sh", "busybox"}, {"bin/ls", "busybox"}, {"bin/wget", "busybox"}, {"usr/bin/env", "/bin/busybox"}} {
			if e := files[tc.path]; e.hdr == nil || e.hdr.Typeflag != tar.TypeSymlink || e.hdr.Linkname != tc.link {
				t.Errorf("%s: want a symlink to %s, got %+v", tc.path, tc.link, e.hdr)
			}
		}
		if e := files["tmp"]; e.hdr == nil || e.hdr.Typeflag != tar.TypeDir || e.hdr.Mode != 0o1777 {
			t.Errorf("tmp: %+v", e.hdr)
		}
		if !strings.HasPrefix(string(files["etc/passwd"].data), "root:x:0:0:") || !strings.HasPrefix(string(files["etc/group"].data), "root:x:0:") {
			t.Errorf("passwd %q group %q", files["etc/passwd"].data, files["etc/group"].data)
		}
		// The busybox in the image runs and has the applets the symlinks name.
		bin := filepath.Join(t.TempDir(), "busybox")
		os.WriteFile(bin, bb.data, 0o755)
		if out, err := exec.Command(bin, "sh", "-c", "echo hello from $0").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "hello from sh" {
			t.Errorf("busybox sh: %q %v", out, err)
		}
	}
}

// TestBusyboxBash: the image's sh passes environment variables whose names are not
// identifiers on to its children (Debian's busybox ash drops them), and busybox's applets
// are still there.
func TestBusyboxBash(t *testing.T) {
	needBusybox(t)
	ctx := context.Background()
	opts := testOpts(t, sharedCache())
	tarPath, digest, err := Build(ctx, BusyboxBash, opts)
	if err != nil {
		t.Fatal(err)
	}
	img := importAndPull(t, tarPath, Refs[BusyboxBash][0])
	if img.digest != digest || len(img.layers) != 1 {
		t.Fatalf("digest %s (built %s), %d layers", img.digest, digest, len(img.layers))
	}
	_, files := readLayer(t, img.layers[0])
	sh, bb := files["bin/sh"], files["bin/busybox"]
	if sh.hdr == nil || sh.hdr.Typeflag != tar.TypeReg || !bytes.HasPrefix(sh.data, []byte("\x7fELF")) {
		t.Fatalf("bin/sh: want bash-static, got %+v", sh.hdr)
	}
	if e := files["bin/wget"]; e.hdr == nil || e.hdr.Linkname != "busybox" || bb.hdr == nil {
		t.Fatalf("bin/wget: want busybox's applet, got %+v", e.hdr)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "busybox"), bb.data, 0o755)
	os.Symlink("busybox", filepath.Join(dir, "env"))
	os.WriteFile(filepath.Join(dir, "sh"), sh.data, 0o755)
	cmd := exec.Command(filepath.Join(dir, "sh"), "-c", "env")
	cmd.Env = []string{"PATH=" + dir, "data-1=value-1", "#@!data-1=value-1", "ABC_data-1=value-1"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sh -c env: %v: %s", err, out)
	}
	for _, want := range []string{"data-1=value-1", "#@!data-1=value-1", "ABC_data-1=value-1"} {
		if !strings.Contains(string(out), want+"\n") {
			t.Errorf("sh -c env lost %q; it printed:\n%s", want, out)
		}
	}
}

func TestLarge(t *testing.T) {
	needBusybox(t)
	old := largeLayerMiB
	largeLayerMiB = 2
	defer func() { largeLayerMiB = old }()
	ctx := context.Background()
	opts := testOpts(t, sharedCache())
	tarPath, digest, err := Large(ctx, 5, opts)
	if err != nil {
		t.Fatal(err)
	}
	_, d2, err := Large(ctx, 5, Options{CacheDir: opts.CacheDir, Rebuild: true, Logger: opts.Logger})
	if err != nil || d2 != digest {
		t.Errorf("rebuild: %s %v; want %s", d2, err, digest)
	}
	img := importAndPull(t, tarPath, LargeRef(5))
	if img.digest != digest || len(img.layers) != 4 {
		t.Fatalf("digest %s (built %s), %d layers; want busybox + 3 data layers", img.digest, digest, len(img.layers))
	}
	seen := map[string]bool{}
	for i, size := range []int{2, 2, 1} {
		_, files := readLayer(t, img.layers[i+1])
		e := files[fmt.Sprintf("data/part-%03d", i)]
		if len(e.data) != size<<20 {
			t.Fatalf("part %d: %d bytes, want %d MiB", i, len(e.data), size)
		}
		head := string(e.data[:64])
		if seen[head] || bytes.Count(e.data[:4096], []byte{0}) > 64 {
			t.Errorf("part %d does not look like fresh random data", i)
		}
		seen[head] = true
	}
	if _, _, err := Large(ctx, 0, opts); err == nil {
		t.Errorf("Large(0) succeeded")
	}
}

func TestBuildUnknown(t *testing.T) {
	if _, _, err := Build(context.Background(), "nginx", testOpts(t, t.TempDir())); err == nil || !strings.Contains(err.Error(), "unknown image") {
		t.Errorf("Build(nginx): %v", err)
	}
}

// TestContainerdRun pulls the built pause and busybox images through a real containerd
// mirrored to the registry and runs them (skipped unless containerd and ctr are around:
// set SOCIALWEB_CONTAINERD_DIR to a node rootfs's usr/bin).
func TestContainerdRun(t *testing.T) {
	needBusybox(t)
	ctx := context.Background()
	s := &registry.Server{Dir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(tlogWriter{t}, nil))}
	for _, name := range []string{Pause, Busybox} {
		p, _, err := Build(ctx, name, testOpts(t, sharedCache()))
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Import(ctx, f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- s.Serve(sctx, ln) }()
	defer func() { cancel(); <-served }()

	c := registrytest.Start(t, ln.Addr().String())
	c.Pull(t, "docker.io/library/busybox:stable")
	c.Pull(t, "registry.k8s.io/pause:3.10")

	out, err := c.Run("run", "--rm", "--snapshotter", "native", "docker.io/library/busybox:stable", "sw-busybox",
		"sh", "-c", "echo hello from $(readlink /bin/sh); id -u; test -d /tmp && echo tmp")
	if err != nil {
		livetest.Skip(t, fmt.Sprintf("cannot run containers here (ctr run: %v: %s)", err, out))
	}
	t.Logf("busybox container printed %q", out)
	if got := strings.Fields(out); !reflect.DeepEqual(got, []string{"hello", "from", "busybox", "0", "tmp"}) {
		t.Errorf("busybox printed %q", out)
	}

	if out, err := c.Run("run", "-d", "--snapshotter", "native", "registry.k8s.io/pause:3.10", "sw-pause"); err != nil {
		t.Fatalf("ctr run pause: %v: %s", err, out)
	}
	time.Sleep(500 * time.Millisecond)
	if out, _ := c.Run("tasks", "ls"); !strings.Contains(out, "RUNNING") {
		t.Fatalf("pause is not running:\n%s", out)
	}
	c.Run("tasks", "kill", "-s", "SIGTERM", "sw-pause")
	livetest.Eventually(t, 10*time.Second, 100*time.Millisecond, "pause to stop on SIGTERM", func() bool {
		out, _ := c.Run("tasks", "ls")
		return strings.Contains(out, "STOPPED")
	})
	if out, err := c.Run("tasks", "delete", "sw-pause"); err != nil {
		t.Errorf("pause exited with an error after SIGTERM: %v %s", err, out)
	}
	c.Run("containers", "delete", "sw-pause")
}

func TestToolLayer(t *testing.T) {
	layer, err := ToolLayer("cachetool", []byte("#!ELF"))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(layer))
	var got []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %o", h.Name, h.Mode))
		if h.Name == "usr/local/bin/cachetool" {
			b, _ := io.ReadAll(tr)
			if string(b) != "#!ELF" {
				t.Errorf("the program's bytes are %q", b)
			}
		}
	}
	if want := "usr/local/ 755,usr/local/bin/ 755,usr/local/bin/cachetool 755"; strings.Join(got, ",") != want {
		t.Errorf("layer entries %v, want %s", got, want)
	}
}
