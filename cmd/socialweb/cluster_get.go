package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

func newClusterGetCommand(g *globalOptions) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "get NAME [-o yaml|json]",
		Short: "Show one cluster's spec and status",
		Args:  nameArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "yaml" && output != "json" {
				return usageError{errf("-o %q: want yaml or json", output)}
			}
			ctx := cmd.Context()
			_, c, err := g.connectTo(ctx, args[0])
			if err != nil {
				return err
			}
			c.ManagedFields = nil
			u, err := c.ToUnstructured()
			if err != nil {
				return err
			}
			var b []byte
			if output == "json" {
				b, err = json.MarshalIndent(u.Object, "", "  ")
				b = append(b, '\n')
			} else {
				b, err = yaml.Marshal(u.Object)
			}
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(os.Stdout, string(b))
			return err
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "yaml", "yaml or json")
	documentEnv(cmd.Flags())
	return cmd
}
