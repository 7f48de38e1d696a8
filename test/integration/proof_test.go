package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/boottimeline"
	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/nodeimage"
)

func cgroupV2Socialweb() bool {
	_, err := os.Stat("/sys/fs/cgroup/socialweb/cgroup.procs")
	return err == nil
}

// vmMemoryLimit reads the memory cap of the group /proc/PID/cgroup names (v1 or v2).
func vmMemoryLimit(procCgroup string) int64 {
	for _, l := range strings.Split(procCgroup, "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 || !strings.Contains(f[2], "/vm-") {
			continue
		}
		for _, p := range []string{"/sys/fs/cgroup/memory" + f[2] + "/memory.limit_in_bytes", "/sys/fs/cgroup" + f[2] + "/memory.max"} {
			if b, err := os.ReadFile(p); err == nil {
				n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				return n
			}
		}
	}
	return -1
}

// vmCPUCap reads the CPU quota (microseconds per 100 ms) of the VM group /proc/PID/cgroup
// names (v1 or v2).
func vmCPUCap(procCgroup string) string {
	for _, l := range strings.Split(procCgroup, "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 || !strings.Contains(f[2], "/vm-") {
			continue
		}
		if b, err := os.ReadFile("/sys/fs/cgroup" + f[2] + "/cpu.max"); err == nil {
			q, _, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
			return q
		}
		for _, c := range []string{"cpu", "cpu,cpuacct"} {
			if b, err := os.ReadFile("/sys/fs/cgroup/" + c + f[2] + "/cpu.cfs_quota_us"); err == nil {
				return strings.TrimSpace(string(b))
			}
		}
	}
	return ""
}

// forgotTheJoin checks that a joined node's bootstrap token is nowhere a tenant could
// read it: the host rewrites the identity disk without it, and a privileged Pod on the
// node reading the disk (through the guest's page cache, which the agent drops) gets
// the document without it.
func forgotTheJoin(t *testing.T, ctx context.Context, k kubernetes.Interface, stateDir, node string) {
	t.Helper()
	disk := filepath.Join(stateDir, "nodes", node, "identity.img")
	livetest.Eventually(t, 2*time.Minute, time.Second, "the host to take the bootstrap token off the identity disk", func() bool {
		b, err := os.ReadFile(disk)
		return err == nil && bytes.Contains(b, []byte(`"nodeName":"`+node+`"`)) && !identity.HoldsJoinSecret(b)
	})
	privileged := true
	for i := 0; ; i++ {
		read := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("read-identity-%d", i), Namespace: "default"},
			Spec: corev1.PodSpec{NodeName: node, RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "main", Image: "busybox:stable",
					Command:         []string{"sh", "-c", `tr -d '\000' < /dev/vdb`},
					SecurityContext: &corev1.SecurityContext{Privileged: &privileged}}}},
		}
		out := runPodOutput(t, ctx, k, read)
		_ = k.CoreV1().Pods("default").Delete(ctx, read.Name, metav1.DeleteOptions{})
		if !strings.Contains(out, `"nodeName":"`+node+`"`) {
			t.Fatalf("a privileged Pod reading /dev/vdb got %q, not the node's identity document", out)
		}
		if !identity.HoldsJoinSecret([]byte(out)) {
			return
		}
		if i == 2 {
			t.Errorf("a privileged Pod on the joined node still reads the bootstrap token from its identity disk: %q", out)
			return
		}
		time.Sleep(5 * time.Second) // the agent polls the disk every second, then drops its cache
	}
}

// vmCPUs is qemu pid's -smp.
func vmCPUs(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	a := strings.Split(string(b), "\x00")
	for i := range len(a) - 1 {
		if a[i] == "-smp" {
			if n, err := strconv.Atoi(a[i+1]); err == nil {
				return n
			}
		}
	}
	t.Fatalf("qemu %d has no -smp N: %q", pid, a)
	return 0
}

