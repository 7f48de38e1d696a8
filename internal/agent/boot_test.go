package agent_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/guestbuild"
	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/nodeimage"
	"github.com/socialweb-computer/socialweb/internal/nodes/qemu"
)

// TestAgentBootsUnderQemu builds the agent and containerd 2.x, stages them
// into a node image whose init is the agent, boots it with qemu -M microvm
// (TCG here) on a user-mode network with an identity whose apiserver is a
// host port where nothing listens, and reads the console: the agent comes
// up, configures the network, starts containerd (its socket answered), starts
// the kubelet, and the kubelet tries TLS bootstrap against that apiserver.
// Then QMP system_powerdown (what the qemu provider's Delete sends) must make
// the agent shut down in order and power the VM off.
func TestAgentBootsUnderQemu(t *testing.T) {
	// qemu user networking; 10.0.2.2 is the host's loopback, where nothing
	// listens on port 1 (apiserver) or 5 (registry).
	n := bootNode(t, func(id *identity.Identity) {
		id.APIServer = "https://10.0.2.2:1"
		id.CACert = testCAPEM(t)
		id.ClientCACert = id.CACert
	})
	con := n.con
	must := n.must
	must("agent start", `msg=agent step=start uptime=`, 90*time.Second)
	must("network step", `msg=agent step=network uptime=`, 60*time.Second)
	must("network on the identity's MAC", `msg=network link=eth0 mac=`+bootMAC+` address=10.0.2.15/24 gateway=10.0.2.2`, 5*time.Second)
	must("registry mirror", `msg=registry mirror=http://10\.0\.2\.2:5 hosts=/etc/containerd/certs.d/_default/hosts.toml`, 60*time.Second)
	must("containerd up (its socket answered)", `msg=agent step=containerd-ready uptime=`, 120*time.Second)
	must("kubelet started", `msg=agent step=kubelet uptime=`, 120*time.Second)
	must("agent up", `msg=agent step=up uptime=`, 10*time.Second)
	if _, ok := con.find(regexp.MustCompile(`msg="layer share" state="absent: no virtio-fs device`)); !ok {
		t.Errorf("no 'layer share absent' line: a VM without a virtio-fs device must boot as before")
	}
	must("kubelet TLS bootstrap", `Client rotation is on, will bootstrap in background`, 120*time.Second)
	// The certificate manager tries the apiserver named on the identity disk.
	must("a bootstrap request to the identity's apiserver", `https://10\.0\.2\.2:1/apis/certificates\.k8s\.io|dial tcp 10\.0\.2\.2:1: connect`, 120*time.Second)
	if m, ok := con.find(regexp.MustCompile(`(kubelet ended|agent step failed|panic:|containerd exited|module did not load)`)); ok {
		t.Errorf("trouble on the console: %s", m)
	}
	n.powerdown()
}

const bootMAC = "52:54:00:5e:00:42"

// bootedNode is a node VM under test.
type bootedNode struct {
	t      *testing.T
	con    *console
	qmp    string
	start  time.Time
	waited chan error
	qctx   context.Context
}

func (n *bootedNode) must(what, re string, d time.Duration) string {
	n.t.Helper()
	m, ok := n.con.await(regexp.MustCompile(re), d)
	if !ok {
		n.t.Fatalf("no %s (/%s/) on the console within %s", what, re, d)
	}
	return m
}

