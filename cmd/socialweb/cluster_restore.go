package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/backup"
	"github.com/socialweb-computer/socialweb/internal/provider"
)

func newClusterRestoreCommand(g *globalOptions) *cobra.Command {
	var (
		name    string
		replace bool
		wait    bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "restore FILE",
		Short: "Bring a tenant back from a `cluster backup` file, on this host or another, at zero nodes",
		Long: `Creates a cluster from a backup: its datastore, its CAs and keys, its spec. It starts at
zero nodes; Pods that want one get a node booted here. Every kubeconfig and runner credential
made before the backup is accepted (same CAs, same service-account signing key). The restored
cluster leases a port on this daemon: if it differs from the old one, clients change only
their server address (` + "`socialweb cluster kubeconfig`" + ` prints the new one); through the front door
nothing changes. With --name, the cluster is renamed: its serving certificate names the new
name, so old kubeconfigs must also change tls-server-name to the new NAME.DOMAIN.

The file is checked whole (format, version, checksums, datastore, keys) before anything is
made; a bad file changes nothing. A cluster that exists under the name is not touched unless
--replace says to delete it first.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("%s takes exactly one backup FILE, got %d arguments", cmd.CommandPath(), len(args))}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if name != "" {
				if err := v1.ValidateName(name); err != nil {
					return usageError{fmt.Errorf("--name: %w", err)}
				}
			}
			ctx := cmd.Context()
			f, err := os.Open(args[0])
			if err != nil {
				return usageError{errf("reading the backup: %v", err)}
			}
			defer f.Close()
			start := time.Now()
			a, staged, err := backup.Stage(ctx, f, backup.StagingDir(g.stateDir))
			if err != nil {
				return fmt.Errorf("%s: %w; nothing was restored", args[0], err)
			}
			// From here on, every failure removes the staged copy.
			r := restore{g: g, archive: a, staged: staged, name: name, replace: replace, timeout: timeout}
			c, err := r.run(ctx)
			if err != nil {
				os.RemoveAll(staged)
				return err
			}
			fmt.Fprintf(os.Stderr, "cluster %s restored from %s (backup of %s taken %s on %s) in %.1fs: %s\n",
				c.Name, args[0], a.Header.Cluster, a.Header.Created.Format(time.RFC3339), a.Header.Host, time.Since(start).Seconds(), c.Status.URL)
			if wait {
				wctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				if c, err = waitPhase(wctx, r.m, c.Name, v1.PhaseReady); err != nil {
					return err
				}
				fmt.Fprintf(os.Stderr, "cluster %s is Ready at %s (%.1fs)\n", c.Name, c.Status.URL, time.Since(start).Seconds())
				if err := r.removeBackupNodes(wctx, c); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(os.Stderr, "without --wait the backup's Nodes stay listed until the node lifecycle finds their machines gone (about a minute after the control plane is Ready); a Pod bound to one meanwhile is deleted with it\n")
			}
			if note := r.clientNote(ctx, c); note != "" {
				fmt.Fprintln(os.Stderr, note)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "name of the restored cluster (default: the name in the backup)")
	f.BoolVar(&replace, "replace", false, "delete a cluster of that name, with all its data, before restoring over it (only after the file checked out whole)")
	f.BoolVar(&wait, "wait", true, "wait until the restored control plane is Ready, then delete the backup's Nodes (their machines are not here)")
	f.DurationVar(&timeout, "timeout", 5*time.Minute, "how long --wait, and --replace's delete, wait")
	documentEnv(f)
	return cmd
}

// restore is one restore from a staged, checked backup.
type restore struct {
	g       *globalOptions
	m       *mgmtClients
	archive backup.Archive
	staged  string
	name    string
	replace bool
	timeout time.Duration
}

// run creates the Cluster that adopts the staged backup and waits until the
// daemon has put it in place. On error nothing it made is left but the
// staged copy, which the caller removes.
func (r *restore) run(ctx context.Context) (*v1.Cluster, error) {
	var rec v1.Cluster
	if err := json.Unmarshal(r.archive.Cluster, &rec); err != nil {
		return nil, fmt.Errorf("the backup's cluster spec: %w", err)
	}
	if r.name == "" {
		r.name = r.archive.Header.Cluster
		if err := v1.ValidateName(r.name); err != nil {
			return nil, fmt.Errorf("the backup names cluster %q: %w; restore it with --name", r.name, err)
		}
	}
	m, err := r.g.connect(ctx)
	if err != nil {
		return nil, err
	}
	r.m = m
	_, err = m.dyn.Resource(v1.ClusterResource).Get(ctx, r.name, metav1.GetOptions{})
	switch {
	case err != nil && !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("looking up cluster %s: %w", r.name, err)
	case err == nil && !r.replace:
		return nil, fmt.Errorf("cluster %s exists: nothing was restored; restore under another name with --name, or add --replace to delete %s and its data first", r.name, r.name)
	case err == nil:
		fmt.Fprintf(os.Stderr, "replacing cluster %s: deleting it and its data\n", r.name)
		if err := m.dyn.Resource(v1.ClusterResource).Delete(ctx, r.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("deleting cluster %s for --replace: %w", r.name, err)
		}
		if !waitGone(ctx, m, r.name, r.timeout) {
			return nil, fmt.Errorf("cluster %s is still draining after %s; `socialweb cluster get %s` shows why; run the restore again once it is gone", r.name, r.timeout, r.name)
		}
	}
	dir := provider.ClusterDir(r.g.stateDir, r.name)
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s exists although no cluster %s does (a cluster still being removed, or left by a crash): nothing was restored; move it aside and run the restore again", dir, r.name)
	}
	c := &v1.Cluster{Spec: rec.Spec}
	c.Name, c.Labels = r.name, rec.Labels
	c.Annotations = map[string]string{provider.RestoreAnnotation: filepath.Base(r.staged)}
	// The daemon names its own datastore kind.
	c.Spec.Datastore = ""
	u, err := c.ToUnstructured()
	if err != nil {
		return nil, err
	}
	if _, err := m.dyn.Resource(v1.ClusterResource).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("cluster %s was created by someone else meanwhile: nothing was restored; pick another --name", r.name)
		}
		return nil, fmt.Errorf("creating cluster %s: %w", r.name, err)
	}
	got, err := waitProvisioned(ctx, m, r.name)
	if err != nil {
		// Undo: the daemon removes whatever it made for the cluster.
		_ = m.dyn.Resource(v1.ClusterResource).Delete(context.WithoutCancel(ctx), r.name, metav1.DeleteOptions{})
		waitGone(context.WithoutCancel(ctx), m, r.name, time.Minute)
		return nil, fmt.Errorf("%w; the cluster was deleted again, nothing was restored", err)
	}
	// Adopted: the token names nothing any more. Left there, it would only
	// make a lost cluster directory an error rather than a fresh one.
	patch := []byte(`{"metadata":{"annotations":{"` + provider.RestoreAnnotation + `":null}}}`)
	if _, err := m.dyn.Resource(v1.ClusterResource).Patch(ctx, r.name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		fmt.Fprintf(os.Stderr, "warning: the cluster keeps its annotation %s (%v); it is harmless\n", provider.RestoreAnnotation, err)
	}
	return got, nil
}

// waitProvisioned waits until the daemon has leased the cluster a port and
// put its datastore, PKI and config in place, or says why it could not.
func waitProvisioned(ctx context.Context, m *mgmtClients, name string) (*v1.Cluster, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	c, err := m.waitCluster(ctx, name, func(c *v1.Cluster) (bool, error) {
		for _, t := range []string{v1.ConditionLeased, v1.ConditionProvisioned} {
			if cond := meta.FindStatusCondition(c.Status.Conditions, t); cond != nil && strings.HasSuffix(cond.Reason, "Failed") {
				return false, fmt.Errorf("cluster %s not restored: %s", name, cond.Message)
			}
		}
		return meta.IsStatusConditionTrue(c.Status.Conditions, v1.ConditionProvisioned) && c.Status.URL != "", nil
	})
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("cluster %s was not provisioned within 2m: is `socialweb serve` running? (`socialweb cluster get %s` shows its conditions)", name, name)
	}
	return c, err
}

// clientNote tells what clients made before the backup must change, if
// anything: the server address when the port differs, the TLS server name
// when the name does.
func (r *restore) clientNote(ctx context.Context, c *v1.Cluster) string {
	cfg, err := r.m.adminConfig(ctx, c)
	if err != nil {
		return ""
	}
	h := r.archive.Header
	var change []string
	if h.Server != "" && h.Server != cfg.Host {
		change = append(change, "server "+h.Server+" -> "+cfg.Host)
	}
	if h.ServerName != "" && h.ServerName != cfg.TLSClientConfig.ServerName {
		change = append(change, "tls-server-name "+h.ServerName+" -> "+cfg.TLSClientConfig.ServerName)
	}
	if len(change) == 0 {
		return "kubeconfigs and runner credentials made before the backup work unchanged"
	}
	return fmt.Sprintf("kubeconfigs and runner credentials made before the backup keep their CA, certificates and tokens; change their %s (e.g. kubectl config set-cluster %s --server %s --tls-server-name %s), or take the new admin kubeconfig from `socialweb cluster kubeconfig %s`",
		strings.Join(change, " and "), h.Cluster, cfg.Host, cfg.TLSClientConfig.ServerName, c.Name)
}

// removeBackupNodes deletes the Nodes the backup holds: their machines stayed
// with the old host, and until the node lifecycle marks them NotReady (about
// 40 s) the scheduler would bind Pods to them. A Node made after the backup
// was taken is one of this daemon's, and stays.
func (r *restore) removeBackupNodes(ctx context.Context, c *v1.Cluster) error {
	cfg, err := r.m.adminConfig(ctx, c)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing the restored cluster's nodes: %w", err)
	}
	var gone []string
	for _, n := range nodes.Items {
		if n.CreationTimestamp.After(r.archive.Header.Created) {
			continue
		}
		if err := kube.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting node %s of the backup's host: %w; the node lifecycle removes it within minutes", n.Name, err)
		}
		gone = append(gone, n.Name)
	}
	if len(gone) > 0 {
		fmt.Fprintf(os.Stderr, "deleted the backup's nodes %s: their machines are not on this daemon; Pods that want a node get one booted here\n", strings.Join(gone, ", "))
	}
	return nil
}
