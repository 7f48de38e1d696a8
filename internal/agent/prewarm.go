package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// A Pod's first start on a node runs programs the node has not run yet: the runc shim,
// the OCI runtime (twice: create, and its init in the container), and the CNI plugins of the pod
// network. Under TCG each first run pays for translating the program's code, and qemu
// keeps what it translated for the same guest pages: the page cache's copy of the file,
// mapped at the same addresses on the next run (static Go binaries, not position
// independent; and, as TCG guests boot with norandmaps, shared libraries and PIE
// programs too). A warm-pool VM therefore runs each of them once, in a mode that does
// nothing, while it waits to be claimed, and its first Pod does not pay again.

// prewarmCNIPlugins are the CNI plugins every sandbox runs: the conflist's (bridge,
// host-local, portmap; see CNITemplate) and containerd's loopback.
func prewarmCNIPlugins() []string { return []string{"loopback", "bridge", "host-local", "portmap"} }

// prewarmCommand is one program run by prewarm.
type prewarmCommand struct {
	path  string
	args  []string
	env   []string
	stdin string
}

// prewarmCommands lists what prewarm runs: the shim (found on PATH as containerd finds
// it), the OCI runtime the shim drives (runtime, "" for none) and the CNI plugins in
// cniBinDir that exist, then, with a bundle (writePrewarmBundle), one container's life
// through the runtime as the shim drives it: create (the runtime and its init,
// namespaces, cgroup, mounts), start, delete. A sandbox's first start spent about 5 s
// more in runc than the next container's.
func prewarmCommands(cniBinDir, bundle, runtime string, lookPath func(string) (string, error)) []prewarmCommand {
	var out []prewarmCommand
	if p, err := lookPath("containerd-shim-runc-v2"); err == nil {
		out = append(out, prewarmCommand{path: p, args: []string{"-v"}})
	}
	if runtime != "" {
		out = append(out, prewarmCommand{path: runtime, args: []string{"--version"}})
	}
	for _, name := range prewarmCNIPlugins() {
		p := filepath.Join(cniBinDir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			// The CNI VERSION command reads no config and touches no network.
			out = append(out, prewarmCommand{path: p, env: []string{"CNI_COMMAND=VERSION"}})
		}
	}
	out = append(out, prewarmNetworkCommands(cniBinDir, lookPath)...)
	if runtime != "" && bundle != "" {
		root := []string{"--root", filepath.Join(bundle, "state")}
		out = append(out,
			prewarmCommand{path: runtime, args: append(root, "create", "--bundle", bundle, prewarmContainer)},
			prewarmCommand{path: runtime, args: append(root, "start", prewarmContainer)},
			prewarmCommand{path: runtime, args: append(root, "delete", "--force", prewarmContainer)})
	}
	return out
}

// prewarmContainer is the throwaway container's id.
const prewarmContainer = "socialweb-prewarm"

// The throwaway sandbox network: its namespace, the bridge it hangs off (not the
// conflist's: that one is made, with its gateway address, by the node's first Pod), and
// a link-local /29 whose host-local leases live under /run.
const (
	prewarmNetns   = "socialweb-prewarm"
	prewarmBridge  = "swprewarm0"
	prewarmSubnet  = "169.254.123.0/29"
	prewarmIPAMDir = "/run/socialweb-prewarm/ipam"
)

// prewarmBridgeConf is the bridge plugin's configuration for the throwaway sandbox:
// the conflist's (CNITemplate) but for the bridge, the subnet and where leases go, with
// masquerade on so the plugin's iptables paths run too.
func prewarmBridgeConf() string {
	return `{"cniVersion":"1.0.0","name":"` + prewarmNetns + `","type":"bridge","bridge":"` + prewarmBridge +
		`","isGateway":true,"ipMasq":true,"hairpinMode":true,"ipam":{"type":"host-local","ranges":[[{"subnet":"` +
		prewarmSubnet + `"}]],"dataDir":"` + prewarmIPAMDir + `"}}`
}