// powerdown presses the ACPI power button through QMP (what the qemu
// provider's Delete does) and checks the agent shuts down in order and
// powers the VM off; then it logs the timeline.
func (n *bootedNode) powerdown() {
	t := n.t
	t.Helper()
	n.con.mark()
	if err := qmpCommand(n.qmp, "system_powerdown"); err != nil {
		t.Fatalf("QMP system_powerdown: %v", err)
	}
	n.must("power button", `msg="power button pressed"`, 30*time.Second)
	n.must("shutdown", `msg=agent step=shutdown uptime=\S+ reason="power button"`, 10*time.Second)
	n.must("kubelet stopped", `msg=agent step=stop-kubelet uptime=`, 30*time.Second)
	n.must("containerd stopped", `msg=agent step=stop-containerd uptime=`, 30*time.Second)
	n.must("unmounted", `msg=agent step=unmount uptime=`, 30*time.Second)
	select {
	case err := <-n.waited:
		if n.qctx.Err() != nil {
			t.Fatalf("qemu was killed at the deadline: %v", err)
		}
		t.Logf("qemu exited %s after start: %v", time.Since(n.start).Round(time.Millisecond), err)
	case <-time.After(60 * time.Second):
		t.Fatal("qemu did not exit within 60s of the shutdown: the agent did not power the VM off")
	}
	if !strings.Contains(n.con.text(), "reboot: Power down") {
		t.Errorf("no 'reboot: Power down' from the kernel")
	}
	t.Log("timeline (guest uptime / host time since qemu started):")
	for _, l := range n.con.timeline() {
		t.Log("  " + l)
	}
}

// bootNode builds the agent, containerd and an image whose init is the
// agent, writes an identity for qemu user networking (edited by mutate) and
// boots it with qemu -M microvm (TCG here). SOCIALWEB_BOOT_CONSOLE=<file>
// saves the console there.
func bootNode(t *testing.T, mutate func(*identity.Identity)) *bootedNode {
	t.Helper()
	return bootNodeWith(t, mutate, nil)
}

