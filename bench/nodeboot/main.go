// Command nodeboot measures a node's boot, step by step, through the real path: a Pod on
// a cluster at zero nodes makes the daemon boot a qemu microVM (KVM where a guest boots
// under it, TCG otherwise), which joins and runs the Pod. For each run it prints:
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
// A second table is the daemon's own breakdown of each node's start, from its `node start`
// log line (the figures of its socialweb_node_start_phase_seconds histogram): decision
// (Pod created -> scale decision), vmm (-> VMM started), kernel and agent (guest), registered
// (the rest until the Node registered), ready (-> Node Ready), image (the kubelet's pulls),
// container (the rest until the Pod's containers started) and their total.
//
// With -pods N each run creates N Pods at once that must not share a node, prints each
// node's timeline, the time from N Pending Pods to N Running, and the host memory each
// microVM costs (RSS of its qemu process against the guest's memory). With -large MiB
// the Pods run a locally built image of that size, pushed into the host registry once;
// each row then also has the Pod's image pull time, and the run prints the bytes the
// host sent over the cluster bridge and received on its other interfaces meanwhile.
//
// With -ci-shaped each Pod is shaped like a GitLab Runner job Pod: an init container and a
// helper container of a 60 MiB image, a build container of an 80 MiB image (podShape), and
// a Pod counts as running once all its containers run. -keep keeps the daemon's state
// directory (node consoles with the kubelet's and containerd's logs, copied to consoles/
// before the nodes go) and its log.
//
// With -shared-layers=false the daemon gives nodes no shared layer store: every layer is
// pulled and unpacked in the guest (the cold path bench/sharedlayers.sh compares with).
//
// With -warm-pool N the daemon keeps N node VMs booted for no cluster (serve --warm-pool),
// of the size the bench's cluster asks for, so its nodes are claimed instead of booted
// (bench/warmstart.sh compares with cold starts). Before each run the bench waits until
// min(N, pods) pool VMs are ready, and the run table gets the claims that hit
// (socialweb_warm_pool_claims_total{result="hit"}, from the daemon's metrics). A claimed
// node's VMM start is its claim, and its guest columns count from the claim: kernel init
// 0 and agent up the guest time from reading its identity to its boot steps done, as the
// daemon's breakdown counts it. The pool refills while a run goes on, as it would in use.
//
//	go run ./bench/nodeboot -bin bin/socialweb -image DIR [-runs 3] [-pods 5 -memory 512Mi -disk 4Gi] [-large 1024 | -ci-shaped] [-keep] [-timeout 20m] [-tcg-cache-mib 128] [-shared-layers=false] [-warm-pool 5 [-warm-pool-prewarm=false]]
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"net"
	"net/http"
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

	"github.com/socialweb-computer/socialweb/internal/images"
	"github.com/socialweb-computer/socialweb/internal/nodes/qemu"
)

