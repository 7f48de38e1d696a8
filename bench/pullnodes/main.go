// Command pullnodes measures the host's pull-through cache on real microVM nodes (issue
// 37's "Measure"), side by side in one run against one daemon: an image of -size MiB
// (busybox and -size MiB of random, incompressible data in layers of at most 256 MiB,
// uncompressed, as images.Large is) that nobody pushed, served by a real upstream
// registry (Debian's docker-registry in a network namespace, behind TLS from a CA made
// for the run, mapped in as upstream.test by serve's --registry-mirror and
// --registry-ca, as TestPullThroughAnyRegistry does), against images.Large of the same
// size pushed with `socialweb image push`.
//
//  1. first: a Pod of upstream.test/bench/big:1 on a new cluster at zero nodes, Pod
//     created -> Running. The node's containerd pulls through the cache (the host fetches
//     from upstream as the node reads) and unpacks in the guest; the host then unpacks the
//     layers into the layer share, which the bench waits for before going on.
//  2. pushed: a Pod of images.Large(-size), pushed beforehand (its layers unpacked into
//     the layer share at push time), on another new cluster at zero nodes.
//  3. hit: a Pod of upstream.test/bench/big:1 again, on a third new cluster at zero nodes
//     (a second node of another tenant): from the cache and the layer share; the upstream
//     registry's access log must show no blob GET meanwhile.
//  4. with -nodes N > 1: N Pods of upstream.test/bench/big:2 (another never-pulled image of
//     the same size) on a new cluster, each on its own node, all created at once: N
//     Pending -> N Running, and the bytes that crossed the upstream link.
//
// Each step's cluster is deleted (its node VM gone) before the next starts. For each
// step it prints Pod created -> Running, the kubelet's image pull (its Pulled event),
// the upstream registry's blob and manifest GETs and the bytes it sent (its access log)
// and the bytes the host received on the upstream's veth, and the ratios first/pushed
// and hit/pushed. Everything it starts (daemon, node VMs, networks, the registry and its
// network namespace) is removed at the end, also after a failure or an interrupt.
//
// Root, docker-registry (Debian package), a node image (socialweb image build --ensure):
//
//	go run ./bench/pullnodes -bin bin/socialweb -image DIR [-size 1024] [-nodes 1] [-memory 1Gi] [-disk 4Gi] [-build-only]
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	ggcr "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/socialweb-computer/socialweb/bench/internal/benchd"
	"github.com/socialweb-computer/socialweb/internal/images"
	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// layerMiB is the data layers' size, as images.Large's.
const layerMiB = 256

type options struct {
	bin, image, memory, disk string
	sizeMiB, nodes, cpus     int
	timeout                  time.Duration
	keepLog, buildOnly       bool
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin/socialweb", "the socialweb binary")
	flag.StringVar(&o.image, "image", "", "node image directory (`socialweb image build --ensure` prints it)")
	flag.IntVar(&o.sizeMiB, "size", 1024, "image size in MiB (data; busybox comes on top)")
	flag.IntVar(&o.nodes, "nodes", 1, "step 4: nodes starting at once on a never-pulled image, for the bytes over the upstream link (1: no step 4; step 1 is the one-node figure)")
	flag.IntVar(&o.cpus, "cpus", 1, "node vCPUs")
	flag.StringVar(&o.memory, "memory", "1Gi", "node memory")
	flag.StringVar(&o.disk, "disk", "4Gi", "node container-storage disk (the daemon's --default-node-disk; the first pull unpacks the image in the guest)")
	flag.DurationVar(&o.timeout, "timeout", 20*time.Minute, "how long a step may wait for its Pods to run")
	flag.BoolVar(&o.keepLog, "keep-log", false, "keep the daemon's log (printed where) also after a successful run")
	flag.BoolVar(&o.buildOnly, "build-only", false, "build the images (cached: images.Large, busybox) and quit: starts nothing")
	flag.Parse()
	if o.image == "" {
		log.Fatal("-image DIR is required: `socialweb image build --ensure` prints it")
	}
	if o.nodes < 1 || o.sizeMiB < 1 {
		log.Fatal("-nodes and -size must be at least 1")
	}
	os.Exit(run(o))
}

