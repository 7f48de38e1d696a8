package main

import (
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/socialweb-computer/socialweb/internal/controlplane"
	"github.com/socialweb-computer/socialweb/internal/logrotate"
	"github.com/socialweb-computer/socialweb/internal/syscallfilter"
)

// newControlPlaneCommand is what the daemon runs in each child process.
func newControlPlaneCommand() *cobra.Command {
	var (
		config   string
		listenFD int
		logFile  string
		logRot   logrotate.Rotation
	)
	cmd := &cobra.Command{
		Use:    "controlplane --config FILE",
		Short:  "Run one control plane in this process (started by serve)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// The control plane serves tenants: no_new_privs and a seccomp filter on
			// every thread, before it reads a byte a tenant wrote.
			if err := syscallfilter.Load(); err != nil {
				return err
			}
			// The datastore and sockets it creates hold secrets.
			syscall.Umask(0o077)
			c, err := controlplane.ReadConfig(config)
			if err != nil {
				return err
			}
			c.ListenFD = listenFD
			log := newLogger(os.Stderr, slog.LevelInfo).With("cluster", c.Name)
			if logFile != "" {
				if err := logRot.Validate(); err != nil {
					return fmt.Errorf("--log-max-size/--log-keep: %w", err)
				}
				// Its own: the daemon that opened the file may be gone.
				go logrotate.Stdio(cmd.Context(), logFile, logRot, time.Second, log)
			}
			return controlplane.Run(cmd.Context(), c, log)
		},
	}
	cmd.Flags().StringVar(&config, "config", "", "control-plane config file written by the daemon")
	cmd.Flags().IntVar(&listenFD, "listen-fd", 0, "an inherited listening socket for the apiserver's loopback port (the daemon holds it while the cluster sleeps); 0 binds the port")
	cmd.Flags().StringVar(&logFile, "log-file", "", "the file stdout and stderr are (opened by serve), rotated by this process; empty: not rotated")
	cmd.Flags().Int64Var(&logRot.MaxSize, "log-max-size", 0, "rotate --log-file past this many bytes (0: never)")
	cmd.Flags().IntVar(&logRot.Keep, "log-keep", 0, "rotated logs kept")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}
