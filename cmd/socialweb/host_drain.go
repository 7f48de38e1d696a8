package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/retry"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
)

func newHostDrainCommand(g *globalOptions) *cobra.Command {
	var (
		wait    bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "drain NAME",
		Short: "Move every tenant off a host, one at a time, and place no new one there",
		Long: `Marks the host drained: placement puts no new tenant on it, and the host hands
its tenants, one at a time, to the hosts placement picks. While a tenant moves,
every host's front door holds its new connections until it answers on its new
host. A tenant whose datastore is sqlite cannot move and stays. ` + "`socialweb host resume NAME`" + ` ends the drain.`,
		Args: hostArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			return setDraining(cmd.Context(), g, args[0], true, wait, timeout)
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", true, "wait until the host runs no tenant that can move, printing each move")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Minute, "how long --wait waits")
	documentEnv(cmd.Flags())
	return cmd
}

func newHostResumeCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "resume NAME",
		Short: "End a host's drain: new tenants may be placed on it again",
		Args:  hostArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			return setDraining(cmd.Context(), g, args[0], false, false, 0)
		},
	}
	documentEnv(cmd.Flags())
	return cmd
}

// setDraining sets a Host's spec.draining and, draining with wait, waits until
// it runs none of the tenants that can move.
func setDraining(ctx context.Context, g *globalOptions, host string, draining, wait bool, timeout time.Duration) error {
	m, err := g.connect(ctx)
	if err != nil {
		return err
	}
	res := m.dyn.Resource(v1.HostGVR)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		u, err := res.Get(ctx, host, metav1.GetOptions{})
		if err != nil {
			return err
		}
		h, err := v1.HostFromUnstructured(u)
		if err != nil {
			return err
		}
		h.Spec.Draining = draining
		if u, err = h.ToUnstructured(); err != nil {
			return err
		}
		_, err = res.Update(ctx, u, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("host %s: %w (`socialweb host list` names the hosts)", host, err)
	}
	if !draining {
		fmt.Fprintf(os.Stderr, "host %s takes new tenants again\n", host)
		return nil
	}
	fmt.Fprintf(os.Stderr, "host %s is drained: no new tenant goes there, and its tenants move one at a time\n", host)
	if !wait {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := -1
	for {
		list, err := m.dyn.Resource(v1.ClusterResource).List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("listing clusters: %w", err)
		}
		left, stuck := 0, 0
		for i := range list.Items {
			c, err := v1.FromUnstructured(&list.Items[i])
			if err != nil || c.Status.Host != host {
				continue
			}
			if c.Spec.Datastore != "postgres" {
				stuck++
				continue
			}
			left++
		}
		if left != last {
			fmt.Fprintf(os.Stderr, "host %s: %d tenants left to move\n", host, left)
			last = left
		}
		if left == 0 {
			if stuck > 0 {
				fmt.Fprintf(os.Stderr, "host %s still runs %d tenants whose datastore is sqlite: they cannot move (back them up and restore them elsewhere, or delete them)\n", host, stuck)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("host %s still runs %d tenants after %s: `socialweb cluster get NAME` says why of each (its Placed condition)", host, left, timeout)
		case <-time.After(time.Second):
		}
	}
}

// hostArg validates the single host NAME argument.
func hostArg(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usageError{fmt.Errorf("%s takes exactly one host NAME (`socialweb host list` names them), got %d arguments", cmd.CommandPath(), len(args))}
	}
	if errs := validation.IsDNS1123Label(args[0]); len(errs) > 0 {
		return usageError{fmt.Errorf("host name %q: %s", args[0], strings.Join(errs, "; "))}
	}
	return nil
}