// run is the bench; everything it starts is registered with t and removed when it
// returns, whether it ends well, by t.Fatal (a panic recovered here) or by an interrupt.
func run(o options) (code int) {
	t := &tb{}
	defer t.cleanup()
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(fatal)
			if !ok {
				panic(r)
			}
			log.Printf("FAILED: %s", f)
			code = 1
		}
	}()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	started := time.Now()
	load0 := loadavg()

	// The images first (CPU, not measured).
	t0 := time.Now()
	big1, err := upstreamImage(ctx, t.TempDir(), o.sizeMiB, 1)
	if err != nil {
		t.Fatalf("the upstream image: %v", err)
	}
	var big2 ggcr.Image
	if o.nodes > 1 {
		if big2, err = upstreamImage(ctx, t.TempDir(), o.sizeMiB, 2); err != nil {
			t.Fatalf("the second upstream image: %v", err)
		}
	}
	largeTar, _, err := images.Large(ctx, o.sizeMiB, images.Options{})
	if err != nil {
		t.Fatalf("images.Large(%d): %v", o.sizeMiB, err)
	}
	log.Printf("images built in %s", time.Since(t0).Round(time.Millisecond))
	if o.buildOnly {
		return 0
	}

	up := livetest.StartUpstream(t, livetest.UpstreamOptions{})
	veth, err := upstreamVeth(up.Addr)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t0 = time.Now()
	if _, err := up.Push(ctx, big1, "bench/big:1"); err != nil {
		t.Fatalf("%v", err)
	}
	if big2 != nil {
		if _, err := up.Push(ctx, big2, "bench/big:2"); err != nil {
			t.Fatalf("%v", err)
		}
	}
	log.Printf("pushed upstream in %s", time.Since(t0).Round(time.Millisecond))

	d, err := benchd.Start(o.bin, "180-189", "--node-image", o.image, "--default-node-disk", o.disk,
		"--registry-mirror", "upstream.test=https://"+up.Addr, "--registry-ca", up.CAFile, "--registry-tag-ttl", "1h")
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		d.Stop() // the daemon, its node VMs and networks (socialweb down), its state dir
		if code == 0 && !o.keepLog {
			os.Remove(d.Log)
		} else {
			log.Printf("daemon log: %s", d.Log)
		}
	})
	t.Cleanup(func() {
		// Belt and braces: the nodes of every step's cluster, while the daemon still runs.
		for _, c := range []string{"first", "pushed", "hit", "many"} {
			d.CLI("cluster", "delete", c, "--wait")
		}
	})

	snap := func() counters {
		return counters{blobs: up.Requests("GET", "/blobs/"), manifests: up.Requests("GET", "/manifests/"), sent: up.SentBytes(), link: rxBytes(veth)}
	}
	var rows []row
	// measure runs pods Pods of image on a new cluster at zero nodes; then, before the
	// cluster goes, after (if not nil).
	measure := func(what, cluster, image string, pods int, after func()) row {
		if out, err := d.CLI("cluster", "create", cluster, "--wait", "--max-nodes", strconv.Itoa(pods), "--hold", "10m",
			"--node-cpus", strconv.Itoa(o.cpus), "--node-memory", o.memory); err != nil {
			t.Fatalf("cluster create %s: %v\n%s", cluster, err, out)
		}
		kc, err := d.CLI("cluster", "kubeconfig", cluster)
		if err != nil {
			t.Fatalf("cluster kubeconfig %s: %v\n%s", cluster, err, kc)
		}
		cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(kc))
		if err != nil {
			t.Fatalf("%v", err)
		}
		k := kubernetes.NewForConfigOrDie(cfg)
		c0 := snap()
		running, pulls, nodes, err := runPods(ctx, k, cluster, image, pods, o.timeout)
		if err != nil {
			t.Fatalf("step %s: %v (daemon log %s)", what, err, d.Log)
		}
		r := row{what: what, image: image, pods: pods, running: running, pulls: pulls, nodes: nodes, c: snap().minus(c0)}
		log.Printf("%s: %d Pod(s) running %s after creation; kubelet pulls %v; upstream %+v", what, pods, running.Round(time.Millisecond), pulls, r.c)
		if after != nil {
			after()
		}
		if out, err := d.CLI("cluster", "delete", cluster, "--wait", "--timeout", "5m"); err != nil {
			t.Fatalf("cluster delete %s: %v\n%s", cluster, err, out)
		}
		return r
	}

	// 1. A never-pulled upstream image, from zero nodes.
	// The host unpacks the image's layers into the layer share once the node has fetched
	// them all; the next nodes read them there. Wait for that (from the Pod running, its
	// node still up) before measuring anything else.
	var shareWait time.Duration
	first := measure("1. first pull through the cache", "first", "upstream.test/bench/big:1", 1, func() {
		var err error
		shareWait, err = waitShare(ctx, filepath.Join(d.State, "layers", "sha256"), big1, (o.sizeMiB+layerMiB-1)/layerMiB, 10*time.Minute)
		if err != nil {
			t.Fatalf("after step 1: %v", err)
		}
		log.Printf("the layer share had the upstream image's data layers %s after step 1's Pod ran", shareWait.Round(time.Millisecond))
	})
	rows = append(rows, first)
	if first.c.blobs == 0 {
		t.Fatalf("step 1: upstream logged no blob GET: the image did not come through the cache")
	}

	// 2. The same-size image pushed on the host.
	t0 = time.Now()
	if out, err := d.CLI("image", "push", largeTar); err != nil {
		t.Fatalf("image push: %v\n%s", err, out)
	}
	pushTook := time.Since(t0)
	pushed := measure("2. pushed with `image push`", "pushed", images.LargeRef(o.sizeMiB), 1, nil)
	rows = append(rows, pushed)

	// 3. The upstream image on another tenant's fresh node: a cache hit.
	hit := measure("3. second node, cache hit", "hit", "upstream.test/bench/big:1", 1, nil)
	rows = append(rows, hit)
	if hit.c.blobs != 0 {
		t.Errorf("step 3: upstream logged %d blob GETs: the second node's pull was no cache hit", hit.c.blobs)
	}

	// 4. N nodes at once on another never-pulled image.
	if o.nodes > 1 {
		rows = append(rows, measure(fmt.Sprintf("4. %d nodes at once, never pulled", o.nodes), "many", "upstream.test/bench/big:2", o.nodes, nil))
	}

	rev, _ := exec.Command(o.bin, "--version").CombinedOutput()
	fmt.Printf("\n%s .. %s UTC; load average before %s, after %s; %s; %d MiB image (+busybox), node %d vCPU / %s, disk %s\n\n",
		started.UTC().Format("2006-01-02 15:04:05"), time.Now().UTC().Format("15:04:05"), load0, loadavg(), strings.TrimSpace(firstLine(string(rev))),
		o.sizeMiB, o.cpus, o.memory, o.disk)
	fmt.Println("| step | Pods | Pod created -> Running | kubelet image pull | upstream blob / manifest GETs | upstream sent (access log) | upstream link (veth rx) |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Printf("| %s | %d | %.1f s | %s | %d / %d | %.1f MiB | %.1f MiB |\n", r.what, r.pods, r.running.Seconds(), r.pullCell(),
			r.c.blobs, r.c.manifests, float64(r.c.sent)/(1<<20), float64(r.c.link)/(1<<20))
	}
	fmt.Printf("\nfirst / pushed = %.2fx; hit / pushed = %.2fx (Pod created -> Running)\n", first.running.Seconds()/pushed.running.Seconds(), hit.running.Seconds()/pushed.running.Seconds())
	share := fmt.Sprintf("%.1f s after step 1's Pod ran", shareWait.Seconds())
	if shareWait < 300*time.Millisecond {
		share = "already when step 1's Pod ran"
	}
	fmt.Printf("the host's layer share had the upstream image's data layers %s; `image push` of the pushed image (with its unpack on the host) took %.1f s\n",
		share, pushTook.Seconds())
	if t.failed {
		return 1
	}
	return 0
}