// bootNodeWith is bootNode with the qemu arguments edited by qemuArgs.
func bootNodeWith(t *testing.T, mutate func(*identity.Identity), qemuArgs func([]string) []string) *bootedNode {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: skipping the image build and boot")
	}
	if os.Geteuid() != 0 {
		livetest.Skip(t, "needs root (debootstrap, chroot for the node image)")
	}
	if err := nodeimage.CheckTools(nil, append(append([]string{}, nodeimage.BuildTools...), "qemu-system-x86_64")...); err != nil {
		livetest.Skip(t, err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	t.Cleanup(cancel)
	dir := t.TempDir()
	progress := func(m string) { t.Log(m) }

	// the programs
	agentBin := filepath.Join(dir, "socialweb-node")
	t0 := time.Now()
	if err := (guestbuild.Builder{Progress: progress}).Agent(ctx, agentBin); err != nil {
		t.Fatal(err)
	}
	t.Logf("agent built in %s", time.Since(t0).Round(time.Second))
	t0 = time.Now()
	ctrd, err := (guestbuild.Builder{Progress: progress}).Containerd(ctx, filepath.Join(nodeimage.DefaultCacheDir(), "guestbuild"), guestbuild.DefaultContainerdVersion)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("containerd %s ready in %s", ctrd.Version, time.Since(t0).Round(time.Second))

	// the image
	extra := ctrd.ExtraFiles()
	extra[guestbuild.GuestAgent] = agentBin
	spec, err := nodeimage.ParseSpec([]byte(`{"vcpu":2,"memMiB":1024,"headroomMiB":512,"init":"` + guestbuild.GuestAgent + `"}`))
	if err != nil {
		t.Fatal(err)
	}
	opts := nodeimage.Options{
		CacheDir:      filepath.Join(dir, "cache"),
		LayerCacheDir: filepath.Join(nodeimage.DefaultCacheDir(), "layers"),
		ExtraFiles:    extra,
		Progress: func(step, msg string) {
			if !strings.HasPrefix(msg, "I: ") {
				t.Logf("[image %s] %s", step, msg)
			}
		},
	}
	img, err := nodeimage.Ensure(ctx, spec, opts)
	if err != nil {
		t.Fatalf("node image: %v", err)
	}
	t.Logf("image %s built in %s, rootfs %d MiB", img.Fingerprint[:12], img.Duration.Round(time.Second), img.Manifest.DiskMiB)
	root := filepath.Join(dir, "rootfs.ext4")
	if out, err := exec.Command("cp", "--sparse=always", filepath.Join(img.Dir, nodeimage.FileRootfs), root).CombinedOutput(); err != nil {
		t.Fatalf("copying rootfs: %v: %s", err, out)
	}

	id := identity.Identity{
		Cluster: "boot", NodeName: "boot-node-1", ProviderID: "socialweb://boot/boot-node-1",
		BootstrapToken: "abcdef.0123456789abcdef",
		Address:        "10.0.2.15/24", Gateway: "10.0.2.2", DNS: "10.0.2.3", ClusterDNS: "10.251.0.10",
		Registry: "http://10.0.2.2:5", MaxPods: 16, MAC: bootMAC,
		Labels: map[string]string{"socialweb.computer/cluster": "boot"},
	}
	mutate(&id)
	idDisk := filepath.Join(dir, "identity.img")
	f, err := os.Create(idDisk)
	if err != nil {
		t.Fatal(err)
	}
	if err := identity.Encode(f, id); err != nil {
		t.Fatal(err)
	}
	f.Close()

	// boot
	qmp := filepath.Join(dir, "qmp.sock")
	cmdline := img.Manifest.Cmdline
	// +rdrand gives the TCG guest RDRAND, so the kernel's random pool is
	// ready at boot (CONFIG_RANDOM_TRUST_CPU) instead of when jitter
	// entropy completes (measured here: 22 s of uptime), which blocks the
	// first crypto/rand reader: the agent's serving key, containerd, the
	// kubelet's TLS.
	// KVM only where a guest of this image boots under it (a nested-PVM /dev/kvm opens
	// and boots no stock kernel): the daemon's own choice.
	accel := []string{"-accel", "tcg", "-cpu", "qemu64,+rdrand"}
	// One vCPU under TCG: two have twice stalled a guest kernel for good under qemu 7.2's
	// multi-threaded TCG (once at "Loading compiled-in X.509 certificates", once in the
	// kubelet's first cgroup_mkdir; docs/status.md), and these tests are about the agent.
	smp := "1"
	v, err := qemu.SelectAccel(ctx, qemu.AccelAuto, qemu.ProbeConfig{ImageDir: img.Dir, CacheDir: nodeimage.DefaultCacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("accelerator: %s", v.Reason)
	if v.Accel == qemu.AccelKVM {
		accel = []string{"-accel", "kvm", "-cpu", "host"}
		smp = "2"
	} else {
		cmdline += tcgCmdline()
	}
	args := append(append([]string{"-M", "microvm"}, accel...),
		"-m", "1024", "-smp", smp,
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-serial", "stdio",
		"-qmp", "unix:"+qmp+",server=on,wait=off",
		"-kernel", filepath.Join(img.Dir, nodeimage.FileKernel),
		"-initrd", filepath.Join(img.Dir, nodeimage.FileInitramfs),
		"-append", cmdline,
		"-drive", "id=root,file="+root+",format=raw,if=none",
		"-device", "virtio-blk-device,drive=root,serial=socialweb-root",
		"-drive", "id=identity,file="+idDisk+",format=raw,if=none,readonly=on",
		"-device", "virtio-blk-device,drive=identity,serial=socialweb-identity",
		"-netdev", "user,id=n0",
		"-device", "virtio-net-device,netdev=n0,mac="+bootMAC,
	)
	if qemuArgs != nil {
		args = qemuArgs(args)
	}
	t.Logf("qemu-system-x86_64 %s", strings.Join(args, " "))
	qctx, qcancel := context.WithTimeout(ctx, 10*time.Minute)
	t.Cleanup(qcancel)
	cmd := exec.CommandContext(qctx, "qemu-system-x86_64", args...)
	cmd.WaitDelay = 5 * time.Second
	// A test binary that dies (go test -timeout panics) takes qemu along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	n := &bootedNode{t: t, con: newConsole(), qmp: qmp, waited: make(chan error, 1), qctx: qctx}
	n.start = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		n.con.read(stdout, n.start)
		n.waited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		qcancel()
		if f := os.Getenv("SOCIALWEB_BOOT_CONSOLE"); f != "" {
			os.WriteFile(f, []byte(n.con.text()+"\n"), 0o644)
		}
		if t.Failed() {
			t.Logf("console:\n%s", n.con.text())
		}
	})
	return n
}

func tcgCmdline() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "cpu MHz"); ok {
			var mhz float64
			if _, err := fmt.Sscanf(strings.TrimLeft(v, " \t:"), "%f", &mhz); err == nil && mhz > 0 {
				return fmt.Sprintf(" tsc_early_khz=%d tsc=reliable", int64(mhz*1000))
			}
		}
	}
	return ""
}

