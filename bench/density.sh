#!/usr/bin/env bash
# Tenant density (issue 13, part 4): N tenants on one host, all awake (today's
# build, until the host runs out) and then with all but K asleep, side by side,
# for docs/benchmarks.md. Needs no root and no node image (--node-network=false).
#   bench/density.sh [-tenants 1000] [-awake 10] [-mode both|awake|sleep] [-concurrency 4]
# Quick check: bench/density.sh -tenants 20 -awake 2
set -euo pipefail
cd "$(dirname "$0")/.."
./hack/build bin/socialweb >&2
go run ./bench/density -bin bin/socialweb "$@"
