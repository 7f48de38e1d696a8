package provider

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
)

// collector reports clusters from the informer cache at scrape time, so the
// numbers are never a second copy of state that could drift.
type collector struct {
	p        *Provider
	clusters *prometheus.Desc
	restarts *prometheus.Desc
	nodes    *prometheus.Desc
}

// Collector returns the provider's Prometheus collector.
func (p *Provider) Collector() prometheus.Collector {
	return &collector{
		p:        p,
		clusters: prometheus.NewDesc("socialweb_clusters", "Tenant clusters by phase.", []string{"phase"}, nil),
		restarts: prometheus.NewDesc("socialweb_controlplane_restarts", "Control-plane process restarts since the daemon started.", []string{"cluster"}, nil),
		nodes:    prometheus.NewDesc("socialweb_cluster_nodes", "Worker nodes per cluster, as last recorded.", []string{"cluster"}, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.clusters
	ch <- c.restarts
	ch <- c.nodes
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	objs, err := c.p.lister.List(everything())
	if err != nil {
		return
	}
	phases := map[v1.Phase]int{v1.PhaseInitializing: 0, v1.PhaseReady: 0, v1.PhaseUnavailable: 0, v1.PhaseDraining: 0, v1.PhaseAsleep: 0}
	for _, o := range objs {
		cl, err := v1.FromUnstructured(o.(*unstructured.Unstructured))
		if err != nil {
			continue
		}
		phases[cl.Status.Phase]++
		if st, ok := c.p.sup.State(ProcessName(cl.Name)); ok {
			ch <- prometheus.MustNewConstMetric(c.restarts, prometheus.CounterValue, float64(st.Restarts), cl.Name)
		}
		ch <- prometheus.MustNewConstMetric(c.nodes, prometheus.GaugeValue, float64(cl.Status.Nodes), cl.Name)
	}
	for ph, n := range phases {
		if ph == "" {
			ph = "Unknown"
		}
		ch <- prometheus.MustNewConstMetric(c.clusters, prometheus.GaugeValue, float64(n), string(ph))
	}
}
