package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/backup"
	"github.com/socialweb-computer/socialweb/internal/controlplane"
	"github.com/socialweb-computer/socialweb/internal/datastore"
	"github.com/socialweb-computer/socialweb/internal/provider"
)

func newClusterBackupCommand(g *globalOptions) *cobra.Command {
	var (
		out       string
		overwrite bool
	)
	cmd := &cobra.Command{
		Use:   "backup NAME --out FILE",
		Short: "Write a tenant's datastore, PKI and spec to one file, while it serves or sleeps",
		Long: `Writes a consistent snapshot of a tenant: its datastore (a sqlite copy taken in one
read transaction, so it may serve and be written meanwhile; a sleeping tenant is not woken;
a postgres tenant's kine table is copied into the same sqlite form),
its whole PKI (the CAs and their keys, the service-account signing key) and its Cluster spec.
` + "`socialweb cluster restore FILE`" + ` brings it back, here or on another host, and every
kubeconfig and runner credential made before the backup works against it.

The file is written with mode 0600 and is not encrypted: it holds the tenant's CA keys, so
anyone who can read it can act as the tenant's admin. Keep it as you keep kubeconfigs.`,
		Args: nameArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if out == "" {
				return usageError{errf("--out is empty: name the file to write, e.g. --out %s.swbackup", name)}
			}
			if st, err := os.Stat(out); err == nil {
				if st.IsDir() {
					return usageError{errf("--out %s is a directory: name a file in it, e.g. %s", out, filepath.Join(out, name+".swbackup"))}
				}
				if !overwrite {
					return usageError{errf("--out %s exists: name another file, or add --overwrite to replace it", out)}
				}
			} else if !errors.Is(err, os.ErrNotExist) {
				return usageError{errf("--out %s: %v", out, err)}
			}
			dir := filepath.Dir(out)
			if st, err := os.Stat(dir); err != nil || !st.IsDir() {
				return usageError{errf("--out %s: its directory %s does not exist; make it first", out, dir)}
			}
			ctx := cmd.Context()
			m, c, err := g.connectTo(ctx, name)
			if err != nil {
				return err
			}
			if c.DeletionTimestamp != nil {
				return fmt.Errorf("cluster %s is being deleted: there is nothing left to back up", name)
			}
			src := backup.Source{ClusterDir: provider.ClusterDir(g.stateDir, name)}
			kind := "sqlite"
			if c.Spec.Datastore == "postgres" {
				// Its own endpoint, as its control plane reads it: the daemon's admin URL is not the CLI's to know.
				cfg, err := controlplane.ReadConfig(filepath.Join(src.ClusterDir, controlplane.ConfigFile))
				if err != nil {
					return fmt.Errorf("cluster %s keeps its datastore in postgres (database %s), and its endpoint is not readable: %w; is it provisioned?", name, datastore.DatabaseName(name), err)
				}
				src.Postgres, kind = cfg.Datastore, "postgres"
			}
			// The spec as the daemon completed it, without status or server-made fields.
			rec := v1.Cluster{Spec: c.Spec}
			rec.Name, rec.Labels = c.Name, c.Labels
			rec.APIVersion, rec.Kind = v1.Group+"/"+v1.Version, v1.Kind
			spec, err := json.Marshal(rec)
			if err != nil {
				return err
			}
			host, _ := os.Hostname()
			hdr := backup.Header{Cluster: name, Created: time.Now().UTC(), Host: host, Datastore: kind}
			if cfg, err := m.adminConfig(ctx, c); err == nil {
				hdr.Server, hdr.ServerName = cfg.Host, cfg.TLSClientConfig.ServerName
			}
			start := time.Now()
			// Written beside --out and renamed: a reader never sees half a backup.
			tmp, err := os.CreateTemp(dir, "."+filepath.Base(out)+".*")
			if err != nil {
				return fmt.Errorf("writing %s: %w", out, err)
			}
			defer os.Remove(tmp.Name()) // a no-op once renamed
			if err := tmp.Chmod(0o600); err != nil {
				tmp.Close()
				return fmt.Errorf("writing %s: %w", out, err)
			}
			hdr, err = backup.Take(ctx, tmp, src, dir, backup.Archive{Header: hdr, Cluster: spec})
			if err == nil {
				err = tmp.Sync()
			}
			if cerr := tmp.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("backing up cluster %s: %w", name, err)
			}
			st, err := os.Stat(tmp.Name())
			if err != nil {
				return err
			}
			if err := os.Rename(tmp.Name(), out); err != nil {
				return fmt.Errorf("writing %s: %w", out, err)
			}
			fmt.Fprintf(os.Stderr, "backed up cluster %s (%s, %d datastore rows) to %s: %.1f MiB in %.1fs, mode 0600 (it holds the cluster's CA keys)\n",
				name, c.Status.Phase, hdr.Rows, out, float64(st.Size())/(1<<20), time.Since(start).Seconds())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", "", "file to write (required); it is made with mode 0600")
	f.BoolVar(&overwrite, "overwrite", false, "replace --out if it exists")
	documentEnv(f)
	return cmd
}

// newCopyDatastoreCommand is what `cluster backup` runs as a tenant's uid to copy
// its sqlite datastore (backup.CopyDatastoreAs).
func newCopyDatastoreCommand() *cobra.Command {
	return &cobra.Command{
		Use:    backup.CopyCommand + " SRC DST",
		Short:  "Copy a sqlite datastore (run by cluster backup as the tenant's uid)",
		Hidden: true,
		Args:   cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := backup.CopyDatastore(cmd.Context(), args[0], args[1])
			return err
		},
	}
}
