package hosts

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics count what membership did: tenants taken over from lost hosts and
// handed over by a drain.
type metrics struct {
	takeovers, handovers atomic.Int64
}

var (
	hostsDesc = prometheus.NewDesc("socialweb_hosts", "Hosts of the service as this host saw them at its last poll of their Leases, by state (live or lost).",
		[]string{"state"}, nil)
	takeoversDesc = prometheus.NewDesc("socialweb_tenant_takeovers_total", "Tenants this host took over from a host whose Lease lapsed.", nil, nil)
	handoversDesc = prometheus.NewDesc("socialweb_tenant_handovers_total", "Tenants this host handed to another while drained.", nil, nil)
	fencedDesc    = prometheus.NewDesc("socialweb_host_fenced", "1 while this host could not renew its Lease for a Lease duration and runs no tenant.", nil, nil)
)

// Collector exports the hosts seen live and lost, and this host's takeovers,
// handovers and fencing.
func (m *Membership) Collector() prometheus.Collector { return collector{m} }

type collector struct{ m *Membership }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- hostsDesc
	ch <- takeoversDesc
	ch <- handoversDesc
	ch <- fencedDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	live, lost := 0, 0
	c.m.mu.Lock()
	for _, ok := range c.m.alive {
		if ok {
			live++
		} else {
			lost++
		}
	}
	c.m.mu.Unlock()
	fenced := 0.0
	if c.m.Fenced() {
		fenced = 1
	}
	ch <- prometheus.MustNewConstMetric(hostsDesc, prometheus.GaugeValue, float64(live), "live")
	ch <- prometheus.MustNewConstMetric(hostsDesc, prometheus.GaugeValue, float64(lost), "lost")
	ch <- prometheus.MustNewConstMetric(takeoversDesc, prometheus.CounterValue, float64(c.m.metrics.takeovers.Load()))
	ch <- prometheus.MustNewConstMetric(handoversDesc, prometheus.CounterValue, float64(c.m.metrics.handovers.Load()))
	ch <- prometheus.MustNewConstMetric(fencedDesc, prometheus.GaugeValue, fenced)
}