// vmUser is the one id a /proc/PID/status gives for every uid and gid (real, effective,
// saved, filesystem); -1 when they differ.
func vmUser(status string) int {
	id := -1
	for _, l := range strings.Split(status, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok || (k != "Uid" && k != "Gid") {
			continue
		}
		for _, f := range strings.Fields(v) {
			n, err := strconv.Atoi(f)
			if err != nil || (id != -1 && n != id) {
				return -1
			}
			id = n
		}
	}
	return id
}

// nodeImage builds (or reuses) the node image with `socialweb image build --ensure`, the
// command the README's main job runs, and returns its directory.
func nodeImage(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		livetest.Skip(t, "needs root: building the node image (debootstrap, chroot), bridges and taps")
	}
	if err := nodeimage.CheckTools(nil, append(append([]string{}, nodeimage.BuildTools...), "qemu-system-x86_64")...); err != nil {
		livetest.Skip(t, err.Error())
	}
	t0 := time.Now()
	cmd := exec.Command(binary, "image", "build", "--ensure")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("socialweb image build --ensure: %v\n%s", err, tail(errb.String(), 30))
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var res struct{ State, Fingerprint, Dir string }
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("last line of image build is not JSON: %q: %v", lines[len(lines)-1], err)
	}
	if res.State != nodeimage.StateBuilt && res.State != nodeimage.StateReused || len(res.Fingerprint) != 64 {
		t.Fatalf("image build result %+v", res)
	}
	if _, err := nodeimage.ReadManifest(res.Dir); err != nil {
		t.Fatalf("image %s: %v", res.Dir, err)
	}
	t.Logf("node image %s (%s) in %s", res.Fingerprint[:12], res.State, time.Since(t0).Round(time.Millisecond))
	return res.Dir
}