// prewarmNetworkCommands sets up and tears down one sandbox's network the way
// containerd's CRI does (loopback, then the bridge plugin with host-local IPAM, ADD then
// DEL) in a namespace of its own, then removes the bridge and the namespace: a CNI
// plugin's VERSION runs only its start, and the sandbox network was 2.6-3.4 s of a warm
// start (docs/benchmarks.md). Nothing is left: the last three are also
// prewarmNetworkUndo.
func prewarmNetworkCommands(cniBinDir string, lookPath func(string) (string, error)) []prewarmCommand {
	ip, err := lookPath("ip")
	if err != nil {
		return nil
	}
	loopback, bridge := filepath.Join(cniBinDir, "loopback"), filepath.Join(cniBinDir, "bridge")
	for _, p := range []string{loopback, bridge, filepath.Join(cniBinDir, "host-local")} {
		if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() {
			return nil
		}
	}
	lo := `{"cniVersion":"1.0.0","name":"` + prewarmNetns + `-lo","type":"loopback"}`
	return append([]prewarmCommand{
		{path: ip, args: []string{"netns", "add", prewarmNetns}},
		prewarmCNI(cniBinDir, loopback, "ADD", "lo", lo),
		prewarmCNI(cniBinDir, bridge, "ADD", "eth0", prewarmBridgeConf()),
		prewarmCNI(cniBinDir, loopback, "DEL", "lo", lo),
	}, prewarmNetworkUndo(ip, cniBinDir)...)
}

// prewarmCNI is one CNI plugin call on the throwaway sandbox's namespace.
func prewarmCNI(cniBinDir, plugin, command, ifname, conf string) prewarmCommand {
	return prewarmCommand{path: plugin, stdin: conf, env: []string{
		"CNI_COMMAND=" + command, "CNI_CONTAINERID=" + prewarmContainer,
		"CNI_NETNS=/run/netns/" + prewarmNetns, "CNI_IFNAME=" + ifname, "CNI_PATH=" + cniBinDir,
	}}
}

// prewarmNetworkUndo tears the throwaway sandbox network down, whatever part of it was
// set up: a claim can stop prewarm between any two steps.
func prewarmNetworkUndo(ip, cniBinDir string) []prewarmCommand {
	return []prewarmCommand{
		prewarmCNI(cniBinDir, filepath.Join(cniBinDir, "bridge"), "DEL", "eth0", prewarmBridgeConf()),
		{path: ip, args: []string{"link", "delete", prewarmBridge}},
		{path: ip, args: []string{"netns", "delete", prewarmNetns}},
	}
}

// prewarmSpec is the throwaway container: /usr/bin/true in new pid, ipc, uts and mount
// namespaces and a cgroup of its own, on a read-only root that has only the node's /usr
// (bound read-only), /proc and a /dev. The host's network: CNI has no pod CIDR yet.
func prewarmSpec() *specs.Spec {
	return &specs.Spec{
		Version: "1.0.2",
		Process: &specs.Process{
			Args: []string{"/usr/bin/true"}, Cwd: "/", Env: []string{"PATH=/usr/bin"},
			NoNewPrivileges: true,
		},
		Root:     &specs.Root{Path: "rootfs", Readonly: true},
		Hostname: prewarmContainer,
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=1m"}},
			{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: "/" + prewarmContainer,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
		},
	}
}

// writePrewarmBundle writes prewarmSpec's bundle into dir: config.json and a rootfs
// whose /bin, /lib and /lib64 lead into /usr, as on the node (merged /usr).
func writePrewarmBundle(dir string) error {
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "usr"), 0o755); err != nil {
		return err
	}
	for _, l := range []string{"bin", "lib", "lib64"} {
		if err := os.Symlink("usr/"+l, filepath.Join(rootfs, l)); err != nil && !os.IsExist(err) {
			return err
		}
	}
	b, err := json.Marshal(prewarmSpec())
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
}

