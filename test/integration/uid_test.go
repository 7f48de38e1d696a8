package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/provider"
	"github.com/socialweb-computer/socialweb/internal/tenantuid"
)

// uidOf is the real uid of process pid, -1 if it cannot be read.
func uidOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				if n, err := strconv.Atoi(f[0]); err == nil {
					return n
				}
			}
		}
	}
	return -1
}

// TestRootControlPlanesGetTheirUIDs: a control plane a daemon of
// --control-plane-uid-base 0 left serving (keep) runs as root; the next daemon, of
// the default base, replaces it by the rolling upgrade (the uid is in the
// fingerprint) with one of the tenant's uid, which is given the run dir root's run
// wrote, datastore and all.
func TestRootControlPlanesGetTheirUIDs(t *testing.T) {
	d := newDaemon(t, 1, "--control-planes-on-exit", "keep", "--control-plane-uid-base", "0")
	d.start()
	d.mustCLI("cluster", "create", "was-root", "--wait")
	ctx := ctxT(t, 10*time.Minute)
	_, k := d.tenant("was-root")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kept"}, Data: map[string]string{"k": "v"}}
	if _, err := k.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := provider.ClusterDir(d.stateDir, "was-root")
	record := filepath.Join(dir, "instance.json")
	before := controlPlaneRunning(record)
	if u := uidOf(before); u != 0 {
		t.Fatalf("with --control-plane-uid-base 0 the control plane runs as uid %d, want root", u)
	}

	d.stop(syscall.SIGTERM)
	d.extra = []string{"--control-planes-on-exit", "keep"}
	d.start()
	uid := tenantuid.DefaultBase + int(d.cluster("was-root").Status.Port)
	livetest.Eventually(t, 5*time.Minute, time.Second, "was-root's control plane replaced by one of its uid", func() bool {
		pid := controlPlaneRunning(record)
		return pid != 0 && pid != before && uidOf(pid) == uid
	})
	d.waitPhase("was-root", v1.PhaseReady, 2*time.Minute)
	_, k = d.tenant("was-root")
	got, err := k.CoreV1().ConfigMaps("default").Get(ctx, "kept", metav1.GetOptions{})
	if err != nil || got.Data["k"] != "v" {
		t.Errorf("the ConfigMap made under root: %v, %v", got, err)
	}
	for _, p := range []string{filepath.Join(dir, "run"), filepath.Join(dir, "run", "state.db"), filepath.Join(dir, "run", "controlplane.log")} {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil || int(st.Uid) != uid {
			t.Errorf("%s is uid %d's (%v), want %d's", p, st.Uid, err, uid)
		}
	}
	for _, p := range []string{dir, filepath.Join(dir, "controlplane.json"), filepath.Join(dir, "pki", "server-ca.key")} {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil || st.Uid != 0 || int(st.Gid) != uid || st.Mode&0o027 != 0 {
			t.Errorf("%s: uid %d gid %d mode %o (%v), want root's, group %d, not group-writable, nothing for others", p, st.Uid, st.Gid, st.Mode&0o777, err, uid)
		}
	}
}
