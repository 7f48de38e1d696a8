package buildcache

import (
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/socialweb-computer/socialweb/internal/promreg"
)

// metrics are shared by every cluster's cache and labelled by cluster.
type metrics struct {
	bytes     *prometheus.GaugeVec
	objects   *prometheus.GaugeVec
	evictions *prometheus.CounterVec
	requests  *prometheus.CounterVec
}

// newMetrics makes the metrics, registered on reg unless it is nil.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		bytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "socialweb_build_cache_bytes",
			Help: "Bytes of objects in a cluster's build cache.",
		}, []string{"cluster"}),
		objects: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "socialweb_build_cache_objects",
			Help: "Objects in a cluster's build cache.",
		}, []string{"cluster"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "socialweb_build_cache_evictions_total",
			Help: "Objects evicted from a cluster's build cache to keep it within its budget.",
		}, []string{"cluster"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "socialweb_build_cache_requests_total",
			Help: "Requests to a cluster's build cache, authenticated or not, by HTTP method.",
		}, []string{"cluster", "op"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.bytes, err = promreg.Register(reg, m.bytes); err != nil {
		return nil, err
	}
	if m.objects, err = promreg.Register(reg, m.objects); err != nil {
		return nil, err
	}
	if m.evictions, err = promreg.Register(reg, m.evictions); err != nil {
		return nil, err
	}
	if m.requests, err = promreg.Register(reg, m.requests); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) usage(cluster string, bytes int64, objects int) {
	m.bytes.WithLabelValues(cluster).Set(float64(bytes))
	m.objects.WithLabelValues(cluster).Set(float64(objects))
}

func (m *metrics) evicted(cluster string) {
	m.evictions.WithLabelValues(cluster).Inc()
}

// request counts a request by method, from a fixed set: anyone can send any method.
func (m *metrics) request(cluster, method string) {
	op := "other"
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPut, http.MethodPost, http.MethodDelete:
		op = method
	}
	m.requests.WithLabelValues(cluster, strings.ToLower(op)).Inc()
}

// forget drops a removed cluster's series.
func (m *metrics) forget(cluster string) {
	l := prometheus.Labels{"cluster": cluster}
	m.bytes.DeletePartialMatch(l)
	m.objects.DeletePartialMatch(l)
	m.evictions.DeletePartialMatch(l)
	m.requests.DeletePartialMatch(l)
}
