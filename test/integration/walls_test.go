package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/provider"
	"github.com/socialweb-computer/socialweb/internal/tenantuid"
)

// asUID runs a shell script as uid (and gid uid, no other group): what a tenant's
// control plane taken over could do. Its output is stdout and stderr.
func asUID(uid int, script string) (string, error) {
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid), Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestControlPlaneInItsBox: each tenant's control plane runs in a cgroup of its own
// with its limits, with no_new_privs and a seccomp filter (internal/syscallfilter). One made to exceed its memory (a limit it
// cannot start under) is OOM-killed there, the Cluster says so, and it is restarted;
// the other tenant and the daemon do not notice. Each runs as a uid of its own
// (tenantuid): it reads its own config and keys, writes only its run dir, and a
// symlink it plants there is not followed by the daemon.
func TestControlPlaneInItsBox(t *testing.T) {
	d := newDaemon(t, 2)
	d.start()

	// Bad input: a clear error and no cluster.
	if _, errOut, code := d.cli("cluster", "create", "bad", "--control-plane-memory", "1Mi"); code == 0 || !strings.Contains(errOut, "--control-plane-memory 1Mi: want 0") {
		t.Errorf("create with --control-plane-memory 1Mi: exit %d, %q; want an error naming the flag and what is accepted", code, errOut)
	}
	if out, _, _ := d.cli("cluster", "list"); strings.Contains(out, "bad") {
		t.Errorf("a refused create left a cluster:\n%s", out)
	}

	d.mustCLI("cluster", "create", "ok", "--wait", "--control-plane-pids", "2048", "--control-plane-cpu-weight", "50")
	_, k := d.tenant("ok")
	ctx := ctxT(t, 5*time.Minute)
	pidOf := func(cluster string) int {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(provider.ClusterDir(d.stateDir, cluster), "instance.json"))
		if err != nil {
			return 0
		}
		var rec struct {
			PID int `json:"pid"`
		}
		if err := json.Unmarshal(b, &rec); err != nil {
			t.Fatal(err)
		}
		return rec.PID
	}
	pid := pidOf("ok")
	if pid == 0 {
		t.Fatal("no instance record of ok's control plane")
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nNoNewPrivs:\t1\n", "\nSeccomp:\t2\n"} {
		if !strings.Contains(string(status), want) {
			t.Errorf("ok's control plane %d runs without %q (no_new_privs, a seccomp filter):\n%s", pid, strings.TrimSpace(want), status)
		}
	}
	// Its own uid and gid, the daemon's base plus its port, and no other group.
	uid := tenantuid.DefaultBase + int(d.cluster("ok").Status.Port)
	fields := map[string]string{}
	for _, line := range strings.Split(string(status), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	ids := fmt.Sprintf("%d %[1]d %[1]d %[1]d", uid)
	if fields["Uid"] != ids || fields["Gid"] != ids || fields["Groups"] != "" {
		t.Errorf("ok's control plane %d runs as Uid %q, Gid %q, Groups %q; want %q, %q and none", pid, fields["Uid"], fields["Gid"], fields["Groups"], ids, ids)
	}
	cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	group := provider.CgroupName(d.stateDir, "ok")
	if !strings.Contains(string(cg), "/socialweb/"+group+"\n") {
		t.Errorf("ok's control plane is not in its cgroup %s:\n%s", group, cg)
	}
	for file, want := range map[string]string{
		"memory.max|memory/socialweb/" + group + "/memory.limit_in_bytes": strconv.Itoa(2 << 30), // the daemon's default, 2Gi
		"pids.max|pids/socialweb/" + group + "/pids.max":                  "2048",
		"cpu.weight|cpu/socialweb/" + group + "/cpu.shares":               "50|512",
	} {
		v2file, v1file, _ := strings.Cut(file, "|")
		got, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/socialweb", group, v2file))
		if err != nil {
			got, err = os.ReadFile(filepath.Join("/sys/fs/cgroup", v1file))
		}
		if err != nil || !strings.Contains("|"+want+"|", "|"+strings.TrimSpace(string(got))+"|") {
			t.Errorf("%s = %q (%v), want %s", file, got, err, want)
		}
	}

	// A tenant whose control plane cannot fit its memory: killed in its own group.
	d.mustCLI("cluster", "create", "small", "--control-plane-memory", v1.MinControlPlaneMemory)
	var cond *metav1.Condition
	livetest.Eventually(t, 3*time.Minute, time.Second, "small's Cluster to say its control plane was OOM-killed", func() bool {
		cond = meta.FindStatusCondition(d.cluster("small").Status.Conditions, v1.ConditionRunning)
		return cond != nil && strings.Contains(cond.Message, "OOM-killed")
	})
	t.Logf("small: %s: %s", cond.Reason, cond.Message)
	// And it is tried again (the supervisor's backoff), still inside its limit.
	livetest.Eventually(t, time.Minute, time.Second, "small's control plane to be restarted", func() bool {
		p := pidOf("small")
		return p != 0 && running(p)
	})

	// Nobody else noticed: ok answers, with the same process, and the daemon runs.
	if _, err := k.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("ok's apiserver after small's OOM kills: %v", err)
	}
	if p := pidOf("ok"); p != pid {
		t.Errorf("ok's control plane changed from %d to %d", pid, p)
	}
	if !d.running() {
		t.Fatal("the daemon died")
	}
	if c := d.cluster("ok"); c.Status.Phase != v1.PhaseReady {
		t.Errorf("ok is %s, want Ready", c.Status.Phase)
	}

	// What ok's uid (its control plane, taken over) can reach: its own config and
	// keys to read; not small's keys or run dir, not the cluster list, not a write
	// to its own config.
	okDir, smallDir := provider.ClusterDir(d.stateDir, "ok"), provider.ClusterDir(d.stateDir, "small")
	for _, tc := range []struct{ what, script string }{
		{"read its own config", "cat " + filepath.Join(okDir, "controlplane.json")},
		{"read its own CA key", "cat " + filepath.Join(okDir, "pki", "server-ca.key")},
		{"write its run dir", "echo x > " + filepath.Join(okDir, "run", "probe") + " && rm " + filepath.Join(okDir, "run", "probe")},
	} {
		if out, err := asUID(uid, tc.script); err != nil {
			t.Errorf("ok's uid cannot %s: %v: %s", tc.what, err, out)
		}
	}
	for _, tc := range []struct{ what, script string }{
		{"read small's CA key", "cat " + filepath.Join(smallDir, "pki", "server-ca.key")},
		{"list small's run dir", "ls " + filepath.Join(smallDir, "run")},
		{"read small's datastore", "cat " + filepath.Join(smallDir, "run", "state.db")},
		{"list the clusters", "ls " + filepath.Join(d.stateDir, "clusters")},
		{"list the state dir", "ls " + d.stateDir},
		{"read the management API's keys", "cat " + filepath.Join(d.stateDir, "mgmt", "pki", "server-ca.key")},
		{"write its own config", "echo '{}' >> " + filepath.Join(okDir, "controlplane.json")},
		{"remove its own config", "rm -f " + filepath.Join(okDir, "controlplane.json")},
		{"make a file beside its config", "touch " + filepath.Join(okDir, "instance.json.tmp")},
	} {
		out, err := asUID(uid, tc.script)
		if err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("ok's uid could %s (%v): %s", tc.what, err, out)
		}
	}
	// What ok's uid can connect to: the kernel's wall (nodenet.ControlPlaneRuleset),
	// under the apiserver's egress proxy, which a shell as the uid never goes through.
	okPort, smallPort := int(d.cluster("ok").Status.Port), int(d.cluster("small").Status.Port)
	lan := livetest.NewPeer(t)
	lanLn := lan.Listen(t, 8080)
	go func() {
		for {
			c, err := lanLn.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	connect := func(addr string) (string, error) {
		host, port, _ := strings.Cut(addr, ":")
		return asUID(uid, fmt.Sprintf(`timeout 5 bash -c 'exec 3<>/dev/tcp/%s/%s'`, host, port))
	}
	if out, err := connect(fmt.Sprintf("127.0.0.1:%d", okPort)); err != nil {
		t.Errorf("ok's uid cannot connect to its own apiserver on 127.0.0.1:%d: %v: %s", okPort, err, out)
	}
	if c, err := net.DialTimeout("tcp", lan.Addr.String()+":8080", 5*time.Second); err != nil {
		t.Fatalf("the host cannot reach the LAN stand-in (%v): the test would prove nothing", err)
	} else {
		c.Close()
	}
	for _, tc := range []struct{ what, addr string }{
		{"small's apiserver", fmt.Sprintf("127.0.0.1:%d", smallPort)},
		{"the management API", fmt.Sprintf("127.0.0.1:%d", d.apiPort)},
		{"the host's LAN", lan.Addr.String() + ":8080"},
	} {
		out, err := connect(tc.addr)
		if err == nil || !strings.Contains(out, "refused") {
			t.Errorf("ok's uid connecting to %s (%s): %v: %q; want refused", tc.what, tc.addr, err, out)
		}
	}
	if out := runOK(t, 30*time.Second, "nft", "list", "table", "inet", fmt.Sprintf("socialweb-cp-%d", okPort)); !strings.Contains(out, fmt.Sprintf("meta skuid %d ct state new jump wall", uid)) {
		t.Errorf("ok's wall does not match its uid %d:\n%s", uid, out)
	}

	// A symlink it plants where the daemon appends (its log) is not followed: the
	// run fails to start, says why, and the file the link names is untouched.
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("untouched\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(okDir, "run", "controlplane.log")
	if out, err := asUID(uid, "ln -sf "+victim+" "+logPath+".new && mv -f "+logPath+".new "+logPath); err != nil {
		t.Fatalf("planting a symlink as ok's uid: %v: %s", err, out)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	livetest.Eventually(t, time.Minute, time.Second, "ok's Cluster to say its log is not its uid's file", func() bool {
		cond := meta.FindStatusCondition(d.cluster("ok").Status.Conditions, v1.ConditionRunning)
		return cond != nil && strings.Contains(cond.Message, tenantuid.ErrNotOwned.Error())
	})
	if b, _ := os.ReadFile(victim); string(b) != "untouched\n" {
		t.Errorf("the daemon wrote through ok's symlink: %q", b)
	}
	if err := os.Remove(logPath); err != nil {
		t.Fatal(err)
	}
	livetest.Eventually(t, 2*time.Minute, time.Second, "ok to come back once the symlink is gone", func() bool {
		return d.cluster("ok").Status.Phase == v1.PhaseReady
	})
	d.mustCLI("cluster", "delete", "small", "--wait")
	if out := runOK(t, 30*time.Second, "nft", "list", "tables"); strings.Contains(out, fmt.Sprintf("socialweb-cp-%d\n", smallPort)) ||
		!strings.Contains(out, fmt.Sprintf("socialweb-cp-%d\n", okPort)) {
		t.Errorf("after small's delete, want its wall gone and ok's kept:\n%s", out)
	}
	for _, dir := range []string{filepath.Join("/sys/fs/cgroup/socialweb", provider.CgroupName(d.stateDir, "small")),
		filepath.Join("/sys/fs/cgroup/memory/socialweb", provider.CgroupName(d.stateDir, "small"))} {
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("a deleted cluster's cgroup %s is left", dir)
		}
	}
}
