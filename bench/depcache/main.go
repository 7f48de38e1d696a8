// Command depcache measures what the build cache saves a CI-shaped job: a Go job whose
// dependencies (a module cache of several hundred MiB, fetched from the Go module proxy)
// are GitLab's `cache:`. Job 1 runs on a fresh node with no cache; job 2 on another
// fresh node (the cluster has --fresh-node-per-job) restores job 1's archive from the
// cluster's S3 bucket first. Each job Pod runs as the runner's kubernetes executor would
// use the cache: the archive is fetched and unpacked before the script, and packed and
// uploaded after it (by cachetool, the live test's stand-in for the runner's helper,
// over URLs presigned with the keys `cluster runner-credential` writes). Printed per job:
// cache restore, job script (go mod download) and cache save, from the containers'
// start and finish times.
//
// With -goproxy host the modules come instead from a module proxy on the host (the
// module cache's download directory, which is a GOPROXY, served over HTTP on a port the
// daemon opens on the cluster's gateway): a proxy on the LAN rather than the internet.
//
//	go run ./bench/depcache -bin bin/socialweb -image DIR [-goproxy URL|host]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/socialweb-computer/socialweb/bench/internal/benchd"
	"github.com/socialweb-computer/socialweb/internal/images"
	"github.com/socialweb-computer/socialweb/internal/scale"
)

// jobImage is the builder image (Debian, Go, tar) with cachetool added.
const jobImage = "socialweb.test/depcache-job:1"

// goMod is the job's project: its dependencies are the cache.
const goMod = `module example.com/job

go 1.19

require (
	github.com/aws/aws-sdk-go v1.44.334
	k8s.io/client-go v0.25.16
	github.com/prometheus/client_golang v1.14.0
	google.golang.org/api v0.114.0
)
`

