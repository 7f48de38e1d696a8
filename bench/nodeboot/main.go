// Command nodeboot measures a node's boot, step by step, through the real path: a Pod on
// a cluster at zero nodes makes the daemon boot a qemu microVM (KVM where /dev/kvm
// exists, TCG otherwise), which joins and runs the Pod. For each run it prints:
//
//	Pod created -> VMM started (qemu launched by the daemon, host clock)
//	kernel init   guest uptime when the agent (PID 1) logged its first step
//	agent up      guest uptime when the agent finished its boot steps (kubelet started)
//	registered    Pod created -> Node object created (host clock)
//	Node Ready    Pod created -> Node Ready
//	Pod Running   Pod created -> Pod Running
//
// The guest uptimes come from the agent's timeline lines on the serial console
// (`step=<name> uptime=<s>s`); the host times from the tenant API and the daemon.
//
//	go run ./bench/nodeboot -bin bin/socialweb -image DIR [-runs 3]
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	bin := flag.String("bin", "bin/socialweb", "socialweb binary")
	image := flag.String("image", "", "node image directory (`socialweb image build --ensure` prints it)")
	runs := flag.Int("runs", 3, "boots to measure")
	flag.Parse()
	if *image == "" {
		log.Fatal("-image is required")
	}
	state, err := os.MkdirTemp("", "socialweb-nodeboot-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(state)
	apiPort, lo := freePort(), freePort()
	daemon := exec.Command(*bin, "serve", "--state-dir", state, "--node-image", *image,
		"--api-port", strconv.Itoa(apiPort), "--port-range", fmt.Sprintf("%d-%d", lo, lo),
		"--network-range", "180-189", "--metrics-address", "")
	logf, err := os.Create(state + ".log")
	if err != nil {
		log.Fatal(err)
	}
	defer os.Remove(state + ".log")
	daemon.Stdout, daemon.Stderr = logf, logf
	if err := daemon.Start(); err != nil {
		log.Fatal(err)
	}
	stop := func() {
		_ = daemon.Process.Signal(syscall.SIGTERM)
		_ = daemon.Wait()
	}
	defer stop()
	cli := func(args ...string) (string, error) {
		out, err := exec.Command(*bin, append(args, "--state-dir", state)...).CombinedOutput()
		return string(out), err
	}
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
		if _, err := cli("cluster", "list"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			log.Fatal("the daemon did not come up; see its log")
		}
	}
	if out, err := cli("cluster", "create", "boot", "--wait", "--hold", "5s", "--max-nodes", "1"); err != nil {
		stop()
		log.Fatalf("cluster create: %v\n%s", err, out)
	}
	defer cli("cluster", "delete", "boot", "--wait")
	kc, err := cli("cluster", "kubeconfig", "boot")
	if err != nil {
		log.Fatal(kc)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(kc))
	if err != nil {
		log.Fatal(err)
	}
	k := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()

	accel := "tcg"
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err == nil {
		f.Close()
		accel = "kvm"
	}
	fmt.Printf("| run | accel | Pod->VMM start | kernel init (guest) | agent up (guest) | Pod->registered | Pod->Node Ready | Pod->Pod Running |\n|---|---|---|---|---|---|---|---|\n")
	var rows [][]float64
	for i := range *runs {
		r, err := measure(ctx, k, filepath.Join(state, "nodes"), i)
		if err != nil {
			log.Fatalf("run %d: %v", i, err)
		}
		rows = append(rows, r)
		fmt.Printf("| %d | %s |%s\n", i+1, accel, cells(r))
	}
	med := make([]float64, len(rows[0]))
	for c := range med {
		col := make([]float64, len(rows))
		for i := range rows {
			col[i] = rows[i][c]
		}
		sort.Float64s(col)
		med[c] = col[len(col)/2]
	}
	fmt.Printf("| median | %s |%s\n", accel, cells(med))
}

func cells(r []float64) string {
	var b strings.Builder
	for _, v := range r {
		fmt.Fprintf(&b, " %.2fs |", v)
	}
	return b.String()
}

var stepRE = regexp.MustCompile(`step=(\S+) uptime=([0-9.]+)s`)

// measure runs one Pod through a boot and waits until the cluster is back at zero.
func measure(ctx context.Context, k kubernetes.Interface, nodesDir string, i int) ([]float64, error) {
	name := fmt.Sprintf("boot-%d", i)
	zero := int64(0)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{Name: "main", Image: "busybox:stable", Command: []string{"sleep", "3600"}}}}}
	t0 := time.Now()
	if _, err := k.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	var vmm, registered, ready, running time.Duration
	var node string
	var kernel, agentUp float64
	deadline := t0.Add(10 * time.Minute)
	for running == 0 || agentUp == 0 {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("pod %s not running with a full console timeline after 10m", name)
		}
		now := time.Since(t0)
		if vmm == 0 {
			if entries, _ := os.ReadDir(nodesDir); len(entries) > 0 {
				for _, e := range entries {
					if e.IsDir() && e.Name() != "consoles" {
						node, vmm = e.Name(), now
					}
				}
			}
		}
		if node != "" && agentUp == 0 {
			kernel, agentUp = consoleTimes(filepath.Join(nodesDir, node, "console.log"))
		}
		if node != "" && (registered == 0 || ready == 0) {
			if n, err := k.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err == nil {
				if registered == 0 {
					registered = now // polled every 100 ms; creationTimestamp has only seconds
				}
				for _, c := range n.Status.Conditions {
					if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && ready == 0 {
						ready = now
					}
				}
			}
		}
		if running == 0 {
			if p, err := k.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{}); err == nil && p.Status.Phase == corev1.PodRunning {
				running = now
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := k.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return nil, err
	}
	for ; ; time.Sleep(time.Second) {
		nl, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		entries, _ := os.ReadDir(nodesDir)
		dirs := 0
		for _, e := range entries {
			if e.IsDir() && e.Name() != "consoles" {
				dirs++
			}
		}
		if err == nil && len(nl.Items) == 0 && dirs == 0 {
			break
		}
		if time.Since(t0) > 15*time.Minute {
			return nil, fmt.Errorf("node %s not gone", node)
		}
	}
	return []float64{vmm.Seconds(), kernel, agentUp, registered.Seconds(), ready.Seconds(), running.Seconds()}, nil
}

// consoleTimes reads the agent's first step's and its "up" line's guest uptimes.
func consoleTimes(file string) (first, up float64) {
	f, err := os.Open(file)
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := stepRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, _ := strconv.ParseFloat(m[2], 64)
		if first == 0 {
			first = v
		}
		if m[1] == "up" {
			return first, v
		}
	}
	return first, 0
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
