// Command socialweb-node is the node agent of a socialweb microVM: PID 1,
// started by the node image's initramfs (switch_root to socialweb.init=).
// It mounts the API filesystems, reads the identity disk, configures the
// network, starts containerd and runs the kubelet in-process; see package
// internal/agent for the lifecycle.
//
// Usage:
//
//	socialweb-node [-identity /dev/vdb]   run as the node agent (PID 1)
//	socialweb-node -version               print the version
//	socialweb-node kube-proxy --config F  run kube-proxy (the agent starts it as a child)
//	socialweb-node kubelet-rehearsal --root D --image REF  run a standalone kubelet with one
//	                                  throwaway Pod, then remove it (a warm-pool VM's agent
//	                                  starts it as a child)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"k8s.io/component-base/version"

	"github.com/socialweb-computer/socialweb/internal/agent"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == agent.ProxyCommand {
		os.Exit(agent.ProxyMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == agent.KubeletRehearsalCommand {
		os.Exit(agent.KubeletRehearsalMain(os.Args[2:]))
	}
	cfg := agent.DefaultConfig()
	flag.StringVar(&cfg.IdentityDevice, "identity", cfg.IdentityDevice, "identity disk (the kernel command line's socialweb.identity= wins)")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println("socialweb-node", version.Get().GitVersion)
		return
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "socialweb-node: not PID 1; it runs as the init of a socialweb microVM (use -version to check the binary)")
		os.Exit(2)
	}
	err := agent.New(cfg).Run(context.Background())
	// Run returns only if powering off failed; PID 1 must not exit.
	fmt.Fprintln(os.Stderr, "socialweb-node: agent returned:", err)
	select {}
}
