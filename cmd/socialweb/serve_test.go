package main

import (
	"strings"
	"testing"
)

// Bad --egress, --egress-allow and --egress-deny values, given as flags or through their
// environment twins, are refused naming the flag and what would do. --datastore is bad
// too, and checked after them: should they pass, serve still starts nothing.
func TestServeEgressFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
	}{
		{"unknown mode", []string{"--egress", "lan"}, nil,
			`--egress "lan": want internet (the public internet; private, link-local and the host's own networks walled off) or none`},
		{"unknown mode from the twin", nil, map[string]string{"SOCIALWEB_EGRESS": "off"}, `--egress "off": want internet`},
		{"allow with host bits", []string{"--egress-allow", "10.0.0.0/8,192.168.5.1/24"}, nil,
			`--egress-allow "192.168.5.1/24" has bits set past its length: want 192.168.5.0/24`},
		{"allow from the twin", nil, map[string]string{"SOCIALWEB_EGRESS_ALLOW": "192.168.5.0/24, 10.1.1.1"},
			`--egress-allow "10.1.1.1" has no length: want 10.1.1.1/32`},
		{"deny of IPv6", []string{"--egress-deny", "fd00::/8"}, nil, `--egress-deny "fd00::/8" is not IPv4`},
		{"deny from the twin, an empty entry", nil, map[string]string{"SOCIALWEB_EGRESS_DENY": "8.8.8.8/32,,1.1.1.1/32"},
			`--egress-deny an empty entry`},
		{"good values reach the next check", []string{"--egress", "none", "--egress-allow", "192.168.5.0/24", "--egress-deny", "192.168.5.7/32"}, nil,
			`--datastore: datastore "nope"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			root := newRootCommand()
			root.SetArgs(append([]string{"serve", "--state-dir", t.TempDir(), "--datastore", "nope", "--node-network=false"}, tc.args...))
			err := root.Execute()
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("serve: %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
