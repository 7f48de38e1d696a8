package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/socialweb-computer/socialweb/internal/daemon"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
)

// newDownCommand stops what a stopped daemon left running. Node VMs outlive `serve` on
// purpose (the next serve adopts them, so a daemon restart is no outage); this is how an
// operator stops them all instead.
func newDownCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "down",
		Short: "After the daemon has stopped: stop its node VMs and leftover control planes, and remove the clusters' node networks (state is kept)",
		Long: `down stops everything a daemon of --state-dir leaves on the host once the daemon
is gone: node VMs (which survive the daemon so that the next serve adopts them),
control-plane processes that outlived it, and each cluster's bridge, taps, pod routes
and nftables tables (the nodes' and the control plane's). The clusters themselves stay in the state dir: the next serve
brings them back at zero nodes. It refuses, changing nothing, while a daemon serves
the state dir.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			log := newLogger(os.Stderr, slog.LevelInfo)
			rep, err := daemon.Down(cmd.Context(), g.stateDir, nodenet.NewManager(nil, log.With("component", "nodenet")), log)
			line := func(what string, xs []string) {
				if len(xs) > 0 {
					fmt.Fprintf(os.Stdout, "%s: %s\n", what, strings.Join(xs, " "))
				}
			}
			line("stopped control planes", rep.ControlPlanes)
			line("stopped node VMs", rep.Nodes)
			line("removed node networks", rep.Networks)
			if err == nil && len(rep.ControlPlanes)+len(rep.Nodes)+len(rep.Networks) == 0 {
				fmt.Fprintln(os.Stdout, "nothing was running")
			}
			return err
		},
	}
	documentEnv(cmd.Flags())
	return cmd
}