func main() {
	bin := flag.String("bin", "bin/socialweb", "socialweb binary")
	image := flag.String("image", "", "node image directory (`socialweb image build --ensure` prints it)")
	runs := flag.Int("runs", 3, "boots to measure")
	pods := flag.Int("pods", 1, "Pods per run, each on its own node")
	memory := flag.String("memory", "1Gi", "node memory")
	cpus := flag.Int("cpus", 1, "node vCPUs")
	disk := flag.String("disk", "", "the daemon's --default-node-disk, each node's container-storage disk (\"\": the daemon's default, 10Gi; the host must have room for each node's whole disk, so five nodes want a smaller one)")
	largeMiB := flag.Int("large", 0, "run a locally built image of this many MiB (0: busybox)")
	ciShaped := flag.Bool("ci-shaped", false, "run CI-shaped Pods instead, as a GitLab Runner's kubernetes executor makes them: an init container and a helper container of a 60 MiB image, and a build container of an 80 MiB image, both from the host registry (140 MiB; -large is ignored)")
	keep := flag.Bool("keep", false, "keep the daemon's state directory and log (node consoles, the kubelet's log) and print where")
	timeout := flag.Duration("timeout", 20*time.Minute, "how long a run may wait for its Pods to run")
	tcgCache := flag.Int64("tcg-cache-mib", 0, "the daemon's --tcg-cache-mib (TCG translation cache per VM; 0: the daemon's default)")
	shared := flag.Bool("shared-layers", true, "the daemon's and image push's --shared-layers (layers unpacked on the host and shared with nodes; false: nodes pull)")
	warmPool := flag.Int("warm-pool", 0, "the daemon's --warm-pool: node VMs of the cluster's node size kept booted, claimed by the runs' nodes (0: every node boots cold)")
	prewarm := flag.Bool("warm-pool-prewarm", true, "the daemon's --warm-pool-prewarm: pool VMs run the programs of a Pod start while they wait")
	warmSettle := flag.Duration("warm-settle", 40*time.Second, "how long the pool VMs wait once ready before the Pods are created (in use, a pool VM waits minutes; its prewarm, which a claim cuts short, takes 14-16 s of its vCPU under TCG)")
	warmTimeout := flag.Duration("warm-timeout", 10*time.Minute, "how long to wait before each run for min(-warm-pool, -pods) pool VMs to be ready")
	flag.Parse()
	if *image == "" {
		log.Fatal("-image is required")
	}
	if err := qemu.ValidatePoolSize(*warmPool); err != nil {
		log.Fatalf("-warm-pool: %v", err)
	}
	state, err := os.MkdirTemp("", "socialweb-nodeboot-")
	if err != nil {
		log.Fatal(err)
	}
	if *keep {
		defer fmt.Fprintf(os.Stderr, "kept: state %s, daemon log %s.log\n", state, state)
	} else {
		defer os.RemoveAll(state)
	}
	push := func(sizeMiB int) string {
		tarPath, _, err := images.Large(context.Background(), sizeMiB, images.Options{})
		if err != nil {
			log.Fatalf("building the %d MiB image: %v", sizeMiB, err)
		}
		if out, err := exec.Command(*bin, "image", "push", tarPath, "--state-dir", state, "--shared-layers="+strconv.FormatBool(*shared)).CombinedOutput(); err != nil {
			log.Fatalf("image push: %v\n%s", err, out)
		}
		return images.LargeRef(sizeMiB)
	}
	shape := podShape{image: "busybox:stable"}
	switch {
	case *ciShaped:
		shape = podShape{image: push(ciJobMiB), helper: push(ciHelperMiB)}
	case *largeMiB > 0:
		shape.image = push(*largeMiB)
	}
	apiPort, lo := freePort(), freePort()
	daemon := exec.Command(*bin, "serve", "--state-dir", state, "--node-image", *image,
		"--api-port", strconv.Itoa(apiPort), "--port-range", fmt.Sprintf("%d-%d", lo, lo),
		"--network-range", "180-189", "--metrics-address", "", "--shared-layers="+strconv.FormatBool(*shared))
	if *disk != "" {
		daemon.Args = append(daemon.Args, "--default-node-disk", *disk)
	}
	if *tcgCache > 0 {
		daemon.Args = append(daemon.Args, "--tcg-cache-mib", strconv.FormatInt(*tcgCache, 10))
	}
	var metricsURL string
	if *warmPool > 0 {
		// The pool's VMs have the daemon's default node size, and only a node of exactly
		// that size claims one: the defaults are the cluster's --node-cpus and
		// --node-memory below. The disk is the daemon's default for both (the cluster
		// sets none), and the Pods request nothing, so nodes get the smallest size.
		metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePort())
		metricsURL = "http://" + metricsAddr + "/metrics"
		daemon.Args = append(daemon.Args, "--warm-pool", strconv.Itoa(*warmPool), "--warm-pool-prewarm="+strconv.FormatBool(*prewarm),
			"--default-node-cpus", strconv.Itoa(*cpus), "--default-node-memory", *memory, "--metrics-address", metricsAddr)
	}
	logf, err := os.Create(state + ".log")
	if err != nil {
		log.Fatal(err)
	}
	if !*keep {
		defer os.Remove(state + ".log")
	}
	daemon.Stdout, daemon.Stderr = logf, logf
	if err := daemon.Start(); err != nil {
		log.Fatal(err)
	}
	stop := func() {
		_ = daemon.Process.Signal(syscall.SIGTERM)
		_ = daemon.Wait()
	}
	defer stop()
	// From here a fatal error stops the daemon and takes down what it ran (node VMs,
	// pool VMs, networks): log.Fatal skips the deferred cleanup, and a run that timed
	// out left a daemon and ten VMs behind.
	fatalf := func(format string, args ...any) {
		stop()
		if out, err := exec.Command(*bin, "down", "--state-dir", state).CombinedOutput(); err != nil {
			slog.Warn("down after a failed run", "err", err, "out", string(out))
		}
		if !*keep {
			os.RemoveAll(state)
		}
		log.Fatalf(format, args...)
	}
	cli := func(args ...string) (string, error) {
		out, err := exec.Command(*bin, append(args, "--state-dir", state)...).CombinedOutput()
		return string(out), err
	}
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
		if _, err := cli("cluster", "list"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			fatalf("the daemon did not come up; see its log")
		}
	}
	if out, err := cli("cluster", "create", "boot", "--wait", "--hold", "5s", "--max-nodes", strconv.Itoa(*pods),
		"--node-cpus", strconv.Itoa(*cpus), "--node-memory", *memory); err != nil {
		fatalf("cluster create: %v\n%s", err, out)
	}
	defer cli("cluster", "delete", "boot", "--wait")
	kc, err := cli("cluster", "kubeconfig", "boot")
	if err != nil {
		fatalf("%v", kc)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(kc))
	if err != nil {
		fatalf("%v", err)
	}
	k := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()

	// The daemon's choice (its KVM probe), as the Cluster reports it; /dev/kvm opening
	// says nothing (nested PVM opens and boots no stock kernel).
	accel := "accelerator unknown"
	if out, err := cli("cluster", "get", "boot", "-o", "yaml"); err == nil {
		if i := strings.Index(out, "type: NodeAccelerator"); i > 0 {
			if j := strings.LastIndex(out[:i], "reason: "); j >= 0 {
				accel = strings.Fields(out[j+len("reason: "):])[0]
			}
		}
	}
	cache := "TCG translation cache: the daemon's default"
	if *tcgCache > 0 {
		cache = fmt.Sprintf("TCG translation cache %d MiB", *tcgCache)
	}
	warm := ""
	if *warmPool > 0 {
		warm = fmt.Sprintf(", warm pool %d (claimed nodes marked warm)", *warmPool)
	}
	fmt.Printf("%d Pod(s) per run, node size %d vCPU / %s, %s, %s, %s, shared layers %v%s\n\n", *pods, *cpus, *memory, accel, cache, shape, *shared, warm)
	fmt.Printf("| run | node | Pod->VMM start | kernel init (guest) | agent up (guest) | Pod->registered | Pod->Node Ready | Pod->Pod Running | image pull | qemu RSS | idle qemu CPU | qemu CPU, Pod -> Running | host CPU, Pod -> Running |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	var rows [][]float64
	var summary []string
	var starts [][]float64 // the daemon's breakdown per node; NaN where it has no figure
	var startRows []string
	var podRows []string
	for i := range *runs {
		hits := "-" // no pool
		var claims0 map[string]float64
		if *warmPool > 0 {
			if claims0, err = waitWarmPool(ctx, metricsURL, min(*warmPool, *pods), *warmTimeout); err != nil {
				fatalf("run %d: %v", i, err)
			}
			select {
			case <-time.After(*warmSettle):
			case <-ctx.Done():
				fatalf("run %d: %v", i, ctx.Err())
			}
		}
		r, err := measure(ctx, k, state, i, *pods, shape, *timeout)
		if err != nil {
			fatalf("run %d: %v", i, err)
		}
		if *warmPool > 0 {
			// Once the run's nodes are gone: nothing claims between their creation and here.
			claims1, err := scrapeMetrics(ctx, metricsURL)
			if err != nil {
				fatalf("run %d: %v", i, err)
			}
			d := func(result string) int {
				key := claimsMetric + `{result="` + result + `"}`
				return int(claims1[key] - claims0[key])
			}
			hits = strconv.Itoa(d("hit"))
			if d("hit") < min(*warmPool, *pods) {
				slog.Warn("warm pool: fewer claims hit than pool VMs were ready", "run", i+1, "hit", d("hit"), "want", min(*warmPool, *pods),
					"missEmpty", d("miss_empty"), "missShape", d("miss_shape"), "failed", d("failed"))
			}
		}
		for j, n := range r.nodes {
			rows = append(rows, n.times())
			node := strconv.Itoa(j + 1)
			if n.warm {
				node += " warm"
			}
			fmt.Printf("| %d | %s |%s %.2fs | %d MiB | %.0f%% of a core | %.2fs | %.2fs |\n", i+1, node, cells(n.times()), n.pull, n.rssMiB, 100*n.idleCPU, n.startCPU, n.hostCPU)
		}
		breakdowns := startBreakdowns(state + ".log")
		for j, n := range r.nodes {
			row := make([]float64, len(startPhases))
			for c, ph := range startPhases {
				row[c] = math.NaN()
				if v, ok := breakdowns[n.name][ph]; ok {
					row[c] = v
				}
			}
			starts = append(starts, row)
			startRows = append(startRows, fmt.Sprintf("| %d | %d |%s", i+1, j+1, optCells(row)))
			podRows = append(podRows, fmt.Sprintf("| %d | %d |%s", i+1, j+1, optCells(n.pod.row())))
		}
		summary = append(summary, fmt.Sprintf("| %d | %.2fs | %d MiB | %d MiB | %.1f MiB | %.1f MiB | %d MiB | %s |", i+1, r.allRunning.Seconds(),
			r.guestMiB, r.meanRSSMiB(), float64(r.bridgeTx)/(1<<20), float64(r.otherRx)/(1<<20), r.registryMiB, hits))
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
	fmt.Printf("| median | all |%s | | | | |\n", cells(med))
	fmt.Printf("\n| run | %d Pending -> %d Running | guest memory | qemu RSS (mean) | host -> guests over the bridge | host received elsewhere | host registry on disk | warm hits |\n|---|---|---|---|---|---|---|---|\n", *pods, *pods)
	for _, l := range summary {
		fmt.Println(l)
	}
	printNodeTable("Each node's first Pod, host clock from the Pods created, as first seen (polled every 0.1 s; `Pulling` of the first container comes once its sandbox is up)",
		podEventReasons, podRows)
	printNodeTable("Where each start went, by the daemon (its `node start` log line: each phase its own duration, and their total)",
		startPhases, startRows)
	startMed := make([]float64, len(startPhases))
	for c := range startMed {
		var col []float64
		for _, r := range starts {
			if !math.IsNaN(r[c]) {
				col = append(col, r[c])
			}
		}
		startMed[c] = math.NaN()
		if len(col) > 0 {
			sort.Float64s(col)
			startMed[c] = col[len(col)/2]
		}
	}
	fmt.Printf("| median | all |%s\n", optCells(startMed))
}

// startPhases are the daemon's start breakdown phases, in order, and their total.
var startPhases = []string{"decision", "vmm", "kernel", "agent", "registered", "ready", "image", "container", "total"}

// printNodeTable prints a table of one row per run and node under title.
func printNodeTable(title string, columns, rows []string) {
	fmt.Printf("\n%s:\n\n| run | node |", title)
	for _, c := range columns {
		fmt.Printf(" %s |", c)
	}
	fmt.Printf("\n|---|---|%s\n", strings.Repeat("---|", len(columns)))
	for _, l := range rows {
		fmt.Println(l)
	}
}

// startBreakdowns reads the daemon's `node start` log lines (JSON): node -> phase ->
// seconds.
func startBreakdowns(logFile string) map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	f, err := os.Open(logFile)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var l struct {
			Msg     string             `json:"msg"`
			Node    string             `json:"node"`
			Seconds map[string]float64 `json:"seconds"`
		}
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "node start" && l.Node != "" {
			out[l.Node] = l.Seconds
		}
	}
	return out
}

