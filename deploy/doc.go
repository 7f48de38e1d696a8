// Package deploy holds no code. Its directory ships what runs beside the
// daemon: Prometheus alert rules (prometheus/), a Grafana dashboard
// (grafana/), a sample config file (config.yaml, which cmd/socialweb's
// TestSampleConfig generates from serve's flags), and what hack/package puts
// in the .deb: the systemd unit (systemd/) and the maintainer scripts and
// copyright (debian/). Its tests check that every metric they query is one the
// daemon exports, run promtool on the rules, and check the unit, the scripts
// and the package's file list, version, conffile and control file.
package deploy
