#!/usr/bin/env bash
# Backup and restore time of a tenant holding 10k objects (issue 40 item 5), for
# docs/benchmarks.md: builds socialweb, fills a tenant with ConfigMaps of 1 KiB, then
# rounds of `cluster backup` (while it serves), `cluster delete`, `cluster restore`
# (to Ready), counting the objects back each time.
#   bench/backup.sh [-objects 10000] [-rounds 3]
set -euo pipefail
cd "$(dirname "$0")/.."
./hack/build bin/socialweb
go run ./bench/backup -bin bin/socialweb "$@"
