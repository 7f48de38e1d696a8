package qemu

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/socialweb-computer/socialweb/internal/nodeimage"
	"github.com/socialweb-computer/socialweb/internal/nodes"
)

// argAfter returns the values following every occurrence of flag.
func argAfter(args []string, flag string) []string {
	var out []string
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			out = append(out, args[i+1])
		}
	}
	return out
}

func TestArgs(t *testing.T) {
	base := launch{Name: "c1-abc", CPUs: 1, MemoryMiB: 512, Kernel: "/img/vmlinuz", Initrd: "/img/initramfs.cpio.gz",
		Cmdline: "console=ttyS0 root=/dev/vda rw", Rootfs: "/s/c1-abc/rootfs.ext4", IdentityDisk: "/s/c1-abc/identity.img",
		Tap: "swt5-0a1b2c3d", MAC: "02:11:22:33:44:55", Console: "/s/c1-abc/console.log", QMP: "qmp.sock"}
	for _, tc := range []struct {
		name  string
		mod   func(*launch)
		check func(t *testing.T, a []string)
	}{
		{"tcg", func(l *launch) { l.Accel = AccelTCG }, func(t *testing.T, a []string) {
			if got := argAfter(a, "-accel"); !slices.Equal(got, []string{"tcg"}) {
				t.Errorf("-accel %v, want tcg", got)
			}
			if got := argAfter(a, "-cpu"); !slices.Equal(got, []string{"qemu64,+rdrand"}) {
				t.Errorf("-cpu %v under tcg, want qemu64,+rdrand (guest entropy)", got)
			}
		}},
		{"tcg with a bounded translation cache", func(l *launch) { l.Accel, l.TCGCacheMiB = AccelTCG, 128 }, func(t *testing.T, a []string) {
			if got := argAfter(a, "-accel"); !slices.Equal(got, []string{"tcg,tb-size=128"}) {
				t.Errorf("-accel %v, want tcg,tb-size=128", got)
			}
		}},
		{"kvm ignores the TCG cache", func(l *launch) { l.Accel, l.TCGCacheMiB = AccelKVM, 128 }, func(t *testing.T, a []string) {
			if got := argAfter(a, "-accel"); !slices.Equal(got, []string{"kvm"}) {
				t.Errorf("-accel %v, want kvm", got)
			}
		}},
		{"kvm", func(l *launch) { l.Accel = AccelKVM }, func(t *testing.T, a []string) {
			if got := argAfter(a, "-accel"); !slices.Equal(got, []string{"kvm"}) {
				t.Errorf("-accel %v, want kvm", got)
			}
			if got := argAfter(a, "-cpu"); !slices.Equal(got, []string{"host"}) {
				t.Errorf("-cpu %v, want host", got)
			}
		}},
		{"sizes", func(l *launch) { l.CPUs, l.MemoryMiB = 4, 6144 }, func(t *testing.T, a []string) {
			if got := argAfter(a, "-smp"); !slices.Equal(got, []string{"4"}) {
				t.Errorf("-smp %v", got)
			}
			if got := argAfter(a, "-m"); !slices.Equal(got, []string{"6144"}) {
				t.Errorf("-m %v", got)
			}
		}},
		{"machine and flags", nil, func(t *testing.T, a []string) {
			if got := argAfter(a, "-M"); !slices.Equal(got, []string{"microvm"}) {
				t.Errorf("-M %v", got)
			}
			if got := argAfter(a, "-sandbox"); !slices.Equal(got, []string{"on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"}) {
				t.Errorf("-sandbox %v, want qemu's seccomp filter with every deny", got)
			}
			for _, f := range []string{"-nographic", "-no-reboot", "-nodefaults", "-no-user-config"} {
				if !slices.Contains(a, f) {
					t.Errorf("missing %s", f)
				}
			}
			if got := argAfter(a, "-serial"); !slices.Equal(got, []string{"file:/s/c1-abc/console.log"}) {
				t.Errorf("-serial %v", got)
			}
			if got := argAfter(a, "-qmp"); !slices.Equal(got, []string{"unix:qmp.sock,server=on,wait=off"}) {
				t.Errorf("-qmp %v", got)
			}
			if got := argAfter(a, "-append"); !slices.Equal(got, []string{"console=ttyS0 root=/dev/vda rw"}) {
				t.Errorf("-append %v", got)
			}
			if argAfter(a, "-kernel")[0] != "/img/vmlinuz" || argAfter(a, "-initrd")[0] != "/img/initramfs.cpio.gz" {
				t.Errorf("kernel/initrd: %v", a)
			}
		}},
		{"as root: no -runas, every sandbox deny", nil, func(t *testing.T, a []string) {
			if got := argAfter(a, "-runas"); got != nil {
				t.Errorf("-runas %v without a user", got)
			}
		}},
		{"as a user of its own", func(l *launch) { l.UID = 2000100007 }, func(t *testing.T, a []string) {
			if got := argAfter(a, "-runas"); !slices.Equal(got, []string{"2000100007:2000100007"}) {
				t.Errorf("-runas %v, want the VM's user and group", got)
			}
			if got := argAfter(a, "-sandbox"); !slices.Equal(got, []string{SandboxRunAs}) || !strings.Contains(got[0], "spawn=deny") {
				t.Errorf("-sandbox %v, want the filter that lets -runas drop (and still no spawn)", got)
			}
		}},
		{"disks: root rw first, identity read-only second", nil, func(t *testing.T, a []string) {
			drives := argAfter(a, "-drive")
			if len(drives) != 2 {
				t.Fatalf("drives %v", drives)
			}
			if !strings.HasPrefix(drives[0], "id=root,file=/s/c1-abc/rootfs.ext4,") || strings.Contains(drives[0], "readonly") {
				t.Errorf("root drive %q: want the clone, read-write", drives[0])
			}
			if !strings.HasPrefix(drives[1], "id=identity,file=/s/c1-abc/identity.img,") || !strings.Contains(drives[1], "readonly=on") {
				t.Errorf("identity drive %q: want the identity disk, readonly=on", drives[1])
			}
			devs := argAfter(a, "-device")
			if len(devs) != 3 || !strings.Contains(devs[0], "drive=root") || !strings.Contains(devs[1], "drive=identity") {
				t.Errorf("devices %v: want root, identity, net in that order (vda, vdb)", devs)
			}
		}},
		{"tap and MAC", nil, func(t *testing.T, a []string) {
			nd := argAfter(a, "-netdev")
			if !slices.Equal(nd, []string{"tap,id=net0,ifname=swt5-0a1b2c3d,script=no,downscript=no"}) {
				t.Errorf("-netdev %v", nd)
			}
			devs := argAfter(a, "-device")
			if devs[len(devs)-1] != "virtio-net-device,netdev=net0,mac=02:11:22:33:44:55" {
				t.Errorf("net device %q", devs[len(devs)-1])
			}
		}},
		{"shared layers: virtio-fs on shared memory, after the disks and the NIC", func(l *launch) { l.LayersSocket = "virtiofs.sock" }, func(t *testing.T, a []string) {
			if got := argAfter(a, "-M"); !slices.Equal(got, []string{"microvm,memory-backend=mem"}) {
				t.Errorf("-M %v, want microvm,memory-backend=mem (vhost-user needs shared guest RAM)", got)
			}
			if got := argAfter(a, "-object"); !slices.Equal(got, []string{"memory-backend-memfd,id=mem,share=on,size=512M"}) {
				t.Errorf("-object %v, want a shared memfd of the guest's 512M", got)
			}
			if got := argAfter(a, "-global"); !slices.Equal(got, []string{"virtio-mmio.force-legacy=false"}) {
				t.Errorf("-global %v, want modern virtio-mmio (libvhost-user refuses legacy devices)", got)
			}
			if got := argAfter(a, "-chardev"); !slices.Equal(got, []string{"socket,id=layers,path=virtiofs.sock"}) {
				t.Errorf("-chardev %v", got)
			}
			devs := argAfter(a, "-device")
			if len(devs) != 4 || !strings.Contains(devs[0], "drive=root") || !strings.HasPrefix(devs[2], "virtio-net-device") ||
				devs[3] != "vhost-user-fs-device,chardev=layers,tag=socialweb-layers,queue-size=1024" {
				t.Errorf("devices %v: want root, identity, net, then the virtio-fs device tagged socialweb-layers", devs)
			}
		}},
		{"no shared layers: no virtio-fs, no shared memory", nil, func(t *testing.T, a []string) {
			for _, f := range []string{"-object", "-chardev", "-global"} {
				if got := argAfter(a, f); len(got) != 0 {
					t.Errorf("%s %v without shared layers", f, got)
				}
			}
			if strings.Contains(strings.Join(a, " "), "vhost-user") || strings.Contains(strings.Join(a, " "), "memory-backend") {
				t.Errorf("a virtio-fs device or memory backend without shared layers: %v", a)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := base
			if tc.mod != nil {
				tc.mod(&l)
			}
			tc.check(t, l.args())
		})
	}
}

func TestKernelCmdline(t *testing.T) {
	m := &nodeimage.Manifest{Cmdline: "console=ttyS0 root=/dev/vda rw socialweb.init=/sbin/agent", Init: "/sbin/agent"}
	old := &nodeimage.Manifest{Cmdline: "console=ttyS0 root=/dev/vda rw", Init: "/sbin/agent"}
	for _, tc := range []struct {
		name      string
		m         *nodeimage.Manifest
		accel     Accel
		tsc       int64
		fixedMaps bool
		want      string
	}{
		{"tcg adds tsc_early_khz and tsc=reliable", m, AccelTCG, 2096012, false, "console=ttyS0 root=/dev/vda rw socialweb.init=/sbin/agent tsc_early_khz=2096012 tsc=reliable"},
		{"an image's own tsc= wins", &nodeimage.Manifest{Cmdline: "console=ttyS0 tsc=unstable socialweb.init=/a"}, AccelTCG, 1000, false, "console=ttyS0 tsc=unstable socialweb.init=/a tsc_early_khz=1000"},
		{"kvm does not", m, AccelKVM, 2096012, false, "console=ttyS0 root=/dev/vda rw socialweb.init=/sbin/agent"},
		{"tcg with unknown rate", m, AccelTCG, 0, false, "console=ttyS0 root=/dev/vda rw socialweb.init=/sbin/agent"},
		{"init from the manifest when the cmdline lacks it", old, AccelKVM, 0, false, "console=ttyS0 root=/dev/vda rw socialweb.init=/sbin/agent"},
		{"tcg with fixed maps adds norandmaps", m, AccelTCG, 2096012, true, "console=ttyS0 root=/dev/vda rw socialweb.init=/sbin/agent norandmaps tsc_early_khz=2096012 tsc=reliable"},
		{"kvm keeps ASLR whatever it is asked", m, AccelKVM, 2096012, true, "console=ttyS0 root=/dev/vda rw socialweb.init=/sbin/agent"},
		{"an image's own norandmaps is not repeated", &nodeimage.Manifest{Cmdline: "console=ttyS0 norandmaps socialweb.init=/a"}, AccelTCG, 0, true, "console=ttyS0 norandmaps socialweb.init=/a"},
	} {
		if got := kernelCmdline(tc.m, tc.accel, tc.tsc, tc.fixedMaps); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestUsesStateDir(t *testing.T) {
	for _, tc := range []struct {
		cmd  []string
		want bool
	}{
		{[]string{"qemu", "-serial", "file:/var/lib/sw/qemu/c1-abc/console.log"}, true},
		{[]string{"qemu", "-serial", "file:/var/lib/sw/qemu/sub/c1-abc/console.log"}, false}, // a nested state dir's
		{[]string{"qemu", "-serial", "file:/var/lib/sw/qemu2/c1-abc/console.log"}, false},
		{[]string{"qemu", "-serial", "file:/var/lib/sw/qemu/c1-abc/other.log"}, false},
		{[]string{"qemu", "-D", "file:/var/lib/sw/qemu/c1-abc/console.log"}, false},
		{[]string{"vim", "/var/lib/sw/qemu/c1-abc/console.log"}, false},
	} {
		if got := usesStateDir(tc.cmd, "/var/lib/sw/qemu"); got != tc.want {
			t.Errorf("usesStateDir(%q) = %v, want %v", tc.cmd, got, tc.want)
		}
	}
}

func TestHostParsing(t *testing.T) {
	if got, err := memTotalMiB([]byte("MemTotal:       24683620 kB\nMemFree: 1 kB\n")); err != nil || got != 24105 {
		t.Errorf("memTotalMiB = %d, %v; want 24105", got, err)
	}
	if _, err := memTotalMiB([]byte("MemFree: 1 kB\n")); err == nil {
		t.Error("memTotalMiB without MemTotal: no error")
	}
	if got := tscKHz([]byte("processor\t: 0\ncpu MHz\t\t: 2096.012\n")); got != 2096012 {
		t.Errorf("tscKHz = %d, want 2096012", got)
	}
	if got := tscKHz([]byte("processor\t: 0\n")); got != 0 {
		t.Errorf("tscKHz without cpu MHz = %d", got)
	}
}

func TestNewValidation(t *testing.T) {
	e := newFakeEnv(t)
	img := e.cfg.ImageDir
	without := func(file string) string {
		dir := filepath.Join(t.TempDir(), "img")
		os.Mkdir(dir, 0o755)
		for _, f := range []string{nodeimage.FileKernel, nodeimage.FileInitramfs, nodeimage.FileRootfs, nodeimage.FileManifest} {
			if f != file {
				if _, err := cloneFile(filepath.Join(img, f), filepath.Join(dir, f)); err != nil {
					t.Fatal(err)
				}
			}
		}
		return dir
	}
	noKVM := host{CPUs: 2, MemoryMiB: 4096, probe: &ProbeResult{DeviceErr: "open /dev/kvm: no such file or directory"}}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		deps func(*Deps)
		h    host
		want []string
	}{
		{"missing qemu", func(c *Config) { c.QemuPath = "qemu-system-x86_64-not-installed-here" }, nil, noKVM,
			[]string{"qemu-system-x86_64-not-installed-here not found", "apt-get install qemu-system-x86"}},
		{"missing kernel", func(c *Config) { c.ImageDir = without(nodeimage.FileKernel) }, nil, noKVM,
			[]string{"has no vmlinuz", "socialweb image build"}},
		{"missing initramfs", func(c *Config) { c.ImageDir = without(nodeimage.FileInitramfs) }, nil, noKVM,
			[]string{"has no initramfs.cpio.gz", "socialweb image build"}},
		{"missing rootfs", func(c *Config) { c.ImageDir = without(nodeimage.FileRootfs) }, nil, noKVM,
			[]string{"has no rootfs.ext4", "socialweb image build"}},
		{"missing manifest", func(c *Config) { c.ImageDir = without(nodeimage.FileManifest) }, nil, noKVM,
			[]string{"has no manifest.json", "socialweb image build"}},
		{"no image dir", func(c *Config) { c.ImageDir = "" }, nil, noKVM, []string{"socialweb image build"}},
		{"kvm without /dev/kvm", func(c *Config) { c.Accel = AccelKVM }, nil, noKVM, []string{"/dev/kvm is not usable", "Use --accel tcg", "--accel auto"}},
		{"unknown accel", func(c *Config) { c.Accel = "hvf" }, nil, noKVM, []string{`accelerator "hvf"`, "auto, kvm or tcg"}},
		{"comma in state dir", func(c *Config) { c.StateDir = filepath.Join(t.TempDir(), "a,b") }, nil, noKVM, []string{"comma"}},
		{"no joiner", nil, func(d *Deps) { d.Joiner = nil }, noKVM, []string{"Deps.Networks, Deps.Joiner and Deps.Plan are required"}},
		{"two errors at once", func(c *Config) { c.QemuPath = "/nonexistent/qemu"; c.ImageDir = without(nodeimage.FileRootfs) }, nil, noKVM,
			[]string{"apt-get install qemu-system-x86", "has no rootfs.ext4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, deps := e.cfg, e.deps
			cfg.StateDir = filepath.Join(t.TempDir(), "s")
			if tc.mod != nil {
				tc.mod(&cfg)
			}
			if tc.deps != nil {
				tc.deps(&deps)
			}
			p, err := newProvider(cfg, deps, tc.h)
			if err == nil {
				p.Close()
				t.Fatalf("no error; want one mentioning %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}

	t.Run("auto follows the probe; a verdict is used as given", func(t *testing.T) {
		booted := host{CPUs: 2, MemoryMiB: 4096, probe: &ProbeResult{Booted: true, Kernel: "Linux version 6.1"}}
		stuck := host{CPUs: 2, MemoryMiB: 4096, probe: &ProbeResult{TimedOut: true, Console: "Probing EDD (edd=off to disable)... ok"}}
		for _, tc := range []struct {
			name    string
			h       host
			verdict *Verdict
			want    Accel
		}{
			{"no device", noKVM, nil, AccelTCG},
			{"guest booted", booted, nil, AccelKVM},
			{"guest stuck", stuck, nil, AccelTCG},
			{"verdict tcg over a booting probe", booted, &Verdict{Accel: AccelTCG, Reason: "r"}, AccelTCG},
		} {
			cfg := e.cfg
			cfg.Accel, cfg.Verdict, cfg.StateDir = AccelAuto, tc.verdict, filepath.Join(t.TempDir(), "s")
			p, err := newProvider(cfg, e.deps, tc.h)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if p.Accel() != tc.want {
				t.Errorf("%s: accel %s, want %s", tc.name, p.Accel(), tc.want)
			}
			if _, why := p.Accelerator(); why == "" {
				t.Errorf("%s: no reason for the accelerator", tc.name)
			}
			p.Close()
		}
	})

	t.Run("one provider per state dir", func(t *testing.T) {
		cfg := e.cfg
		cfg.StateDir = filepath.Join(t.TempDir(), "s")
		p1, err := newProvider(cfg, e.deps, noKVM)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := newProvider(cfg, e.deps, noKVM); err == nil || !strings.Contains(err.Error(), "in use by another provider") {
			t.Errorf("second provider on the same state dir: %v", err)
		}
		p1.Close()
		p2, err := newProvider(cfg, e.deps, noKVM)
		if err != nil {
			t.Fatalf("after Close: %v", err)
		}
		p2.Close()
	})
}

func TestValidateRequest(t *testing.T) {
	e := newFakeEnv(t)
	p, err := newProvider(e.cfg, e.deps, host{CPUs: 2, MemoryMiB: 24105, probe: &ProbeResult{DeviceErr: "no device"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ok := req("a", "a-0123456789")
	for _, tc := range []struct {
		name string
		mod  func(*nodes.NodeRequest)
		want []string // empty: valid
	}{
		{"valid", func(r *nodes.NodeRequest) {}, nil},
		{"largest that fits", func(r *nodes.NodeRequest) { r.CPUs, r.MemoryMiB = 2, 24105-DefaultHostReserveMiB }, nil},
		{"empty cluster", func(r *nodes.NodeRequest) { r.Cluster = "" }, []string{"empty cluster"}},
		{"no cpus", func(r *nodes.NodeRequest) { r.CPUs = 0 }, []string{"cpus must be positive"}},
		{"no max pods", func(r *nodes.NodeRequest) { r.MaxPods = 0 }, []string{"max pods must be positive"}},
		{"name with a slash", func(r *nodes.NodeRequest) { r.Name = "../etc" }, []string{"not a DNS label"}},
		{"upper-case name", func(r *nodes.NodeRequest) { r.Name = "A-node" }, []string{"not a DNS label"}},
		{"name too long", func(r *nodes.NodeRequest) { r.Name = strings.Repeat("a", 64) }, []string{"not a DNS label"}},
		{"more vCPUs than the host", func(r *nodes.NodeRequest) { r.CPUs = 3 }, []string{"asks for 3 vCPUs", "this host has 2 CPUs", "2 vCPUs or fewer"}},
		{"more memory than the host", func(r *nodes.NodeRequest) { r.MemoryMiB = 30000 },
			[]string{"asks for 30000 MiB", "this host has 24105 MiB", "1024 MiB kept for the host", "23081 MiB or less"}},
		{"just over the margin", func(r *nodes.NodeRequest) { r.MemoryMiB = 24105 - DefaultHostReserveMiB + 1 }, []string{"23081 MiB or less"}},
		{"too little memory", func(r *nodes.NodeRequest) { r.MemoryMiB = 64 }, []string{"below the 256 MiB"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			tc.mod(&r)
			err := p.Validate(r)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error; want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	// Create validates before touching anything.
	if _, err := p.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	big := ok
	big.CPUs = 64
	if _, err := p.Create(t.Context(), big); err == nil || !strings.Contains(err.Error(), "this host has 2 CPUs") {
		t.Errorf("Create of an oversized node: %v", err)
	}
	if e.join.calls != 0 || e.net.added != 0 || len(dirEntries(t, p.cfg.StateDir)) != 0 {
		t.Errorf("an invalid Create touched something: joiner calls %d, taps added %d, dirs %v", e.join.calls, e.net.added, dirEntries(t, p.cfg.StateDir))
	}
	if _, err := p.Create(t.Context(), req("nocluster", "nocluster-x")); err == nil || !strings.Contains(err.Error(), "network plan") {
		t.Errorf("Create for a cluster without a network: %v", err)
	}
}

func TestCloneFile(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, _ := os.Create(src)
	f.Truncate(32 << 20)
	f.WriteAt([]byte("head"), 0)
	f.WriteAt([]byte("middle"), 16<<20)
	f.WriteAt([]byte("tail"), 32<<20-4)
	f.Close()
	dst := filepath.Join(dir, "dst")
	method, err := cloneFile(src, dst)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if string(a) != string(b) {
		t.Fatal("clone differs from the source")
	}
	var sst, dstat = statBlocks(t, src), statBlocks(t, dst)
	t.Logf("clone by %s: source %d KiB allocated, clone %d KiB", method, sst/2, dstat/2)
	if method == cloneSparse && dstat > 4*sst+64 {
		t.Errorf("the sparse copy allocated %d blocks for a source with %d: holes were filled", dstat, sst)
	}
	if _, err := cloneFile(src, dst); !errors.Is(err, os.ErrExist) {
		t.Errorf("cloning onto an existing file: %v, want ErrExist", err)
	}
	if b2, _ := os.ReadFile(dst); string(b2) != string(a) {
		t.Error("a failed clone damaged the existing file")
	}
}

func TestTailLines(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "c")
	var b strings.Builder
	for i := range 5000 {
		b.WriteString("line ")
		b.WriteString(strings.Repeat("x", i%7))
		b.WriteString("\r\n")
	}
	b.WriteString("last line without newline")
	os.WriteFile(f, []byte(b.String()), 0o644)
	got := tailLines(f, 3)
	want := "line \nline x\nlast line without newline" // i = 4998, 4999
	if got != want {
		t.Errorf("tailLines = %q, want %q", got, want)
	}
	if tailLines(filepath.Join(dir, "missing"), 3) != "" || tailLines(f, 0) != "" {
		t.Error("tail of a missing file or of 0 lines is not empty")
	}
	os.WriteFile(f, []byte("a\nb\n"), 0o644)
	if got := tailLines(f, 10); got != "a\nb" {
		t.Errorf("short file: %q", got)
	}
}

func statBlocks(t *testing.T, file string) int64 {
	t.Helper()
	st, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Blocks
}

func TestValidateTCGCache(t *testing.T) {
	for _, tc := range []struct {
		mib int64
		ok  bool
	}{{0, true}, {32, true}, {256, true}, {1024, true}, {16, false}, {-1, false}, {2048, false}} {
		if err := ValidateTCGCache(tc.mib); (err == nil) != tc.ok {
			t.Errorf("ValidateTCGCache(%d) = %v, want ok %v", tc.mib, err, tc.ok)
		}
	}
}

func TestVMMOverhead(t *testing.T) {
	for _, tc := range []struct {
		accel Accel
		cache int64
		want  int64
	}{{AccelKVM, 0, 128}, {AccelKVM, 64, 128}, {AccelTCG, 0, 512}, {AccelTCG, 128, 256}, {AccelTCG, 1024, 512}} {
		if got := vmmOverheadMiB(tc.accel, tc.cache); got != tc.want {
			t.Errorf("vmmOverheadMiB(%s, %d) = %d, want %d", tc.accel, tc.cache, got, tc.want)
		}
	}
}
