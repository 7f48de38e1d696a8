package main

import (
	"github.com/spf13/cobra"

	"github.com/socialweb-computer/socialweb/internal/buildinfo"
	"github.com/socialweb-computer/socialweb/internal/manpage"
)

// newManPagesCommand writes socialweb(1) and a page per command (socialweb-serve(1),
// socialweb-cluster-create(1), ...) from the same text as --help, for hack/package.
// Hidden: it is a build step, not something an operator runs. SOURCE is the pages'
// footer ("socialweb VERSION"; the package passes its own version), the date
// $SOURCE_DATE_EPOCH when set, so a package build is reproducible.
func newManPagesCommand() *cobra.Command {
	return &cobra.Command{
		Use:    "man-pages DIR [SOURCE]",
		Short:  "Write the man pages of every command into DIR (for packaging)",
		Hidden: true,
		Args:   cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			source := "socialweb " + buildinfo.Read().Version
			if len(args) == 2 {
				source = args[1]
			}
			return manpage.Write(cmd.Root(), args[0], source)
		},
	}
}
