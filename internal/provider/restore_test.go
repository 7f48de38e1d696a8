package provider

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/backup"
	"github.com/socialweb-computer/socialweb/internal/datastore"
)

func TestAdoptRestore(t *testing.T) {
	postgres, err := datastore.Open("postgres://u:p@127.0.0.1:1/db")
	if err != nil {
		t.Fatal(err)
	}
	sqlite, _ := datastore.Open("sqlite")
	for _, tc := range []struct {
		name       string
		token      string // the annotation; "" none
		stage      bool   // a staged restore r-1 exists
		dirExists  bool   // the cluster's dir exists already
		store      datastore.Store
		wantErr    string
		wantAdopt  bool // the staged file is in the cluster dir after
		wantStaged bool // the staged dir is still there after
	}{
		{name: "no annotation", store: sqlite},
		{name: "adopts once", token: "r-1", stage: true, store: sqlite, wantAdopt: true},
		{name: "adopted before", token: "r-1", stage: true, dirExists: true, store: sqlite, wantStaged: true},
		{name: "a token naming another path", token: "../clusters/b", store: sqlite, wantErr: "not one `socialweb cluster restore` makes"},
		{name: "staged copy gone", token: "r-1", store: sqlite, wantErr: "run `socialweb cluster restore` again"},
		{name: "postgres daemon adopts too", token: "r-1", stage: true, store: postgres, wantAdopt: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			staged := filepath.Join(backup.StagingDir(state), "r-1")
			if tc.stage {
				if err := os.MkdirAll(staged, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(staged, "state.db"), []byte("x"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			dir := ClusterDir(state, "ci")
			if tc.dirExists {
				if err := os.MkdirAll(dir, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			p := &Provider{cfg: Config{StateDir: state}, store: tc.store, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			c := &v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "ci"}}
			if tc.token != "" {
				c.Annotations = map[string]string{RestoreAnnotation: tc.token}
			}
			err := p.adoptRestore(c)
			if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("adoptRestore: %v, want %q", err, tc.wantErr)
			}
			if _, err := os.Stat(filepath.Join(dir, "state.db")); (err == nil) != tc.wantAdopt {
				t.Errorf("restored state.db in the cluster dir: %v, want %v", err == nil, tc.wantAdopt)
			}
			if _, err := os.Stat(staged); (err == nil) != tc.wantStaged {
				t.Errorf("staged dir there after: %v, want %v", err == nil, tc.wantStaged)
			}
			// Deleting the cluster removes a restore it never adopted.
			if err := p.removeStagedRestore(c); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(staged); err == nil && tc.token == "r-1" {
				t.Errorf("removeStagedRestore left %s", staged)
			}
		})
	}
}
