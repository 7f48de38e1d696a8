package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/socialweb-computer/socialweb/internal/buildinfo"
)

func newVersionCommand() *cobra.Command {
	var out output
	cmd := &cobra.Command{
		Use:   "version [-o json|yaml]",
		Short: "Print the build: socialweb version, commit, Kubernetes version, Go version, OS/arch",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			i := buildinfo.Read()
			if out == outputJSON || out == outputYAML {
				return writeObject(cmd.OutOrStdout(), out, i)
			}
			_, err := fmt.Fprint(cmd.OutOrStdout(), i.String())
			return err
		},
	}
	addOutputFlag(cmd.Flags(), &out, "one fact a line; wide is the same")
	documentEnv(cmd.Flags())
	return cmd
}

// setVersion gives root --version, printing what `socialweb version` prints. The
// text goes through an annotation, not into the template itself, so that nothing
// in it is read as template syntax.
func setVersion(root *cobra.Command) {
	i := buildinfo.Read()
	root.Version = i.Version
	// Ours, before cobra merges pflag.CommandLine: there a linked Kubernetes package
	// (verflag) registers a --version of its own type, which cobra cannot read.
	root.Flags().Bool("version", false, "print the build, as socialweb version does")
	if root.Annotations == nil {
		root.Annotations = map[string]string{}
	}
	root.Annotations["version"] = i.String()
	root.SetVersionTemplate(`{{index .Annotations "version"}}`)
}
