package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
)

func newClusterCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Create, inspect, delete, back up and restore tenant clusters",
	}
	cmd.AddCommand(
		newClusterCreateCommand(g),
		newClusterListCommand(g),
		newClusterGetCommand(g),
		newClusterKubeconfigCommand(g),
		newClusterRunnerCredentialCommand(g),
		newClusterDeleteCommand(g),
		newClusterBackupCommand(g),
		newClusterRestoreCommand(g),
	)
	return cmd
}

// connectTo connects to the management API and fetches one Cluster.
func (g *globalOptions) connectTo(ctx context.Context, name string) (*mgmtClients, *v1.Cluster, error) {
	m, err := g.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	c, err := m.getCluster(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	return m, c, nil
}

// getCluster fetches one Cluster with a NotFound error that says what to do.
func (m *mgmtClients) getCluster(ctx context.Context, name string) (*v1.Cluster, error) {
	u, err := m.dyn.Resource(v1.ClusterResource).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("cluster %q not found; `socialweb cluster list` shows the clusters there are", name)
	}
	if err != nil {
		return nil, fmt.Errorf("getting cluster %s: %w", name, err)
	}
	return v1.FromUnstructured(u)
}

// nameArg validates the single NAME argument.
func nameArg(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usageError{fmt.Errorf("%s takes exactly one cluster NAME, got %d arguments", cmd.CommandPath(), len(args))}
	}
	if err := v1.ValidateName(args[0]); err != nil {
		return usageError{err}
	}
	return nil
}

// age is how long before now t was, as kubectl prints ages: 42s, 5m, 3h, 2d.
func age(t, now time.Time) string { return roughDuration(now.Sub(t)) }

// roughDuration keeps d's largest unit; a negative d (clock skew) is 0s.
func roughDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}
