package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
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

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/images"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/pullevents"
)

// TestPullThroughAnyRegistry: images nobody pushed run on microVM nodes, pulled through
// the host's cache from real registries (Debian's docker-registry, in network
// namespaces, TLS from a test CA; one anonymous, one with htpasswd auth), mapped in as
// upstream.test and private.test by --registry-mirror.
//
//  1. Tenant a's Pod of upstream.test/team/hello:1 runs from zero nodes.
//  2. Tenant a's Pod of private.test/team/secret:1 with an imagePullSecret runs.
//  3. Tenant b's Pod of the public image runs on b's own node, and upstream logs no
//     request for it: the second node's pull came from the cache.
//  4. Tenant b's Pod of the private image, without credentials, gets an Event saying it
//     is not allowed, and never runs, though the image is on the host.
//  5. The layer share every node reads holds the public image's layer, not the private
//     one's: on the host, and as a privileged Pod of tenant b lists it.
//  6. The quota counts what a cluster brought into the cache: a is charged for the
//     public image its node fetched; b, whose node got it from the cache, nothing. Restarted
//     with a's charge as --image-cluster-quota, the charges are as they were; a's Pod of
//     a public image not stored gets an Event saying over quota, and a's Pod of the
//     stored image (pull policy Always) runs.
//  7. Upstream stopped: a's new Pod of the cached image (pull policy Always) runs; a Pod
//     of an uncached image gets an Event saying upstream could not be reached, in 30 s.
func TestPullThroughAnyRegistry(t *testing.T) {
	img := nodeImage(t)
	pub := livetest.StartUpstream(t, livetest.UpstreamOptions{})
	priv := livetest.StartUpstream(t, livetest.UpstreamOptions{Auth: true})
	ctx := ctxT(t, 30*time.Minute)
	hello, token := testImage(t, ctx, "hello")
	secret, secretToken := testImage(t, ctx, "secret")
	if _, err := pub.Push(ctx, hello, "team/hello:1"); err != nil {
		t.Fatal(err)
	}
	if _, err := priv.Push(ctx, secret, "team/secret:1"); err != nil {
		t.Fatal(err)
	}

	metrics := fmt.Sprintf("127.0.0.1:%d", livetest.FreePort(t))
	d := newDaemon(t, 2, "--node-image", img, "--default-node-disk", "3Gi", "--metrics-address", metrics,
		"--registry-mirror", "upstream.test=https://"+pub.Addr+",private.test=https://"+priv.Addr,
		"--registry-ca", pub.CAFile+","+priv.CAFile, "--registry-tag-ttl", "1h")
	d.start()
	d.mustCLI("cluster", "create", "a", "--wait", "--max-nodes", "1", "--hold", "10m")
	d.mustCLI("cluster", "create", "b", "--wait", "--max-nodes", "1", "--hold", "10m")
	_, ka := d.tenant("a")
	_, kb := d.tenant("b")

	// 1. A public image nobody pushed, from zero nodes.
	runPod(t, ctx, ka, pullPod("public", "upstream.test/team/hello:1", ""), token)
	manifests, blobs := pub.Requests("GET", "/team/hello/manifests/"), pub.Requests("GET", "/team/hello/blobs/")
	if manifests == 0 || blobs == 0 {
		t.Fatalf("step 1: upstream logged %d manifest and %d blob GETs for the first pull; want some\n%s", manifests, blobs, tail(pub.Log(), 20))
	}
	t.Logf("step 1: first pull: upstream logged %d manifest and %d blob GETs", manifests, blobs)

	// 2. A private image with the tenant's credentials.
	auth := base64.StdEncoding.EncodeToString([]byte(priv.User + ":" + priv.Password))
	cfg, _ := json.Marshal(map[string]any{"auths": map[string]any{"private.test": map[string]string{"auth": auth}}})
	if _, err := ka.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pull"}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: cfg}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runPod(t, ctx, ka, pullPod("private", "private.test/team/secret:1", "pull"), secretToken)

	// 3. The public image on another tenant's node: from the cache.
	runPod(t, ctx, kb, pullPod("public", "upstream.test/team/hello:1", ""), token)
	if m, b := pub.Requests("GET", "/team/hello/manifests/"), pub.Requests("GET", "/team/hello/blobs/"); m != manifests || b != blobs {
		t.Errorf("step 3: the second node's pull reached upstream: %d manifest and %d blob GETs in all, want still %d and %d", m, b, manifests, blobs)
	}

	// 4. The private image in tenant b, without credentials.
	if _, err := kb.CoreV1().Pods("default").Create(ctx, pullPod("steal", "private.test/team/secret:1", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ev := waitEvent(t, ctx, kb, "steal", "ImageNotAllowed", 3*time.Minute)
	if !strings.Contains(ev.Message, "imagePullSecret") {
		t.Errorf("step 4: event %q does not say what would do (an imagePullSecret)", ev.Message)
	}
	if p, err := kb.CoreV1().Pods("default").Get(ctx, "steal", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodPending {
		t.Errorf("step 4: tenant b's Pod of a's private image is %v (%v), want Pending", p.Status.Phase, err)
	}

	// 5. The layer share (virtio-fs, every node of every cluster) holds the layers of
	// images every cluster may pull: the public image's own layer, never the private one's.
	secretLayer, helloLayer := lastLayer(t, secret), lastLayer(t, hello)
	livetest.Eventually(t, 2*time.Minute, time.Second, "the public image's layer unpacked on the host", func() bool {
		_, err := os.Stat(filepath.Join(d.stateDir, "layers", "sha256", helloLayer))
		return err == nil
	})
	if _, err := os.Stat(filepath.Join(d.stateDir, "layers", "sha256", secretLayer)); err == nil {
		t.Errorf("step 5: the private image's layer %s is in the layer share", secretLayer)
	}
	privileged := true
	look := pullPod("look", "busybox:stable", "")
	look.Spec.Containers[0].Command = []string{"sh", "-c", "ls /share/sha256; test -d /share/sha256/" + helloLayer + " && echo public-present; test -e /share/sha256/" + secretLayer + " && echo private-present; true"}
	look.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &privileged}
	look.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "share", MountPath: "/share"}}
	look.Spec.Volumes = []corev1.Volume{{Name: "share", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/run/socialweb/layers"}}}}
	listing := runPodOutput(t, ctx, kb, look)
	if strings.Contains(listing, secretLayer) || strings.Contains(listing, "private-present") || !strings.Contains(listing, "public-present") {
		t.Errorf("step 5: tenant b's privileged Pod lists the layer share as\n%s\nwant %s (public) and not %s (a's private image)", listing, helloLayer, secretLayer)
	}

	// 6. The quota.
	charged, err := registryCharges(metrics)
	if err != nil {
		t.Fatal(err)
	}
	if charged["a"] <= 0 || charged["b"] != 0 {
		t.Errorf("step 6: socialweb_registry_cluster_bytes is %v; want a charged for what its node fetched, b for nothing", charged)
	}
	fresh, _ := testImage(t, ctx, "fresh")
	if _, err := pub.Push(ctx, fresh, "team/fresh:1"); err != nil {
		t.Fatal(err)
	}
	d.stop(syscall.SIGTERM)
	d.extra = append(d.extra, "--image-cluster-quota", strconv.FormatInt(charged["a"], 10))
	d.start()
	d.waitPhase("a", v1.PhaseReady, 3*time.Minute)
	livetest.Eventually(t, time.Minute, time.Second, "a's charge read back after the restart", func() bool {
		again, err := registryCharges(metrics)
		if err != nil {
			return false // the metrics listener starts after the management API
		}
		if again["a"] != charged["a"] {
			t.Fatalf("step 6: after a restart a is charged %d bytes, before it %d", again["a"], charged["a"])
		}
		return true
	})
	if _, err := ka.CoreV1().Pods("default").Create(ctx, pullPod("fresh", "upstream.test/team/fresh:1", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ev = waitEvent(t, ctx, ka, "fresh", "OverQuota", 3*time.Minute)
	if !strings.Contains(ev.Message, "--image-cluster-quota") || !strings.Contains(ev.Message, "image gc") {
		t.Errorf("step 6: event %q does not say what would do (--image-cluster-quota, image gc)", ev.Message)
	}
	stored := pullPod("stored", "upstream.test/team/hello:1", "")
	stored.Spec.Containers[0].ImagePullPolicy = corev1.PullAlways
	runPod(t, ctx, ka, stored, token)

	// 7. Upstream down.
	pub.Stop()
	cached := pullPod("cached", "upstream.test/team/hello:1", "")
	cached.Spec.Containers[0].ImagePullPolicy = corev1.PullAlways
	runPod(t, ctx, ka, cached, token)
	t0 := time.Now()
	if _, err := ka.CoreV1().Pods("default").Create(ctx, pullPod("uncached", "upstream.test/team/never:1", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ev = waitEvent(t, ctx, ka, "uncached", "UpstreamUnreachable", 30*time.Second)
	t.Logf("step 7: %s %q %s after the Pod was created", ev.Reason, ev.Message, time.Since(t0).Round(time.Millisecond))
}

// registryCharges is socialweb_registry_cluster_bytes by cluster, scraped from addr.
func registryCharges(addr string) (map[string]int64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", addr, err)
	}
	out := map[string]int64{}
	for _, l := range strings.Split(string(body), "\n") {
		rest, ok := strings.CutPrefix(l, `socialweb_registry_cluster_bytes{cluster="`)
		if !ok {
			continue
		}
		cluster, value, ok := strings.Cut(rest, `"} `)
		if !ok {
			return nil, fmt.Errorf("metric line %q", l)
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", l, err)
		}
		out[cluster] = int64(f)
	}
	return out, nil
}

func pullPod(name, image, secret string) *corev1.Pod {
	grace := int64(1)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "main", Image: image, Command: []string{"cat", "/token"}}},
		},
	}
	if secret != "" {
		p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: secret}}
	}
	return p
}

