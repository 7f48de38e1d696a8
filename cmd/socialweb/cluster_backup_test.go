package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Bad backup and restore input is refused before the daemon is asked anything, and a
// refused restore leaves no staged copy in the state dir.
func TestBackupRestoreRefuseBadInput(t *testing.T) {
	dir := t.TempDir()
	existing := filepath.Join(dir, "existing.swbackup")
	notBackup := filepath.Join(dir, "notes.txt")
	for _, p := range []string{existing, notBackup} {
		if err := os.WriteFile(p, []byte("not a backup\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
	}{
		{"backup without --out", []string{"cluster", "backup", "ci"}, nil, "--out is empty"},
		{"backup over a file", []string{"cluster", "backup", "ci", "--out", existing}, nil, "add --overwrite"},
		{"backup over a file, twin", []string{"cluster", "backup", "ci"}, map[string]string{"SOCIALWEB_OUT": existing}, "add --overwrite"},
		{"backup into a directory", []string{"cluster", "backup", "ci", "--out", dir}, nil, "is a directory"},
		{"backup into a missing directory", []string{"cluster", "backup", "ci", "--out", filepath.Join(dir, "no", "f")}, nil, "does not exist"},
		{"backup of a bad name", []string{"cluster", "backup", "Not_A_Name", "--out", "f"}, nil, "Not_A_Name"},
		{"restore without a file", []string{"cluster", "restore"}, nil, "exactly one backup FILE"},
		{"restore of a missing file", []string{"cluster", "restore", filepath.Join(dir, "missing")}, nil, "no such file"},
		{"restore of a text file", []string{"cluster", "restore", notBackup}, nil, "not a socialweb backup"},
		{"restore under a bad name", []string{"cluster", "restore", notBackup, "--name", "Bad_Name"}, nil, "--name"},
		{"restore under a bad name, twin", []string{"cluster", "restore", notBackup}, map[string]string{"SOCIALWEB_NAME": "-x"}, "--name"},
		{"restore with a bad --wait twin", []string{"cluster", "restore", notBackup}, map[string]string{"SOCIALWEB_WAIT": "maybe"}, "SOCIALWEB_WAIT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			state := t.TempDir()
			root := newRootCommand()
			root.SetArgs(append(tc.args, "--state-dir", state))
			root.SilenceErrors, root.SilenceUsage = true, true
			err := root.Execute()
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("%v: %v, want an error containing %q", tc.args, err, tc.wantErr)
			}
			if left, _ := os.ReadDir(filepath.Join(state, "restore")); len(left) != 0 {
				t.Errorf("left staged copies %v", left)
			}
			if b, _ := os.ReadFile(existing); string(b) != "not a backup\n" {
				t.Errorf("%s was overwritten", existing)
			}
		})
	}
}
