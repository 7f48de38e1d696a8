package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/socialweb-computer/socialweb/internal/registry"
)

func newImagePushCommand(g *globalOptions) *cobra.Command {
	var refs []string
	cmd := &cobra.Command{
		Use:   "push TARBALL [--ref NAME:TAG]",
		Short: "Load an OCI layout or docker-save tarball into the host registry nodes pull from",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("%s takes one TARBALL (an OCI layout or `docker save` tar, optionally gzipped)", cmd.CommandPath())}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return fmt.Errorf("opening %s: %w", args[0], err)
			}
			defer f.Close()
			rs := &registry.Server{Dir: filepath.Join(g.stateDir, "registry"), Logger: newLogger(os.Stderr, 0)}
			loaded, err := rs.Import(cmd.Context(), f, refs...)
			if err != nil {
				return fmt.Errorf("loading %s: %w", args[0], err)
			}
			for _, r := range loaded {
				fmt.Println(r)
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&refs, "ref", nil, "name the image (e.g. docker.io/library/app:1); the tarball must then hold one image")
	documentEnv(cmd.Flags())
	return cmd
}