// optCells is cells with "-" for a figure the daemon did not give (NaN).
func optCells(r []float64) string {
	var b strings.Builder
	for _, v := range r {
		if math.IsNaN(v) {
			b.WriteString(" - |")
			continue
		}
		fmt.Fprintf(&b, " %.2fs |", v)
	}
	return b.String()
}

func cells(r []float64) string {
	var b strings.Builder
	for _, v := range r {
		fmt.Fprintf(&b, " %.2fs |", v)
	}
	return b.String()
}

var stepRE = regexp.MustCompile(`step=(\S+) uptime=([0-9.]+)s`)

// nodeTimes is one node's timeline (seconds from the Pods' creation, guest uptimes for
// kernel and agent), its Pod's image pull and its qemu's RSS once the Pods ran.
type nodeTimes struct {
	name                                    string
	vmm, kernel, agentUp, registered, ready float64
	running, pull                           float64
	rssMiB                                  int
	idleCPU                                 float64 // host cores its qemu used while idle
	// startCPU is the CPU its qemu used from the Pods' creation to its Pod running, and
	// hostCPU what the whole host used meanwhile (every core, all processes): CPU seconds,
	// which a busy neighbour or a slow core moves far less than wall time.
	startCPU, hostCPU float64
	timeline          bool // the console had the agent's up line
	warm              bool // claimed from the warm pool
	pod               podTimes
}

