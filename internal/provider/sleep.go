package provider

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/controlplane"
	"github.com/socialweb-computer/socialweb/internal/lease"
	"github.com/socialweb-computer/socialweb/internal/pki"
	"github.com/socialweb-computer/socialweb/internal/scale"
	"github.com/socialweb-computer/socialweb/internal/sleep"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
	"github.com/socialweb-computer/socialweb/internal/window"
)

const (
	// sleepCheckInterval is how often awake clusters are checked for idleness
	// and sleeping ones for a due CronJob.
	sleepCheckInterval = 5 * time.Second
	// wakeTimeout bounds a wake: a control plane that does not answer by then
	// fails the wake, and the connections that woke it are closed.
	wakeTimeout = 2 * time.Minute
)

// sleeper is the daemon's sleep state of one cluster whose sleepAfter is set
// (or that slept before). Under Provider.sleepMu.
type sleeper struct {
	gate *sleep.Gate // the held port; nil until the cluster first starts with sleep on
	// known: asleep was read from the Cluster's status (a daemon restart keeps a
	// sleeping cluster asleep).
	known    bool
	asleep   bool
	nextWake time.Time // a CronJob is due: wake at this time
	woke     bool
	wakeMsg  string
	wakeErr  string
	cause    string               // what woke it: connection, cronjob, config
	wokeAt   time.Time            // when the last wake began (a cronjob wake has no gate time)
	tenant   kubernetes.Interface // as the daemon's own user (its requests are not activity); nil asleep
}

// sleepAfter is the cluster's idle time before sleep: its spec, else the daemon's default.
func (p *Provider) sleepAfter(c *v1.Cluster) time.Duration {
	if c.Spec.SleepAfter != nil {
		return c.Spec.SleepAfter.Duration
	}
	return p.cfg.Defaults.SleepAfter
}

// sleeperFor returns the cluster's sleep state, reading whether it sleeps from
// its status the first time. Call with sleepMu held.
func (p *Provider) sleeperFor(c *v1.Cluster) *sleeper {
	s := p.sleepers[c.Name]
	if s == nil {
		s = &sleeper{}
		p.sleepers[c.Name] = s
	}
	if !s.known {
		s.known = true
		s.asleep = c.Status.Phase == v1.PhaseAsleep
		if c.Status.NextWake != nil {
			s.nextWake = c.Status.NextWake.Time
		}
	}
	return s
}

// observeSleep fills the sleep part of an observation.
func (p *Provider) observeSleep(c *v1.Cluster, o *Observed) {
	p.sleepMu.Lock()
	defer p.sleepMu.Unlock()
	if p.sleepers[c.Name] == nil && p.sleepAfter(c) == 0 && c.Status.Phase != v1.PhaseAsleep {
		return // sleep off: nothing changes
	}
	s := p.sleeperFor(c)
	o.Asleep = s.asleep
	if s.gate != nil {
		waking, _ := s.gate.Waking()
		o.Gated = s.gate.Listening() || waking
	}
	o.Woke, o.WakeMsg, o.WakeErr = s.woke, s.wakeMsg, s.wakeErr
}

