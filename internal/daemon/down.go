package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/socialweb-computer/socialweb/internal/controlplane"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodes/qemu"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
)

// DownReport is what Down stopped and removed.
type DownReport struct {
	ControlPlanes []string // records of control-plane processes that were still running
	Nodes         []string // node VMs stopped
	Networks      []string // cluster bridges (with their taps, routes and nftables tables) removed
}

// Down stops everything a daemon of stateDir leaves on the host once the daemon is gone:
// control-plane processes that outlived it (a crash, or --control-planes-on-exit keep), node VMs (which survive a daemon on purpose,
// for the next serve to adopt), and each cluster's node network. The state itself (the
// clusters, their datastores and PKI) is kept: the next serve brings the clusters back
// at zero nodes. It refuses, changing nothing, while a daemon serves stateDir.
func Down(ctx context.Context, stateDir string, nets *nodenet.Manager, log *slog.Logger) (DownReport, error) {
	var rep DownReport
	if stateDir == "" {
		return rep, errors.New("--state-dir is required (or $SOCIALWEB_STATE_DIR)")
	}
	if _, err := os.Stat(stateDir); err != nil {
		return rep, fmt.Errorf("state dir %s: %w: nothing of socialweb's to stop there", stateDir, err)
	}
	if id, alive, err := supervisor.Running(daemonRecord(stateDir)); err != nil {
		return rep, fmt.Errorf("reading %s: %w", daemonRecord(stateDir), err)
	} else if alive {
		return rep, fmt.Errorf("a daemon serves %s (pid %d): stop the daemon first (SIGTERM); then run down again", stateDir, id.PID)
	}
	mgmtRecord := filepath.Join(stateDir, "mgmt", "instance.json")

	records, _ := filepath.Glob(filepath.Join(stateDir, "clusters", "*", "instance.json"))
	records = append(records, mgmtRecord)
	var errs []error
	for _, r := range records {
		killed, err := supervisor.Reap(r, 10*time.Second)
		if err != nil {
			errs = append(errs, fmt.Errorf("stopping the process of %s: %w", r, err))
		}
		if killed {
			rep.ControlPlanes = append(rep.ControlPlanes, filepath.Base(filepath.Dir(r)))
		}
	}

	// Their groups go with them (socialweb down knows no --cgroup-parent: serve
	// recorded it).
	if h, err := openRecordedCgroups(stateDir); err != nil {
		errs = append(errs, fmt.Errorf("finding the control planes' cgroups: %w", err))
	} else if err := removeControlPlaneGroups(h, stateDir); err != nil {
		errs = append(errs, err)
	}

	stopped, err := qemu.StopAll(ctx, filepath.Join(stateDir, "nodes"), nets, log)
	rep.Nodes = stopped
	if err != nil {
		// A VM that may still run keeps its network: removing the bridge under it
		// would leave a qemu with a dangling tap.
		return rep, errors.Join(append(errs, err)...)
	}

	// The control planes are stopped: their walls go (the nodes' are their networks').
	for _, port := range clusterPorts(stateDir) {
		if err := nets.UnwallControlPlane(ctx, port); err != nil {
			errs = append(errs, err)
		}
	}

	plans, err := clusterPlans(stateDir)
	if err != nil {
		errs = append(errs, err)
	}
	names := make([]string, 0, len(plans))
	for n := range plans {
		names = append(names, n)
	}
	slices.Sort(names)
	owned, err := nets.List(ctx)
	if err != nil {
		return rep, errors.Join(append(errs, err)...)
	}
	for _, n := range names {
		if !slices.Contains(owned.Indexes(), plans[n].Index) {
			continue // already gone (or never made: --node-network=false)
		}
		if err := nets.Remove(ctx, n, plans[n]); err != nil {
			errs = append(errs, err)
			continue
		}
		rep.Networks = append(rep.Networks, nodenet.BridgeName(plans[n].Index))
	}
	return rep, errors.Join(errs...)
}

// clusterPorts are the apiserver ports of the state dir's clusters, read from their
// control-plane configs: each names its control plane's wall. An unreadable config
// is clusterPlans' to report.
func clusterPorts(stateDir string) []int {
	configs, _ := filepath.Glob(filepath.Join(stateDir, "clusters", "*", controlplane.ConfigFile))
	var ports []int
	for _, path := range configs {
		if c, err := controlplane.ReadConfig(path); err == nil && c.Port > 0 {
			ports = append(ports, c.Port)
		}
	}
	return ports
}

// clusterPlans maps each cluster of the state dir to its node network, read from its
// control-plane config (its pod CIDR names the network index); the leases live in the
// management API, which is not running when Down runs.
func clusterPlans(stateDir string) (map[string]nodenet.Plan, error) {
	configs, err := filepath.Glob(filepath.Join(stateDir, "clusters", "*", controlplane.ConfigFile))
	if err != nil {
		return nil, err
	}
	plans := map[string]nodenet.Plan{}
	var errs []error
	for _, path := range configs {
		c, err := controlplane.ReadConfig(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if c.ClusterCIDR == "" {
			continue // a cluster without nodes (--node-network=false)
		}
		found := false
		for i := 1; i <= nodenet.MaxIndex; i++ {
			p, err := nodenet.ForIndex(i)
			if err == nil && p.PodCIDR.String() == c.ClusterCIDR {
				plans[c.Name] = p
				found = true
				break
			}
		}
		if !found {
			errs = append(errs, fmt.Errorf("cluster %s: pod CIDR %s is no node network of socialweb's", c.Name, c.ClusterCIDR))
		}
	}
	return plans, errors.Join(errs...)
}
