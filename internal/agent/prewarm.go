package agent

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// A Pod's first start on a node runs programs the node has not run yet: the runc shim,
// runc (twice: create, and its init in the container), and the CNI plugins of the pod
// network. Under TCG each first run pays for translating the program's code, and qemu
// keeps what it translated for the same guest pages: the page cache's copy of the file,
// mapped at the same addresses on the next run (static Go binaries, not position
// independent). A warm-pool VM therefore runs each of them once, in a mode that does
// nothing, while it waits to be claimed, and its first Pod does not pay again.

// prewarmCNIPlugins are the CNI plugins every sandbox runs: the conflist's (bridge,
// host-local, portmap; see CNITemplate) and containerd's loopback.
func prewarmCNIPlugins() []string { return []string{"loopback", "bridge", "host-local", "portmap"} }

// prewarmCommand is one program run by prewarm.
type prewarmCommand struct {
	path string
	args []string
	env  []string
}

// prewarmCommands lists what prewarm runs: the programs that exist of runc, the shim
// (found on PATH as containerd finds them) and the CNI plugins in cniBinDir.
func prewarmCommands(cniBinDir string, lookPath func(string) (string, error)) []prewarmCommand {
	var out []prewarmCommand
	if p, err := lookPath("containerd-shim-runc-v2"); err == nil {
		out = append(out, prewarmCommand{path: p, args: []string{"-v"}})
	}
	if p, err := lookPath("runc"); err == nil {
		out = append(out, prewarmCommand{path: p, args: []string{"--version"}})
	}
	for _, name := range prewarmCNIPlugins() {
		p := filepath.Join(cniBinDir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			// The CNI VERSION command reads no config and touches no network.
			out = append(out, prewarmCommand{path: p, env: []string{"CNI_COMMAND=VERSION"}})
		}
	}
	return out
}

// prewarm runs cmds one after another until ctx ends (the claim): a claimed node needs
// the vCPU more. It returns how many ran to the end; their output and errors do not
// matter.
func prewarm(ctx context.Context, cmds []prewarmCommand) int {
	n := 0
	for _, c := range cmds {
		if ctx.Err() != nil {
			break
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		cmd := exec.CommandContext(cctx, c.path, c.args...)
		cmd.Env = append(os.Environ(), c.env...)
		if cmd.Start() == nil {
			_ = cmd.Wait()
			if cctx.Err() == nil {
				n++ // ran to its end, whatever it answered
			}
		}
		cancel()
	}
	return n
}

// startPrewarm runs prewarm in the background while a warm-pool VM waits; the returned
// func is called at the claim and waits for it to stop.
func (a *Agent) startPrewarm(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	cmds := prewarmCommands(a.Layout.CNIBinDir, exec.LookPath)
	go func() {
		defer close(done)
		t0 := time.Now()
		n := prewarm(ctx, cmds)
		a.Log.Info("warm-pool VM: ran the programs a Pod start runs", "ran", n, "of", len(cmds), "took", time.Since(t0).Round(time.Millisecond))
	}()
	return func() { cancel(); <-done }
}
