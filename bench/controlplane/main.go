// Command controlplane measures tenant control planes side by side, in one
// run: socialweb's (one process per tenant: kine over sqlite + apiserver +
// controller-manager + scheduler) against the baseline a user would
// otherwise run (etcd + kube-apiserver + kube-controller-manager +
// kube-scheduler as separate processes, equivalent flags). For 1, 5 and 10
// tenants it reports create-to-Ready time and idle memory (PSS and RSS).
//
//	go run ./bench/controlplane -bin bin/socialweb -baseline-dir /tmp/k8sbin
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/socialweb-computer/socialweb/internal/controlplane"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
)

func main() {
	bin := flag.String("bin", "bin/socialweb", "socialweb binary")
	baseDir := flag.String("baseline-dir", "", "directory with etcd, kube-apiserver, kube-controller-manager, kube-scheduler (empty: skip the baseline)")
	counts := flag.String("tenants", "1,5,10", "tenant counts to measure")
	idle := flag.Duration("idle", 60*time.Second, "idle time before memory is read")
	flag.Parse()
	var ns []int
	for _, s := range strings.Split(*counts, ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			log.Fatalf("-tenants: %v", err)
		}
		ns = append(ns, n)
	}
	fmt.Printf("| system | tenants | create->Ready median | max | PSS/tenant MiB | RSS/tenant MiB |\n|---|---|---|---|---|---|\n")
	for _, n := range ns {
		r := measureSocialweb(*bin, n, *idle)
		r.print("socialweb (kine/sqlite, 1 process)", n)
		if *baseDir != "" {
			b := measureBaseline(*baseDir, n, *idle)
			b.print("baseline (etcd + 3 processes)", n)
			fmt.Printf("| ratio socialweb/baseline | %d | %.2f | %.2f | %.2f | %.2f |\n", n,
				r.median()/b.median(), r.max()/b.max(), r.pss/b.pss, r.rss/b.rss)
		}
	}
}

type result struct {
	ready    []float64 // seconds
	pss, rss float64   // MiB per tenant
}

func (r result) median() float64 {
	s := append([]float64(nil), r.ready...)
	sort.Float64s(s)
	return s[len(s)/2]
}
func (r result) max() float64 {
	s := append([]float64(nil), r.ready...)
	sort.Float64s(s)
	return s[len(s)-1]
}
func (r result) print(name string, n int) {
	fmt.Printf("| %s | %d | %.2fs | %.2fs | %.0f | %.0f |\n", name, n, r.median(), r.max(), r.pss, r.rss)
}

// memory reads PSS and RSS (MiB) of a process from smaps_rollup.
func memory(pid int) (pss, rss float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		log.Fatalf("reading memory of %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "Pss:":
			pss = kb / 1024
		case "Rss:":
			rss = kb / 1024
		}
	}
	return
}

func freePortBlock(n int) int {
	for lo := 30000 + os.Getpid()%5000; lo < 60000; lo += n + 7 {
		ok := true
		for p := lo; p < lo+n && ok; p++ {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				ok = false
				continue
			}
			l.Close()
		}
		if ok {
			return lo
		}
	}
	log.Fatal("no free ports")
	return 0
}

func measureSocialweb(bin string, n int, idle time.Duration) result {
	state, _ := os.MkdirTemp("", "bench-socialweb-")
	defer os.RemoveAll(state)
	lo := freePortBlock(n + 1)
	daemon := exec.Command(bin, "serve", "--state-dir", state, "--api-port", strconv.Itoa(lo+n),
		"--port-range", fmt.Sprintf("%d-%d", lo, lo+n-1), "--metrics-address", "")
	logf, _ := os.Create(filepath.Join(state, "..", filepath.Base(state)+".log"))
	daemon.Stdout, daemon.Stderr = logf, logf
	if err := daemon.Start(); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = daemon.Process.Signal(syscall.SIGTERM); _ = daemon.Wait() }()
	cli := func(args ...string) error {
		out, err := exec.Command(bin, append(args, "--state-dir", state)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	deadline := time.Now().Add(5 * time.Minute)
	for cli("cluster", "list") != nil {
		if time.Now().After(deadline) {
			log.Fatal("socialweb daemon did not start")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The daemon is up when it logs "serving": its API is installed and its
	// fresh management API has captured the datastore seed tenants start from.
	serving := func() bool {
		b, _ := os.ReadFile(logf.Name())
		seeds, _ := filepath.Glob(filepath.Join(state, "seeds", "seed-*.json"))
		return bytes.Contains(b, []byte(`"msg":"serving"`)) && len(seeds) > 0
	}
	for !serving() {
		if time.Now().After(deadline) {
			log.Fatalf("socialweb's daemon did not log \"serving\" with a datastore seed; see %s", logf.Name())
		}
		time.Sleep(200 * time.Millisecond)
	}
	var r result
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			if err := cli("cluster", "create", fmt.Sprintf("t%d", i), "--wait"); err != nil {
				log.Fatal(err)
			}
			mu.Lock()
			r.ready = append(r.ready, time.Since(start).Seconds())
			mu.Unlock()
		}()
	}
	wg.Wait()
	time.Sleep(idle)
	// Delete the clusters afterwards: their bridges and rules outlive a
	// daemon stop by design, and the state dir is thrown away.
	defer func() {
		for i := range n {
			_ = cli("cluster", "delete", fmt.Sprintf("t%d", i), "--wait")
		}
	}()
	for i := range n {
		b, err := os.ReadFile(filepath.Join(state, "clusters", fmt.Sprintf("t%d", i), "instance.json"))
		if err != nil {
			log.Fatal(err)
		}
		var rec struct{ PID int }
		_ = json.Unmarshal(b, &rec)
		p, rs := memory(rec.PID)
		r.pss += p / float64(n)
		r.rss += rs / float64(n)
	}
	return r
}

// baselineTenant is one etcd + apiserver + controller-manager + scheduler.
type baselineTenant struct{ procs []*exec.Cmd }

// stop stops the processes in reverse start order: etcd last, because an apiserver whose
// etcd is gone does not finish its graceful shutdown (this hung earlier runs). A process
// that has not exited 20 s after SIGTERM is killed.
func (t *baselineTenant) stop() {
	for i := len(t.procs) - 1; i >= 0; i-- {
		p := t.procs[i]
		_ = p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = p.Process.Kill()
			<-done
		}
	}
}