// TestFourStepProof is the seed's proof with a real microVM (qemu TCG where there is no
// KVM): a tenant is Ready at zero nodes and stays there; a Pod makes the scale decision
// Provision; a VM boots, joins with its providerID and goes Ready; the Pod runs and
// `kubectl logs` and `kubectl exec` (the same API calls) reach it; once the Pod is gone
// and the hold has passed, the node is drained, deleted and its VM gone, and the control
// plane is still Ready at zero nodes.
func TestFourStepProof(t *testing.T) {
	img := nodeImage(t)
	args := []string{"--node-image", img}
	// Every client call of the proof goes through the front door (logs, exec over
	// websocket and SPDY, port-forward), as TestCIJob's do; the sleep tests and
	// TestTwoClustersIsolatedAndSurviveRestarts use the tenants' own ports.
	args = append(args, "--front-door", fmt.Sprintf("127.0.0.1:%d", livetest.FreePort(t)))
	d := newDaemon(t, 1, args...)
	d.start()
	const hold = 20 * time.Second
	d.mustCLI("cluster", "create", "proof", "--wait", "--hold", hold.String(), "--max-nodes", "2", "--node-disk", "4Gi")
	cfg, k := d.tenant("proof")
	ctx := ctxT(t, 15*time.Minute)
	nodeCount := func() int {
		t.Helper()
		nl, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("listing nodes: %v", err)
		}
		return len(nl.Items)
	}

	// 1. Ready at zero nodes.
	if c := d.cluster("proof"); c.Status.Phase != v1.PhaseReady || nodeCount() != 0 {
		t.Fatalf("step 1: phase %s with %d nodes, want Ready at 0", c.Status.Phase, nodeCount())
	}
	// 2. Still zero 20 s later.
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		if n := nodeCount(); n != 0 {
			t.Fatalf("step 2: %d nodes appeared without any workload", n)
		}
	}
	if qs := qemusOf(d.stateDir); len(qs) != 0 {
		t.Fatalf("step 2: qemu running without a workload: %v", qs)
	}

	// 3. A Pod; the scale decision says Provision.
	t0 := time.Now()
	grace := int64(1)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "proof", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "main", Image: "busybox:stable",
				Command: []string{"sh", "-c", "echo proof-ran-on-$(hostname); exec sleep 3600"},
			}},
		},
	}
	if _, err := k.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	livetest.Eventually(t, time.Minute, 250*time.Millisecond, "the scale decision to say Provision", func() bool {
		c := d.cluster("proof")
		return c.Status.LastScaleDecision != nil && c.Status.LastScaleDecision.Action == "Provision"
	})
	tProvision := time.Since(t0)

	// 4. A qemu microVM boots.
	livetest.Eventually(t, time.Minute, 250*time.Millisecond, "a qemu process for the cluster", func() bool {
		return len(qemusOf(d.stateDir)) == 1
	})
	tVM := time.Since(t0)
	// The VM runs tenant code and TCG is no boundary: qemu is under its seccomp filter.
	for _, pid := range qemusOf(d.stateDir) {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			t.Fatalf("qemu %d: %v", pid, err)
		}
		for _, want := range []string{"\nSeccomp:\t2\n", "\nNoNewPrivs:\t1\n"} {
			if !strings.Contains(string(st), want) {
				t.Errorf("step 4: qemu %d's status lacks %q (no -sandbox?):\n%s", pid, strings.TrimSpace(want), st)
			}
		}
		// It drops to a user of its own (--vm-uid-base's default range) once its files
		// are open: every id its status lists, and no capability left.
		livetest.Eventually(t, 30*time.Second, 100*time.Millisecond, "qemu to run as the VM's own user", func() bool {
			st, _ = os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			return vmUser(string(st)) >= 2000100000
		})
		if !strings.Contains(string(st), "\nCapEff:\t0000000000000000\n") {
			t.Errorf("step 4: qemu %d runs as its own user but keeps capabilities:\n%s", pid, st)
		}
		// And in a cgroup of its own, capped (where the host gives cgroups: the
		// daemon's default parent serves without them, saying so, where it does not).
		if _, err := os.Stat("/sys/fs/cgroup/memory/socialweb"); err == nil || cgroupV2Socialweb() {
			cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
			if !strings.Contains(string(cg), "/socialweb/vm-") {
				t.Errorf("step 4: qemu %d is in no VM cgroup of its own:\n%s", pid, cg)
			} else if limit := vmMemoryLimit(string(cg)); limit <= 0 || limit > 8<<30 {
				t.Errorf("step 4: qemu %d's cgroup memory limit is %d bytes; want a cap near the guest's memory", pid, limit)
			} else if q, want := vmCPUCap(string(cg)), vmCPUs(t, pid)*100000+50000; q != strconv.Itoa(want) {
				t.Errorf("step 4: qemu %d's cgroup CPU cap is %q µs per 100 ms, want %d (its vCPUs and half a core)", pid, q, want)
			}
			// Its virtiofsd (the shared layers) is held in the same group.
			for _, v := range processesMentioning(d.stateDir) {
				cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", v))
				if !strings.Contains(string(cmdline), "virtiofsd") || strings.Contains(string(cmdline), "qemu-system") {
					continue
				}
				livetest.Eventually(t, 30*time.Second, 250*time.Millisecond, "virtiofsd in its VM's cgroup", func() bool {
					vcg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", v))
					return string(vcg) == string(cg)
				})
			}
		}
	}
	// The Cluster says which accelerator its nodes use and why, and the VM runs under it.
	var accelCond *metav1.Condition
	livetest.Eventually(t, time.Minute, 250*time.Millisecond, "the NodeAccelerator condition", func() bool {
		c := d.cluster("proof")
		accelCond = meta.FindStatusCondition(c.Status.Conditions, v1.ConditionNodeAccelerator)
		return accelCond != nil
	})
	if accelCond.Reason != "KVM" && accelCond.Reason != "TCG" || accelCond.Message == "" {
		t.Errorf("step 4: NodeAccelerator %s/%q; want KVM or TCG with why", accelCond.Reason, accelCond.Message)
	}
	for pid, args := range qemuCmdlines(d.stateDir) {
		// -accel tcg may carry options (tb-size=...): the accelerator is before the comma.
		want := "-accel\x00" + strings.ToLower(accelCond.Reason)
		joined := bytes.Join(args, []byte{0})
		if !bytes.Contains(joined, []byte(want+"\x00")) && !bytes.Contains(joined, []byte(want+",")) {
			t.Errorf("step 4: qemu %d does not run with -accel %s as the Cluster says (%q)", pid, strings.ToLower(accelCond.Reason), accelCond.Message)
		}
	}
	t.Logf("nodes run under %s: %s", accelCond.Reason, accelCond.Message)
	if out := d.mustCLI("cluster", "get", "proof", "-o", "yaml"); !strings.Contains(out, "type: NodeAccelerator") {
		t.Errorf("step 4: socialweb cluster get does not show the NodeAccelerator condition:\n%s", out)
	}

	// 5. The node joins with its providerID and goes Ready.
	node := oneReadyNode(t, ctx, k)
	tNodeReady := time.Since(t0)
	if want := "socialweb://proof/" + node.Name; node.Spec.ProviderID != want {
		t.Errorf("step 5: providerID %q, want %q", node.Spec.ProviderID, want)
	}
	if !strings.HasPrefix(node.Name, "proof-") {
		t.Errorf("step 5: node name %q, want proof-<unique>", node.Name)
	}
	// It imported the sandbox image its node image carries before the kubelet ran.
	if tl := nodeBootTimeline(t, ctx, k, node.Name); tl[boottimeline.StepSandboxImage] <= 0 || tl[boottimeline.StepSandboxImage] > tl["kubelet"] {
		t.Errorf("step 5: boot timeline %v: want %s (the sandbox image imported from the node image) before the kubelet",
			tl, boottimeline.StepSandboxImage)
	}
	// Its container storage is its own 4 GiB data disk, and the kubelet reports that.
	eph := node.Status.Capacity[corev1.ResourceEphemeralStorage]
	if eph.Value() < 3500<<20 || eph.Value() > 4<<30 {
		t.Errorf("step 5: ephemeral-storage capacity %s; want the 4 GiB data disk (less ext4's own)", eph.String())
	}
	for pid, args := range qemuCmdlines(d.stateDir) {
		if !bytes.Contains(bytes.Join(args, []byte{0}), []byte("serial=socialweb-data")) {
			t.Errorf("step 5: qemu %d has no data disk", pid)
		}
	}
	var internal string
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			internal = a.Address
		}
	}
	if !strings.HasPrefix(internal, "10.250.") {
		t.Errorf("step 5: node addresses %v, want an InternalIP on the cluster's node network", node.Status.Addresses)
	}

	// 6. The Pod runs there; logs and exec reach it.
	livetest.Eventually(t, 5*time.Minute, time.Second, "the Pod to run", func() bool {
		p, err := k.CoreV1().Pods("default").Get(ctx, "proof", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning
	})
	tRunning := time.Since(t0)
	p, _ := k.CoreV1().Pods("default").Get(ctx, "proof", metav1.GetOptions{})
	if p.Spec.NodeName != node.Name {
		t.Errorf("step 6: Pod on %q, want %q", p.Spec.NodeName, node.Name)
	}
	var logs []byte
	livetest.Eventually(t, time.Minute, time.Second, "the Pod's log (kubectl logs)", func() bool {
		var err error
		logs, err = k.CoreV1().Pods("default").GetLogs("proof", &corev1.PodLogOptions{}).DoRaw(ctx)
		return err == nil && bytes.Contains(logs, []byte("proof-ran-on-proof"))
	})
	stdout, err := execIn(ctx, cfg, k, "default", "proof", "sh", "-c", "echo exec-ok; cat /proc/1/cmdline | tr '\\0' ' '")
	if err != nil || !strings.Contains(stdout, "exec-ok") || !strings.Contains(stdout, "sleep 3600") {
		t.Errorf("step 6: exec: %q, %v", stdout, err)
	}
	// What logs and exec were verified against: the kubelet serves with the certificate
	// the host issued from this cluster's server CA, for its name and address.
	pkiDir := filepath.Join(d.stateDir, "clusters", "proof", "pki")
	if err := kubeletServes(filepath.Join(pkiDir, "server-ca.crt"), internal, node.Name); err != nil {
		t.Errorf("step 6: the kubelet's serving certificate under the cluster's server CA: %v", err)
	}
	var unknownCA x509.UnknownAuthorityError
	if err := kubeletServes(filepath.Join(d.stateDir, "mgmt", "pki", "server-ca.crt"), internal, node.Name); !errors.As(err, &unknownCA) {
		t.Errorf("step 6: the kubelet's serving certificate under another CA (the management API's): %v, want unknown authority", err)
	}
	throughTheDoor(t, ctx, cfg, k, "default", "proof")
	forgotTheJoin(t, ctx, k, d.stateDir, node.Name)
	startBreakdown(t, d.logPath, node.Name)
	t.Logf("timeline from Pod create: Provision %s, VM started %s, Node Ready %s, Pod Running %s",
		tProvision.Round(time.Millisecond), tVM.Round(time.Millisecond), tNodeReady.Round(time.Millisecond), tRunning.Round(time.Millisecond))

	// 7. Delete the Pod: after the hold, the node is drained and deleted, the VM gone.
	if err := k.CoreV1().Pods("default").Delete(ctx, "proof", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	tDeleted := time.Now()
	livetest.Eventually(t, time.Minute, 500*time.Millisecond, "the Pod to be gone", func() bool {
		_, err := k.CoreV1().Pods("default").Get(ctx, "proof", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	livetest.Eventually(t, hold+2*time.Minute, time.Second, "the node and its VM to be gone", func() bool {
		return nodeCount() == 0 && len(qemusOf(d.stateDir)) == 0
	})
	if gone := time.Since(tDeleted); gone < hold {
		t.Errorf("step 7: node gone %s after the Pod, before the %s hold", gone.Round(time.Millisecond), hold)
	}
	t.Logf("node and VM gone %s after the Pod was deleted (hold %s)", time.Since(tDeleted).Round(time.Millisecond), hold)

	// 8. Zero nodes, control plane still Ready.
	if c := d.cluster("proof"); c.Status.Phase != v1.PhaseReady || c.Status.Nodes != 0 || nodeCount() != 0 {
		t.Errorf("step 8: phase %s, status nodes %d, %d Node objects; want Ready at 0", c.Status.Phase, c.Status.Nodes, nodeCount())
	}
	if _, err := k.Discovery().ServerVersion(); err != nil {
		t.Errorf("step 8: apiserver: %v", err)
	}
	// The host keeps the deleted node's console log.
	if con, err := os.ReadFile(filepath.Join(d.stateDir, "nodes", "consoles", node.Name+".log")); err != nil || !bytes.Contains(con, []byte("step=up")) {
		t.Errorf("step 8: console log of %s not kept with the agent's timeline: %v", node.Name, err)
	}
	entries, _ := os.ReadDir(filepath.Join(d.stateDir, "nodes"))
	for _, e := range entries {
		if e.IsDir() && e.Name() != "consoles" {
			t.Errorf("step 8: node directory left: %s", e.Name())
		}
	}
}

// startBreakdown checks the daemon's start breakdown of a node (issue 12, item 4):
// one `node start` log line, once its first Pod has run for 2 s, with every phase,
// none negative, adding up to the total.
func startBreakdown(t *testing.T, daemonLog, node string) {
	t.Helper()
	var line string
	livetest.Eventually(t, time.Minute, time.Second, "the daemon's `node start` line for "+node, func() bool {
		b, err := os.ReadFile(daemonLog)
		if err != nil {
			return false
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, `"msg":"node start"`) && strings.Contains(l, `"node":"`+node+`"`) {
				line = l
				return true
			}
		}
		return false
	})
	var rec struct {
		Seconds map[string]float64 `json:"seconds"`
	}
	if err := json.Unmarshal([]byte(line), &rec); err != nil {
		t.Fatalf("the node start line is not JSON: %v\n%s", err, line)
	}
	sum := 0.0
	for _, phase := range []string{"decision", "vmm", "kernel", "agent", "registered", "ready", "image", "container"} {
		v, ok := rec.Seconds[phase]
		if !ok || v < 0 {
			t.Errorf("node start: phase %s is %v (present %v); want a duration >= 0\n%s", phase, v, ok, line)
		}
		sum += v
	}
	if total := rec.Seconds["total"]; total <= 0 || math.Abs(sum-total) > 0.05 {
		t.Errorf("node start: the phases add up to %.3f s, the total is %.3f s\n%s", sum, total, line)
	}
	t.Logf("node start breakdown (s): %v", rec.Seconds)
}

// qemuCmdlines maps each qemu process whose command line names stateDir to its
// command line's arguments.
func qemuCmdlines(stateDir string) map[int][][]byte {
	out := map[int][][]byte{}
	for _, pid := range processesMentioning(stateDir) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && bytes.Contains(b, []byte("qemu-system")) {
			out[pid] = bytes.Split(b, []byte{0})
		}
	}
	return out
}

// qemusOf returns the qemu processes whose command line names stateDir.
func qemusOf(stateDir string) []int {
	return slices.Collect(maps.Keys(qemuCmdlines(stateDir)))
}

// vmNamesOf returns the guest names (node names) of the qemu processes of stateDir.
func vmNamesOf(stateDir string) []string {
	var out []string
	for _, args := range qemuCmdlines(stateDir) {
		for _, arg := range args {
			if name, ok := bytes.CutPrefix(arg, []byte("guest=")); ok {
				out = append(out, string(name))
			}
		}
	}
	return out
}

// execIn runs a command in a Pod's first container as kubectl exec does and returns stdout.
func execIn(ctx context.Context, cfg *rest.Config, k kubernetes.Interface, ns, pod string, command ...string) (string, error) {
	req := k.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Command: command, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
	if err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		return stdout.String(), fmt.Errorf("%w (stderr %q)", err, stderr.String())
	}
	return stdout.String(), nil
}

// TestNodeThatCannotJoinIsReported: a node VM that does not register within the boot
// timeout (3 s here, far less than a TCG boot) is reported on its Cluster (NodeBoot
// condition and an Event, both with its last console lines) and deleted; once the Pod is
// gone nothing is left: no qemu, no node directory, no tap.
func TestNodeThatCannotJoinIsReported(t *testing.T) {
	img := nodeImage(t)
	d := newDaemon(t, 1, "--node-image", img, "--node-boot-timeout", "3s")
	d.start()
	d.mustCLI("cluster", "create", "late", "--wait", "--max-nodes", "1")
	_, k := d.tenant("late")
	ctx := ctxT(t, 10*time.Minute)
	grace := int64(0)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "waits", Namespace: "default"},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "main", Image: "busybox:stable", Command: []string{"true"}}}},
	}
	if _, err := k.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var cond *metav1.Condition
	livetest.Eventually(t, 2*time.Minute, 500*time.Millisecond, "a NodeBoot=False JoinTimeout condition on the Cluster", func() bool {
		c := d.cluster("late")
		for i := range c.Status.Conditions {
			if x := c.Status.Conditions[i]; x.Type == v1.ConditionNodeBoot && x.Status == metav1.ConditionFalse && x.Reason == "JoinTimeout" {
				cond = &x
				return true
			}
		}
		return false
	})
	t.Logf("NodeBoot condition: %s", cond.Message)
	if !strings.Contains(cond.Message, "did not register within 3s") || !strings.Contains(cond.Message, "console") {
		t.Errorf("NodeBoot message lacks the timeout or the console lines:\n%s", cond.Message)
	}
	evs, err := k.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs.Items {
		found = found || e.Reason == "NodeJoinTimeout" && e.Type == corev1.EventTypeWarning
	}
	if !found {
		t.Errorf("no Warning Event NodeJoinTimeout among %d events", len(evs.Items))
	}
	if err := k.CoreV1().Pods("default").Delete(ctx, "waits", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	livetest.Eventually(t, time.Minute, 500*time.Millisecond, "every node VM of the cluster to be gone", func() bool {
		entries, _ := os.ReadDir(filepath.Join(d.stateDir, "nodes"))
		dirs := 0
		for _, e := range entries {
			if e.IsDir() && e.Name() != "consoles" {
				dirs++
			}
		}
		return len(qemusOf(d.stateDir)) == 0 && dirs == 0
	})
	if c := d.cluster("late"); c.Status.Phase != v1.PhaseReady {
		t.Errorf("phase %s after the failed boots, want Ready", c.Status.Phase)
	}
}

