package registry

import (
	"io/fs"
	"path/filepath"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// pullMetrics counts what the pull-through cache did. The zero value counts.
type pullMetrics struct {
	hits, misses, stale, upstreamBytes, servedBytes atomic.Int64
}

func (m *pullMetrics) hit()                 { m.hits.Add(1) }
func (m *pullMetrics) miss()                { m.misses.Add(1) }
func (m *pullMetrics) staleServed()         { m.stale.Add(1) }
func (m *pullMetrics) fromUpstream(n int64) { m.upstreamBytes.Add(n) }
func (m *pullMetrics) served(n int64)       { m.servedBytes.Add(n) }

var (
	descHits     = prometheus.NewDesc("socialweb_registry_cache_hits_total", "Manifests served from the store without asking upstream (pulled tags within their TTL or confirmed, digests, pushed images).", nil, nil)
	descMisses   = prometheus.NewDesc("socialweb_registry_cache_misses_total", "Manifests and blobs fetched from upstream because the store lacked them or a tag moved.", nil, nil)
	descStale    = prometheus.NewDesc("socialweb_registry_cache_stale_served_total", "Cached tags served because upstream could not be asked whether they moved.", nil, nil)
	descUpstream = prometheus.NewDesc("socialweb_registry_upstream_bytes_total", "Bytes fetched from upstream registries.", nil, nil)
	descServed   = prometheus.NewDesc("socialweb_registry_served_bytes_total", "Bytes of manifests and blobs served to nodes.", nil, nil)
	descSize     = prometheus.NewDesc("socialweb_registry_cache_bytes", "Bytes of blobs the registry stores (pushed and pulled).", nil, nil)
	descCluster  = prometheus.NewDesc("socialweb_registry_cluster_bytes", `Bytes of blobs a cluster brought into the registry (fetched from upstream for its nodes, shared images included, or pushed for it): what --image-cluster-quota counts. cluster="" is the blobs no cluster is charged for (pushed host-wide, stored before charges were kept, or brought by a deleted cluster). A blob counts once.`, []string{"cluster"}, nil)
)

// Collector exposes the registry's pull-through metrics.
func (s *Server) Collector() prometheus.Collector { return registryCollector{s} }

type registryCollector struct{ s *Server }

func (c registryCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descHits, descMisses, descStale, descUpstream, descServed, descSize, descCluster} {
		ch <- d
	}
}

func (c registryCollector) Collect(ch chan<- prometheus.Metric) {
	m := &c.s.metrics
	ch <- prometheus.MustNewConstMetric(descHits, prometheus.CounterValue, float64(m.hits.Load()))
	ch <- prometheus.MustNewConstMetric(descMisses, prometheus.CounterValue, float64(m.misses.Load()))
	ch <- prometheus.MustNewConstMetric(descStale, prometheus.CounterValue, float64(m.stale.Load()))
	ch <- prometheus.MustNewConstMetric(descUpstream, prometheus.CounterValue, float64(m.upstreamBytes.Load()))
	ch <- prometheus.MustNewConstMetric(descServed, prometheus.CounterValue, float64(m.servedBytes.Load()))
	if c.s.init() == nil {
		var total int64
		filepath.WalkDir(filepath.Join(c.s.st.dir, "blobs"), func(_ string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if info, err := d.Info(); err == nil {
					total += info.Size()
				}
			}
			return nil
		})
		ch <- prometheus.MustNewConstMetric(descSize, prometheus.GaugeValue, float64(total))
		if u, err := c.s.Usage(); err == nil {
			for cluster, n := range u {
				ch <- prometheus.MustNewConstMetric(descCluster, prometheus.GaugeValue, float64(n), cluster)
			}
		}
	}
}