// gateFor returns the cluster's held port, binding it (or taking it back from an
// earlier daemon's control plane) the first time.
func (p *Provider) gateFor(c *v1.Cluster, l lease.Lease) (*sleep.Gate, error) {
	p.sleepMu.Lock()
	defer p.sleepMu.Unlock()
	// Every cluster's port is held, whether it sleeps or not: the next run of its
	// control plane (a restart, an upgrade) takes the same socket, and clients
	// wait in its backlog instead of being refused.
	s := p.sleeperFor(c)
	if s.gate == nil {
		// It wakes for the name the cluster's kubeconfigs and the door send. The
		// socket of a control plane an earlier daemon left running is taken back
		// from it: the port is bound once for the cluster's life.
		var g *sleep.Gate
		f, err := supervisor.TakeFile(filepath.Join(ClusterDir(p.cfg.StateDir, c.Name), "instance.json"), 3, "apiserver-listener")
		if err == nil {
			g, err = sleep.FromFile(c.Name, p.serverName(c.Name), f, p.log)
		}
		if err == nil && g.Addr() != net.JoinHostPort("127.0.0.1", strconv.Itoa(l.Port)) {
			err = fmt.Errorf("the earlier control plane's socket is %s, not the cluster's port %d", g.Addr(), l.Port)
			g.Close()
		}
		if err != nil {
			g, err = sleep.Listen(c.Name, p.serverName(c.Name), l.Port, p.log)
		}
		if err != nil {
			return nil, err
		}
		// The apiserver's own certificate: a failed wake is answered with it.
		paths := pki.PathsFor(filepath.Join(ClusterDir(p.cfg.StateDir, c.Name), "pki"))
		g.AnswerWith(paths.ServingCert, paths.ServingKey, p.sleepMetrics.FailedWakeAnswers)
		g.CountRefused(p.sleepMetrics.WakeRefused.MustCurryWith(prometheus.Labels{"cluster": c.Name}))
		s.gate = g
	}
	return s.gate, nil
}

// goToSleep is OpSleep: the node services and the process stop, the node
// network is removed and given back, the port is gated. Data and port stay.
func (p *Provider) goToSleep(ctx context.Context, c *v1.Cluster, l lease.Lease) error {
	if err := p.stopNodeServices(ctx, c.Name); err != nil {
		return err
	}
	if err := p.stopProcess(c.Name); err != nil {
		return err
	}
	p.forgetProbe(c.Name)
	p.forgetTenantClient(c.Name)
	// Nothing in a sleeping cluster names the network: it has no node and no
	// Pod with an address, and the wake writes the new gateway into its config,
	// certificate and cluster-info. The bridge goes first, so a crash between
	// the two leaves a lease that the next pass releases, never a bridge that
	// no lease holds.
	if err := p.removeNetwork(ctx, c.Name, &l); err != nil {
		return fmt.Errorf("removing the node network: %w", err)
	}
	if err := p.leases.ReleaseNetwork(ctx, c.Name); err != nil {
		return fmt.Errorf("giving back the node network: %w", err)
	}
	// A cluster asleep since an earlier daemon is prepared again only at its
	// wake, which its admin kubeconfig must be able to cause: it gets one that
	// names it now (its serving certificate gets the name at the wake, before
	// the apiserver answers).
	// One that moved here asleep has no files here yet: its Secret is its
	// first host's, and names the service's door.
	paths := pki.PathsFor(filepath.Join(ClusterDir(p.cfg.StateDir, c.Name), "pki"))
	if _, err := os.Stat(paths.ClientCAKey); !p.isPrepared(c.Name) && err == nil {
		if err := p.writeAdminKubeconfig(ctx, c, paths, fmt.Sprintf("https://127.0.0.1:%d", l.Port)); err != nil {
			return fmt.Errorf("writing the admin kubeconfig of the sleeping cluster: %w", err)
		}
	}
	// Usually held since the start; bound only now for a cluster started before
	// it could sleep (its apiserver held the port itself until it stopped).
	g, err := p.gateFor(c, l)
	if err != nil {
		return err
	}
	if g == nil { // cannot happen: only a cluster with a sleeper sleeps
		return fmt.Errorf("cluster %s sleeps without a held port", c.Name)
	}
	return g.Sleep(func() { p.wake(c.Name, "connection") })
}

// wake lets a sleeping cluster start again (the gate's first connection, a due
// CronJob, sleep turned off).
func (p *Provider) wake(name, cause string) {
	p.sleepMu.Lock()
	s := p.sleepers[name]
	if s == nil || !s.asleep {
		p.sleepMu.Unlock()
		return
	}
	s.asleep, s.nextWake = false, time.Time{}
	s.woke, s.wakeMsg, s.wakeErr = false, "", ""
	s.cause, s.wokeAt = cause, time.Now()
	if s.gate != nil && cause != "connection" {
		s.gate.Stop()
	}
	p.sleepMu.Unlock()
	p.fail(name, OpLease, nil) // a wake that found no free node network tries again
	p.log.Info("waking cluster", "cluster", name, "cause", cause)
	p.queue.Add(name)
}