func measureBaseline(dir string, n int, idle time.Duration) result {
	work, _ := os.MkdirTemp("", "bench-baseline-")
	defer os.RemoveAll(work)
	lo := freePortBlock(3 * n)
	var r result
	var mu sync.Mutex
	var wg sync.WaitGroup
	tenants := make([]*baselineTenant, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			t, err := startBaseline(context.Background(), dir, filepath.Join(work, strconv.Itoa(i)), lo+3*i)
			if err != nil {
				log.Fatalf("baseline tenant %d: %v", i, err)
			}
			mu.Lock()
			tenants[i] = t
			r.ready = append(r.ready, time.Since(start).Seconds())
			mu.Unlock()
		}()
	}
	wg.Wait()
	defer func() {
		for _, t := range tenants {
			t.stop()
		}
	}()
	time.Sleep(idle)
	for _, t := range tenants {
		for _, p := range t.procs {
			ps, rs := memory(p.Process.Pid)
			r.pss += ps / float64(n)
			r.rss += rs / float64(n)
		}
	}
	return r
}

func runLogged(dir, name, bin string, args ...string) (*exec.Cmd, error) {
	cmd := exec.Command(bin, args...)
	f, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), "GOGC=50")
	// An interrupted benchmark leaves no baseline process behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd, cmd.Start()
}

func startBaseline(ctx context.Context, binDir, dir string, port int) (*baselineTenant, error) {
	cfg := controlplane.Config{
		Name: filepath.Base(dir), Dir: dir, Port: port, Datastore: "etcd",
		Components:       []string{controlplane.APIServer, controlplane.ControllerManager, controlplane.Scheduler},
		AdvertiseAddress: "10.250.199.1", ServiceCIDR: "10.251.0.0/16", ClusterCIDR: "10.1.0.0/16", NodeCIDRMaskSize: 24, Tenant: true,
	}
	if err := controlplane.Prepare(cfg); err != nil {
		return nil, err
	}
	t := &baselineTenant{}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", port+1)
	etcd, err := runLogged(dir, "etcd", filepath.Join(binDir, "etcd"),
		"--data-dir", filepath.Join(dir, "etcd"), "--name", "default",
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", port+2),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", port+2),
		"--initial-cluster", fmt.Sprintf("default=http://127.0.0.1:%d", port+2))
	if err != nil {
		return nil, err
	}
	t.procs = append(t.procs, etcd)
	api, cm, sched := controlplane.ComponentArgs(cfg)
	// Same flags, etcd instead of kine. (--etcd-servers is a list flag:
	// a second occurrence would add to it, not replace it.)
	for i, a := range api {
		if strings.HasPrefix(a, "--etcd-servers=") {
			api[i] = "--etcd-servers=" + etcdURL
		}
	}
	a, err := runLogged(dir, "kube-apiserver", filepath.Join(binDir, "kube-apiserver"), api...)
	if err != nil {
		return nil, err
	}
	t.procs = append(t.procs, a)
	client, err := controlplane.AdminHTTPClient(cfg)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(3 * time.Minute)
	for controlplane.Probe(ctx, client, cfg) != nil {
		if _, err := supervisor.Observe(a.Process.Pid); err != nil {
			return nil, fmt.Errorf("kube-apiserver over etcd exited; see %s", dir)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("kube-apiserver over etcd not ready in 3m; see %s", dir)
		}
		time.Sleep(100 * time.Millisecond)
	}
	c, err := runLogged(dir, "kube-controller-manager", filepath.Join(binDir, "kube-controller-manager"), cm...)
	if err != nil {
		return nil, err
	}
	s, err := runLogged(dir, "kube-scheduler", filepath.Join(binDir, "kube-scheduler"), sched...)
	if err != nil {
		return nil, err
	}
	t.procs = append(t.procs, c, s)
	return t, nil
}
