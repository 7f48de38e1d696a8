// Package deploy holds no code. Its directory ships what runs beside the
// daemon: Prometheus alert rules (prometheus/) and a Grafana dashboard
// (grafana/). Its tests check that every metric they query is one the daemon
// exports, and run promtool on the rules.
package deploy
