package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/provider"
)

func newClusterKubeconfigCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "kubeconfig NAME",
		Short: "Print a tenant's admin kubeconfig (CA and client certificate embedded)",
		Args:  nameArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			m, c, err := g.connectTo(ctx, args[0])
			if err != nil {
				return err
			}
			b, err := m.adminKubeconfig(ctx, c)
			if err != nil {
				return err
			}
			_, err = os.Stdout.Write(b)
			return err
		},
	}
}

// adminKubeconfig is the tenant's admin kubeconfig, as the daemon keeps it.
func (m *mgmtClients) adminKubeconfig(ctx context.Context, c *v1.Cluster) ([]byte, error) {
	s, err := m.kube.CoreV1().Secrets(v1.SystemNamespace).Get(ctx, provider.AdminSecretName(c.Name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && len(s.Data["kubeconfig"]) == 0) {
		return nil, fmt.Errorf("cluster %s has no admin kubeconfig yet (phase %q): retry once it is provisioned, or create with --wait", c.Name, c.Status.Phase)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the admin kubeconfig of %s: %w", c.Name, err)
	}
	return s.Data["kubeconfig"], nil
}

// adminConfig is the tenant's admin kubeconfig as a client config.
func (m *mgmtClients) adminConfig(ctx context.Context, c *v1.Cluster) (*rest.Config, error) {
	b, err := m.adminKubeconfig(ctx, c)
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(b)
	if err != nil {
		return nil, fmt.Errorf("reading the admin kubeconfig of %s: %w", c.Name, err)
	}
	return cfg, nil
}