// TestPodsOnTwoNodesReachEachOther: two Pods that must not share a node get a microVM
// each, and one reaches the other's address across nodes (pod routes via the gateway).
func TestPodsOnTwoNodesReachEachOther(t *testing.T) {
	img := nodeImage(t)
	d := newDaemon(t, 1, "--node-image", img)
	d.start()
	before := hostNetwork(t)
	d.mustCLI("cluster", "create", "pair", "--wait", "--hold", "10s", "--max-nodes", "2")
	cfg, k := d.tenant("pair")
	ctx := ctxT(t, 15*time.Minute)
	zero := int64(0)
	mk := func(name string, cmd string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": "pair", "role": name}},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &zero,
				Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
					RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
						LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "pair"}},
						TopologyKey:   corev1.LabelHostname,
					}},
				}},
				Containers: []corev1.Container{{Name: "main", Image: "busybox:stable", Command: []string{"sh", "-c", cmd}}},
			},
		}
	}
	for _, p := range []*corev1.Pod{
		mk("client", "exec sleep 3600"),
		mk("server", "mkdir -p /www && echo reached-$(hostname) > /www/index.html && exec httpd -f -p 8080 -h /www"),
	} {
		if _, err := k.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pods := map[string]*corev1.Pod{}
	livetest.Eventually(t, 8*time.Minute, time.Second, "both Pods to run", func() bool {
		for _, n := range []string{"client", "server"} {
			p, err := k.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
				return false
			}
			pods[n] = p
		}
		return true
	})
	if pods["client"].Spec.NodeName == pods["server"].Spec.NodeName {
		t.Fatalf("both Pods on %s", pods["client"].Spec.NodeName)
	}
	url := "http://" + pods["server"].Status.PodIP + ":8080/"
	var out string
	livetest.Eventually(t, time.Minute, 2*time.Second, "the client to reach the server's Pod on the other node", func() bool {
		var err error
		out, err = execIn(ctx, cfg, k, "default", "client", "wget", "-q", "-O-", url) // busybox 1.35 wget -T segfaults
		return err == nil && strings.Contains(out, "reached-server")
	})
	t.Logf("client on %s fetched %s from server on %s: %q", pods["client"].Spec.NodeName, url, pods["server"].Spec.NodeName, strings.TrimSpace(out))

	// A ClusterIP Service in front of the server answers on the client's node too
	// (kube-proxy in each node's agent).
	svc, err := k.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "server", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"role": "server"},
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svcURL := "http://" + svc.Spec.ClusterIP + "/"
	var lastErr error
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, lastErr = execIn(ctx, cfg, k, "default", "client", "wget", "-q", "-O-", svcURL)
		if lastErr == nil && strings.Contains(out, "reached-server") {
			break
		}
		if time.Now().After(deadline) {
			slices, _ := k.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{})
			con, _ := os.ReadFile(filepath.Join(d.stateDir, "nodes", pods["client"].Spec.NodeName, "console.log"))
			t.Fatalf("the client did not reach %s (Service server) in 2m: %q, %v\nendpoint slices: %+v\nclient node console, kube-proxy lines:\n%s\nclient node console (tail):\n%s",
				svcURL, out, lastErr, slices.Items, grepLines(string(con), "proxy", "nft", "conntrack", "Sync"), tail(string(con), 30))
		}
		time.Sleep(2 * time.Second)
	}
	t.Logf("client fetched %s (Service server): %q", svcURL, strings.TrimSpace(out))

	// Cluster DNS, answered by the client's own node: the Service's short name (through
	// the Pod's search path) and its full name.
	for _, u := range []string{"http://server/", "http://server.default.svc.cluster.local/"} {
		livetest.Eventually(t, time.Minute, 2*time.Second, "the client to reach "+u+" by name", func() bool {
			var err error
			out, err = execIn(ctx, cfg, k, "default", "client", "wget", "-q", "-O-", u)
			return err == nil && strings.Contains(out, "reached-server")
		})
	}
	for _, n := range []string{"client", "server"} {
		if err := k.CoreV1().Pods("default").Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	livetest.Eventually(t, 3*time.Minute, time.Second, "both nodes and VMs to be gone", func() bool {
		nl, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		return err == nil && len(nl.Items) == 0 && len(qemusOf(d.stateDir)) == 0
	})

	// Deleting the cluster leaves the host's interfaces, routes and nftables rules as
	// they were before it was created: no bridge, tap, pod route or NAT rule behind.
	d.mustCLI("cluster", "delete", "pair", "--wait")
	after := hostNetwork(t)
	for what, lines := range before {
		if !slices.Equal(lines, after[what]) {
			t.Errorf("%s after the cluster was deleted:\n%s\nbefore it was created:\n%s", what,
				strings.Join(after[what], "\n"), strings.Join(lines, "\n"))
		}
	}
}

