package qemu

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/identity"
	"github.com/socialweb-computer/socialweb/internal/layershare"
	"github.com/socialweb-computer/socialweb/internal/nodeimage"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
)

// TestMain turns the test binary into a fake qemu when it is started the way the
// provider starts qemu (first argument -name): the provider's process handling, QMP
// conversation, records and recovery are then tested without root, qemu or an image.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "-name" {
		os.Exit(fakeQemu(os.Args[1:]))
	}
	if len(os.Args) > 1 && os.Args[1] == layershare.WrapperCommand {
		// The live test's virtiofsd wrapper, as the socialweb binary is in production.
		fmt.Fprintln(os.Stderr, layershare.Main(os.Args[2:]))
		os.Exit(111)
	}
	os.Exit(m.Run())
}

// fakePoolBootDelay is how long a fake pool VM's guest takes to reach its identity step.
const fakePoolBootDelay = 200 * time.Millisecond

// fakeQemu checks its arguments the way qemu would fail on them, writes the identity's
// node name to the console file, serves QMP, and exits on system_powerdown or SIGTERM.
// The node name selects misbehaviour: "crash" exits at once with an error on stderr,
// "hang" never opens QMP, "stubborn" ignores system_powerdown and SIGTERM, "dies"
// exits 3 a second after starting, printing a panic to the console, "mute" prints a
// kernel banner and nothing more. A warm-pool VM (the pool marker on its identity disk)
// prints the agent's identity-wait line and, once claimed, the identity it then reads.
func fakeQemu(args []string) int {
	opt := map[string][]string{}
	noValue := map[string]bool{"-nodefaults": true, "-no-user-config": true, "-nographic": true, "-no-reboot": true}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case !strings.HasPrefix(a, "-"):
			fmt.Fprintf(os.Stderr, "qemu-system-x86_64: %s: invalid option\n", a)
			return 1
		case noValue[a]:
			opt[a] = append(opt[a], "")
		case i+1 == len(args):
			fmt.Fprintf(os.Stderr, "qemu-system-x86_64: %s requires an argument\n", a)
			return 1
		default:
			opt[a] = append(opt[a], args[i+1])
			i++
		}
	}
	name := strings.TrimPrefix(opt["-name"][0], "guest=")
	signal.Ignore(syscall.SIGHUP)
	if strings.Contains(name, "crash") {
		fmt.Fprintln(os.Stderr, "qemu-system-x86_64: -netdev tap: could not configure /dev/net/tun: Operation not permitted")
		return 1
	}
	console := strings.TrimPrefix(opt["-serial"][0], "file:")
	sock, _, _ := strings.Cut(strings.TrimPrefix(opt["-qmp"][0], "unix:"), ",")
	var idDisk string
	for _, d := range opt["-drive"] {
		if rest, ok := strings.CutPrefix(d, "id=identity,file="); ok {
			idDisk, _, _ = strings.Cut(rest, ",")
			if !strings.Contains(d, "readonly=on") {
				fmt.Fprintln(os.Stderr, "fake qemu: identity disk is not read-only")
				return 1
			}
		}
	}
	for _, f := range []string{opt["-kernel"][0], opt["-initrd"][0], idDisk} {
		if _, err := os.Stat(f); err != nil {
			fmt.Fprintf(os.Stderr, "qemu-system-x86_64: %v\n", err)
			return 1
		}
	}
	con, err := os.OpenFile(console, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Held open like qemu's disk: a claim must rewrite this file, not replace it.
	f, err := os.Open(idDisk)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	id, err := identity.Decode(io.NewSectionReader(f, 0, identity.MaxSize))
	pooled := errors.Is(err, identity.ErrUnclaimed)
	if err != nil && !pooled {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	switch {
	case strings.Contains(name, "edd"): // stuck in the real-mode stub, as under nested PVM
		fmt.Fprintf(con, "Probing EDD (edd=off to disable)... ok\r\n")
	case strings.Contains(name, "mute"): // a kernel that runs but an agent that never waits
		fmt.Fprintf(con, "[    0.000000] Linux version 6.1.0-fake (fake qemu)\r\n")
	default:
		fmt.Fprintf(con, "[    0.000000] Linux version 6.1.0-fake (fake qemu)\r\n")
		fmt.Fprintf(con, "[    0.000000] Command line: %s\r\n", opt["-append"][0])
		if !pooled {
			fmt.Fprintf(con, "SWQT NAME %s\r\nSWQT ADDRESS %s\r\n", id.NodeName, id.Address)
			break
		}
		// A warm-pool VM: the agent parks at its identity step and reads the disk again
		// until a claim wrote an identity into it.
		go func() {
			time.Sleep(fakePoolBootDelay)
			fmt.Fprintf(con, "time=fake level=INFO msg=agent step=identity-wait\r\n")
			for {
				id, err := identity.Decode(io.NewSectionReader(f, 0, identity.MaxSize))
				if err == nil {
					fmt.Fprintf(con, "SWQT NAME %s\r\nSWQT ADDRESS %s\r\nSWQT MAC %s\r\n", id.NodeName, id.Address, id.MAC)
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	if strings.Contains(name, "dies") {
		go func() { // after Create has seen it running
			time.Sleep(time.Second)
			for i := range 30 {
				fmt.Fprintf(con, "boot line %d\r\n", i)
			}
			fmt.Fprintln(con, "Kernel panic - not syncing: fake")
			fmt.Fprintln(os.Stderr, "fake qemu: guest panicked")
			os.Exit(3)
		}()
	}
	stubborn := strings.Contains(name, "stubborn")
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	quit := make(chan int, 1)
	go func() {
		<-term
		if stubborn {
			fmt.Fprintln(con, "fake qemu: ignoring SIGTERM")
			return
		}
		fmt.Fprintln(os.Stderr, "qemu-system-x86_64: terminating on signal 15")
		quit <- 0
	}()
	if !strings.Contains(name, "hang") {
		l, err := net.Listen("unix", sock)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.Remove(sock)
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go serveQMP(c, con, stubborn, quit)
			}
		}()
	}
	return <-quit
}

func serveQMP(c net.Conn, con *os.File, stubborn bool, quit chan<- int) {
	defer c.Close()
	fmt.Fprintln(c, `{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}}, "capabilities": []}}`)
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		var cmd struct {
			Execute   string `json:"execute"`
			Arguments struct {
				Name string `json:"name"`
				Up   bool   `json:"up"`
			} `json:"arguments"`
		}
		if err := json.Unmarshal(sc.Bytes(), &cmd); err != nil {
			fmt.Fprintln(c, `{"error": {"class": "GenericError", "desc": "bad JSON"}}`)
			continue
		}
		switch cmd.Execute {
		case "qmp_capabilities":
			fmt.Fprintln(c, `{"return": {}}`)
		case "query-status":
			fmt.Fprintln(c, `{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "RESUME"}`)
			fmt.Fprintln(c, `{"return": {"status": "running", "singlestep": false, "running": true}}`)
		case "set_link":
			if cmd.Arguments.Name != "net0" {
				fmt.Fprintf(c, `{"error": {"class": "DeviceNotFound", "desc": "Device '%s' not found"}}`+"\n", cmd.Arguments.Name)
				continue
			}
			fmt.Fprintln(c, `{"return": {}}`)
			fmt.Fprintf(con, "fake qemu: link up=%t\n", cmd.Arguments.Up)
		case "system_powerdown":
			fmt.Fprintln(c, `{"return": {}}`)
			fmt.Fprintln(con, "fake qemu: power button pressed")
			if !stubborn {
				quit <- 0
			}
		default:
			fmt.Fprintf(c, `{"error": {"class": "CommandNotFound", "desc": "The command %s has not been found"}}`+"\n", cmd.Execute)
		}
	}
}

// fakeNetworks records taps.
type fakeNetworks struct {
	mu        sync.Mutex
	taps      map[string]string // tap -> node
	added     int
	failAdd   error
	failRem   error
	failClaim error
	removeLog []string
	claimLog  []string // "<pool tap> -> <tap>"
}

func newFakeNetworks() *fakeNetworks { return &fakeNetworks{taps: map[string]string{}} }

func (f *fakeNetworks) AddTap(ctx context.Context, cluster string, plan nodenet.Plan, node string) (nodenet.Tap, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failAdd != nil {
		return nodenet.Tap{}, f.failAdd
	}
	t := nodenet.Tap{Name: nodenet.TapName(plan.Index, cluster, node), Bridge: nodenet.BridgeName(plan.Index), MAC: nodenet.NodeMAC(cluster, node)}
	f.taps[t.Name] = node
	f.added++
	return t, nil
}

func (f *fakeNetworks) RemoveTap(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failRem != nil {
		return f.failRem
	}
	delete(f.taps, name)
	f.removeLog = append(f.removeLog, name)
	return nil
}

func (f *fakeNetworks) AddPoolTap(ctx context.Context, owner, vm string) (nodenet.Tap, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failAdd != nil {
		return nodenet.Tap{}, f.failAdd
	}
	t := nodenet.Tap{Name: nodenet.PoolTapName(owner, vm), MAC: nodenet.PoolMAC(vm)}
	f.taps[t.Name] = vm
	f.added++
	return t, nil
}

func (f *fakeNetworks) ClaimTap(ctx context.Context, poolTap, cluster string, plan nodenet.Plan, node string) (nodenet.Tap, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failClaim != nil {
		return nodenet.Tap{}, f.failClaim
	}
	if _, ok := f.taps[poolTap]; !ok {
		return nodenet.Tap{}, fmt.Errorf("claiming pool tap %s: no such tap", poolTap)
	}
	t := nodenet.Tap{Name: nodenet.TapName(plan.Index, cluster, node), Bridge: nodenet.BridgeName(plan.Index)}
	delete(f.taps, poolTap)
	f.taps[t.Name] = node
	f.claimLog = append(f.claimLog, poolTap+" -> "+t.Name)
	return t, nil
}

func (f *fakeNetworks) PoolTaps(ctx context.Context, owner string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for t := range f.taps {
		if strings.HasPrefix(t, "swp"+owner+"-") {
			out = append(out, t)
		}
	}
	return out, nil
}

// tapNames lists the taps, sorted.
func (f *fakeNetworks) tapNames() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for t := range f.taps {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

func (f *fakeNetworks) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.taps)
}

// fakeJoiner hands out identities; apiServer defaults to the gateway on 6443.
type fakeJoiner struct {
	mu        sync.Mutex
	err       error
	apiServer string
	calls     int
	override  func(*identity.Identity)
}

func (j *fakeJoiner) Identity(ctx context.Context, req nodes.NodeRequest, addr net.IP, mac string) (identity.Identity, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.calls++
	if j.err != nil {
		return identity.Identity{}, j.err
	}
	api := j.apiServer
	if api == "" {
		gw := addr.To4()
		api = fmt.Sprintf("https://%d.%d.%d.1:6443", gw[0], gw[1], gw[2])
	}
	id := identity.Identity{APIServer: api, CACert: "-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n", ClientCACert: "-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n",
		BootstrapToken: "abcdef.0123456789abcdef", Registry: "http://" + strings.TrimPrefix(strings.TrimSuffix(api, ":6443"), "https://") + ":5000"}
	if j.override != nil {
		j.override(&id)
	}
	return id, nil
}

// testLogger logs to t at debug level.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// plans maps clusters to network indexes.
func plans(m map[string]int) func(string) (nodenet.Plan, error) {
	return func(c string) (nodenet.Plan, error) {
		i, ok := m[c]
		if !ok {
			return nodenet.Plan{}, fmt.Errorf("cluster %s has no network", c)
		}
		return nodenet.ForIndex(i)
	}
}

// fakeImage writes a node image directory with a valid manifest: a tiny kernel and
// initramfs and a sparse 64 MiB rootfs with a few data blocks.
func fakeImage(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "image")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(nodeimage.FileKernel, []byte("fake kernel"))
	write(nodeimage.FileInitramfs, []byte("fake initramfs"))
	rf, err := os.Create(filepath.Join(dir, nodeimage.FileRootfs))
	if err != nil {
		t.Fatal(err)
	}
	if err := rf.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 1 << 20, 40 << 20} {
		if _, err := rf.WriteAt([]byte(strings.Repeat("rootfs-data ", 400)), off); err != nil {
			t.Fatal(err)
		}
	}
	rf.Close()
	m := nodeimage.Manifest{FormatVersion: nodeimage.FormatVersion, Fingerprint: "fake", VCPU: 1, MemMiB: 256,
		Cmdline: "console=ttyS0 root=/dev/vda rw panic=-1 socialweb.init=/sbin/fake-init", Init: "/sbin/fake-init",
		Files: map[string]nodeimage.ManifestFile{}}
	for _, f := range []string{nodeimage.FileKernel, nodeimage.FileInitramfs} {
		b, _ := os.ReadFile(filepath.Join(dir, f))
		sum := sha256.Sum256(b)
		m.Files[f] = nodeimage.ManifestFile{Size: int64(len(b)), SHA256: hex.EncodeToString(sum[:])}
	}
	m.Files[nodeimage.FileRootfs] = nodeimage.ManifestFile{Size: 64 << 20}
	b, _ := json.Marshal(m)
	write(nodeimage.FileManifest, b)
	return dir
}