// runPod creates p and waits for it to succeed printing want.
func runPod(t *testing.T, ctx context.Context, k kubernetes.Interface, p *corev1.Pod, want string) {
	t.Helper()
	if got := runPodOutput(t, ctx, k, p); strings.TrimSpace(got) != want {
		t.Fatalf("pod %s printed %q, want %q: not the image's content", p.Name, got, want)
	}
}

// runPodOutput creates p, waits for it to succeed and returns what it printed.
func runPodOutput(t *testing.T, ctx context.Context, k kubernetes.Interface, p *corev1.Pod) string {
	t.Helper()
	t0 := time.Now()
	if _, err := k.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var last *corev1.Pod
	livetest.Eventually(t, 8*time.Minute, 2*time.Second, "pod "+p.Name+" ("+p.Spec.Containers[0].Image+") to succeed", func() bool {
		got, err := k.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		last = got
		if got.Status.Phase == corev1.PodFailed {
			t.Fatalf("pod %s failed: %+v", p.Name, got.Status)
		}
		return got.Status.Phase == corev1.PodSucceeded
	})
	_ = last
	logs, err := k.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("logs of pod %s: %v", p.Name, err)
	}
	t.Logf("pod %s (%s) ran in %s", p.Name, p.Spec.Containers[0].Image, time.Since(t0).Round(time.Millisecond))
	return string(logs)
}

