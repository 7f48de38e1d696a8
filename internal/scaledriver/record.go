package scaledriver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/socialweb-computer/socialweb/internal/promreg"
	"github.com/socialweb-computer/socialweb/internal/scale"
)

// reportingController names the driver in the Events it writes.
const reportingController = "socialweb.computer/scale"

// maxNote is the apiserver's limit on an Event's note.
const maxNote = 1024

// event writes an events.k8s.io/v1 Event on the tenant about the namespace, since the
// nodes a decision is about may not exist yet (or any more). Failing to write one is
// logged, never fatal: the Event reports a change, it is not the change.
func (d *Driver) event(ctx context.Context, dec scale.Decision, typ, reason, note string) {
	d.writeEvent(ctx, d.cfg.EventNamespace, corev1.ObjectReference{APIVersion: "v1", Kind: "Namespace", Name: d.cfg.EventNamespace}, typ, reason, note)
}

// writeEvent writes an Event in namespace about regarding (which must be in it, or
// cluster-scoped).
func (d *Driver) writeEvent(ctx context.Context, namespace string, regarding corev1.ObjectReference, typ, reason, note string) {
	if len(note) > maxNote {
		note = note[:maxNote-3] + "..."
	}
	var suffix [8]byte
	_, _ = rand.Read(suffix[:])
	ev := &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      d.cfg.Cluster + "-scale." + hex.EncodeToString(suffix[:]),
			Namespace: namespace,
		},
		EventTime:           metav1.NewMicroTime(d.now()),
		ReportingController: reportingController,
		ReportingInstance:   reportingController + "/" + d.cfg.Cluster,
		Action:              "Scale",
		Reason:              reason,
		Type:                typ,
		Note:                note,
		Regarding:           regarding,
	}
	if _, err := d.tenant.EventsV1().Events(namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		d.log.Warn("record scale event", "reason", reason, "err", err)
	}
}

// metrics are shared by every driver on a Registerer and labelled by cluster.
type metrics struct {
	decisions *prometheus.CounterVec
	failures  *prometheus.CounterVec
	nodes     *prometheus.GaugeVec
	pending   *prometheus.HistogramVec
	nodeFails *prometheus.CounterVec
	unfit     *prometheus.GaugeVec
	waits     *prometheus.CounterVec
	starts    *prometheus.HistogramVec
	kinds     *prometheus.CounterVec
	podStarts *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "socialweb_scale_decisions_total",
			Help: "Scale decisions made, by cluster and action (every pass, including None and Hold).",
		}, []string{"cluster", "action"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "socialweb_scale_action_failures_total",
			Help: "Scale decisions whose action failed against the node provider or the tenant.",
		}, []string{"cluster", "action"}),
		nodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "socialweb_nodes",
			Help: "Nodes of the cluster (registered and booting) after the last scale pass.",
		}, []string{"cluster"}),
		pending: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "socialweb_scale_pending_to_provision_seconds",
			Help:    "From the oldest unplaceable Pod's creation to the provisioning of nodes for it.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 12), // 50ms .. ~100s
		}, []string{"cluster"}),
		nodeFails: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "socialweb_node_failures_total",
			Help: "Machines deleted because their VM stopped on its own (VMExited), their kernel never started (EarlyBootStall) or their Node did not register in time (JoinTimeout).",
		}, []string{"cluster", "reason"}),
		unfit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "socialweb_scale_unprovisionable_pods",
			Help: "Pods (or workloads whose Pods do not exist yet) that fit no node size the cluster may boot, at the last scale pass.",
		}, []string{"cluster"}),
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "socialweb_scale_host_capacity_waits_total",
			Help: "Node boots put off because the host lacked the memory or disk for them; they are tried again on later passes.",
		}, []string{"cluster"}),
		starts: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "socialweb_node_start_phase_seconds",
			Help: "Where a node this daemon booted spent its start, by phase: each phase's own duration (not cumulative); " +
				"together they are its first Pod's creation to that Pod's last container started. " +
				"decision: Pod created to the scale decision; vmm: decision to the VMM started; " +
				"kernel: guest kernel to the agent (PID 1), 0 for a warm start (a warm-pool VM claimed for the node); " +
				"agent: the agent's boot steps, for a warm start those after the claim; " +
				"registered: the rest until the Node registered (VMM before the kernel, kubelet TLS bootstrap); " +
				"ready: registered to Node Ready; image: the kubelet pulling the Pod's images, waiting included; " +
				"container: the rest until its last container started (scheduling, sandbox, network, start).",
			Buckets: prometheus.ExponentialBucketsRange(0.1, 600, 14), // 0.1s .. 10min
		}, []string{"cluster", "phase"}),
		kinds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "socialweb_node_starts_total",
			Help: "Node starts recorded in socialweb_node_start_phase_seconds, by kind: warm (a warm-pool VM booted ahead and claimed for the node) or cold (booted for it).",
		}, []string{"cluster", "start"}),
		podStarts: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "socialweb_pod_start_seconds",
			Help: "Pods that waited for a node, from their creation to all of their containers started, by path: " +
				"idle (a node that was up before the Pod), warm (a node started from a warm-pool VM for it) or cold (a node booted for it).",
			Buckets: prometheus.ExponentialBucketsRange(0.5, 600, 16), // 0.5s .. 10min
		}, []string{"cluster", "path"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.decisions, err = promreg.Register(reg, m.decisions); err != nil {
		return nil, err
	}
	if m.failures, err = promreg.Register(reg, m.failures); err != nil {
		return nil, err
	}
	if m.nodes, err = promreg.Register(reg, m.nodes); err != nil {
		return nil, err
	}
	if m.pending, err = promreg.Register(reg, m.pending); err != nil {
		return nil, err
	}
	if m.nodeFails, err = promreg.Register(reg, m.nodeFails); err != nil {
		return nil, err
	}
	if m.unfit, err = promreg.Register(reg, m.unfit); err != nil {
		return nil, err
	}
	if m.waits, err = promreg.Register(reg, m.waits); err != nil {
		return nil, err
	}
	if m.starts, err = promreg.Register(reg, m.starts); err != nil {
		return nil, err
	}
	if m.kinds, err = promreg.Register(reg, m.kinds); err != nil {
		return nil, err
	}
	if m.podStarts, err = promreg.Register(reg, m.podStarts); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) decided(cluster string, d scale.Decision) {
	m.decisions.WithLabelValues(cluster, string(d.Action)).Inc()
}

