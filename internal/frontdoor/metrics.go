package frontdoor

import "github.com/prometheus/client_golang/prometheus"

// metrics are the door's counters. Carried connections are labelled by
// cluster (bounded by the clusters that exist). Refused ones are labelled by
// reason only: the name a client asked for could be anything, and would both
// grow without bound and record guesses at cluster names.
type metrics struct {
	connections *prometheus.CounterVec
	open        *prometheus.GaugeVec
	bytes       *prometheus.CounterVec
	refused     *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		connections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "socialweb_frontdoor_connections_total",
			Help: "Connections the front door passed to a cluster's apiserver.",
		}, []string{"cluster"}),
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "socialweb_frontdoor_open_connections",
			Help: "Connections the front door carries to a cluster's apiserver now.",
		}, []string{"cluster"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "socialweb_frontdoor_bytes_total",
			Help: "Bytes the front door carried, by cluster and direction (in: client to apiserver, out: apiserver to client).",
		}, []string{"cluster", "direction"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "socialweb_frontdoor_refused_total",
			Help: "Connections the front door refused, by reason: unknown_name, no_name, unavailable (the cluster's apiserver did not answer), bad_hello, hello_timeout, too_many_from_source, too_many_connections (its limits).",
		}, []string{"reason"}),
	}
}

// clusterMetrics are one cluster's series, looked up once per connection.
type clusterMetrics struct {
	connections prometheus.Counter
	open        prometheus.Gauge
	in, out     prometheus.Counter
}

func (m *metrics) forCluster(cluster string) clusterMetrics {
	return clusterMetrics{
		connections: m.connections.WithLabelValues(cluster),
		open:        m.open.WithLabelValues(cluster),
		in:          m.bytes.WithLabelValues(cluster, "in"),
		out:         m.bytes.WithLabelValues(cluster, "out"),
	}
}

// Forget drops a deleted cluster's series.
func (m *metrics) forget(cluster string) {
	m.connections.DeleteLabelValues(cluster)
	m.open.DeleteLabelValues(cluster)
	m.bytes.DeleteLabelValues(cluster, "in")
	m.bytes.DeleteLabelValues(cluster, "out")
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	m.connections.Describe(ch)
	m.open.Describe(ch)
	m.bytes.Describe(ch)
	m.refused.Describe(ch)
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.connections.Collect(ch)
	m.open.Collect(ch)
	m.bytes.Collect(ch)
	m.refused.Collect(ch)
}
