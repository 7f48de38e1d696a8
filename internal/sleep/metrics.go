package sleep

import "github.com/prometheus/client_golang/prometheus"

// Metrics count sleeps and wakes. Make them with NewMetrics and register
// Collectors.
type Metrics struct {
	Sleeps prometheus.Counter
	// Wakes is labelled by what woke the cluster (connection, cronjob) and
	// the result (ok, failed).
	Wakes *prometheus.CounterVec
	// WakeSeconds is from the waking connection's arrival to the apiserver
	// answering, when the connection is passed on.
	WakeSeconds prometheus.Histogram
	// FailedWakeAnswers counts connections answered with an HTTP 503
	// because their wake failed (Gate.Fail).
	FailedWakeAnswers prometheus.Counter
	// WakeRefused counts connections to a sleeping cluster's port closed
	// without a wake, by cluster and reason (Gate.CountRefused; the name a
	// client asked for is never a label).
	WakeRefused *prometheus.CounterVec
	// Moves counts, on a sleeping cluster's host, the moves a door asked for
	// so that it wakes on another host, by result: handed_over, stayed (it
	// was awake or waking here), failed.
	Moves *prometheus.CounterVec
}

// NewMetrics makes the sleep and wake metrics.
func NewMetrics() *Metrics {
	return &Metrics{
		Sleeps: prometheus.NewCounter(prometheus.CounterOpts{Name: "socialweb_cluster_sleeps_total", Help: "Control planes put to sleep."}),
		Wakes:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "socialweb_cluster_wakes_total", Help: "Wakes of sleeping control planes, by cause and result."}, []string{"cause", "result"}),
		WakeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "socialweb_cluster_wake_seconds",
			Help:    "From the connection that woke a cluster to its apiserver answering.",
			Buckets: []float64{0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 30, 60},
		}),
		FailedWakeAnswers: prometheus.NewCounter(prometheus.CounterOpts{Name: "socialweb_cluster_failed_wake_answers_total", Help: "Connections to a sleeping cluster answered with an HTTP 503 because its wake failed."}),
		WakeRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "socialweb_cluster_wake_refused_total",
			Help: "Connections to a sleeping cluster closed without waking it, by reason: no_name, other_name (the TLS ClientHello did not name the cluster), bad_hello, hello_timeout, too_many_pending.",
		}, []string{"cluster", "reason"}),
		Moves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "socialweb_cluster_sleeping_moves_total",
			Help: "Sleeping clusters a door asked to wake on another host, counted on their host, by result: handed_over, stayed (awake or waking here), failed.",
		}, []string{"result"}),
	}
}

// Collectors are the metrics to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Sleeps, m.Wakes, m.WakeSeconds, m.FailedWakeAnswers, m.WakeRefused, m.Moves}
}