func (n nodeTimes) times() []float64 {
	return []float64{n.vmm, n.kernel, n.agentUp, n.registered, n.ready, n.running}
}

type runResult struct {
	nodes             []nodeTimes
	allRunning        time.Duration
	guestMiB          int
	bridgeTx, otherRx int64
	registryMiB       int64
}

func (r runResult) meanRSSMiB() int {
	sum := 0
	for _, n := range r.nodes {
		sum += n.rssMiB
	}
	return sum / max(1, len(r.nodes))
}

// measure creates n anti-affine Pods at once, follows each node's boot and each Pod to
// Running, then deletes the Pods and waits until the cluster is back at zero.
func measure(ctx context.Context, k kubernetes.Interface, state string, run, n int, shape podShape, timeout time.Duration) (runResult, error) {
	nodesDir := filepath.Join(state, "nodes")
	zero := int64(0)
	labels := map[string]string{"bench": fmt.Sprintf("run-%d", run)}
	bridgeTx0, otherRx0 := netCounters()
	qemuCPU0, hostCPU0 := qemuCPUs(), hostCPUSeconds()
	t0 := time.Now()
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watched := watchRunning(wctx, k, "bench="+labels["bench"], t0, func(node string) float64 {
		return qemuCPUSeconds(vmName(nodesDir, node))
	})
	for p := range n {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("boot-%d-%d", run, p), Namespace: "default", Labels: labels},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &zero,
				Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
					RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
						LabelSelector: &metav1.LabelSelector{MatchLabels: labels}, TopologyKey: corev1.LabelHostname}}}},
			}}
		shape.fill(&pod.Spec)
		if _, err := k.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return runResult{}, err
		}
	}
	nodes := map[string]*nodeTimes{}
	var res runResult
	lastRunning := 0.0 // seconds from t0 to the last Pod seen running
	deadline := t0.Add(timeout)
	for {
		if time.Now().After(deadline) {
			return res, fmt.Errorf("%d Pods not running with full console timelines after %s (-timeout)", n, timeout)
		}
		now := time.Since(t0).Seconds()
		entries, _ := os.ReadDir(nodesDir)
		for _, e := range entries {
			if isNodeDir(e) && nodes[e.Name()] == nil {
				nodes[e.Name()] = &nodeTimes{name: e.Name(), vmm: now}
			}
		}
		for _, nt := range nodes {
			if !nt.timeline {
				nt.kernel, nt.agentUp, nt.warm, nt.timeline = consoleTimes(filepath.Join(nodesDir, nt.name, "console.log"))
			}
			if nt.registered == 0 || nt.ready == 0 {
				if node, err := k.CoreV1().Nodes().Get(ctx, nt.name, metav1.GetOptions{}); err == nil {
					if nt.registered == 0 {
						nt.registered = now // polled; creationTimestamp has only seconds
					}
					for _, c := range node.Status.Conditions {
						if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && nt.ready == 0 {
							nt.ready = now
						}
					}
				}
			}
		}
		pl, err := k.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "bench=" + labels["bench"]})
		running, timelines := 0, 0
		if err == nil {
			events := podEvents(ctx, k)
			for _, p := range pl.Items {
				nt := nodes[p.Spec.NodeName]
				if nt == nil {
					continue
				}
				nt.pod.observe(now, events[p.Name])
				r, ok := watched.get(p.Name)
				if !ok && allRunning(&p) { // the watch missed it: this poll's time
					r, ok = runningAt{at: now, qemuCPU: qemuCPUSeconds(vmName(nodesDir, nt.name)), hostCPU: hostCPUSeconds()}, true
				}
				if ok {
					running++
					if nt.running == 0 {
						vm := vmName(nodesDir, nt.name)
						nt.running = r.at
						nt.startCPU = r.qemuCPU - qemuCPU0[vm] // a cold node's qemu was not there: 0
						nt.hostCPU = r.hostCPU - hostCPU0
					}
					lastRunning = max(lastRunning, r.at)
				}
			}
		}
		for _, nt := range nodes {
			if nt.timeline {
				timelines++
			}
		}
		if running == n && res.allRunning == 0 {
			res.allRunning = time.Duration(lastRunning * float64(time.Second))
		}
		if res.allRunning > 0 && timelines >= n {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	bridgeTx1, otherRx1 := netCounters()
	res.bridgeTx, res.otherRx = bridgeTx1-bridgeTx0, otherRx1-otherRx0
	res.registryMiB = duMiB(filepath.Join(state, "registry"))
	pulls := pullTimes(ctx, k)
	// Host CPU of each qemu while its node only keeps a sleeping Pod: what an idle node costs.
	cpu0, vms := map[string]float64{}, map[string]string{}
	for _, nt := range nodes {
		vms[nt.name] = vmName(nodesDir, nt.name)
		cpu0[nt.name] = qemuCPUSeconds(vms[nt.name])
	}
	const idleWindow = 30 * time.Second
	time.Sleep(idleWindow)
	for _, nt := range nodes {
		nt.idleCPU = (qemuCPUSeconds(vms[nt.name]) - cpu0[nt.name]) / idleWindow.Seconds()
		nt.rssMiB, res.guestMiB = qemuRSS(vms[nt.name])
		nt.pull = pulls[nt.name]
		res.nodes = append(res.nodes, *nt)
	}
	sort.Slice(res.nodes, func(i, j int) bool { return res.nodes[i].vmm < res.nodes[j].vmm })
	// The node directories go with the nodes: keep their consoles (the agent's, the
	// kubelet's and containerd's log) for -keep.
	for _, nt := range nodes {
		if b, err := os.ReadFile(filepath.Join(nodesDir, nt.name, "console.log")); err == nil {
			_ = os.MkdirAll(filepath.Join(state, "consoles"), 0o755)
			_ = os.WriteFile(filepath.Join(state, "consoles", nt.name+".log"), b, 0o644)
		}
	}
	if err := k.CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "bench=" + labels["bench"]}); err != nil {
		return res, err
	}
	for ; ; time.Sleep(time.Second) {
		nl, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		entries, _ := os.ReadDir(nodesDir)
		dirs := 0
		for _, e := range entries {
			if isNodeDir(e) {
				dirs++
			}
		}
		if err == nil && len(nl.Items) == 0 && dirs == 0 {
			break
		}
		if time.Since(t0) > timeout+10*time.Minute {
			return res, fmt.Errorf("nodes not gone")
		}
	}
	return res, nil
}

