package main

import (
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
)

func newClusterListCommand(g *globalOptions) *cobra.Command {
	var out output
	cmd := &cobra.Command{
		Use:   "list [-o json|yaml|wide]",
		Short: "List tenant clusters: name, phase, URL, nodes, age, host",
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
			if out == outputJSON || out == outputYAML {
				return writeObject(os.Stdout, out, clusterListObject(list))
			}
			cs := make([]v1.Cluster, 0, len(list.Items))
			for i := range list.Items {
				c, err := v1.FromUnstructured(&list.Items[i])
				if err != nil {
					return err
				}
				cs = append(cs, *c)
			}
			return writeClusterTable(os.Stdout, cs, out == outputWide, time.Now())
		},
	}
	addOutputFlag(cmd.Flags(), &out, "a table of name, phase, URL, nodes, age")
	documentEnv(cmd.Flags())
	return cmd
}

// clusterListObject is the clusters as kubectl prints a list: a v1 List of the
// objects as the API returned them, less their managedFields (server bookkeeping).
func clusterListObject(list *unstructured.UnstructuredList) map[string]any {
	items := make([]any, 0, len(list.Items))
	for i := range list.Items {
		u := list.Items[i].DeepCopy()
		u.SetManagedFields(nil)
		if u.GetKind() == "" {
			u.SetAPIVersion(v1.Group + "/" + v1.Version)
			u.SetKind(v1.Kind)
		}
		items = append(items, u.Object)
	}
	return map[string]any{"apiVersion": "v1", "kind": "List", "items": items}
}

// writeClusterTable prints the clusters as `cluster list` does; wide adds the
// network, the node sizes, sleep and the last scale decision.
func writeClusterTable(w io.Writer, cs []v1.Cluster, wide bool, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	if !wide {
		// These five columns are what scripts parse (bench/density): keep them as
		// they are, and add new ones after them.
		fmt.Fprintln(tw, "NAME\tPHASE\tURL\tNODES\tAGE\tHOST")
		for _, c := range cs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", c.Name, c.Status.Phase, c.Status.URL, c.Status.Nodes, age(c.CreationTimestamp.Time, now), orNone(c.Status.Host))
		}
		return tw.Flush()
	}
	fmt.Fprintln(tw, "NAME\tPHASE\tURL\tNODES\tAGE\tHOST\tGATEWAY\tNODE CIDR\tNODE CPUS\tNODE MEMORY\tNODE DISK\tMAX NODES\tSLEEP AFTER\tDATASTORE\tLAST DECISION")
	for i := range cs {
		c := &cs[i]
		s := newSpecText(c)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			c.Name, orNone(string(c.Status.Phase)), orNone(c.Status.URL), c.Status.Nodes, age(c.CreationTimestamp.Time, now), orNone(c.Status.Host),
			orNone(c.Status.Gateway), orNone(c.Status.NodeCIDR),
			s.cpus(), s.memory(), s.disk(), s.maxNodes(), s.sleepAfter(), s.datastore(),
			lastDecisionShort(c.Status.LastScaleDecision, now))
	}
	return tw.Flush()
}

// orNone fills an empty table cell so that the columns stay readable.
func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// lastDecisionShort is a scale decision in one cell: "Provision to 2, 3m ago".
func lastDecisionShort(d *v1.ScaleDecision, now time.Time) string {
	if d == nil {
		return "<none>"
	}
	return fmt.Sprintf("%s to %d, %s ago", d.Action, d.Target, age(d.Time.Time, now))
}