type row struct {
	what, image string
	pods        int
	running     time.Duration // the first Pod created -> the last Running
	pulls       []float64     // the kubelet's image pull of each Pod, s (-1: no Pulled event)
	nodes       []string
	c           counters
}

func (r row) pullCell() string {
	var s []string
	for _, p := range r.pulls {
		if p < 0 {
			s = append(s, "-")
		} else {
			s = append(s, fmt.Sprintf("%.1f s", p))
		}
	}
	return strings.Join(s, ", ")
}

// counters are the upstream's access-log counts and its link's bytes.
type counters struct {
	blobs, manifests int
	sent, link       int64
}

func (c counters) minus(o counters) counters {
	return counters{c.blobs - o.blobs, c.manifests - o.manifests, c.sent - o.sent, c.link - o.link}
}

// runPods creates n Pods of image at once, each on its own node, and waits until all run.
func runPods(ctx context.Context, k kubernetes.Interface, label, image string, n int, timeout time.Duration) (time.Duration, []float64, []string, error) {
	grace := int64(0)
	labels := map[string]string{"bench": label}
	t0 := time.Now()
	for i := range n {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", label, i), Namespace: "default", Labels: labels},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &grace,
				Containers: []corev1.Container{{Name: "main", Image: image, Command: []string{"sleep", "3600"}}},
				Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
					RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
						LabelSelector: &metav1.LabelSelector{MatchLabels: labels}, TopologyKey: corev1.LabelHostname}}}},
			},
		}
		if _, err := k.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return 0, nil, nil, err
		}
	}
	running := map[string]time.Duration{}
	var last time.Duration
	for len(running) < n {
		if err := ctx.Err(); err != nil {
			return 0, nil, nil, err
		}
		if time.Since(t0) > timeout {
			return 0, nil, nil, fmt.Errorf("%d of %d Pods running after %s (-timeout)", len(running), n, timeout)
		}
		pl, err := k.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "bench=" + label})
		now := time.Since(t0)
		if err == nil {
			for _, p := range pl.Items {
				if p.Status.Phase == corev1.PodFailed {
					return 0, nil, nil, fmt.Errorf("pod %s failed: %+v", p.Name, p.Status)
				}
				if _, seen := running[p.Name]; !seen && p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Running != nil {
					running[p.Name] = now
					last = max(last, now)
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	pulls := make([]float64, n)
	nodes := make([]string, n)
	for i := range n {
		name := fmt.Sprintf("%s-%d", label, i)
		pulls[i] = pulledSeconds(ctx, k, name)
		if p, err := k.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{}); err == nil {
			nodes[i] = p.Spec.NodeName
		}
	}
	return last, pulls, nodes, nil
}

// pullRE matches the kubelet's Pulled event: `... in 1.234s (5.678s including waiting)`.
var pullRE = regexp.MustCompile(`Successfully pulled image .* in (\S+) \(`)

// pulledSeconds is the kubelet's image pull time for pod, from its Pulled event; -1
// when there is none (yet).
func pulledSeconds(ctx context.Context, k kubernetes.Interface, pod string) float64 {
	for range 10 {
		el, err := k.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod + ",reason=Pulled"})
		if err == nil {
			for _, e := range el.Items {
				if m := pullRE.FindStringSubmatch(e.Message); m != nil {
					if d, err := time.ParseDuration(m[1]); err == nil {
						return d.Seconds()
					}
				}
			}
		}
		time.Sleep(time.Second)
	}
	return -1
}

