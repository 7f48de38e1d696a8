package daemon

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/socialweb-computer/socialweb/internal/controlplane"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
)

func TestClusterPlans(t *testing.T) {
	state := t.TempDir()
	write := func(name, clusterCIDR string) {
		dir := filepath.Join(state, "clusters", name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		c := controlplane.Config{Name: name, Dir: dir, Components: []string{controlplane.APIServer}, Datastore: "sqlite://x",
			Port: 7500, ClusterCIDR: clusterCIDR}
		if err := c.Write(); err != nil {
			t.Fatal(err)
		}
	}
	write("ci", "10.3.0.0/16")
	write("loopback-only", "")
	write("web", "10.17.0.0/16")
	plans, err := clusterPlans(state)
	if err != nil {
		t.Fatal(err)
	}
	if len(plans) != 2 || plans["ci"].Index != 3 || plans["web"].Index != 17 {
		t.Errorf("plans %+v; want ci -> 3, web -> 17 and nothing for a cluster without a pod CIDR", plans)
	}
	write("alien", "192.168.0.0/16")
	if _, err := clusterPlans(state); err == nil || !strings.Contains(err.Error(), "alien") {
		t.Errorf("a cluster with a foreign pod CIDR: %v; want an error naming it", err)
	}
}

func TestDownRefusals(t *testing.T) {
	nets := nodenet.NewManager(failRunner{t}, nil)
	for _, tc := range []struct {
		name  string
		state func(t *testing.T) string
		want  string
	}{
		{"no state dir given", func(*testing.T) string { return "" }, "--state-dir is required"},
		{"missing state dir", func(t *testing.T) string { return filepath.Join(t.TempDir(), "nope") }, "nothing of socialweb's"},
		{"a daemon serves it", func(t *testing.T) string {
			// A live process stands in for the daemon.
			state := t.TempDir()
			cmd := exec.Command("sleep", "60")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			id, err := supervisor.ObserveStarted(cmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(id)
			if err := os.WriteFile(daemonRecord(state), b, 0o600); err != nil {
				t.Fatal(err)
			}
			return state
		}, "a daemon serves"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Down(context.Background(), tc.state(t), nets, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Down: %v; want an error mentioning %q", err, tc.want)
			}
		})
	}
}

// failRunner fails the test on any command: a refused Down touches no network.
type failRunner struct{ t *testing.T }

func (f failRunner) Run(context.Context, string, string, ...string) (string, error) {
	f.t.Error("down ran a network command although it refused")
	return "", nil
}
