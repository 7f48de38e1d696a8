package integration

import (
	"database/sql"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/datastore"
	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// TestPostgresDatastore: with a postgres datastore each control plane gets
// its own database, objects survive a restart, and delete drops it.
func TestPostgresDatastore(t *testing.T) {
	admin := livetest.Postgres(t)
	db, err := sql.Open("pgx", admin)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	dbExists := func(name string) bool {
		var n int
		if err := db.QueryRow("SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	// Databases are per host; start from a clean slate for these names.
	for _, n := range []string{datastore.DatabaseName("mgmt"), datastore.DatabaseName("pg-one")} {
		_, _ = db.Exec(`DROP DATABASE IF EXISTS "` + n + `" WITH (FORCE)`)
	}
	t.Cleanup(func() { _, _ = db.Exec(`DROP DATABASE IF EXISTS "socialweb_mgmt" WITH (FORCE)`) })

	d := newDaemon(t, 1, "--datastore", admin)
	d.start()
	d.mustCLI("cluster", "create", "pg-one", "--wait")
	if !dbExists(datastore.DatabaseName("pg-one")) {
		t.Fatal("no database was created for the tenant")
	}
	if got := d.cluster("pg-one").Spec.Datastore; got != "postgres" {
		t.Errorf("spec.datastore = %q, want postgres", got)
	}
	_, k := d.tenant("pg-one")
	putConfigMap(t, k, "kept-in-postgres")
	url := d.cluster("pg-one").Status.URL

	d.stop(syscall.SIGTERM)
	d.start()
	c := d.waitPhase("pg-one", v1.PhaseReady, 2*time.Minute)
	if c.Status.URL != url {
		t.Errorf("URL changed across restart: %s -> %s", url, c.Status.URL)
	}
	_, k = d.tenant("pg-one")
	// The phase read right after the restart may still be the last daemon's Ready
	// until the first pass: wait for the tenant to answer, as a user would.
	livetest.Eventually(t, 2*time.Minute, 500*time.Millisecond, "pg-one to answer after the restart", func() bool {
		_, err := k.Discovery().ServerVersion()
		return err == nil
	})
	if !hasConfigMap(t, k, "kept-in-postgres") {
		t.Error("object lost across restart")
	}
	d.mustCLI("cluster", "delete", "pg-one", "--wait")
	if dbExists(datastore.DatabaseName("pg-one")) {
		t.Error("the tenant database outlived the cluster")
	}
}
