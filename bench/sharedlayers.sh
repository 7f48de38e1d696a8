#!/usr/bin/env bash
# Shared layers (issue 12 item 1) against today's cold path, side by side in one run:
# rounds of bench/nodeboot with the daemon's --shared-layers on, then off, each a fresh
# daemon and a cluster at zero nodes running one Pod of a locally built image of MIB MiB.
#   bench/sharedlayers.sh [-rounds 2] [-large 140]
# Prints each run's tables, then Pod created -> Running and the kubelet's image pull for
# both, with the ratio off/on.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=2 large=140
while [ $# -gt 0 ]; do
  case "$1" in
    -rounds) rounds="$2"; shift 2 ;;
    -large) large="$2"; shift 2 ;;
    *) echo "usage: $0 [-rounds N] [-large MIB]" >&2; exit 2 ;;
  esac
done
./hack/build bin/socialweb >&2
go build -o bin/nodeboot ./bench/nodeboot
image="$(bin/socialweb image build --ensure 2>/dev/null | tail -1 | sed -n 's/.*"dir":"\([^"]*\)".*/\1/p')"
out="$(mktemp -d /tmp/socialweb-sharedlayers.XXXXXX)"
for r in $(seq 1 "$rounds"); do
  for mode in true false; do
    echo "## round $r, shared layers $mode" | tee -a "$out/all"
    bin/nodeboot -bin bin/socialweb -image "$image" -runs 1 -large "$large" -shared-layers="$mode" | tee "$out/$r-$mode" | tee -a "$out/all"
  done
done
# The first table's run row: column 8 is Pod->Pod Running, column 9 the image pull.
row() { awk -F'|' '/^\| 1 \| 1 \|/{gsub(/[ s]/,"",$9); gsub(/[ s]/,"",$10); print $9, $10; exit}' "$1"; }
echo
echo "| round | shared: Pod -> Running | shared: image pull | cold: Pod -> Running | cold: image pull | Running, cold/shared |"
echo "|---|---|---|---|---|---|"
for r in $(seq 1 "$rounds"); do
  read -r son pon < <(row "$out/$r-true")
  read -r soff poff < <(row "$out/$r-false")
  awk -v r="$r" -v a="$son" -v b="$pon" -v c="$soff" -v d="$poff" 'BEGIN{printf "| %s | %.1f s | %.1f s | %.1f s | %.1f s | %.2fx |\n", r, a, b, c, d, (a>0? c/a : 0)}'
done
echo "(all output: $out/all)"
