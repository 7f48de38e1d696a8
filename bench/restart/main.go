// Command restart measures what tenants see of a daemon restart and of an upgrade
// to another build, side by side in one run: a client per tenant asks its apiserver
// for the default namespace every 100 ms (each request may wait up to 90 s), and the
// bench reports, per way of restarting, the failed requests, the longest answer and
// the longest time with no answer (between two answered requests' ends).
//
//	before       serve --control-planes-on-exit stop, SIGTERM, serve again: every
//	             control plane stops with the daemon and starts cold (as before issue 40)
//	kill -9      the daemon killed, serve again: the control planes are adopted
//	restart      --control-planes-on-exit keep, SIGTERM, serve again: adopted
//	upgrade, on-restart   keep, SIGTERM, serve another build --upgrade-strategy on-restart
//	upgrade, rolling      keep, SIGTERM, serve another build --upgrade-strategy rolling
//
// The other build is the binary with bytes appended: it runs the same, and its digest
// differs, as a release's would. No node is booted: tenants at zero nodes.
//
//	go run ./bench/restart -bin bin/socialweb [-tenants 3]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/socialweb-computer/socialweb/internal/supervisor"
)

func main() {
	bin := flag.String("bin", "bin/socialweb", "the socialweb binary")
	tenants := flag.Int("tenants", 3, "tenants polled")
	keepLog := flag.String("log", "", "keep the daemons' log at this path")
	flag.Parse()
	abs, err := filepath.Abs(*bin)
	if err != nil {
		log.Fatal(err)
	}
	state, err := os.MkdirTemp("", "socialweb-restart-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(state)
	next := filepath.Join(state+"-bin", "socialweb-next")
	if err := otherBuild(abs, next); err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(filepath.Dir(next))
	apiPort, lo := freePort(), freePort()
	b := &bench{state: state, apiPort: apiPort, ports: fmt.Sprintf("%d-%d", lo, lo+*tenants-1), keepLog: *keepLog}
	defer b.down(abs)

	b.serve(abs, "--control-planes-on-exit", "stop")
	var names []string
	for i := range *tenants {
		n := fmt.Sprintf("restart-%d", i)
		names = append(names, n)
		if out, err := b.cli(abs, "cluster", "create", n, "--wait"); err != nil {
			log.Fatalf("create %s: %v\n%s", n, err, out)
		}
	}
	type way struct {
		name   string
		stop   syscall.Signal
		binary string
		flags  []string
	}
	ways := []way{
		{"before (stop with the daemon)", syscall.SIGTERM, abs, []string{"--control-planes-on-exit", "keep"}},
		{"kill -9", syscall.SIGKILL, abs, []string{"--control-planes-on-exit", "keep"}},
		{"restart (keep)", syscall.SIGTERM, abs, []string{"--control-planes-on-exit", "keep"}},
		{"upgrade, on-restart", syscall.SIGTERM, next, []string{"--control-planes-on-exit", "keep", "--upgrade-strategy", "on-restart"}},
		{"upgrade, rolling", syscall.SIGTERM, abs, []string{"--control-planes-on-exit", "keep", "--upgrade-strategy", "rolling"}},
	}
	fmt.Printf("| way | tenant | requests | failed | longest answer | longest without an answer | daemon back |\n|---|---|---|---|---|---|---|\n")
	for _, w := range ways {
		var ps []*poller
		for _, n := range names {
			kc, err := b.cli(abs, "cluster", "kubeconfig", n)
			if err != nil {
				log.Fatalf("kubeconfig %s: %v", n, err)
			}
			ps = append(ps, startPoller(n, kc))
		}
		time.Sleep(2 * time.Second)
		start := time.Now()
		b.stop(w.stop)
		b.serve(w.binary, w.flags...)
		back := time.Since(start)
		// Until every tenant runs the build the daemon runs and has answered since,
		// then a little more.
		b.waitBuild(names, w.binary)
		switched := time.Now()
		for _, p := range ps {
			p.answeredSince(switched)
		}
		time.Sleep(3 * time.Second)
		for _, p := range ps {
			r := p.result()
			fmt.Printf("| %s | %s | %d | %d | %s | %s | %s |\n", w.name, p.name, r.ok+len(r.failed), len(r.failed),
				r.longest.Round(10*time.Millisecond), r.gap.Round(10*time.Millisecond), back.Round(100*time.Millisecond))
			for _, f := range r.failed[:min(3, len(r.failed))] {
				log.Printf("%s %s: %s", w.name, p.name, f)
			}
		}
	}
}

type bench struct {
	state, ports string
	apiPort      int
	keepLog      string
	daemon       *exec.Cmd
	exited       chan struct{}
}

func (b *bench) cli(bin string, args ...string) (string, error) {
	out, err := exec.Command(bin, append(args, "--state-dir", b.state)...).CombinedOutput()
	return string(out), err
}

func (b *bench) serve(bin string, flags ...string) {
	args := append([]string{"serve", "--state-dir", b.state, "--api-port", strconv.Itoa(b.apiPort),
		"--port-range", b.ports, "--network-range", "180-189", "--metrics-address", "", "--node-network=false"}, flags...)
	d := exec.Command(bin, args...)
	logf, err := os.OpenFile(b.state+".log", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		log.Fatal(err)
	}
	d.Stdout, d.Stderr = logf, logf
	if err := d.Start(); err != nil {
		log.Fatal(err)
	}
	b.daemon, b.exited = d, make(chan struct{})
	go func() { _ = d.Wait(); logf.Close(); close(b.exited) }()
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if _, err := b.cli(bin, "cluster", "list"); err == nil {
			return
		}
		if time.Now().After(deadline) {
			log.Fatalf("the daemon did not serve within 3m; see %s.log", b.state)
		}
	}
}

