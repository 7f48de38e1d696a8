package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
)

func TestNodeSizeFlags(t *testing.T) {
	// A host of 4 CPUs and 8 GiB, as qemu.CheckHostFits would see it.
	fits := func(cpus, memMiB int64) error {
		switch {
		case cpus > 4:
			return fmt.Errorf("nodes of %d vCPUs do not fit this host's 4 CPUs: use --node-cpus 4 or fewer", cpus)
		case memMiB > 8192:
			return fmt.Errorf("nodes of %d MiB do not fit this host: use --node-memory 8192Mi or less", memMiB)
		}
		return nil
	}
	host := hostLimits{fits: fits, stateDir: t.TempDir()}
	tests := []struct {
		name    string
		flags   nodeSizeFlags
		given   []string
		want    string // the spec's sizes, when accepted
		wantErr string
	}{
		{"nothing given", nodeSizeFlags{}, nil, "0 0   0 0", ""},
		{"a range", nodeSizeFlags{cpus: 1, maxCPUs: 4, memory: "1Gi", maxMemory: "8Gi", disk: "10Gi", maxDisk: "20Gi"},
			[]string{"node-cpus", "max-node-cpus", "node-memory", "max-node-memory", "node-disk", "max-node-disk"}, "1 4 1Gi 8Gi 10Gi 20Gi", ""},
		{"only the maximum", nodeSizeFlags{maxCPUs: 4}, []string{"max-node-cpus"}, "0 4   0 0", ""},
		{"zero cpus", nodeSizeFlags{maxCPUs: 0}, []string{"max-node-cpus"}, "", "--max-node-cpus 0: want 1 or more"},
		{"negative memory", nodeSizeFlags{maxMemory: "-2Gi"}, []string{"max-node-memory"}, "", `--max-node-memory "-2Gi": want a positive quantity such as 16Gi`},
		{"zero disk", nodeSizeFlags{disk: "0"}, []string{"node-disk"}, "", `--node-disk "0": want a positive quantity such as 10Gi`},
		{"disk does not parse", nodeSizeFlags{maxDisk: "lots"}, []string{"max-node-disk"}, "", `--max-node-disk "lots": want a positive quantity`},
		{"minimum above maximum", nodeSizeFlags{cpus: 4, maxCPUs: 2}, []string{"node-cpus", "max-node-cpus"}, "",
			"--max-node-cpus 2 is below --node-cpus 4: want --max-node-cpus 4 or more, or --node-cpus 2 or fewer"},
		{"memory minimum above maximum", nodeSizeFlags{memory: "4Gi", maxMemory: "2Gi"}, []string{"node-memory", "max-node-memory"}, "",
			"--max-node-memory 2Gi is below --node-memory 4Gi"},
		{"disk minimum above maximum", nodeSizeFlags{disk: "20Gi", maxDisk: "10Gi"}, []string{"node-disk", "max-node-disk"}, "",
			"--max-node-disk 10Gi is below --node-disk 20Gi"},
		{"largest beyond the host's CPUs", nodeSizeFlags{maxCPUs: 16}, []string{"max-node-cpus"}, "",
			"the largest node: nodes of 16 vCPUs do not fit this host's 4 CPUs: use --max-node-cpus 4 or fewer"},
		{"largest beyond the host's memory", nodeSizeFlags{maxMemory: "64Gi"}, []string{"max-node-memory"}, "", "use --max-node-memory 8192Mi or less"},
		{"smallest beyond the host", nodeSizeFlags{cpus: 8}, []string{"node-cpus"}, "", "use --node-cpus 4 or fewer"},
		{"disk beyond the host's filesystem", nodeSizeFlags{maxDisk: "1Ei"}, []string{"max-node-disk"}, "", "filesystem at"},
	}
	for _, tc := range tests {
		var spec v1.ClusterSpec
		err := tc.flags.apply(&spec, func(f string) bool { return slices.Contains(tc.given, f) }, host)
		if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		q := func(s string) string {
			if s == "0" {
				return ""
			}
			return s
		}
		got := fmt.Sprintf("%d %d %s %s %s %s", spec.NodeCPUs, spec.MaxNodeCPUs, q(spec.NodeMemory.String()), q(spec.MaxNodeMemory.String()), spec.NodeDisk.String(), spec.MaxNodeDisk.String())
		if got != tc.want {
			t.Errorf("%s: spec sizes %q, want %q", tc.name, got, tc.want)
		}
	}
}

