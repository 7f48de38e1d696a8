package main

import (
	"github.com/spf13/cobra"

	"github.com/socialweb-computer/socialweb/internal/layershare"
)

// newVirtiofsdCommand is the wrapper the qemu provider starts for each node VM's
// virtiofsd: it makes the layer store read-only in a private mount namespace, then execs
// virtiofsd (layershare.Main).
func newVirtiofsdCommand() *cobra.Command {
	return &cobra.Command{
		Use:                layershare.WrapperCommand + " --source DIR -- VIRTIOFSD ARGS...",
		Short:              "Run virtiofsd with DIR read-only (started by serve for each node VM)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return layershare.Main(args)
		},
	}
}
