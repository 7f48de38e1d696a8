package main

import (
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/socialweb-computer/socialweb/internal/controlplane"
)

// newControlPlaneCommand is what the daemon runs in each child process.
func newControlPlaneCommand() *cobra.Command {
	var config string
	cmd := &cobra.Command{
		Use:    "controlplane --config FILE",
		Short:  "Run one control plane in this process (started by serve)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := controlplane.ReadConfig(config)
			if err != nil {
				return err
			}
			log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("cluster", c.Name)
			return controlplane.Run(cmd.Context(), c, log)
		},
	}
	cmd.Flags().StringVar(&config, "config", "", "control-plane config file written by the daemon")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}