// upstreamImage is busybox (as socialweb builds it) and sizeMiB MiB of random data in
// uncompressed layers of at most layerMiB, one file data/part-NNN each: images.Large's
// shape, with other bytes (seeded by the clock and which), so no layer is one the host
// has.
func upstreamImage(ctx context.Context, dir string, sizeMiB int, which uint64) (ggcr.Image, error) {
	base, err := busybox(ctx, dir)
	if err != nil {
		return nil, err
	}
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[0:], uint64(time.Now().UnixNano()))
	binary.LittleEndian.PutUint64(seed[8:], which)
	copy(seed[16:], "pullnodes upstream")
	src := rand.NewChaCha8(seed)
	img := base
	for part, left := 0, sizeMiB; left > 0; part++ {
		n := min(left, layerMiB)
		left -= n
		var buf bytes.Buffer
		buf.Grow(n<<20 + 4096)
		tw := tar.NewWriter(&buf)
		if err := tw.WriteHeader(&tar.Header{Name: "data/", Mode: 0o755, Typeflag: tar.TypeDir, ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("data/part-%03d", part), Mode: 0o644, Size: int64(n) << 20, Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
		if _, err := io.CopyN(tw, src, int64(n)<<20); err != nil {
			return nil, err
		}
		if err := tw.Close(); err != nil {
			return nil, err
		}
		if img, err = mutate.AppendLayers(img, static.NewLayer(buf.Bytes(), types.OCIUncompressedLayer)); err != nil {
			return nil, err
		}
	}
	return img, nil
}

// busybox is the busybox image socialweb builds (Debian's busybox-static), read from the
// OCI layout tar images.Build writes, unpacked into dir (which must stay while the image
// is read).
func busybox(ctx context.Context, dir string) (ggcr.Image, error) {
	tarPath, _, err := images.Build(ctx, images.Busybox, images.Options{})
	if err != nil {
		return nil, fmt.Errorf("building busybox: %w", err)
	}
	if out, err := exec.CommandContext(ctx, "tar", "-xf", tarPath, "-C", dir).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("unpacking %s: %v\n%s", tarPath, err, out)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) == 0 {
		return nil, fmt.Errorf("busybox layout: no image (%v)", err)
	}
	return idx.Image(im.Manifests[0].Digest)
}