type fakeEnv struct {
	cfg  Config
	deps Deps
	net  *fakeNetworks
	join *fakeJoiner
}

// newFakeEnv is a Config and Deps that boot fake qemus; cluster "a" is network 5 and
// "b" network 6.
func newFakeEnv(t *testing.T) *fakeEnv {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e := &fakeEnv{net: newFakeNetworks(), join: &fakeJoiner{}}
	e.cfg = Config{StateDir: filepath.Join(t.TempDir(), "state"), ImageDir: fakeImage(t), QemuPath: self,
		Accel: AccelTCG, StopGrace: 5 * time.Second, StartTimeout: 10 * time.Second}
	e.deps = Deps{Networks: e.net, Joiner: e.join, Plan: plans(map[string]int{"a": 5, "b": 6}), Log: testLogger(t)}
	t.Cleanup(func() { killLeftovers(t, e.cfg.StateDir) })
	return e
}

// provider makes a recovered Provider closed at the end of the test.
func (e *fakeEnv) provider(t *testing.T) *Provider {
	t.Helper()
	p, err := New(e.cfg, e.deps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if _, err := p.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	return p
}

func req(cluster, name string) nodes.NodeRequest {
	return nodes.NodeRequest{Cluster: cluster, Name: name, CPUs: 1, MemoryMiB: 256, MaxPods: 16,
		Labels: map[string]string{"socialweb.computer/pool": "default"}}
}

// qemusUsing lists processes whose console file is under stateDir.
func qemusUsing(stateDir string) []supervisor.Identity {
	var out []supervisor.Identity
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		id, err := supervisor.Observe(pid)
		if err == nil && usesStateDir(id.Cmdline, stateDir) {
			out = append(out, id)
		}
	}
	return out
}

// killLeftovers kills (and reports) qemus a failed test left behind.
func killLeftovers(t *testing.T, stateDir string) {
	for _, id := range qemusUsing(stateDir) {
		t.Errorf("left behind: pid %d %s", id.PID, strings.Join(id.Cmdline, " "))
		if id.Alive() {
			syscall.Kill(id.PID, syscall.SIGKILL)
		}
	}
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dirEntries lists the node directories of a state dir (not .lock, not the kept consoles).
func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if e.Name() != ".lock" && e.Name() != dirConsoles {
			out = append(out, e.Name())
		}
	}
	return out
}
