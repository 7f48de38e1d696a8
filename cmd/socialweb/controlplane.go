package main

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spf13/cobra"

	"github.com/socialweb-computer/socialweb/internal/controlplane"
	"github.com/socialweb-computer/socialweb/internal/logrotate"
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
			if err := noNewPrivs(); err != nil {
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

// noNewPrivsEnv marks the process image that already runs with no_new_privs.
const noNewPrivsEnv = "SOCIALWEB_CONTROLPLANE_NO_NEW_PRIVS"

// noNewPrivs makes the control plane, which serves tenants, unable to gain
// privileges through exec (setuid binaries, file capabilities) from here on.
// The flag is per thread and the Go runtime already runs several, so it is set
// on this one and the process image is executed again from it: every thread of
// the new image has it. The pid, its cgroup and inherited fds stay.
func noNewPrivs() error {
	if os.Getenv(noNewPrivsEnv) != "" {
		return nil
	}
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no_new_privs: %w", err)
	}
	// /proc/self/exe: this very build, even if an upgrade replaced the file.
	env := append(os.Environ(), noNewPrivsEnv+"=1")
	if err := syscall.Exec("/proc/self/exe", os.Args, env); err != nil {
		return fmt.Errorf("running again with no_new_privs: %w", err)
	}
	return nil
}
