package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/nodes/qemu"
	"github.com/socialweb-computer/socialweb/internal/provider"
	"github.com/socialweb-computer/socialweb/internal/window"
)

func newClusterCreateCommand(g *globalOptions) *cobra.Command {
	var (
		wait        bool
		timeout     time.Duration
		maxNodes    int32
		hold        time.Duration
		sizes       nodeSizeFlags
		podsPerNode int32
		sleepAfter  time.Duration
		cpMemory    string
		cpPIDs      int32
		cpWeight    int32
		fresh       bool
		idleNodes   int32
		idleSched   string
		egress      string
		egressDeny  []string
	)
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a tenant cluster (its control plane comes up with zero nodes)",
		Args:  nameArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			c := &v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: name}}
			f := cmd.Flags()
			// Only what was asked for is set; the daemon fills the rest from
			// its --default-* flags.
			if f.Changed("max-nodes") {
				if maxNodes < 0 {
					return usageError{errf("--max-nodes %d: want 0 or more", maxNodes)}
				}
				c.Spec.MaxNodes = maxNodes
			}
			if f.Changed("hold") {
				if hold < 0 {
					return usageError{errf("--hold %s: want a positive duration such as 1m", hold)}
				}
				c.Spec.Hold = metav1.Duration{Duration: hold}
			}
			if err := sizes.apply(&c.Spec, f.Changed, hostLimits{fits: qemu.CheckHostFits, stateDir: g.stateDir}); err != nil {
				return usageError{err}
			}
			if f.Changed("pods-per-node") {
				if podsPerNode < 1 {
					return usageError{errf("--pods-per-node %d: want 1 or more", podsPerNode)}
				}
				c.Spec.PodsPerNode = podsPerNode
			}
			if f.Changed("sleep-after") {
				if err := v1.ValidateSleepAfter("--sleep-after", sleepAfter); err != nil {
					return usageError{err}
				}
				c.Spec.SleepAfter = &metav1.Duration{Duration: sleepAfter}
			}
			c.Spec.FreshNodePerJob = fresh
			if idleNodes < 0 {
				return usageError{errf("--idle-nodes %d: want 0 or more", idleNodes)}
			}
			if _, err := window.Parse(idleSched); err != nil {
				return usageError{fmt.Errorf("--idle-schedule: %w", err)}
			}
			if idleSched != "" && idleNodes == 0 {
				return usageError{errf("--idle-schedule %q without --idle-nodes: say how many idle nodes to keep in it", idleSched)}
			}
			c.Spec.IdleNodes, c.Spec.IdleSchedule = idleNodes, idleSched
			if err := controlPlaneLimits(&c.Spec, cpMemory, cpPIDs, cpWeight); err != nil {
				return usageError{err}
			}
			c.Spec.Egress, c.Spec.EgressDeny = egress, egressDeny
			if err := v1.ValidateEgress(c.Spec, func(f string) string {
				return map[string]string{"egress": "--node-egress", "egressDeny": "--node-egress-deny"}[f]
			}); err != nil {
				return usageError{err}
			}
			ctx := cmd.Context()
			m, err := g.connect(ctx)
			if err != nil {
				return err
			}
			u, err := c.ToUnstructured()
			if err != nil {
				return err
			}
			_, err = m.dyn.Resource(v1.ClusterResource).Create(ctx, u, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("cluster %q already exists: pick another name, or delete it first with `socialweb cluster delete %s`", name, name)
			}
			if err != nil {
				return fmt.Errorf("creating cluster %s: %w", name, err)
			}
			c, err = waitLeased(ctx, m, name)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "cluster %s created: %s\n", name, c.Status.URL)
			if !wait {
				return nil
			}
			start := time.Now()
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			c, err = waitPhase(ctx, m, name, v1.PhaseReady)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "cluster %s is Ready at %s (%.1fs); `socialweb cluster kubeconfig %s` prints its admin kubeconfig\n",
				name, c.Status.URL, time.Since(start).Seconds(), name)
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&wait, "wait", false, "wait until the control plane is Ready")
	f.DurationVar(&timeout, "timeout", 5*time.Minute, "how long --wait waits")
	f.Int32Var(&maxNodes, "max-nodes", 0, "max worker nodes (default: the daemon's --default-max-nodes)")
	f.DurationVar(&hold, "hold", 0, "idle time before a node is removed (default: the daemon's --default-hold)")
	f.Int32Var(&sizes.cpus, "node-cpus", 0, "vCPUs of the smallest worker node (default: the daemon's --default-node-cpus)")
	f.Int32Var(&sizes.maxCPUs, "max-node-cpus", 0, "vCPUs of the largest worker node; each node is sized from its Pods' requests between the two (default: the daemon's --default-max-node-cpus)")
	f.StringVar(&sizes.memory, "node-memory", "", "memory of the smallest worker node, e.g. 2Gi (default: the daemon's --default-node-memory)")
	f.StringVar(&sizes.maxMemory, "max-node-memory", "", "memory of the largest worker node, e.g. 16Gi (default: the daemon's --default-max-node-memory)")
	f.StringVar(&sizes.disk, "node-disk", "", "container-storage disk of the smallest worker node, e.g. 10Gi (default: the daemon's --default-node-disk)")
	f.StringVar(&sizes.maxDisk, "max-node-disk", "", "container-storage disk of the largest worker node, for Pods that request ephemeral storage, e.g. 50Gi (default: the daemon's --default-max-node-disk)")
	f.Int32Var(&podsPerNode, "pods-per-node", 0, "max pods per worker node (default: the daemon's --default-pods-per-node)")
	f.DurationVar(&sleepAfter, "sleep-after", 0, "idle time before the control plane sleeps (it wakes on the first connection); 0 is never, else at least 30s (default: the daemon's --default-sleep-after)")
	f.StringVar(&cpMemory, "control-plane-memory", "", "memory cap of the control-plane process, e.g. 2Gi: past it the kernel kills that process alone and it is restarted (default: the daemon's --default-control-plane-memory)")
	f.Int32Var(&cpPIDs, "control-plane-pids", 0, "cap on the control plane's threads and processes (default: the daemon's --default-control-plane-pids)")
	f.Int32Var(&cpWeight, "control-plane-cpu-weight", 0, "CPU share of the control plane against other tenants, 1-10000, 100 being an ordinary process (default: the daemon's --default-control-plane-cpu-weight)")
	f.Int32Var(&idleNodes, "idle-nodes", 0, "joined, Ready nodes of the smallest size kept up with nothing on them, so a Pod starts without a boot; they count against --max-nodes and the host's capacity, and keep the cluster awake")
	f.StringVar(&idleSched, "idle-schedule", "", `weekly window for --idle-nodes, e.g. "Mon-Fri 08:00-18:00 Europe/Berlin"; outside it they go after the hold (default: always)`)
	f.StringVar(&egress, "node-egress", "", "where this cluster's nodes and Pods may send traffic, narrowing the daemon's --egress policy: host (the daemon's policy) or none (nothing forwarded, not even --egress-allow's ranges) (default: host)")
	f.StringSliceVar(&egressDeny, "node-egress-deny", nil, "IPv4 CIDRs this cluster's nodes and Pods may not reach, on top of the daemon's --egress-deny, e.g. 192.168.10.0/24,203.0.113.7/32")
	f.BoolVar(&fresh, "fresh-node-per-job", false, "a node a CI job Pod ran on (GitLab Runner's) takes no other Pod and is removed as soon as the job ends, without the hold: one job per VM, never reused")
	documentEnv(f)
	return cmd
}

