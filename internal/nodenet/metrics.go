package nodenet

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector reports the refused-packet counters of the clusters this Manager
// ensured, read from nft at each scrape.
func (m *Manager) Collector() prometheus.Collector {
	return collector{m: m, denied: prometheus.NewDesc("socialweb_node_network_denied_packets_total",
		"Packets from a cluster's bridge its walls refused: wall=host (to the host, on no port it serves the cluster) or wall=egress (forwarded, where the egress policy does not let them go). Reset when the cluster's network is ensured again (each start of its control plane).",
		[]string{"cluster", "wall"}, nil),
		controlPlane: prometheus.NewDesc("socialweb_control_plane_denied_connections_total",
			"New connections of a cluster's control plane (its uid) the kernel's wall refused: to anywhere but its loopback port, its nodes and Pods, its datastore and, with the internet, public addresses. Reset when the wall is written again (each start of the control plane).",
			[]string{"cluster"}, nil)}
}

type collector struct {
	m            *Manager
	denied       *prometheus.Desc
	controlPlane *prometheus.Desc
}

func (c collector) Describe(ch chan<- *prometheus.Desc) { ch <- c.denied; ch <- c.controlPlane }

func (c collector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	m.mu.Lock()
	ensured, walled := maps.Clone(m.ensured), maps.Clone(m.walled)
	m.mu.Unlock()
	if len(ensured) == 0 && len(walled) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counters, cps, err := m.deniedCounters(ctx)
	m.noteCollectErr(err)
	if err != nil {
		return // the rest of the scrape is still worth having
	}
	for i, cl := range ensured {
		for wall, n := range counters[i] {
			ch <- prometheus.MustNewConstMetric(c.denied, prometheus.CounterValue, float64(n), cl, wall)
		}
	}
	for port, cl := range walled {
		if n, ok := cps[port]; ok {
			ch <- prometheus.MustNewConstMetric(c.controlPlane, prometheus.CounterValue, float64(n), cl)
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
	got, _, err := m.deniedCounters(ctx)
	return got, err
}

// ControlPlaneDenied reads every control-plane wall's refused-connection counter:
// apiserver port -> connections.
func (m *Manager) ControlPlaneDenied(ctx context.Context) (map[int]uint64, error) {
	_, got, err := m.deniedCounters(ctx)
	return got, err
}

func (m *Manager) deniedCounters(ctx context.Context) (map[int]map[string]uint64, map[int]uint64, error) {
	out, err := m.cmd(ctx, "", "nft", "-j", "list", "counters")
	if err != nil {
		return nil, nil, explain(err, "listing nftables counters")
	}
	nodes, cps, err := parseDeniedCounters(out)
	if err != nil {
		return nil, nil, fmt.Errorf("reading `nft -j list counters`: %w", err)
	}
	return nodes, cps, nil
}

// parseDeniedCounters reads the node networks' counters (index -> wall ->
// packets) and the control planes' (port -> connections).
func parseDeniedCounters(out string) (map[int]map[string]uint64, map[int]uint64, error) {
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
		return nil, nil, err
	}
	walls := map[string]string{counterEgress: "egress", counterHost: "host"}
	got, cps := map[int]map[string]uint64{}, map[int]uint64{}
	for _, o := range doc.Nftables {
		c := o.Counter
		if c == nil || c.Family != tableFamily {
			continue
		}
		if mt := cpTableRe.FindStringSubmatch(c.Table); mt != nil && c.Name == counterControlPlane {
			port, _ := strconv.Atoi(mt[1])
			cps[port] = c.Packets
			continue
		}
		if walls[c.Name] == "" {
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
	return got, cps, nil
}
