#!/usr/bin/env bash
# What the walls of issue 38 cost a control plane: create->Ready and idle memory
# (bench/controlplane) side by side, arms alternating, for the tree before them
# (BASE, built in a worktree), this tree, and this tree without cgroups.
#   bench/walls.sh [BASE_REV (default 81382b7)] [ROUNDS (default 2)]
# Run it alone on the host: its daemons take node network indexes from 1, and a
# cluster they delete removes that index's bridge and table even if another
# daemon's (a test's) cluster holds it.
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:-81382b7}" rounds="${2:-2}"
out="${SOCIALWEB_BENCH_BIN:-$HOME/.cache/socialweb/bench-bin}/walls"
mkdir -p "$out"
./hack/build "$out/new-socialweb"
wt="$(mktemp -d)"
trap 'git worktree remove --force "$wt" >/dev/null 2>&1 || true' EXIT
git worktree add -q --detach "$wt" "$base"
(cd "$wt" && ./hack/build "$out/old-socialweb")
for round in $(seq 1 "$rounds"); do
  for arm in new old nocg; do
    echo "## round $round arm $arm $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    bin="$out/$arm-socialweb"
    [ "$arm" = nocg ] && bin="$out/new-socialweb"
    if [ "$arm" = nocg ]; then
      SOCIALWEB_CGROUP_PARENT= go run ./bench/controlplane -bin "$bin" -tenants 1,5 -idle 30s
    else
      go run ./bench/controlplane -bin "$bin" -tenants 1,5 -idle 30s
    fi
  done
done