func main() {
	bin := flag.String("bin", "bin/socialweb", "the socialweb binary")
	image := flag.String("image", "", "node image directory (socialweb image build --ensure)")
	goproxy := flag.String("goproxy", "https://proxy.golang.org", "GOPROXY of the job, or host: a module proxy on the host")
	flag.Parse()
	if *image == "" {
		log.Fatal("-image DIR is required: run `socialweb image build --ensure -o dir`")
	}
	ctx := context.Background()
	serveArgs := []string{"--node-image", *image, "--build-cache-budget", "4Gi"}
	proxyPort := 0
	if *goproxy == "host" {
		proxyPort = benchd.FreePort()
		if err := hostProxy(ctx, proxyPort); err != nil {
			log.Fatal(err)
		}
		serveArgs = append(serveArgs, "--gateway-tcp-allow", strconv.Itoa(proxyPort))
	}
	d, err := benchd.Start(*bin, "180-189", serveArgs...)
	if err != nil {
		log.Fatal(err)
	}
	defer d.Stop()
	cli, state := d.CLI, d.State
	fatalf := func(format string, args ...any) {
		d.Stop()
		log.Fatalf(format+" (daemon log: "+d.Log+")", args...)
	}
	waitFor := func(what string, within time.Duration, ok func() bool) {
		for end := time.Now().Add(within); !ok(); time.Sleep(time.Second) {
			if time.Now().After(end) {
				fatalf("timed out after %s waiting for %s", within, what)
			}
		}
	}

	tarPath, err := jobImageTar(ctx, state)
	if err != nil {
		fatalf("the job image: %v", err)
	}
	if out, err := cli("image", "push", tarPath); err != nil {
		fatalf("image push: %v\n%s", err, out)
	}
	if out, err := cli("cluster", "create", "deps", "--wait", "--fresh-node-per-job", "--max-nodes", "2",
		"--node-cpus", "1", "--node-memory", "2Gi", "--node-disk", "8Gi"); err != nil {
		fatalf("cluster create: %v\n%s", err, out)
	}
	credDir := filepath.Join(state, "runner")
	if out, err := cli("cluster", "runner-credential", "deps", "--out", credDir); err != nil {
		fatalf("runner-credential: %v\n%s", err, out)
	}
	get, put, err := presign(ctx, filepath.Join(credDir, "config.template.toml"))
	if err != nil {
		fatalf("presigning the cache URLs: %v", err)
	}
	if proxyPort != 0 {
		out, err := cli("cluster", "get", "deps", "-o", "json")
		if err != nil {
			fatalf("%v: %s", err, out)
		}
		var c struct{ Status struct{ Gateway string } }
		if err := json.Unmarshal([]byte(out), &c); err != nil || c.Status.Gateway == "" {
			fatalf("the cluster's gateway: %v", err)
		}
		*goproxy = fmt.Sprintf("http://%s:%d", c.Status.Gateway, proxyPort)
	}
	kc, err := cli("cluster", "kubeconfig", "deps")
	if err != nil {
		fatalf("%s", kc)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(kc))
	if err != nil {
		fatalf("%v", err)
	}
	k := kubernetes.NewForConfigOrDie(cfg)
	if _, err := k.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "project"}, Data: map[string]string{"go.mod": goMod}}, metav1.CreateOptions{}); err != nil {
		fatalf("%v", err)
	}
	type result struct {
		restore, script, save time.Duration
		node, log             string
	}
	var results []result
	for i := 1; i <= 2; i++ {
		podName := fmt.Sprintf("job%d", i)
		if _, err := k.CoreV1().Pods("default").Create(ctx, jobPod(podName, get, put, *goproxy), metav1.CreateOptions{}); err != nil {
			fatalf("%v", err)
		}
		var p *corev1.Pod
		waitFor(podName+" to finish", 60*time.Minute, func() bool {
			p, err = k.CoreV1().Pods("default").Get(ctx, podName, metav1.GetOptions{})
			return err == nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed)
		})
		var logs strings.Builder
		for _, c := range []string{"restore", "script", "save"} {
			b, _ := k.CoreV1().Pods("default").GetLogs(podName, &corev1.PodLogOptions{Container: c}).DoRaw(ctx)
			fmt.Fprintf(&logs, "--- %s\n%s", c, b)
		}
		if p.Status.Phase != corev1.PodSucceeded {
			fatalf("%s failed:\n%s", podName, logs.String())
		}
		r := result{node: p.Spec.NodeName, log: logs.String()}
		for _, s := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			t := s.State.Terminated
			if t == nil {
				continue
			}
			d := t.FinishedAt.Sub(t.StartedAt.Time)
			switch s.Name {
			case "restore":
				r.restore = d
			case "script":
				r.script = d
			case "save":
				r.save = d
			}
		}
		results = append(results, r)
		fmt.Printf("job %d on %s: restore %s, script %s, save %s\n%s\n", i, r.node, r.restore, r.script, r.save, r.log)
	}
	if results[0].node == results[1].node {
		fatalf("both jobs ran on node %s: want a fresh node per job", results[0].node)
	}
	fmt.Println("\n| job | cache restore | job script (go mod download) | cache save | restore + script |")
	fmt.Println("|---|---|---|---|---|")
	for i, r := range results {
		fmt.Printf("| %d | %.0f s | %.0f s | %.0f s | %.0f s |\n", i+1, r.restore.Seconds(), r.script.Seconds(), r.save.Seconds(), (r.restore + r.script).Seconds())
	}
	a, b := results[0], results[1]
	fmt.Printf("\nscript: first / second = %.1fx; restore + script: first / second = %.1fx\n",
		a.script.Seconds()/b.script.Seconds(), (a.restore+a.script).Seconds()/(b.restore+b.script).Seconds())
}

// jobPod is one CI job: restore the cache, run the script, save the cache.
func jobPod(name, get, put, goproxy string) *corev1.Pod {
	grace := int64(1)
	mounts := []corev1.VolumeMount{{Name: "cache", MountPath: "/cache"}, {Name: "project", MountPath: "/project"}}
	c := func(name, script string) corev1.Container {
		return corev1.Container{Name: name, Image: jobImage, Command: []string{"sh", "-ec", script}, VolumeMounts: mounts,
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("600m")}}}
	}
	return &corev1.Pod{
		// Labelled as a CI job (GitLab Runner's own Pods are known by theirs): with
		// --fresh-node-per-job its node takes nothing after it.
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{scale.LabelCIJob: "true"}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			Volumes: []corev1.Volume{
				{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "project", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
					LocalObjectReference: corev1.LocalObjectReference{Name: "project"}}}},
			},
			InitContainers: []corev1.Container{
				c("restore", fmt.Sprintf(`if cachetool get '%s' /cache/cache.tar; then
  tar -xf /cache/cache.tar -C /cache && rm /cache/cache.tar && du -sh /cache/gomod
else echo "no cache yet"; rm -f /cache/cache.tar; fi`, get)),
				c("script", fmt.Sprintf(`export GOMODCACHE=/cache/gomod GOFLAGS=-modcacherw GOPROXY=%s GOSUMDB=off
mkdir -p /build && cp /project/go.mod /build/ && cd /build
go version
go mod download
du -sh /cache/gomod`, goproxy)),
			},
			Containers: []corev1.Container{c("save", fmt.Sprintf(`tar -cf /cache/cache.tar -C /cache gomod
cachetool put '%s' /cache/cache.tar`, put))},
		},
	}
}

