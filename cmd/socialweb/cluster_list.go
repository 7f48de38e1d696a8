package main

import (
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
)

func newClusterListCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List tenant clusters: name, phase, URL, nodes, age",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			m, err := g.connect(ctx)
			if err != nil {
				return err
			}
			list, err := m.dyn.Resource(v1.ClusterResource).List(ctx, metav1.ListOptions{})
			if err != nil {
				return fmt.Errorf("listing clusters: %w", err)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 3, ' ', 0)
			fmt.Fprintln(w, "NAME\tPHASE\tURL\tNODES\tAGE")
			for i := range list.Items {
				c, err := v1.FromUnstructured(&list.Items[i])
				if err != nil {
					return err
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\n", c.Name, c.Status.Phase, c.Status.URL, c.Status.Nodes, age(c.CreationTimestamp))
			}
			return w.Flush()
		},
	}
}