// waitShare waits until the layer share (dir, <state>/layers/sha256) holds img's data
// layers (its last data layers), and says how long that took.
func waitShare(ctx context.Context, dir string, img ggcr.Image, data int, within time.Duration) (time.Duration, error) {
	ls, err := img.Layers()
	if err != nil {
		return 0, err
	}
	if data > len(ls) {
		return 0, fmt.Errorf("%d layers, want at least %d data layers", len(ls), data)
	}
	var want []string
	for _, l := range ls[len(ls)-data:] {
		dg, err := l.Digest()
		if err != nil {
			return 0, err
		}
		want = append(want, dg.Hex)
	}
	t0 := time.Now()
	for {
		missing := ""
		for _, h := range want {
			if _, err := os.Stat(filepath.Join(dir, h)); err != nil {
				missing = h
				break
			}
		}
		if missing == "" {
			return time.Since(t0), nil
		}
		if time.Since(t0) > within {
			return 0, fmt.Errorf("layer %s not in the layer share %s after %s", missing, dir, within)
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// upstreamVeth is the host's end of the upstream's link: livetest's peer at 10.253.K.2
// is behind regupKh.
func upstreamVeth(addr string) (string, error) {
	var a, b, k, c, port int
	if _, err := fmt.Sscanf(addr, "%d.%d.%d.%d:%d", &a, &b, &k, &c, &port); err != nil || a != 10 || b != 253 {
		return "", fmt.Errorf("upstream address %s: not livetest's 10.253.K.2", addr)
	}
	veth := fmt.Sprintf("regup%dh", k)
	if _, err := os.Stat("/sys/class/net/" + veth); err != nil {
		return "", fmt.Errorf("the upstream's veth: %w", err)
	}
	return veth, nil
}

// rxBytes is what the host received on link.
func rxBytes(link string) int64 {
	b, _ := os.ReadFile("/sys/class/net/" + link + "/statistics/rx_bytes")
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// tb is the testing.TB livetest.StartUpstream wants, outside a test: Fatal panics with
// a fatal (run recovers it), Cleanup functions run, last first, when run returns.
type tb struct {
	testing.TB // nil: only the methods below are called (livetest's)
	cleanups   []func()
	failed     bool
}

type fatal string

func (t *tb) Helper()                         {}
func (t *tb) Name() string                    { return "pullnodes" }
func (t *tb) Log(args ...any)                 { log.Print(args...) }
func (t *tb) Logf(format string, args ...any) { log.Printf(format, args...) }
func (t *tb) Fatal(args ...any)               { panic(fatal(fmt.Sprint(args...))) }
func (t *tb) Fatalf(format string, args ...any) {
	panic(fatal(fmt.Sprintf(format, args...)))
}
func (t *tb) FailNow()         { panic(fatal("FailNow")) }
func (t *tb) Skip(args ...any) { panic(fatal("cannot run: " + fmt.Sprint(args...))) }
func (t *tb) Skipf(format string, args ...any) {
	panic(fatal("cannot run: " + fmt.Sprintf(format, args...)))
}
func (t *tb) Error(args ...any) { t.failed = true; log.Print(append([]any{"ERROR: "}, args...)...) }
func (t *tb) Errorf(format string, args ...any) {
	t.failed = true
	log.Printf("ERROR: "+format, args...)
}
func (t *tb) Failed() bool     { return t.failed }
func (t *tb) Cleanup(f func()) { t.cleanups = append(t.cleanups, f) }
func (t *tb) TempDir() string {
	d, err := os.MkdirTemp("", "pullnodes-")
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func (t *tb) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		func() {
			defer func() {
				if r := recover(); r != nil {
					log.Printf("cleanup: %v", r)
				}
			}()
			t.cleanups[i]()
		}()
	}
	t.cleanups = nil
}
