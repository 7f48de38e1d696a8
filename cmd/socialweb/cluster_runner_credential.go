package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/buildcache"
	"github.com/socialweb-computer/socialweb/internal/gitlab"
	"github.com/socialweb-computer/socialweb/internal/provider"
)

func newClusterRunnerCredentialCommand(g *globalOptions) *cobra.Command {
	var (
		grant  = gitlab.Grant{Namespace: gitlab.DefaultNamespace, Name: gitlab.DefaultName, TTL: gitlab.DefaultTTL}
		jobs   = gitlab.DefaultJobOptions()
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
With the host's build cache on (serve --build-cache, the default), the template's
[runners.cache] names the cluster's S3 bucket on the host and its keys, so a job's
cache: outlives its node. The template is written for the cluster's node size and its start from zero nodes:
poll_timeout covers a node boot and image pulls, CPU and memory requests (not limits)
fit a node so jobs pack the way the scale decision plans, output_limit, pull_policy
if-not-present, and with --one-job-per-node a required anti-affinity between job Pods.
Each value carries a comment saying why; a value no node could run is refused.

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
			if err := jobs.Validate(); err != nil {
				return usageError{err}
			}
			if out != "" {
				if _, err := gitlab.CheckOutDir(out); err != nil {
					return usageError{err}
				}
			}
			ctx := cmd.Context()
			m, c, err := g.connectTo(ctx, args[0])
			if err != nil {
				return err
			}
			if c.Status.Phase != v1.PhaseReady {
				return fmt.Errorf("cluster %s is %q, not Ready: wait for it (`socialweb cluster get %s`) and run this again", c.Name, c.Status.Phase, c.Name)
			}
			// Fit the job requests to the cluster's nodes before anything is made in it.
			var settings gitlab.Settings
			jobs.PrivilegedJobs = grant.PrivilegedJobs
			if !revoke {
				settings, err = jobs.ForNode(c.Name, gitlab.NodeSize{
					CPUs: int64(c.Spec.NodeCPUs), Memory: c.Spec.NodeMemory, MaxPods: int(c.Spec.PodsPerNode),
					MaxCPUs: int64(c.Spec.MaxNodeCPUs), MaxMemory: c.Spec.MaxNodeMemory,
				})
				if err != nil {
					return usageError{err}
				}
			}
			cfg, err := m.adminConfig(ctx, c)
			if err != nil {
				return err
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
			cache, err := m.buildCacheAccess(ctx, c.Name)
			if err != nil {
				return err
			}
			cred := gitlab.Credential{Grant: grant, Cluster: c.Name, Server: cfg.Host, ServerName: cfg.TLSClientConfig.ServerName,
				Door: cfg.Host != c.Status.URL, CA: cfg.CAData, Token: token, Expires: expires, Cache: cache}
			fmt.Fprintf(os.Stderr, "minted a token for %s in cluster %s, namespace %s, valid until %s\n",
				grant.Username(), c.Name, grant.Namespace, expires.UTC().Format(time.RFC3339))
			if out == "" {
				kubeconfig, err := cred.Kubeconfig()
				if err != nil {
					return err
				}
				_, err = os.Stdout.Write(kubeconfig)
				return err
			}
			if err := gitlab.WriteOutDir(out, cred, settings); err != nil {
				return err
			}
			cacheNote := "no build cache (the host serves none)"
			if cache != nil {
				cacheNote = "build cache " + cache.Bucket + " at " + cache.Endpoint
			}
			fmt.Fprintf(os.Stderr, "wrote %s, %s and %s in %s: job Pods ask for %dm CPU and %dMi each (nodes of %s), poll_timeout %s, output_limit %d KiB, %s\n",
				gitlab.KubeconfigFile, gitlab.CAFile, gitlab.TemplateFile, out,
				settings.PodCPUMilli, (settings.PodMemory+1<<20-1)>>20, settings.Node, settings.PollTimeout, settings.LogLimitKiB, cacheNote)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&grant.Namespace, "namespace", grant.Namespace, "namespace the runner's job Pods run in (made if missing)")
	f.StringVar(&grant.Name, "name", grant.Name, "name of the runner's ServiceAccount, Role and RoleBinding")
	f.DurationVar(&grant.TTL, "ttl", grant.TTL, fmt.Sprintf("how long the token is accepted (%s to %s)", gitlab.MinTTL, gitlab.MaxTTL))
	f.StringVar(&out, "out", "", "write kubeconfig, ca.crt and config.template.toml into this directory instead of printing the kubeconfig")
	f.BoolVar(&grant.PrivilegedJobs, "privileged-jobs", false, "let job Pods run privileged (docker-in-docker): the namespace enforces Pod Security \"privileged\" instead of \"baseline\"; root in a job is root in its node VM, not on the host")
	f.BoolVar(&revoke, "revoke", false, "delete the ServiceAccount (every token minted for it stops working), Role and RoleBinding")

	// The template's job settings (config.template.toml, with --out).
	f.StringVar(&jobs.JobCPU, "job-cpu", "", "CPU request of the build container (e.g. 500m, 2); default: a node's CPUs / --jobs-per-node, less the helper and services")
	f.StringVar(&jobs.JobMemory, "job-memory", "", "memory request of the build container (e.g. 1Gi); default: a node's schedulable memory / --jobs-per-node, less the helper and services")
	f.StringVar(&jobs.HelperCPU, "helper-cpu", jobs.HelperCPU, "CPU request of the helper container (clone, artifacts)")
	f.StringVar(&jobs.HelperMemory, "helper-memory", jobs.HelperMemory, "memory request of the helper container")
	f.StringVar(&jobs.ServiceCPU, "service-cpu", jobs.ServiceCPU, "CPU request of each service container")
	f.StringVar(&jobs.ServiceMemory, "service-memory", jobs.ServiceMemory, "memory request of each service container")
	f.IntVar(&jobs.ServicesPerJob, "services-per-job", jobs.ServicesPerJob, fmt.Sprintf("services a job Pod is sized for (0 to %d; 0: services get no request)", gitlab.MaxServicesPerJob))
	f.IntVar(&jobs.JobsPerNode, "jobs-per-node", jobs.JobsPerNode, fmt.Sprintf("job Pods a node is shared by when the build requests are derived (1 to %d)", gitlab.MaxJobsPerNode))
	f.BoolVar(&jobs.OneJobPerNode, "one-job-per-node", false, "never put two job Pods on one node (required pod anti-affinity on kubernetes.io/hostname)")
	f.DurationVar(&jobs.PollTimeout, "poll-timeout", jobs.PollTimeout, fmt.Sprintf("how long the runner waits for a job Pod to run: a node boot (%s, the daemon's default --node-boot-timeout) plus image pulls; %s to %s", gitlab.NodeBootDeadline, gitlab.NodeBootDeadline, gitlab.MaxPollTimeout))
	f.DurationVar(&jobs.PollInterval, "poll-interval", jobs.PollInterval, fmt.Sprintf("how often the runner checks a waiting job Pod (%s to %s)", gitlab.MinPollInterval, gitlab.MaxPollInterval))
	f.StringVar(&jobs.LogLimit, "log-limit", jobs.LogLimit, "size at which the runner stops collecting a job's log (output_limit; 1Mi to 1Gi; the runner's own default is 4Mi)")
	f.StringVar(&jobs.HelperImage, "helper-image", "", "helper image the nodes pull from the host registry (${CI_RUNNER_VERSION} allowed); default: the runner's own")
	documentEnv(f)
	return cmd
}

// buildCacheAccess is cluster's build cache access, which the daemon keeps in a Secret
// while it serves the cache; nil when it serves none.
func (m *mgmtClients) buildCacheAccess(ctx context.Context, cluster string) (*buildcache.Access, error) {
	s, err := m.kube.CoreV1().Secrets(v1.SystemNamespace).Get(ctx, provider.BuildCacheSecretName(cluster), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the build cache access of %s: %w", cluster, err)
	}
	a, err := buildcache.AccessFromSecret(s.Data)
	if err != nil {
		return nil, fmt.Errorf("the build cache access of %s: %w (restart serve to write it again)", cluster, err)
	}
	return &a, nil
}
