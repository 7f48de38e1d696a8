package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
)

func newClusterGetCommand(g *globalOptions) *cobra.Command {
	var out output
	cmd := &cobra.Command{
		Use:   "get NAME [-o json|yaml|wide]",
		Short: "Show one cluster: a summary, or with -o yaml or json the object",
		Args:  nameArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			_, c, err := g.connectTo(ctx, args[0])
			if err != nil {
				return err
			}
			switch out {
			case outputDefault:
				_, err = fmt.Fprint(os.Stdout, clusterSummary(c, time.Now()))
				return err
			case outputWide:
				_, err = fmt.Fprint(os.Stdout, clusterSummaryWide(c, time.Now()))
				return err
			}
			c.ManagedFields = nil
			u, err := c.ToUnstructured()
			if err != nil {
				return err
			}
			return writeObject(os.Stdout, out, u.Object)
		},
	}
	addOutputFlag(cmd.Flags(), &out, "a summary of spec, status and conditions")
	documentEnv(cmd.Flags())
	return cmd
}