// controlPlaneLimits puts the control-plane limits asked for into spec, after
// checking them; a flag left at its zero value leaves the daemon's default.
func controlPlaneLimits(spec *v1.ClusterSpec, memory string, pids, weight int32) error {
	if memory != "" {
		q, err := resource.ParseQuantity(memory)
		if err != nil {
			return errf("--control-plane-memory %q: %v; want a quantity such as 2Gi", memory, err)
		}
		spec.ControlPlaneMemory = q
	}
	spec.ControlPlanePIDs, spec.ControlPlaneCPUWeight = pids, weight
	return v1.ValidateControlPlaneLimits(*spec, func(f string) string {
		return map[string]string{"controlPlaneMemory": "--control-plane-memory", "controlPlanePIDs": "--control-plane-pids",
			"controlPlaneCPUWeight": "--control-plane-cpu-weight"}[f]
	})
}

// waitLeased waits for the daemon to lease a port. If it cannot, or no host
// can take the cluster, the Cluster is deleted again, so a refused create
// leaves nothing behind.
func waitLeased(ctx context.Context, m *mgmtClients, name string) (*v1.Cluster, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	c, err := m.waitCluster(ctx, name, func(c *v1.Cluster) (bool, error) {
		cond := meta.FindStatusCondition(c.Status.Conditions, v1.ConditionLeased)
		if placed := meta.FindStatusCondition(c.Status.Conditions, v1.ConditionPlaced); placed != nil && placed.Reason == provider.ReasonUnplaceable {
			cond = placed // no host takes it: refused the same way
		}
		if cond != nil && (cond.Reason == "LeaseFailed" || cond.Reason == provider.ReasonUnplaceable) {
			_ = m.dyn.Resource(v1.ClusterResource).Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{})
			waitGone(context.WithoutCancel(ctx), m, name, 30*time.Second)
			return false, fmt.Errorf("cluster %s not created: %s", name, cond.Message)
		}
		return cond != nil && cond.Status == metav1.ConditionTrue && c.Status.URL != "", nil
	})
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("cluster %s was created but the daemon has not leased it a port after 60s: is `socialweb serve` running? (`socialweb cluster get %s` shows its conditions)", name, name)
	}
	return c, err
}

