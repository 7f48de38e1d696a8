package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
)

func newClusterDeleteCommand(g *globalOptions) *cobra.Command {
	var (
		wait    bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a tenant cluster: its processes, port lease and data",
		Args:  nameArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			ctx := cmd.Context()
			m, err := g.connect(ctx)
			if err != nil {
				return err
			}
			err = m.dyn.Resource(v1.ClusterResource).Delete(ctx, name, metav1.DeleteOptions{})
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("cluster %q not found; `socialweb cluster list` shows the clusters there are", name)
			}
			if err != nil {
				return fmt.Errorf("deleting cluster %s: %w", name, err)
			}
			if !wait {
				fmt.Fprintf(os.Stderr, "cluster %s is draining\n", name)
				return nil
			}
			if !waitGone(context.WithoutCancel(ctx), m, name, timeout) {
				return fmt.Errorf("cluster %s still draining after %s; `socialweb cluster get %s` shows why", name, timeout, name)
			}
			fmt.Fprintf(os.Stderr, "cluster %s deleted\n", name)
			return nil
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the processes, lease and data are gone")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long --wait waits")
	documentEnv(cmd.Flags())
	return cmd
}