// presign makes the cache archive's GET and PUT URLs with the keys of the runner template.
func presign(ctx context.Context, template string) (get, put string, err error) {
	var doc struct {
		Runners []struct {
			Cache struct {
				S3 struct {
					ServerAddress, AccessKey, SecretKey, BucketName, BucketLocation string
					Insecure                                                        bool
				} `toml:"s3"`
			} `toml:"cache"`
		} `toml:"runners"`
	}
	if _, err := toml.DecodeFile(template, &doc); err != nil {
		return "", "", err
	}
	if len(doc.Runners) == 0 || doc.Runners[0].Cache.S3.ServerAddress == "" {
		return "", "", fmt.Errorf("%s has no [runners.cache]: is serve's --build-cache off?", template)
	}
	s3 := doc.Runners[0].Cache.S3
	mc, err := minio.New(s3.ServerAddress, &minio.Options{
		Creds: credentials.NewStaticV4(s3.AccessKey, s3.SecretKey, ""), Secure: !s3.Insecure, Region: s3.BucketLocation})
	if err != nil {
		return "", "", err
	}
	const key = "runner/bench/project/1/default"
	g, err := mc.PresignedGetObject(ctx, s3.BucketName, key, 2*time.Hour, nil)
	if err != nil {
		return "", "", err
	}
	p, err := mc.PresignedPutObject(ctx, s3.BucketName, key, 2*time.Hour)
	if err != nil {
		return "", "", err
	}
	return g.String(), p.String(), nil
}

// jobImageTar builds the builder image (cached by fingerprint) and adds cachetool to it.
func jobImageTar(ctx context.Context, dir string) (string, error) {
	builderTar, _, err := images.Builder(ctx, images.Options{})
	if err != nil {
		return "", fmt.Errorf("the builder image: %w", err)
	}
	tool := filepath.Join(dir, "cachetool")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", tool, "./test/integration/cachetool")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building cachetool: %v\n%s", err, out)
	}
	data, err := os.ReadFile(tool)
	if err != nil {
		return "", err
	}
	layer, err := images.ToolLayer("cachetool", data)
	if err != nil {
		return "", err
	}
	// The builder is an OCI image layout in a tar: unpacked, it is a layout to read.
	layoutDir := filepath.Join(dir, "builder-layout")
	if err := os.MkdirAll(layoutDir, 0o700); err != nil {
		return "", err
	}
	if out, err := exec.CommandContext(ctx, "tar", "-xf", builderTar, "-C", layoutDir).CombinedOutput(); err != nil {
		return "", fmt.Errorf("unpacking %s: %v\n%s", builderTar, err, out)
	}
	idx, err := layout.ImageIndexFromPath(layoutDir)
	if err != nil {
		return "", fmt.Errorf("reading the builder layout: %w", err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) == 0 {
		return "", fmt.Errorf("the builder layout has no image: %v", err)
	}
	base, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		return "", fmt.Errorf("reading the builder image: %w", err)
	}
	job, err := mutate.AppendLayers(base, static.NewLayer(layer, types.OCIUncompressedLayer))
	if err != nil {
		return "", err
	}
	ref, err := name.NewTag(jobImage)
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "job.tar")
	if err := tarball.WriteToFile(out, ref, job); err != nil {
		return "", err
	}
	return out, nil
}

// hostProxy downloads the job's modules on the host and serves the module cache's
// download directory (a GOPROXY layout) on port, on every address: the daemon's
// --gateway-tcp-allow opens it to the cluster's nodes on their gateway alone.
func hostProxy(ctx context.Context, port int) error {
	dir, err := os.MkdirTemp("", "depcache-proxy-")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(goMod), 0o644); err != nil {
		return err
	}
	dl := exec.CommandContext(ctx, "go", "mod", "download")
	dl.Dir = dir
	dl.Env = append(os.Environ(), "GOMODCACHE="+filepath.Join(dir, "mod"), "GOFLAGS=-modcacherw", "GOSUMDB=off")
	if out, err := dl.CombinedOutput(); err != nil {
		return fmt.Errorf("downloading the job's modules on the host: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		return err
	}
	go http.Serve(l, http.FileServer(http.Dir(filepath.Join(dir, "mod", "cache", "download"))))
	return nil
}
