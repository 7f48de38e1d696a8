package agent

import "testing"

func TestContainerdLogLevel(t *testing.T) {
	for _, tc := range []struct {
		name, arg string
		set       bool
		want      string
	}{
		{"no kernel argument", "", false, "warn"},
		{"a level", "debug", true, "debug"},
		{"not a level", "verbose", true, "warn"},
		{"empty", "", true, "warn"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			arg := func(name string) (string, bool) {
				if name != "socialweb.containerd-log" {
					t.Errorf("asked for kernel argument %q", name)
				}
				return tc.arg, tc.set
			}
			if got := containerdLogLevel("warn", arg); got != tc.want {
				t.Errorf("containerdLogLevel = %q, want %q", got, tc.want)
			}
		})
	}
}
