package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/atomicfile"
	"github.com/socialweb-computer/socialweb/internal/gitlab"
)

// Files written by --out.
const (
	runnerKubeconfigFile = "kubeconfig"
	runnerCAFile         = "ca.crt"
	runnerTemplateFile   = "config.template.toml"
)

func newClusterRunnerCredentialCommand(g *globalOptions) *cobra.Command {
	var (
		grant  = gitlab.Grant{Namespace: gitlab.DefaultNamespace, Name: gitlab.DefaultName, TTL: gitlab.DefaultTTL}
		out    string
		revoke bool
	)
	cmd := &cobra.Command{
		Use:   "runner-credential NAME",
		Short: "Mint the scoped credential a GitLab Runner (kubernetes executor) uses in a cluster",
		Long: `Makes a ServiceAccount and a Role in one namespace of the tenant cluster with exactly what
the kubernetes executor needs there (job Pods, exec/attach, logs, Secrets, ConfigMaps,
Services, events), and mints a token for it that expires after --ttl.

Without --out it prints a kubeconfig. With --out DIR it writes DIR/kubeconfig,
DIR/ca.crt and DIR/config.template.toml, for
  gitlab-runner register --non-interactive --url URL --token TOKEN \
    --executor kubernetes --template-config DIR/config.template.toml
Run it again to mint a fresh token; --revoke deletes the ServiceAccount, which
invalidates every token minted for it.`,
		Args: nameArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			// Input first: bad input must not need, or touch, the cluster.
			if err := grant.Validate(); err != nil {
				return usageError{err}
			}
			if revoke && out != "" {
				return usageError{errf("--revoke and --out: a revoked credential writes no files; drop one of them")}
			}
			ctx := cmd.Context()
			m, c, err := g.connectTo(ctx, args[0])
			if err != nil {
				return err
			}
			if c.Status.Phase != v1.PhaseReady {
				return fmt.Errorf("cluster %s is %q, not Ready: wait for it (`socialweb cluster get %s`) and run this again", c.Name, c.Status.Phase, c.Name)
			}
			admin, err := m.adminKubeconfig(ctx, c)
			if err != nil {
				return err
			}
			cfg, err := clientcmd.RESTConfigFromKubeConfig(admin)
			if err != nil {
				return fmt.Errorf("reading the admin kubeconfig of %s: %w", c.Name, err)
			}
			kube, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			if revoke {
				if err := gitlab.Revoke(ctx, kube, grant); err != nil {
					return fmt.Errorf("revoking the runner credential of %s: %w", c.Name, err)
				}
				fmt.Fprintf(os.Stderr, "revoked %s in cluster %s: its tokens are no longer accepted\n", grant.Username(), c.Name)
				return nil
			}
			if err := gitlab.Apply(ctx, kube, grant); err != nil {
				return fmt.Errorf("granting the runner role in %s: %w", c.Name, err)
			}
			token, expires, err := gitlab.MintToken(ctx, kube, grant)
			if err != nil {
				return err
			}
			cred := gitlab.Credential{Grant: grant, Cluster: c.Name, Server: cfg.Host, CA: cfg.CAData, Token: token, Expires: expires}
			kubeconfig, err := cred.Kubeconfig()
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "minted a token for %s in cluster %s, namespace %s, valid until %s\n",
				grant.Username(), c.Name, grant.Namespace, expires.UTC().Format(time.RFC3339))
			if out == "" {
				_, err = os.Stdout.Write(kubeconfig)
				return err
			}
			return writeRunnerFiles(out, cred, kubeconfig)
		},
	}
	f := cmd.Flags()
	f.StringVar(&grant.Namespace, "namespace", grant.Namespace, "namespace the runner's job Pods run in (made if missing)")
	f.StringVar(&grant.Name, "name", grant.Name, "name of the runner's ServiceAccount, Role and RoleBinding")
	f.DurationVar(&grant.TTL, "ttl", grant.TTL, fmt.Sprintf("how long the token is accepted (%s to %s)", gitlab.MinTTL, gitlab.MaxTTL))
	f.StringVar(&out, "out", "", "write kubeconfig, ca.crt and config.template.toml into this directory instead of printing the kubeconfig")
	f.BoolVar(&revoke, "revoke", false, "delete the ServiceAccount (every token minted for it stops working), Role and RoleBinding")
	documentEnv(f)
	return cmd
}

// writeRunnerFiles writes the runner's files into dir (0700), secrets 0600; each file
// appears whole or not at all.
func writeRunnerFiles(dir string, cred gitlab.Credential, kubeconfig []byte) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("--out %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return fmt.Errorf("--out %s: %w", dir, err)
	}
	caPath := filepath.Join(abs, runnerCAFile)
	template, err := cred.RunnerTemplate(caPath)
	if err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{runnerCAFile, cred.CA, 0o644},
		{runnerKubeconfigFile, kubeconfig, 0o600},
		{runnerTemplateFile, template, 0o600},
	} {
		if err := atomicfile.Write(filepath.Join(abs, f.name), f.data, f.mode); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "wrote %s, %s and %s in %s\n", runnerKubeconfigFile, runnerCAFile, runnerTemplateFile, abs)
	return nil
}
