package main

import (
	"github.com/spf13/cobra"
)

func newImageCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Node images and the container images nodes pull from the host registry",
	}
	cmd.AddCommand(newImageBuildCommand(), newImagePushCommand(g), newImageListCommand(g), newImageGCCommand(g), newImageBuilderCommand(), newImageBuiltinCommand())
	return cmd
}