func testCAPEM(t *testing.T) string {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "boot-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// console collects qemu's serial output and answers waits for patterns.
type console struct {
	mu    sync.Mutex
	lines []string
	at    []time.Duration
	from  int // await/find look at lines from here on
	cond  *sync.Cond
	done  bool
}

func newConsole() *console {
	c := &console{}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func (c *console) read(r io.Reader, start time.Time) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		c.mu.Lock()
		c.lines = append(c.lines, strings.TrimRight(sc.Text(), "\r"))
		c.at = append(c.at, time.Since(start))
		c.cond.Broadcast()
		c.mu.Unlock()
	}
	c.mu.Lock()
	c.done = true
	c.cond.Broadcast()
	c.mu.Unlock()
}

func (c *console) mark() {
	c.mu.Lock()
	c.from = len(c.lines)
	c.mu.Unlock()
}

func (c *console) await(re *regexp.Regexp, d time.Duration) (string, bool) {
	timer := time.AfterFunc(d, func() { c.mu.Lock(); c.cond.Broadcast(); c.mu.Unlock() })
	defer timer.Stop()
	deadline := time.Now().Add(d)
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := c.from; ; {
		for ; i < len(c.lines); i++ {
			if re.MatchString(c.lines[i]) {
				return c.lines[i], true
			}
		}
		if c.done || time.Now().After(deadline) {
			return "", false
		}
		c.cond.Wait()
	}
}

func (c *console) find(re *regexp.Regexp) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.lines[c.from:] {
		if re.MatchString(l) {
			return l, true
		}
	}
	return "", false
}

func (c *console) text() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.lines, "\n")
}

var timelineRE = regexp.MustCompile(`msg=agent step=(\S+) uptime=(\S+)(?: took=(\S+))?`)

func (c *console) timeline() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for i, l := range c.lines {
		if m := timelineRE.FindStringSubmatch(l); m != nil {
			s := fmt.Sprintf("%-18s uptime %-8s host %6.2fs", m[1], m[2], c.at[i].Seconds())
			if m[3] != "" {
				s += "  took " + m[3]
			}
			out = append(out, s)
		}
		if strings.Contains(l, "Run /init as init process") || strings.Contains(l, "socialweb-initramfs: switching") ||
			strings.Contains(l, "crng init done") {
			out = append(out, fmt.Sprintf("%-18s host %6.2fs  (%s)", "kernel/initramfs", c.at[i].Seconds(), strings.TrimSpace(l)))
		}
	}
	return out
}

// qmpCommand runs one QMP command on qemu's socket.
func qmpCommand(sock, command string) error {
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	dec := json.NewDecoder(c)
	var greeting map[string]any
	if err := dec.Decode(&greeting); err != nil {
		return fmt.Errorf("greeting: %w", err)
	}
	for _, cmd := range []string{"qmp_capabilities", command} {
		if _, err := fmt.Fprintf(c, `{"execute":%q}`+"\n", cmd); err != nil {
			return err
		}
		for {
			var resp map[string]any
			if err := dec.Decode(&resp); err != nil {
				return fmt.Errorf("%s: %w", cmd, err)
			}
			if _, ok := resp["event"]; ok {
				continue
			}
			if e, ok := resp["error"]; ok {
				return fmt.Errorf("%s: %v", cmd, e)
			}
			break
		}
	}
	return nil
}