// awake is called once a cluster is Ready: connections that woke it are passed
// on, and the wake is recorded. It reports whether the status must be written
// again (the Wake condition changed).
func (p *Provider) awake(name string) bool {
	p.sleepMu.Lock()
	defer p.sleepMu.Unlock()
	s := p.sleepers[name]
	if s == nil || s.cause == "" {
		return false
	}
	took := time.Since(s.wokeAt)
	if s.gate != nil {
		if t, ok := s.gate.Awake(); ok {
			took = t
		}
	}
	p.sleepMetrics.Wakes.WithLabelValues(s.cause, "ok").Inc()
	if s.cause == "connection" {
		p.sleepMetrics.WakeSeconds.Observe(took.Seconds())
	}
	s.woke, s.wakeErr = true, ""
	s.wakeMsg = fmt.Sprintf("woken by a %s; the apiserver answered %s later", s.cause, took.Round(time.Millisecond))
	p.log.Info("cluster awake", "cluster", name, "cause", s.cause, "took", took.Round(time.Millisecond))
	s.cause = ""
	return true
}

// forgetSleeper releases a deleted (or let go) cluster's port and drops its
// series and its door's last wake placement.
func (p *Provider) forgetSleeper(name string) {
	p.sleepMu.Lock()
	s := p.sleepers[name]
	delete(p.sleepers, name)
	p.sleepMu.Unlock()
	p.failMu.Lock()
	delete(p.wakePlaced, name)
	p.failMu.Unlock()
	if p.sleepMetrics != nil {
		p.sleepMetrics.WakeRefused.DeletePartialMatch(prometheus.Labels{"cluster": name})
	}
	if s != nil && s.gate != nil {
		if err := s.gate.Close(); err != nil {
			p.log.Warn("releasing the held port", "cluster", name, "err", err)
		}
	}
}

// sleepLoop puts idle clusters to sleep, wakes sleeping ones ahead of a due
// CronJob, and fails wakes that take too long.
func (p *Provider) sleepLoop(ctx context.Context) {
	t := time.NewTicker(sleepCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		objs, err := p.lister.List(everything())
		if err != nil {
			continue
		}
		for _, o := range objs {
			c, err := v1.FromUnstructured(o.(*unstructured.Unstructured))
			if err != nil || c.DeletionTimestamp != nil {
				continue
			}
			if err := p.checkSleep(ctx, c); err != nil {
				p.log.Warn("checking whether the cluster may sleep", "cluster", c.Name, "err", err)
			}
		}
	}
}