// pullRE matches the kubelet's Pulled event: `... in 1.234s (5.678s including waiting)`.
var pullRE = regexp.MustCompile(`Successfully pulled image .* in (\S+) \(`)

// pullTimes is each node's latest image pull time, from the kubelet's Pulled events
// (0 when the image was already there).
func pullTimes(ctx context.Context, k kubernetes.Interface) map[string]float64 {
	out := map[string]float64{}
	el, err := k.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "reason=Pulled"})
	if err != nil {
		return out
	}
	for _, e := range el.Items {
		m := pullRE.FindStringSubmatch(e.Message)
		if m == nil {
			continue
		}
		if d, err := time.ParseDuration(m[1]); err == nil {
			out[e.Source.Host] = d.Seconds()
		}
	}
	return out
}

// netCounters are the bytes the host sent on its socialweb bridges (swb*) and received
// on every other interface but loopback, from /proc/net/dev.
func netCounters() (bridgeTx, otherRx int64) {
	b, err := os.ReadFile("/proc/net/dev")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n")[2:] {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		name = strings.TrimSpace(name)
		f := strings.Fields(rest)
		if len(f) < 9 {
			continue
		}
		rx, _ := strconv.ParseInt(f[0], 10, 64)
		tx, _ := strconv.ParseInt(f[8], 10, 64)
		switch {
		case strings.HasPrefix(name, "swb"):
			bridgeTx += tx
		case name != "lo" && !strings.HasPrefix(name, "swt"):
			otherRx += rx
		}
	}
	return bridgeTx, otherRx
}

