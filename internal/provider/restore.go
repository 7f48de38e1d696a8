package provider

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/backup"
)

// RestoreAnnotation on a Cluster names a restore that `socialweb cluster
// restore` unpacked and checked in the state dir (backup.StagedDir). The
// provider moves it into place as the cluster's directory before it first
// provisions the cluster, so the tenant starts on the backup's datastore and
// CAs; the CLI cannot do the move itself without racing that first provision.
const RestoreAnnotation = "socialweb.computer/restore"

// adoptRestore moves the cluster's staged restore into place, once: a
// cluster whose directory exists has adopted it (or never had one).
func (p *Provider) adoptRestore(c *v1.Cluster) error {
	token := c.Annotations[RestoreAnnotation]
	if token == "" {
		return nil
	}
	dir := ClusterDir(p.cfg.StateDir, c.Name)
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	staged, err := backup.StagedDir(p.cfg.StateDir, token)
	if err != nil {
		return err
	}
	if _, err := os.Stat(staged); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cluster %s's restore, staged in %s, is gone: delete the cluster and run `socialweb cluster restore` again", c.Name, staged)
	}
	p.log.Info("adopting a restored datastore and PKI", "cluster", c.Name, "staged", staged)
	return backup.Adopt(staged, dir)
}

// loadRestoredDatastore puts a restored datastore into postgres. A restore
// leaves the backup's sqlite file in the cluster dir, where a postgres
// daemon's tenants never have one otherwise; once loaded (one transaction,
// into the new database Ensure made) the file goes, so this runs once.
func (p *Provider) loadRestoredDatastore(ctx context.Context, c *v1.Cluster, dir, endpoint string) error {
	if p.store.Kind() != "postgres" {
		return nil
	}
	db := filepath.Join(dir, backup.DatastoreEntry)
	if _, err := os.Stat(db); err != nil {
		return nil
	}
	n, err := backup.LoadPostgres(ctx, db, endpoint)
	if err != nil {
		return fmt.Errorf("loading cluster %s's restored datastore into postgres: %w", c.Name, err)
	}
	p.log.Info("loaded a restored datastore into postgres", "cluster", c.Name, "rows", n)
	return os.Remove(db)
}

// removeStagedRestore removes a restore the cluster never adopted.
func (p *Provider) removeStagedRestore(c *v1.Cluster) error {
	token := c.Annotations[RestoreAnnotation]
	if token == "" {
		return nil
	}
	staged, err := backup.StagedDir(p.cfg.StateDir, token)
	if err != nil {
		return nil // nothing of ours to remove
	}
	return os.RemoveAll(staged)
}
