// Package deploy holds no code. Its directory ships what runs beside the
// daemon: Prometheus alert rules (prometheus/), a Grafana dashboard
// (grafana/) and a sample config file (config.yaml, which cmd/socialweb's
// TestSampleConfig generates from serve's flags). Its tests check that every
// metric they query is one the daemon exports, and run promtool on the rules.
package deploy