// poolDirPrefix starts an unclaimed warm-pool VM's directory (qemu's pool-<random>): no
// node's; a claim renames it to the node's name.
const poolDirPrefix = "pool-"

// isNodeDir reports whether an entry of the provider's state dir is a node's directory:
// not the kept consoles, nor a warm-pool VM no cluster claimed.
func isNodeDir(e os.DirEntry) bool {
	return e.IsDir() && e.Name() != "consoles" && !strings.HasPrefix(e.Name(), poolDirPrefix)
}

// vmName is the name qemu runs node's VM under (-name guest=...): the node's, or for a
// node claimed from the warm pool the pool VM's, which its command line keeps. It reads
// the node's instance record; node itself when that says nothing.
func vmName(nodesDir, node string) string {
	b, err := os.ReadFile(filepath.Join(nodesDir, node, "instance.json"))
	if err != nil {
		return node
	}
	var rec struct {
		Process *struct {
			Cmdline []string `json:"cmdline"`
		} `json:"process"`
	}
	if json.Unmarshal(b, &rec) != nil || rec.Process == nil {
		return node
	}
	for _, a := range rec.Process.Cmdline {
		if v, ok := strings.CutPrefix(a, "guest="); ok {
			return strings.Split(v, ",")[0]
		}
	}
	return node
}

