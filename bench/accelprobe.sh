#!/usr/bin/env bash
# The node accelerator's cost, for docs/benchmarks.md: the KVM probe cold and cached, and
# daemon start to serving with --accel tcg, auto uncached and auto cached, side by side.
#   bench/accelprobe.sh [-runs 3]
set -euo pipefail
cd "$(dirname "$0")/.."
./hack/build bin/socialweb >&2
image="$(bin/socialweb image build --ensure 2>/dev/null | tail -1 | sed -n 's/.*"dir":"\([^"]*\)".*/\1/p')"
go run ./bench/accelprobe -bin bin/socialweb -image "$image" "$@"
