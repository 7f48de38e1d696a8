package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/socialweb-computer/socialweb/internal/registry"
)

func newImageGCCommand(g *globalOptions) *cobra.Command {
	var (
		budget string
		dryRun bool
	)
	cmd := &cobra.Command{
		Use:   "gc [--image-cache-size SIZE] [--dry-run]",
		Short: "Remove least recently used pulled images until the host registry fits a budget, then every blob nothing references",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			q, err := resource.ParseQuantity(budget)
			if err != nil || q.Sign() < 0 {
				return usageError{fmt.Errorf("--image-cache-size %q: want a size such as 20Gi, or 0 to remove only what nothing references", budget)}
			}
			rs := &registry.Server{Dir: filepath.Join(g.stateDir, "registry"), Logger: newLogger(os.Stderr, 0)}
			res, err := rs.GC(q.Value(), dryRun)
			verb := "removed"
			if dryRun {
				verb = "would remove"
			}
			for _, r := range res.RemovedRepos {
				fmt.Printf("%s %s\n", verb, r)
			}
			fmt.Printf("%s %d blobs: %d -> %d bytes\n", verb, res.RemovedBlobs, res.Before, res.After)
			if res.KeptOverBudgetWhy != "" {
				fmt.Fprintf(os.Stderr, "still over the budget of %d bytes: %s\n", q.Value(), res.KeptOverBudgetWhy)
			}
			if err != nil {
				return fmt.Errorf("collecting garbage in %s: %w", g.stateDir, err)
			}
			return nil
		},
	}
	// serve's flag and twin: one budget for the daemon's collections and this one.
	cmd.Flags().StringVar(&budget, "image-cache-size", "50Gi", "size the registry's blobs should fit; pulled images go least recently used first, never a pushed one nor one used in the last 10m; 0 removes only blobs nothing references")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "say what would go, remove nothing")
	documentEnv(cmd.Flags())
	return cmd
}
