// Command podstart measures a Pod's start, created to all containers started, on each
// path the daemon gives it a node by, side by side in one run, as the daemon's own
// socialweb_pod_start_seconds histogram and the Cluster's status.podStarts count them:
//
//	warm  a node started from a warm-pool VM (serve --warm-pool 1)
//	cold  a node booted from nothing (created with the warm Pod: the pool has one VM)
//	idle  a node that was up before the Pod (a third Pod on one of those two nodes)
//
// Each round is a fresh cluster at zero nodes on one daemon: the warm and cold Pods ask
// for 600m of a 1-vCPU node each (one per node), the idle one for nothing. Before each
// round the bench waits for the pool's VM to be ready.
//
//	go run ./bench/podstart -bin bin/socialweb -image DIR [-rounds 2]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/bench/internal/benchd"
)

func main() {
	bin := flag.String("bin", "bin/socialweb", "the socialweb binary")
	image := flag.String("image", "", "node image directory (socialweb image build --ensure)")
	rounds := flag.Int("rounds", 2, "rounds, each a fresh cluster")
	flag.Parse()
	if *image == "" {
		log.Fatal("-image DIR is required: run `socialweb image build --ensure`")
	}
	metrics := fmt.Sprintf("127.0.0.1:%d", benchd.FreePort())
	d, err := benchd.Start(*bin, "180-189", "--node-image", *image, "--metrics-address", metrics, "--warm-pool", "1",
		"--default-node-cpus", "1", "--default-node-memory", "1Gi")
	if err != nil {
		log.Fatal(err)
	}
	defer d.Stop()
	cli := d.CLI
	fatalf := func(format string, args ...any) {
		d.Stop()
		log.Fatalf(format+" (daemon log: "+d.Log+")", args...)
	}
	waitFor := func(what string, within time.Duration, ok func() bool) {
		for end := time.Now().Add(within); !ok(); time.Sleep(500 * time.Millisecond) {
			if time.Now().After(end) {
				fatalf("timed out after %s waiting for %s", within, what)
			}
		}
	}

	type row struct{ warm, cold, idle time.Duration }
	var rows []row
	for r := 1; r <= *rounds; r++ {
		waitFor("a ready warm-pool VM", 10*time.Minute, func() bool { return poolReady(metrics) })
		name := fmt.Sprintf("paths%d", r)
		if out, err := cli("cluster", "create", name, "--wait", "--hold", "10m", "--max-nodes", "3",
			"--node-cpus", "1", "--node-memory", "1Gi"); err != nil {
			fatalf("cluster create: %v\n%s", err, out)
		}
		kc, err := cli("cluster", "kubeconfig", name)
		if err != nil {
			fatalf("%v", kc)
		}
		cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(kc))
		if err != nil {
			fatalf("%v", err)
		}
		k := kubernetes.NewForConfigOrDie(cfg)
		ctx := context.Background()
		run := func(names ...string) {
			for _, n := range names {
				if _, err := k.CoreV1().Pods("default").Create(ctx, pod(n, n != "idle"), metav1.CreateOptions{}); err != nil {
					fatalf("create %s: %v", n, err)
				}
			}
			waitFor(strings.Join(names, ", ")+" running", 10*time.Minute, func() bool {
				for _, n := range names {
					p, err := k.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{})
					if err != nil || p.Status.Phase != corev1.PodRunning {
						return false
					}
				}
				return true
			})
		}
		run("first", "second") // one claims the pool's VM, the other boots
		run("idle")
		var got row
		waitFor("status.podStarts with all three paths", 2*time.Minute, func() bool {
			out, err := cli("cluster", "get", name, "-o", "json")
			if err != nil {
				return false
			}
			var c v1.Cluster
			if json.Unmarshal([]byte(out), &c) != nil {
				return false
			}
			for _, s := range c.Status.PodStarts {
				switch s.Path {
				case v1.PodStartWarm:
					got.warm = s.P50.Duration
				case v1.PodStartCold:
					got.cold = s.P50.Duration
				case v1.PodStartIdle:
					got.idle = s.P50.Duration
				}
			}
			return got.warm > 0 && got.cold > 0 && got.idle > 0
		})
		rows = append(rows, got)
		fmt.Printf("round %d: idle %.1f s, warm %.1f s, cold %.1f s\n", r, got.idle.Seconds(), got.warm.Seconds(), got.cold.Seconds())
		if out, err := cli("cluster", "delete", name, "--wait"); err != nil {
			fatalf("cluster delete: %v\n%s", err, out)
		}
	}
	fmt.Println("\n| round | idle | warm | cold | cold/warm | cold/idle |")
	fmt.Println("|---|---|---|---|---|---|")
	for i, r := range rows {
		fmt.Printf("| %d | %.1f s | %.1f s | %.1f s | %.2fx | %.1fx |\n", i+1, r.idle.Seconds(), r.warm.Seconds(), r.cold.Seconds(),
			r.cold.Seconds()/r.warm.Seconds(), r.cold.Seconds()/r.idle.Seconds())
	}
}

// pod is a busybox Pod; sized, it asks for 600m, so two of them never share a 1-vCPU node.
func pod(name string, sized bool) *corev1.Pod {
	grace := int64(1)
	c := corev1.Container{Name: "c", Image: "busybox:stable", Command: []string{"sleep", "3600"}}
	if sized {
		c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("600m")}
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{c}}}
}

// poolReady reads socialweb_warm_pool_vms{state="ready"} from the daemon's metrics.
func poolReady(addr string) bool {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, `socialweb_warm_pool_vms{state="ready"}`) {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			return v >= 1
		}
	}
	return false
}
