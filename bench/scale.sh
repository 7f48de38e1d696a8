#!/usr/bin/env bash
# The scale decision and driver benchmarks: Decide() on 1,000 Pods and 100
# Nodes, and the latency from a Pod turning Pending to Create being called
# (through the driver, fake provider, fake clientset).
set -euo pipefail
cd "$(dirname "$0")/.."
go test -run XXX -bench . -benchmem -count "${COUNT:-3}" ./internal/scale/ ./internal/scaledriver/