// qemuRSS is the resident memory of the qemu process running the VM named node (vmName:
// a claimed node's qemu keeps its pool name), and its guest memory (-m), in MiB.
func qemuRSS(node string) (rssMiB, guestMiB int) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, c := range procs {
		b, err := os.ReadFile(c)
		if err != nil || !strings.Contains(string(b), "qemu-system") || !strings.Contains(string(b), "guest="+node) {
			continue
		}
		args := strings.Split(string(b), "\x00")
		for i, a := range args {
			if a == "-m" && i+1 < len(args) {
				guestMiB, _ = strconv.Atoi(strings.TrimSuffix(strings.Split(args[i+1], ",")[0], "M"))
			}
		}
		status, _ := os.ReadFile(filepath.Join(filepath.Dir(c), "status"))
		for _, l := range strings.Split(string(status), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.Atoi(f[1])
				rssMiB = kb / 1024
			}
		}
	}
	return rssMiB, guestMiB
}

// qemuCPUSeconds is the user+system CPU time the qemu process running the VM named node
// (vmName) has used.
func qemuCPUSeconds(node string) float64 {
	return qemuCPUs()[node]
}

// qemuCPUs is the user+system CPU time of each running qemu, by its VM's name (its
// -name guest=).
func qemuCPUs() map[string]float64 {
	out := map[string]float64{}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, c := range procs {
		b, err := os.ReadFile(c)
		if err != nil || !strings.Contains(string(b), "qemu-system") {
			continue
		}
		name := ""
		for _, a := range strings.Split(string(b), "\x00") {
			if v, ok := strings.CutPrefix(a, "guest="); ok {
				name = strings.Split(v, ",")[0]
			}
		}
		if name == "" {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join(filepath.Dir(c), "stat")); err == nil {
			out[name] = procCPUSeconds(string(stat))
		}
	}
	return out
}

