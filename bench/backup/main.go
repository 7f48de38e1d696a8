// Command backup measures `socialweb cluster backup` and `cluster restore` of a tenant
// holding many objects: one daemon, one tenant filled with -objects ConfigMaps, then
// backup (while it serves), delete, and restore until it is Ready again, with the
// objects counted back. No node image is needed: the tenant stays at zero nodes. Its
// daemon uses node networks 171-179, apart from the other benches' 180-189.
//
//	go run ./bench/backup -bin bin/socialweb [-objects 10000] [-rounds 3]
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/socialweb-computer/socialweb/bench/internal/benchd"
)

func main() {
	bin := flag.String("bin", "bin/socialweb", "the socialweb binary")
	objects := flag.Int("objects", 10000, "ConfigMaps in the tenant")
	rounds := flag.Int("rounds", 3, "backup/delete/restore rounds")
	flag.Parse()
	d, err := benchd.Start(*bin, "171-179")
	if err != nil {
		log.Fatal(err)
	}
	cli, state := d.CLI, d.State
	stop := func() {
		_, _ = cli("cluster", "delete", "bench", "--wait")
		d.Stop()
	}
	defer stop()
	// Interrupted: the daemon and its tenant go too.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sigs
		stop()
		os.Exit(1)
	}()
	fatalf := func(format string, args ...any) {
		stop()
		log.Fatalf(format, args...)
	}
	if out, err := cli("cluster", "create", "bench", "--wait"); err != nil {
		fatalf("cluster create: %v\n%s", err, out)
	}
	t0 := time.Now()
	fill(fatalf, tenant(fatalf, cli), *objects)
	fmt.Fprintf(os.Stderr, "wrote %d ConfigMaps in %.1fs\n", *objects, time.Since(t0).Seconds())

	file := filepath.Join(state, "bench.swbackup")
	var backups, restores []time.Duration
	var size int64
	for r := 1; r <= *rounds; r++ {
		_ = os.Remove(file)
		t0 := time.Now()
		if out, err := cli("cluster", "backup", "bench", "--out", file); err != nil {
			fatalf("cluster backup: %v\n%s", err, out)
		}
		backups = append(backups, time.Since(t0))
		fi, err := os.Stat(file)
		if err != nil {
			fatalf("%v", err)
		}
		size = fi.Size()
		if out, err := cli("cluster", "delete", "bench", "--wait"); err != nil {
			fatalf("cluster delete: %v\n%s", err, out)
		}
		t0 = time.Now()
		if out, err := cli("cluster", "restore", file); err != nil { // --wait is the default
			fatalf("cluster restore: %v\n%s", err, out)
		}
		restores = append(restores, time.Since(t0))
		// The namespace's kube-root-ca.crt is not one of ours.
		cms, err := tenant(fatalf, cli).CoreV1().ConfigMaps("bench").List(context.Background(), metav1.ListOptions{LabelSelector: "bench"})
		if err != nil || len(cms.Items) != *objects {
			fatalf("after restore %d: %d ConfigMaps (%v), want %d", r, len(cms.Items), err, *objects)
		}
		fmt.Fprintf(os.Stderr, "round %d: backup %.2fs (%.1f MiB), restore to Ready %.2fs, %d ConfigMaps back\n", r, backups[r-1].Seconds(), float64(size)/(1<<20), restores[r-1].Seconds(), len(cms.Items))
	}
	fmt.Printf("| objects | file MiB | backup median | max | restore to Ready median | max | rounds |\n|---|---|---|---|---|---|---|\n")
	fmt.Printf("| %d ConfigMaps | %.1f | %.2f s | %.2f s | %.2f s | %.2f s | %d |\n", *objects, float64(size)/(1<<20),
		median(backups), maxOf(backups), median(restores), maxOf(restores), *rounds)
}

// tenant is a client of the bench cluster with its admin kubeconfig.
func tenant(fatalf func(string, ...any), cli func(...string) (string, error)) kubernetes.Interface {
	kc, err := cli("cluster", "kubeconfig", "bench")
	if err != nil {
		fatalf("cluster kubeconfig: %v\n%s", err, kc)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(kc))
	if err != nil {
		fatalf("%v", err)
	}
	cfg.QPS, cfg.Burst = 500, 1000
	return kubernetes.NewForConfigOrDie(cfg)
}

// fill writes n ConfigMaps of 1 KiB of random letters each, 8 writers at a time.
func fill(fatalf func(string, ...any), k kubernetes.Interface, n int) {
	ctx := context.Background()
	if _, err := k.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}, metav1.CreateOptions{}); err != nil {
		fatalf("%v", err)
	}
	next := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for range 8 {
		wg.Go(func() {
			for i := range next {
				// Random letters each: the file compresses as real data would, not as one repeated value.
				payload := make([]byte, 1024)
				for j := range payload {
					payload[j] = byte('a' + rand.IntN(26))
				}
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%05d", i), Labels: map[string]string{"bench": "1"}}, Data: map[string]string{"payload": string(payload)}}
				if _, err := k.CoreV1().ConfigMaps("bench").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		fatalf("writing ConfigMaps: %v", firstErr)
	}
}

func median(ds []time.Duration) float64 {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2].Seconds()
}

func maxOf(ds []time.Duration) float64 {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m.Seconds()
}
