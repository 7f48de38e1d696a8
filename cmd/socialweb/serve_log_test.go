package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Bad --controlplane-log-max-size and --controlplane-log-keep values, as flags or
// through their twins, are refused before anything is created; good ones reach
// the next check (a bad --datastore, so serve still starts nothing).
func TestServeControlPlaneLogFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
	}{
		{"a size that is no quantity", []string{"--controlplane-log-max-size", "lots"}, nil,
			`--controlplane-log-max-size "lots": want a size such as 50Mi, or 0 to never rotate`},
		{"a negative size", []string{"--controlplane-log-max-size", "-1Mi"}, nil,
			`--controlplane-log-max-size "-1Mi": want a size such as 50Mi, or 0 to never rotate`},
		{"a bad size from the twin", nil, map[string]string{"SOCIALWEB_CONTROLPLANE_LOG_MAX_SIZE": "50 MB"},
			`--controlplane-log-max-size "50 MB": want a size`},
		{"keep past 100", []string{"--controlplane-log-keep", "101"}, nil, `--controlplane-log-keep 101: want 0-100`},
		{"a negative keep from the twin", nil, map[string]string{"SOCIALWEB_CONTROLPLANE_LOG_KEEP": "-1"}, `--controlplane-log-keep -1: want 0-100`},
		{"keep that is no number", []string{"--controlplane-log-keep", "few"}, nil, `invalid argument "few" for "--controlplane-log-keep"`},
		{"good values reach the next check", []string{"--controlplane-log-max-size", "0", "--controlplane-log-keep", "0"}, nil,
			`--datastore: datastore "nope"`},
		{"good values from the twins", nil, map[string]string{"SOCIALWEB_CONTROLPLANE_LOG_MAX_SIZE": "1Gi", "SOCIALWEB_CONTROLPLANE_LOG_KEEP": "100"},
			`--datastore: datastore "nope"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			state := filepath.Join(t.TempDir(), "state")
			root := newRootCommand()
			root.SetArgs(append([]string{"serve", "--state-dir", state, "--datastore", "nope", "--node-network=false"}, tc.args...))
			err := root.Execute()
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("serve: %v, want an error containing %q", err, tc.wantErr)
			}
			if _, err := os.Stat(state); !os.IsNotExist(err) {
				t.Errorf("serve refused its flags but created its state dir: %v", err)
			}
		})
	}
}

// Both flags document their default and their environment twin.
func TestServeControlPlaneLogFlagUsage(t *testing.T) {
	cmd, _, err := newRootCommand().Find([]string{"serve"})
	if err != nil {
		t.Fatal(err)
	}
	for name, dflt := range map[string]string{"controlplane-log-max-size": "50Mi", "controlplane-log-keep": "3"} {
		f := cmd.Flags().Lookup(name)
		if f == nil {
			t.Errorf("serve has no --%s", name)
			continue
		}
		if f.DefValue != dflt || !strings.Contains(f.Usage, "$"+envName(name)) {
			t.Errorf("--%s: default %q, usage %q; want default %q and its twin in the usage", name, f.DefValue, f.Usage, dflt)
		}
	}
}
