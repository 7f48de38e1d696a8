package main

import (
	"log/slog"
	"os"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/socialweb-computer/socialweb/internal/controlplane"
)

// newControlPlaneCommand is what the daemon runs in each child process.
func newControlPlaneCommand() *cobra.Command {
	var (
		config   string
		listenFD int
	)
	cmd := &cobra.Command{
		Use:    "controlplane --config FILE",
		Short:  "Run one control plane in this process (started by serve)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// The datastore and sockets it creates hold secrets.
			syscall.Umask(0o077)
			c, err := controlplane.ReadConfig(config)
			if err != nil {
				return err
			}
			c.ListenFD = listenFD
			log := newLogger(os.Stderr, slog.LevelInfo).With("cluster", c.Name)
			return controlplane.Run(cmd.Context(), c, log)
		},
	}
	cmd.Flags().StringVar(&config, "config", "", "control-plane config file written by the daemon")
	cmd.Flags().IntVar(&listenFD, "listen-fd", 0, "an inherited listening socket for the apiserver's loopback port (the daemon holds it while the cluster sleeps); 0 binds the port")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}
