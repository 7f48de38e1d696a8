#!/usr/bin/env bash
# Warm starts (issue 12 item 2) against cold boots, side by side in one run: rounds of
# bench/nodeboot with the daemon's --warm-pool P (P = Pods per run: each node claims a
# pool VM that is ready and has waited nodeboot's -warm-settle, 40 s, past its prewarm, as
# pool VMs in use wait longer, before the Pods are created), then --warm-pool 0, each a
# fresh daemon and a cluster at zero nodes, the other flags the same.
#   bench/warmstart.sh [-rounds 2] [-pods 1] [-large 0 | -ci-shaped] [-memory 1Gi] [-disk 10Gi] [-no-prewarm] [-keep]
# Issue 12's rows:
#   busybox Pod Pending -> Running, cluster at zero nodes   bench/warmstart.sh
#   a Pod of ~140 MB of images from the host registry       bench/warmstart.sh -large 140
#   a CI-shaped Pod (init container + 2 containers, 140 MiB) bench/warmstart.sh -ci-shaped
#   five such Pods on five nodes, compared with one         bench/warmstart.sh -ci-shaped -pods 5 -memory 512Mi -disk 4Gi
# -large MIB runs a locally built image of that size (0: busybox); -ci-shaped runs Pods shaped
# like a GitLab Runner job (bench/nodeboot -ci-shaped); -keep keeps each run's daemon state
# and log (node consoles) for a look at where a start went; -memory is the node
# size and -disk each node's container-storage disk (the pool's VMs get the same; P of them
# and P nodes must fit the host: the daemon reserves each node's whole disk, 12 GiB with
# the default 10Gi).
# The warm runs use the daemon's default --warm-pool-prewarm (pool VMs that run a Pod
# start's programs and one throwaway container through runc while they wait);
# -no-prewarm adds a third run per round, warm with --warm-pool-prewarm=false, between.
# Prints each run's tables, then per round the time from the Pods created to all Running,
# warm and cold, their ratio, and the claims that hit the pool (P of P when all did).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=2 pods=1 large=0 memory=1Gi disk= bare=0 extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    -no-prewarm) bare=1; shift ;;
    -ci-shaped|-keep) extra+=("$1"); shift ;;
    -rounds) rounds="$2"; shift 2 ;;
    -pods) pods="$2"; shift 2 ;;
    -large) large="$2"; shift 2 ;;
    -memory) memory="$2"; shift 2 ;;
    -disk) disk="$2"; shift 2 ;;
    *) echo "usage: $0 [-rounds N] [-pods N] [-large MIB | -ci-shaped] [-memory QUANTITY] [-disk QUANTITY] [-no-prewarm] [-keep]" >&2; exit 2 ;;
  esac
done
./hack/build bin/socialweb >&2
go build -o bin/nodeboot ./bench/nodeboot
image="$(bin/socialweb image build --ensure 2>/dev/null | tail -1 | sed -n 's/.*"dir":"\([^"]*\)".*/\1/p')"
out="$(mktemp -d /tmp/socialweb-warmstart.XXXXXX)"
for r in $(seq 1 "$rounds"); do
  variants="$pods"
  [ "$bare" = 1 ] && variants="$variants bare"
  for v in $variants 0; do
    pool="$v" pre=true
    [ "$v" = bare ] && pool="$pods" pre=false
    echo "## round $r, warm pool $pool, prewarm $pre" | tee -a "$out/all"
    bin/nodeboot -bin bin/socialweb -image "$image" -runs 1 -pods "$pods" -memory "$memory" ${disk:+-disk "$disk"} -large "$large" -warm-pool "$pool" \
      -warm-pool-prewarm="$pre" ${extra[@]+"${extra[@]}"} | tee "$out/$r-$v" | tee -a "$out/all"
  done
done
# The run table (its header has "Pending ->"): column 2 is N Pending -> N Running, the
# last the warm hits.
row() { awk -F'|' '/Pending -> /{t=1; next} t && /^\| 1 \|/{gsub(/[ s]/,"",$3); gsub(/ /,"",$(NF-1)); print $3, $(NF-1); exit}' "$1"; }
echo
if [ "$bare" = 1 ]; then
  echo "| round | warm: $pods Pod(s) -> Running | warm, not prewarmed | cold | not prewarmed/warm | cold/warm | warm hits |"
  echo "|---|---|---|---|---|---|---|"
else
  echo "| round | warm: $pods Pod(s) -> Running | cold: $pods Pod(s) -> Running | cold/warm | warm hits |"
  echo "|---|---|---|---|---|"
fi
for r in $(seq 1 "$rounds"); do
  read -r warm hits < <(row "$out/$r-$pods")
  read -r cold _ < <(row "$out/$r-0")
  if [ "$bare" = 1 ]; then
    read -r nb _ < <(row "$out/$r-bare")
    awk -v r="$r" -v w="$warm" -v o="$nb" -v c="$cold" -v h="$hits" -v p="$pods" 'BEGIN{printf "| %s | %.1f s | %.1f s | %.1f s | %.2fx | %.2fx | %s of %s |\n", r, w, o, c, (w>0? o/w : 0), (w>0? c/w : 0), h, p}'
  else
    awk -v r="$r" -v w="$warm" -v c="$cold" -v h="$hits" -v p="$pods" 'BEGIN{printf "| %s | %.1f s | %.1f s | %.2fx | %s of %s |\n", r, w, c, (w>0? c/w : 0), h, p}'
  fi
done
echo "(all output: $out/all)"
