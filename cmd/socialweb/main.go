// Command socialweb is the host binary: the daemon (`serve`) and a thin CLI
// over its management API.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	// The IANA zones of idle schedules (internal/window) whatever the host has installed:
	// the CLI that checks one and the daemon that runs it then know the same zones.
	_ "time/tzdata"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRootCommand()
	if err := root.ExecuteContext(ctx); err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(os.Stderr, "socialweb: %v\n", err)
			os.Exit(2)
		}
		fmt.Fprintf(os.Stderr, "socialweb: %v\n", err)
		os.Exit(1)
	}
}

// usageError marks a bad flag or argument: exit status 2.
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

func newRootCommand() *cobra.Command {
	g := &globalOptions{}
	root := &cobra.Command{
		Use:           "socialweb",
		Short:         "Run many tenant Kubernetes clusters that scale their microVM nodes from zero",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if err := applyEnv(cmd); err != nil {
				return usageError{err}
			}
			return nil
		},
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageError{fmt.Errorf("%w (see '%s --help')", err, cmd.CommandPath())}
	})
	g.addFlags(root)
	setVersion(root)
	root.AddCommand(
		newServeCommand(g),
		newClusterCommand(g),
		newHostCommand(g),
		newImageCommand(g),
		newDownCommand(g),
		newControlPlaneCommand(),
		newCopyDatastoreCommand(),
		newVirtiofsdCommand(),
		newVersionCommand(),
		newManPagesCommand(),
	)
	return root
}
