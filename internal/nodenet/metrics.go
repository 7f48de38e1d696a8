package nodenet

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector reports the refused-packet counters of the clusters this Manager
// ensured, read from nft at each scrape.
func (m *Manager) Collector() prometheus.Collector {
	return collector{m: m, denied: prometheus.NewDesc("socialweb_node_network_denied_packets_total",
		"Packets from a cluster's bridge its walls refused: wall=host (to the host, on no port it serves the cluster) or wall=egress (forwarded, where the egress policy does not let them go). Reset when the cluster's network is ensured again (each start of its control plane).",
		[]string{"cluster", "wall"}, nil)}
}

type collector struct {
	m      *Manager
	denied *prometheus.Desc
}

func (c collector) Describe(ch chan<- *prometheus.Desc) { ch <- c.denied }

func (c collector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	m.mu.Lock()
	ensured := make(map[int]string, len(m.ensured))
	for i, cl := range m.ensured {
		ensured[i] = cl
	}
	m.mu.Unlock()
	if len(ensured) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counters, err := m.DeniedCounters(ctx)
	m.noteCollectErr(err)
	if err != nil {
		return // the rest of the scrape is still worth having
	}
	for i, cl := range ensured {
		for wall, n := range counters[i] {
			ch <- prometheus.MustNewConstMetric(c.denied, prometheus.CounterValue, float64(n), cl, wall)
		}
	}
}

// noteCollectErr logs a scrape's error once, not at every scrape.
func (m *Manager) noteCollectErr(err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	m.mu.Lock()
	changed := msg != m.collectErr
	m.collectErr = msg
	m.mu.Unlock()
	if changed && err != nil {
		m.log.Warn("reading the node networks' refused-packet counters", "err", err)
	}
}

// DeniedCounters reads every socialweb table's refused-packet counters:
// network index -> wall ("egress", "host") -> packets.
func (m *Manager) DeniedCounters(ctx context.Context) (map[int]map[string]uint64, error) {
	out, err := m.cmd(ctx, "", "nft", "-j", "list", "counters")
	if err != nil {
		return nil, explain(err, "listing nftables counters")
	}
	got, err := parseDeniedCounters(out)
	if err != nil {
		return nil, fmt.Errorf("reading `nft -j list counters`: %w", err)
	}
	return got, nil
}

func parseDeniedCounters(out string) (map[int]map[string]uint64, error) {
	var doc struct {
		Nftables []struct {
			Counter *struct {
				Family  string `json:"family"`
				Table   string `json:"table"`
				Name    string `json:"name"`
				Packets uint64 `json:"packets"`
			} `json:"counter"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		return nil, err
	}
	walls := map[string]string{counterEgress: "egress", counterHost: "host"}
	got := map[int]map[string]uint64{}
	for _, o := range doc.Nftables {
		c := o.Counter
		if c == nil || c.Family != tableFamily || walls[c.Name] == "" {
			continue
		}
		mt := tableRe.FindStringSubmatch(c.Table)
		if mt == nil {
			continue
		}
		i, _ := strconv.Atoi(mt[1])
		if got[i] == nil {
			got[i] = map[string]uint64{}
		}
		got[i][walls[c.Name]] = c.Packets
	}
	return got, nil
}