// hostNetwork lists the host's interfaces, IPv4 routes and nftables rules (every table,
// iptables-nft's included), one sorted line each.
func hostNetwork(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for what, cmd := range map[string][]string{
		"interfaces":  {"ip", "-o", "link", "show"},
		"routes":      {"ip", "route", "show"},
		"nft ruleset": {"nft", "-s", "list", "ruleset"}, // -s: without counters
	} {
		b, err := exec.Command(cmd[0], cmd[1:]...).Output()
		if err != nil {
			t.Fatalf("%s: %v", strings.Join(cmd, " "), err)
		}
		var lines []string
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if what == "interfaces" { // "3: eth0: <...> ... state UP ...": name only, counters change
				if f := strings.Fields(l); len(f) > 1 {
					l = strings.TrimSuffix(f[1], ":")
				}
			}
			lines = append(lines, l)
		}
		slices.Sort(lines)
		out[what] = lines
	}
	// VMs' cgroups (qemu and its virtiofsd): removed with their VM, by `down` too.
	groups, _ := filepath.Glob("/sys/fs/cgroup/*/socialweb/vm-*")
	v2, _ := filepath.Glob("/sys/fs/cgroup/socialweb/vm-*")
	out["VM cgroups"] = slices.Sorted(slices.Values(append(groups, v2...)))
	return out
}

// kubeletServes dials the kubelet at ip:10250 and verifies its serving certificate for
// ip under the CA in caFile, as the apiserver does (--kubelet-certificate-authority),
// and that the certificate also names the node.
func kubeletServes(caFile, ip, nodeName string) error {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("no certificate in %s", caFile)
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", net.JoinHostPort(ip, "10250"),
		&tls.Config{RootCAs: pool, ServerName: ip})
	if err != nil {
		return err
	}
	defer conn.Close()
	leaf := conn.ConnectionState().PeerCertificates[0]
	if err := leaf.VerifyHostname(nodeName); err != nil {
		return fmt.Errorf("the certificate does not name the node: %w", err)
	}
	return nil
}