// lastLayer is the hex digest of img's last layer (the one testImage added).
func lastLayer(t *testing.T, img ggcr.Image) string {
	t.Helper()
	ls, err := img.Layers()
	if err != nil || len(ls) == 0 {
		t.Fatalf("layers: %v", err)
	}
	d, err := ls[len(ls)-1].Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.Hex
}

// waitEvent waits for a socialweb-registry Event of reason on pod.
func waitEvent(t *testing.T, ctx context.Context, k kubernetes.Interface, pod, reason string, within time.Duration) corev1.Event {
	t.Helper()
	var found corev1.Event
	livetest.Eventually(t, within, time.Second, fmt.Sprintf("a %s event on pod %s", reason, pod), func() bool {
		evs, err := k.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Source.Component == pullevents.Component && e.Reason == reason {
				found = e
				return true
			}
		}
		return false
	})
	return found
}

// testImage is the locally built busybox image with a layer of its own: /token, a
// value no other image holds, so a Pod that prints it ran this image.
func testImage(t *testing.T, ctx context.Context, what string) (ggcr.Image, string) {
	t.Helper()
	base := busyboxImage(t, ctx)
	token := fmt.Sprintf("%s-%d", what, time.Now().UnixNano())
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "token", Mode: 0o644, Size: int64(len(token)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)})
	tw.Write([]byte(token))
	tw.Close()
	out, err := mutate.AppendLayers(base, static.NewLayer(buf.Bytes(), types.OCIUncompressedLayer))
	if err != nil {
		t.Fatal(err)
	}
	return out, token
}

// busyboxImage is the busybox image socialweb builds from Debian's busybox-static, as a
// base to add test layers to.
func busyboxImage(t *testing.T, ctx context.Context) ggcr.Image {
	t.Helper()
	tarPath, _, err := images.Build(ctx, images.Busybox, images.Options{})
	if err != nil {
		t.Fatalf("building busybox: %v", err)
	}
	dir := t.TempDir()
	if err := applyLayer(tarPath, dir); err != nil { // an OCI layout tar: plain files
		t.Fatal(err)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) == 0 {
		t.Fatalf("busybox layout: %v", err)
	}
	base, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return base
}