func (m *metrics) failed(cluster string, d scale.Decision, nodes int) {
	m.failures.WithLabelValues(cluster, string(d.Action)).Inc()
	m.nodes.WithLabelValues(cluster).Set(float64(nodes))
}

// succeeded records a decision carried out, leaving the cluster with nodes nodes (fewer
// than its target when some wait for host capacity).
func (m *metrics) succeeded(cluster string, d scale.Decision, nodes int, now time.Time) {
	m.nodes.WithLabelValues(cluster).Set(float64(nodes))
	if d.Action == scale.Provision && nodes > d.Current && !d.PendingSince.IsZero() {
		m.pending.WithLabelValues(cluster).Observe(now.Sub(d.PendingSince).Seconds())
	}
}

func (m *metrics) nodeFailed(cluster, reason string) {
	m.nodeFails.WithLabelValues(cluster, reason).Inc()
}

func (m *metrics) unprovisionable(cluster string, n int) {
	m.unfit.WithLabelValues(cluster).Set(float64(n))
}

// started records one phase of a node's start.
func (m *metrics) started(cluster, phase string, took time.Duration) {
	m.starts.WithLabelValues(cluster, phase).Observe(took.Seconds())
}

// startedNode counts one node start recorded, warm or cold.
func (m *metrics) startedNode(cluster string, warm bool) {
	kind := "cold"
	if warm {
		kind = "warm"
	}
	m.kinds.WithLabelValues(cluster, kind).Inc()
}

func (m *metrics) podStarted(cluster, path string, took time.Duration) {
	m.podStarts.WithLabelValues(cluster, path).Observe(took.Seconds())
}

func (m *metrics) capacityWait(cluster string) {
	m.waits.WithLabelValues(cluster).Inc()
}

// forget drops a stopped driver's series, so a deleted cluster does not linger.
func (m *metrics) forget(cluster string) {
	l := prometheus.Labels{"cluster": cluster}
	m.decisions.DeletePartialMatch(l)
	m.failures.DeletePartialMatch(l)
	m.nodes.DeletePartialMatch(l)
	m.pending.DeletePartialMatch(l)
	m.nodeFails.DeletePartialMatch(l)
	m.unfit.DeletePartialMatch(l)
	m.waits.DeletePartialMatch(l)
	m.starts.DeletePartialMatch(l)
	m.kinds.DeletePartialMatch(l)
	m.podStarts.DeletePartialMatch(l)
}