// waitPhase waits for a phase, printing each change of phase or condition.
func waitPhase(ctx context.Context, m *mgmtClients, name string, want v1.Phase) (*v1.Cluster, error) {
	last := ""
	c, err := m.waitCluster(ctx, name, func(c *v1.Cluster) (bool, error) {
		ready := meta.FindStatusCondition(c.Status.Conditions, v1.ConditionReady)
		line := string(c.Status.Phase)
		if ready != nil {
			line += ": " + ready.Message
		}
		if line != last {
			fmt.Fprintf(os.Stderr, "  %s %s\n", name, line)
			last = line
		}
		return c.Status.Phase == want, nil
	})
	if err != nil {
		return nil, fmt.Errorf("cluster %s not %s in time (last: %s); `socialweb cluster get %s` shows its conditions", name, want, last, name)
	}
	return c, err
}

// waitCluster reads the Cluster at each change until done says it is done
// or fails; it returns ctx's error if ctx ends first.
func (m *mgmtClients) waitCluster(ctx context.Context, name string, done func(*v1.Cluster) (bool, error)) (*v1.Cluster, error) {
	for {
		c, err := m.getCluster(ctx, name)
		rv := ""
		if err == nil {
			rv = c.ResourceVersion
			if ok, err := done(c); err != nil || ok {
				return c, err
			}
		}
		if err := m.awaitChange(ctx, name, rv); err != nil {
			return nil, err
		}
	}
}

// awaitChange returns once the Cluster changes after resourceVersion rv, or
// after at most a second (also when rv is empty or the watch fails), so the
// caller's next read sees a status update as soon as the daemon writes it
// rather than up to a polling interval later. It returns ctx's error once
// ctx ends.
func (m *mgmtClients) awaitChange(ctx context.Context, name, rv string) error {
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if rv != "" {
		w, err := m.dyn.Resource(v1.ClusterResource).Watch(wctx, metav1.ListOptions{
			FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
			ResourceVersion: rv,
		})
		if err == nil {
			defer w.Stop()
			select {
			case ev, ok := <-w.ResultChan():
				if ok && ev.Type != watch.Error {
					return nil
				}
			case <-wctx.Done():
			}
		}
	}
	<-wctx.Done()
	return ctx.Err()
}

func waitGone(ctx context.Context, m *mgmtClients, name string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		_, err := m.dyn.Resource(v1.ClusterResource).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return false
}
