package agent

import (
	"os/exec"
	"slices"
	"testing"
)

func TestProxyArgv(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lookPath func(string) (string, error)
		want     []string
	}{
		{"with nice", func(f string) (string, error) { return "/usr/bin/" + f, nil },
			[]string{"/usr/bin/nice", "-n", "10", "/agent", "kube-proxy", "--config", "/p.yaml"}},
		{"without", func(f string) (string, error) { return "", exec.ErrNotFound },
			[]string{"/agent", "kube-proxy", "--config", "/p.yaml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := proxyArgv("/agent", "/p.yaml", tc.lookPath); !slices.Equal(got, tc.want) {
				t.Errorf("proxyArgv = %q, want %q", got, tc.want)
			}
		})
	}
}