// prewarm runs cmds one after another until ctx ends (the claim): a claimed node needs
// the vCPU more. It returns how many ran to the end, whatever they answered, and what
// those that failed said (a CNI plugin answers VERSION with an exit status of 0; the
// runc steps fail only when the container could not be run).
func prewarm(ctx context.Context, cmds []prewarmCommand) (n int, failed []string) {
	for _, c := range cmds {
		if ctx.Err() != nil {
			break
		}
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		cmd := exec.CommandContext(cctx, c.path, c.args...)
		cmd.Env = append(os.Environ(), c.env...)
		if c.stdin != "" {
			cmd.Stdin = strings.NewReader(c.stdin)
		}
		// Output to a file, not a pipe: the container runc create leaves waiting for
		// its start holds runc's stdio open.
		out, _ := os.CreateTemp("", "prewarm-*")
		if out != nil {
			cmd.Stdout, cmd.Stderr = out, out
		}
		err := cmd.Run()
		if cctx.Err() == nil && (err == nil || cmd.ProcessState != nil) {
			n++ // ran to its end
			if err != nil {
				said := ""
				if out != nil {
					b, _ := os.ReadFile(out.Name())
					said = string(b)
				}
				failed = append(failed, fmt.Sprintf("%s %v: %v: %.200s", filepath.Base(c.path), c.args, err, said))
			}
		}
		if out != nil {
			out.Close()
			os.Remove(out.Name())
		}
		cancel()
	}
	return n, failed
}

// startPrewarm imports the sandbox image (importSandboxImage), then runs prewarm, in the
// background while a warm-pool VM waits; the returned func is called at the claim and
// waits for it to stop.
func (a *Agent) startPrewarm(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	bundle := "/run/socialweb-prewarm"
	if err := writePrewarmBundle(bundle); err != nil {
		a.Log.Warn("warm-pool VM: no throwaway container to prewarm the OCI runtime with", "err", err)
		bundle = ""
	}
	cmds := prewarmCommands(a.Layout.CNIBinDir, bundle, a.OCIRuntime, exec.LookPath)
	// Last, the costliest: the kubelet's start and a Pod through it (rehearsal.go).
	if self, err := os.Executable(); err == nil {
		argv := kubeletRehearsalArgv(self, kubeletRehearsalRoot, a.Config.SandboxImage, kubeletRehearsalFor)
		cmds = append(cmds, prewarmCommand{path: argv[0], args: argv[1:]})
	}
	go func() {
		defer close(done)
		a.importSandboxImage(ctx)
		t0 := time.Now()
		n, failed := prewarm(ctx, cmds)
		a.Log.Info("warm-pool VM: ran the programs a Pod start runs", "ran", n, "of", len(cmds), "failed", len(failed),
			"took", time.Since(t0).Round(time.Millisecond))
		for _, f := range failed {
			a.Log.Warn("warm-pool VM: prewarm step failed", "step", f)
		}
		if n < len(cmds) {
			// Claimed midway: a created container's init would wait for its start
			// forever, and the throwaway network would stay. They are undone beside
			// the node's start, not before it.
			var undo []prewarmCommand
			if a.OCIRuntime != "" && bundle != "" {
				undo = append(undo, prewarmCommand{path: a.OCIRuntime, args: []string{"--root", filepath.Join(bundle, "state"), "delete", "--force", prewarmContainer}})
			}
			if ip, err := exec.LookPath("ip"); err == nil {
				undo = append(undo, prewarmNetworkUndo(ip, a.Layout.CNIBinDir)...)
			}
			go func() {
				prewarm(context.Background(), undo)
				_ = os.RemoveAll(kubeletRehearsalRoot)
				// A rehearsal killed midway leaves its Pod in containerd.
				if cri, closeCRI, err := criClient(a.Layout.ContainerdSocket); err == nil {
					if err := removeRehearsalPod(cri); err != nil {
						a.Log.Warn("warm-pool VM: removing the rehearsal Pod after the claim", "err", err)
					}
					closeCRI()
				}
			}()
		} else {
			_ = os.RemoveAll(kubeletRehearsalRoot)
		}
	}()
	return func() { cancel(); <-done }
}