// procCPUSeconds is utime+stime from a /proc/<pid>/stat line, in seconds.
func procCPUSeconds(stat string) float64 {
	// Fields after the parenthesised command (which may hold ") " itself, hence the
	// last one): utime and stime are the 12th and 13th.
	i := strings.LastIndex(stat, ") ")
	if i < 0 {
		return 0
	}
	f := strings.Fields(stat[i+2:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// hostCPUSeconds is the CPU time every core of the host has been busy (/proc/stat's
// first line less idle and iowait; steal is not busy here), in seconds.
func hostCPUSeconds() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return statBusySeconds(line)
}

// statBusySeconds reads the "cpu  user nice system idle iowait irq softirq steal ..."
// line: user+nice+system+irq+softirq, in seconds.
func statBusySeconds(line string) float64 {
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	busy := 0.0
	for _, i := range []int{1, 2, 3, 6, 7} {
		v, _ := strconv.ParseFloat(f[i], 64)
		busy += v
	}
	return busy / 100 // USER_HZ
}

func duMiB(dir string) int64 {
	var total int64
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				total += info.Size()
			}
		}
		return nil
	})
	return total >> 20
}

// consoleTimes reads the agent's first step's and its "up" line's guest uptimes; ok once
// the up line is there. A warm-pool VM's guest booted before its claim (its agent waited
// at identity-wait): its kernel init is 0 and its agent up the guest time from reading
// its claim (the identity step done) to up, as the daemon's start breakdown counts it.
func consoleTimes(file string) (kernel, agentUp float64, warm, ok bool) {
	f, err := os.Open(file)
	if err != nil {
		return 0, 0, false, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var first, claimed float64
	for sc.Scan() {
		m := stepRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, _ := strconv.ParseFloat(m[2], 64)
		if first == 0 {
			first = v
		}
		switch m[1] {
		case "identity-wait":
			warm = true
		case "identity":
			claimed = v
		case "up":
			if warm {
				return 0, v - claimed, true, true
			}
			return first, v, false, true
		}
	}
	return first, 0, warm, false
}

// claimsMetric is the daemon's warm-pool claims counter, by result.
const claimsMetric = "socialweb_warm_pool_claims_total"

// waitWarmPool waits until the daemon's warm pool has want ready VMs
// (socialweb_warm_pool_vms{state="ready"}), so a run measures claims of booted VMs, not
// misses or claims of VMs still booting. It returns the metrics then, for the run's claims.
func waitWarmPool(ctx context.Context, url string, want int, timeout time.Duration) (map[string]float64, error) {
	t0 := time.Now()
	lastLog := t0
	for {
		m, err := scrapeMetrics(ctx, url)
		ready, booting := m[`socialweb_warm_pool_vms{state="ready"}`], m[`socialweb_warm_pool_vms{state="booting"}`]
		if err == nil && int(ready) >= want {
			slog.Info("warm pool ready", "ready", int(ready), "want", want, "waited", time.Since(t0).Round(time.Second))
			return m, nil
		}
		if time.Since(t0) > timeout {
			if err == nil {
				err = fmt.Errorf("%d ready, %d booting", int(ready), int(booting))
			}
			return nil, fmt.Errorf("warm pool not at %d ready VMs after %s (-warm-timeout): %w; see the daemon's log for its pool VMs", want, timeout, err)
		}
		if time.Since(lastLog) >= 10*time.Second {
			attrs := []any{"ready", int(ready), "booting", int(booting), "want", want, "elapsed", time.Since(t0).Round(time.Second)}
			if err != nil {
				attrs = append(attrs, "err", err)
			}
			slog.Info("waiting for the warm pool", attrs...)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// scrapeMetrics reads the daemon's /metrics (text format): each sample's name with its
// labels, as printed, to its value. The series read here have one label, so their text
// is fixed.
func scrapeMetrics(ctx context.Context, url string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("metrics request: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading the daemon's metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading the daemon's metrics %s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the daemon's metrics: %w", err)
	}
	out := map[string]float64{}
	for _, l := range strings.Split(string(b), "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
			out[l[:i]] = v
		}
	}
	return out, nil
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