func (p *Provider) checkSleep(ctx context.Context, c *v1.Cluster) error {
	after := p.sleepAfter(c)
	now := time.Now()
	p.sleepMu.Lock()
	s := p.sleepers[c.Name]
	if s == nil {
		p.sleepMu.Unlock()
		return nil // never started with sleep on (observe makes the sleeper)
	}
	asleep, nextWake, cause, wokeAt := s.asleep, s.nextWake, s.cause, s.wokeAt
	p.sleepMu.Unlock()
	switch {
	case asleep && after == 0:
		p.wake(c.Name, "config")
		return nil
	case asleep && !nextWake.IsZero() && !now.Before(nextWake):
		p.wake(c.Name, "cronjob")
		return nil
	case asleep:
		return nil
	case cause != "" && p.exitedSince(c.Name, wokeAt):
		// Fail now, not at the timeout: the waiting client would give up first.
		p.failWake(c.Name, "the control plane exited while waking: "+p.whyNotUp(c.Name))
		return nil
	case cause != "" && now.Sub(wokeAt) > wakeTimeout:
		p.failWake(c.Name, fmt.Sprintf("the control plane did not answer within %s of the wake; %s", wakeTimeout, p.whyNotUp(c.Name)))
		return nil
	case after == 0 || c.Status.Phase != v1.PhaseReady || cause != "":
		return nil
	}
	p.probeMu.Lock()
	pr := p.probes[c.Name]
	var awakeSince time.Time
	ok := pr != nil && pr.state.OK
	if ok {
		awakeSince = pr.state.Since
	}
	p.probeMu.Unlock()
	if !ok {
		return nil
	}
	if wokeAt.After(awakeSince) {
		awakeSince = wokeAt
	}
	obs := sleep.Observed{Now: now, SleepAfter: after, AwakeSince: awakeSince, LastRequest: controlplane.LastRequest(RunDir(p.cfg.StateDir, c.Name))}
	// The cheap part first: the tenant is asked only once the cluster looks idle.
	if v := sleep.Decide(obs); !v.Sleep {
		return nil
	}
	if err := p.observeTenant(ctx, c.Name, &obs); err != nil {
		return err
	}
	observeIdleNodes(c, &obs)
	v := sleep.Decide(obs)
	if !v.Sleep {
		p.log.Debug("cluster stays awake", "cluster", c.Name, "why", v.Why)
		return nil
	}
	p.sleepMu.Lock()
	if s.asleep || s.cause != "" {
		p.sleepMu.Unlock()
		return nil
	}
	s.asleep, s.nextWake, s.woke, s.wakeMsg = true, v.NextWake, false, ""
	p.sleepMu.Unlock()
	p.sleepMetrics.Sleeps.Inc()
	p.log.Info("cluster going to sleep", "cluster", c.Name, "why", v.Why, "nextWake", v.NextWake)
	p.queue.Add(c.Name)
	return nil
}

// observeTenant asks the tenant, as the daemon's own user, for what keeps it
// awake: nodes, Pods waiting for one, CronJobs.
func (p *Provider) observeTenant(ctx context.Context, name string, o *sleep.Observed) error {
	tenant, err := p.tenantClient(name)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	nodes, err := tenant.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	o.Nodes = len(nodes.Items)
	// What the scale decision boots nodes for (its intent): Pods not placed yet, and
	// the Pods Jobs, Deployments and StatefulSets still lack.
	var want scale.Observed
	pods, err := tenant.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	want.Pods = pointers(pods.Items)
	jobs, err := tenant.BatchV1().Jobs("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing jobs: %w", err)
	}
	want.Jobs = pointers(jobs.Items)
	deployments, err := tenant.AppsV1().Deployments("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing deployments: %w", err)
	}
	want.Deployments = pointers(deployments.Items)
	statefulSets, err := tenant.AppsV1().StatefulSets("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing statefulsets: %w", err)
	}
	want.StatefulSets = pointers(statefulSets.Items)
	o.WantsNodes = scale.Wanting(want)
	cronJobs, err := tenant.BatchV1().CronJobs("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing cronjobs: %w", err)
	}
	o.NextCron = sleep.NextCron(cronJobs.Items, o.Now)
	return nil
}

// observeIdleNodes puts a cluster's idle-node window into o: wanted now, or when it
// opens next. A schedule that does not parse keeps nothing awake: the scale driver keeps
// no idle nodes for it either, and says so (BadIdleSchedule).
func observeIdleNodes(c *v1.Cluster, o *sleep.Observed) {
	if c.Spec.IdleNodes <= 0 {
		return
	}
	w, err := window.Parse(c.Spec.IdleSchedule)
	if err != nil {
		return
	}
	if w.Open(o.Now) {
		o.IdleNodesWanted = true
		return
	}
	o.NextIdleWindow = w.NextOpen(o.Now)
}

