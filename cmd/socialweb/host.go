package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/hosts"
)

func newHostCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "host",
		Short: "The hosts of the service: the daemons that share one management API",
	}
	cmd.AddCommand(newHostListCommand(g), newHostDrainCommand(g), newHostResumeCommand(g))
	return cmd
}

func newHostListCommand(g *globalOptions) *cobra.Command {
	var out output
	cmd := &cobra.Command{
		Use:   "list [-o json|yaml|wide]",
		Short: "List the hosts: name, live, tenants, free memory, address, version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			m, err := g.connect(ctx)
			if err != nil {
				return err
			}
			list, err := m.dyn.Resource(v1.HostGVR).List(ctx, metav1.ListOptions{})
			if err != nil {
				return fmt.Errorf("listing hosts: %w", err)
			}
			if out == outputJSON || out == outputYAML {
				for i := range list.Items {
					list.Items[i].SetManagedFields(nil)
				}
				return writeObject(os.Stdout, out, list.UnstructuredContent())
			}
			leases, err := m.kube.CoordinationV1().Leases(v1.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: hosts.LeaseLabel + "=host"})
			if err != nil {
				return fmt.Errorf("listing host Leases: %w", err)
			}
			hs := make([]v1.Host, 0, len(list.Items))
			for i := range list.Items {
				h, err := v1.HostFromUnstructured(&list.Items[i])
				if err != nil {
					return err
				}
				hs = append(hs, *h)
			}
			return writeHostTable(os.Stdout, hs, leases.Items, out == outputWide, time.Now())
		},
	}
	addOutputFlag(cmd.Flags(), &out, "a table of name, live, tenants, free memory, address, version")
	documentEnv(cmd.Flags())
	return cmd
}

// hostLive says, from a host's Lease, whether it renewed within the Lease's
// duration by this machine's clock, and how long ago it renewed.
func hostLive(l *coordinationv1.Lease, now time.Time) (bool, time.Duration) {
	if l == nil || l.Spec.RenewTime == nil {
		return false, 0
	}
	ago := now.Sub(l.Spec.RenewTime.Time)
	return ago < time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0))*time.Second, ago
}

// writeHostTable prints the hosts as `host list` does.
func writeHostTable(w io.Writer, hs []v1.Host, leases []coordinationv1.Lease, wide bool, now time.Time) error {
	slices.SortFunc(hs, func(a, b v1.Host) int { return strings.Compare(a.Name, b.Name) })
	byHost := map[string]*coordinationv1.Lease{}
	for i := range leases {
		byHost[ptr.Deref(leases[i].Spec.HolderIdentity, "")] = &leases[i]
	}
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	head := "NAME\tLIVE\tTENANTS\tAWAKE\tFREE MEMORY\tADDRESS\tVERSION"
	if wide {
		head += "\tRENEWED\tCPUS\tMEMORY\tMAX TENANTS\tDRAINING\tFRONT DOOR"
	}
	fmt.Fprintln(tw, head)
	for _, h := range hs {
		live, ago := hostLive(byHost[h.Name], now)
		liveText := "no"
		if live {
			liveText = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s", h.Name, liveText, h.Status.Tenants, h.Status.Awake,
			mib(h.Status.FreeMemory.Value()), orNone(h.Status.Address), orNone(h.Status.Version))
		if wide {
			renewed := "never"
			if byHost[h.Name] != nil {
				renewed = roughDuration(ago) + " ago"
			}
			maxTenants := "none"
			if h.Status.MaxTenants > 0 {
				maxTenants = fmt.Sprint(h.Status.MaxTenants)
			}
			fmt.Fprintf(tw, "\t%s\t%d\t%s\t%s\t%t\t%s", renewed, h.Status.CPUs, mib(h.Status.Memory.Value()), maxTenants, h.Spec.Draining, orNone(h.Status.FrontDoor))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// mib is a byte count in MiB, for a table cell.
func mib(b int64) string { return fmt.Sprintf("%d MiB", b>>20) }