func (b *bench) stop(sig syscall.Signal) {
	_ = b.daemon.Process.Signal(sig)
	<-b.exited
}

// waitBuild waits until each tenant's control plane runs bin and answers.
func (b *bench) waitBuild(names []string, bin string) {
	for deadline := time.Now().Add(10 * time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		all := true
		for _, n := range names {
			id, _, _ := supervisor.Running(filepath.Join(b.state, "clusters", n, "instance.json"))
			exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", id.PID))
			if exe != bin {
				all = false
			}
		}
		if all {
			return
		}
	}
	log.Fatalf("the control planes did not all run %s within 10m", bin)
}

func (b *bench) down(bin string) {
	if b.daemon != nil {
		b.stop(syscall.SIGTERM)
	}
	if out, err := b.cli(bin, "down"); err != nil {
		log.Printf("down: %v\n%s", err, out)
	}
	if b.keepLog != "" {
		_ = os.Rename(b.state+".log", b.keepLog)
	}
	os.Remove(b.state + ".log")
}

type poller struct {
	name string
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	res    result
	lastOK time.Time
}

// answeredSince waits (up to 5 minutes) for an answer that ended after t.
func (p *poller) answeredSince(t time.Time) {
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		p.mu.Lock()
		ok := p.lastOK.After(t)
		p.mu.Unlock()
		if ok {
			return
		}
	}
	log.Printf("%s: no answer within 5m", p.name)
}

type result struct {
	ok      int
	failed  []string
	longest time.Duration
	gap     time.Duration
}

func startPoller(name, kubeconfig string) *poller {
	cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(kubeconfig))
	if err != nil {
		log.Fatal(err)
	}
	cfg.Timeout = 90 * time.Second
	k := kubernetes.NewForConfigOrDie(cfg)
	p := &poller{name: name, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		last := time.Now()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
			start := time.Now()
			_, err := k.CoreV1().Namespaces().Get(context.Background(), "default", metav1.GetOptions{})
			end := time.Now()
			p.mu.Lock()
			p.res.longest = max(p.res.longest, end.Sub(start))
			if err != nil {
				p.res.failed = append(p.res.failed, err.Error())
			} else {
				p.res.ok++
				p.res.gap = max(p.res.gap, end.Sub(last))
				last, p.lastOK = end, end
			}
			p.mu.Unlock()
		}
	}()
	return p
}

func (p *poller) result() result {
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.res
}

func otherBuild(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nsocialweb bench build %d\n", time.Now().UnixNano())
	return out.Close()
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