// An env twin counts as given: `cluster create` applies only the sizes given.
func TestEnvTwinIsGiven(t *testing.T) {
	cmd := newClusterCreateCommand(&globalOptions{})
	t.Setenv("SOCIALWEB_MAX_NODE_CPUS", "4")
	if err := applyEnv(cmd); err != nil {
		t.Fatal(err)
	}
	if f := cmd.Flags().Lookup("max-node-cpus"); !f.Changed || f.Value.String() != "4" {
		t.Errorf("--max-node-cpus after SOCIALWEB_MAX_NODE_CPUS=4: changed %t, value %s", f.Changed, f.Value)
	}
	if cmd.Flags().Changed("node-cpus") {
		t.Error("--node-cpus changed without its twin")
	}
}

// serve's warm-pool flags: their defaults and env twins.
func TestWarmPoolFlags(t *testing.T) {
	tests := []struct{ flag, def, env, set string }{
		{"warm-pool", "0", "SOCIALWEB_WARM_POOL", "2"},
		{"warm-pool-prewarm", "true", "SOCIALWEB_WARM_POOL_PREWARM", "false"},
		{"warm-pool-refill-delay", "30s", "SOCIALWEB_WARM_POOL_REFILL_DELAY", "5m0s"},
	}
	for _, tt := range tests {
		t.Run(tt.flag, func(t *testing.T) {
			cmd := newServeCommand(&globalOptions{})
			f := cmd.Flags().Lookup(tt.flag)
			if f == nil || f.DefValue != tt.def || !strings.Contains(f.Usage, "$"+tt.env) {
				t.Fatalf("--%s: %+v, want default %s and $%s in its usage", tt.flag, f, tt.def, tt.env)
			}
			t.Setenv(tt.env, tt.set)
			if err := applyEnv(cmd); err != nil {
				t.Fatal(err)
			}
			if f.Value.String() != tt.set {
				t.Errorf("--%s after %s=%s: %s", tt.flag, tt.env, tt.set, f.Value)
			}
		})
	}
}

// A flag's environment twin is read by every command that has the flag: two commands
// may share a name only when it means the same thing to both (the state dir, the
// management API), or an operator's SOCIALWEB_EGRESS for serve would set every
// `cluster create`'s too.
func TestEnvTwinsMeanOneThing(t *testing.T) {
	// Names that mean the same to each command that has them, or that no operator sets
	// for a host (a command's own file or name).
	shared := map[string]bool{
		"state-dir": true, "help": true, "output": true, "timeout": true, "wait": true, "log-level": true, "log-format": true,
		"cache-dir":        true, // the image cache, for image build and builder alike
		"image-cache-size": true, // image gc collects to the daemon's budget
		"shared-layers":    true, // image push unpacks where a serve --shared-layers reads
		"config":           true, // controlplane's is always on its command line (serve writes it)
		"out":              true, // where one command writes its file
		"name":             true, // one command's new name
	}
	root := newRootCommand()
	seen := map[string]string{} // flag name -> command path
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if shared[f.Name] || f.Hidden {
				return
			}
			if other, ok := seen[f.Name]; ok && other != c.CommandPath() {
				t.Errorf("--%s is a flag of both %q and %q: its twin %s would set both", f.Name, other, c.CommandPath(), envName(f.Name))
			}
			seen[f.Name] = c.CommandPath()
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}
