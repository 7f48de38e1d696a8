package main

import (
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/socialweb-computer/socialweb/internal/registry"
)

func newImageListCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the images the host registry holds",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			rs := &registry.Server{Dir: filepath.Join(g.stateDir, "registry"), Logger: newLogger(os.Stderr, 0)}
			list, err := rs.List()
			if err != nil {
				return fmt.Errorf("listing the registry in %s: %w", g.stateDir, err)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 3, ' ', 0)
			fmt.Fprintln(w, "NAME\tTAG\tDIGEST\tSIZE\tSEEN BY")
			for _, r := range list {
				seen := "every cluster"
				if r.Cluster != "" {
					seen = "cluster " + r.Cluster
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\n", r.Name, r.Tag, r.Digest, r.Size, seen)
			}
			return w.Flush()
		},
	}
}