func (p *Provider) tenantClient(name string) (kubernetes.Interface, error) {
	p.sleepMu.Lock()
	defer p.sleepMu.Unlock()
	s := p.sleepers[name]
	if s == nil {
		return nil, fmt.Errorf("cluster %s has no sleep state", name)
	}
	if s.tenant != nil {
		return s.tenant, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(ClusterDir(p.cfg.StateDir, name), pki.Daemon.Name+".kubeconfig"))
	if err != nil {
		return nil, fmt.Errorf("the daemon's credentials for %s: %w", name, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("a client of %s: %w", name, err)
	}
	s.tenant = cs
	return cs, nil
}

// forgetTenantClient drops the daemon's client of a cluster going to sleep:
// a sleeping cluster keeps only its port, its record and its gate, and the
// client (its transport, TLS config and connection pool) is made again by
// the first check after the wake.
func (p *Provider) forgetTenantClient(name string) {
	p.sleepMu.Lock()
	defer p.sleepMu.Unlock()
	if s := p.sleepers[name]; s != nil {
		s.tenant = nil
	}
}

// failWake ends a wake that did not come up: the waiting connections are
// answered with an HTTP 503 saying why (sleep.Gate.Fail), the Wake condition too, and the cluster goes back to sleep (its
// process stopped, its port gated), so the next connection tries a fresh wake
// instead of waiting on a control plane that restarts with backoff.
func (p *Provider) failWake(name, why string) {
	p.sleepMu.Lock()
	s := p.sleepers[name]
	if s == nil || s.cause == "" {
		p.sleepMu.Unlock()
		return
	}
	p.sleepMetrics.Wakes.WithLabelValues(s.cause, "failed").Inc()
	s.cause, s.woke, s.wakeErr = "", false, why
	s.asleep = true
	g := s.gate
	p.sleepMu.Unlock()
	if g != nil {
		g.Fail(errors.New(why))
	}
	p.log.Error("wake failed", "cluster", name, "why", why)
	p.queue.Add(name)
}

// failWakeIfExited fails a wake at once when the control plane exits while
// waking, rather than at the next sleep check: the client that woke it
// waits, and kubectl gives up on a TLS handshake after 10 s. Called on every
// process change (SupervisorHook).
func (p *Provider) failWakeIfExited(name string) {
	p.sleepMu.Lock()
	s := p.sleepers[name]
	var cause string
	var wokeAt time.Time
	if s != nil {
		cause, wokeAt = s.cause, s.wokeAt
	}
	p.sleepMu.Unlock()
	if cause != "" && p.exitedSince(name, wokeAt) {
		p.failWake(name, "the control plane exited while waking: "+p.whyNotUp(name))
	}
}

// whyNotUp describes a control plane that does not answer.
func (p *Provider) whyNotUp(name string) string {
	st, ok := p.sup.State(ProcessName(name))
	switch {
	case !ok:
		return "the process was not started"
	case !st.Running:
		return fmt.Sprintf("the process %s (%d restarts); see controlplane.log in the cluster's run dir (STATE/clusters/NAME/run)", st.LastExit, st.Restarts)
	}
	p.probeMu.Lock()
	defer p.probeMu.Unlock()
	if pr := p.probes[name]; pr != nil && pr.state.Err != "" {
		return "its readiness check: " + pr.state.Err
	}
	return "it is still starting"
}

// nextWake is when a sleeping cluster wakes by itself, for its status.
func (p *Provider) nextWake(name string) *metav1.Time {
	p.sleepMu.Lock()
	defer p.sleepMu.Unlock()
	if s := p.sleepers[name]; s != nil && !s.nextWake.IsZero() {
		t := metav1.NewTime(s.nextWake)
		return &t
	}
	return nil
}

// exitedSince reports whether the cluster's control-plane process exited after t.
func (p *Provider) exitedSince(name string, t time.Time) bool {
	st, ok := p.sup.State(ProcessName(name))
	return ok && !st.Running && st.LastExit != "" && st.Since.After(t)
}

// pointers points at each item of a list's Items.
func pointers[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}
