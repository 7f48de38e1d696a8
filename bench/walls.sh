#!/usr/bin/env bash
# What the walls of issue 38 cost, side by side: the tree before them (BASE, built in a
# worktree), this tree, and this tree without cgroups (nocg: SOCIALWEB_CGROUP_PARENT=, or
# density's -serve-arg=--cgroup-parent=, since density passes the daemon no SOCIALWEB_*).
# Each round runs every arm, one after another (round R starts with arm R: new old nocg,
# then old nocg new, ...), and each arm runs, on a fresh daemon each:
#   controlplane  create -> Ready and idle memory (PSS, RSS per tenant), 1 and then 5
#                 tenants at once: bench/controlplane -tenants 1,5 -idle 30s
#   wake          a pod list's first byte on each of 4 sleeping tenants, nothing awake:
#                 bench/density -tenants 4 -awake 0 -mode sleep -wake-samples 4
#   warmstart     one busybox Pod Pending -> Running on a cluster at zero nodes, its node
#                 claimed from a warm pool of one VM (nodes boot under TCG here):
#                 bench/nodeboot -runs 1 -pods 1 -warm-pool 1 -memory 1Gi -disk 3Gi
#                 -warm-settle 150s, with the node image its arm's tree builds
#                 (`image build --ensure --source TREE`: the agent differs)
# Each run's output goes to the terminal under a `## round R arm A figure F` header and to
# a log dir; at the end come every run's figures and, per figure, each arm's median over
# the rounds and new/old (a warm start whose node missed the pool is listed, not counted).
# A failed run is marked FAILED, the rest go on, and the script exits 1.
#   bench/walls.sh [BASE_REV (default 81382b7)] [ROUNDS (default 2)]
# One round (three arms) took 21.5 min on 2 cores, nodes under TCG, load 0.6-3.5
# (2026-12-06, another session's test beside the first arm): per arm about 1.5 min
# controlplane, 2 min wake, 3.5 min warmstart (most of it the pool VM's boot and the 150 s
# settle). The builds take about 2 min more (the two binaries, the tools, two node images
# from the build caches): two rounds about 45 min.
# Run it alone on the host: its daemons take node network indexes from 1 (controlplane)
# and 180-189 (nodeboot), and a cluster they delete removes that index's bridge and table
# even if another daemon's (a test's) cluster holds it.
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:-81382b7}" rounds="${2:-2}"
arms=(new old nocg)
out="${SOCIALWEB_BENCH_BIN:-$HOME/.cache/socialweb/bench-bin}/walls"
mkdir -p "$out"
logs="$(mktemp -d /tmp/socialweb-walls.XXXXXX)"
./hack/build "$out/new-socialweb"
wt="$(mktemp -d)"
trap 'git worktree remove --force "$wt" >/dev/null 2>&1 || true' EXIT
git worktree add -q --detach "$wt" "$base"
(cd "$wt" && ./hack/build "$out/old-socialweb")
for tool in controlplane density nodeboot; do
  go build -o "$out/$tool" "./bench/$tool"
done
# Each tree's node image: the last line of `image build` is JSON with its "dir".
image_dir() { "$1" image build --ensure --source "$2" | tail -1 | sed -n 's/.*"dir":"\([^"]*\)".*/\1/p'; }
image_new="$(image_dir "$out/new-socialweb" "$PWD")"
image_old="$(image_dir "$out/old-socialweb" "$wt")"
if [ -z "$image_new" ] || [ -z "$image_old" ]; then
  echo "walls: image build printed no node image dir" >&2
  exit 1
fi
echo "## base $base ($(git rev-parse --short "$base")), this tree $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' + changes'), rounds $rounds, logs $logs"
echo "## node images: new and nocg $image_new, old $image_old"

failed=0
# leftovers prints what is on the host after a run that a run may leave: qemu, the bench's
# binaries, socialweb links (sw*), nft tables and cgroups (another daemon's or test's too:
# the host should run nothing else).
leftovers() {
  {
    pgrep -af 'qemu-system' || true
    pgrep -af -- "^$out/" || true
    ip -o link show | awk -F': ' '$2 ~ /^sw/ {print "link " $2}'
    nft list tables 2>/dev/null | grep socialweb || true
    find /sys/fs/cgroup/*/socialweb /sys/fs/cgroup/socialweb -mindepth 1 -type d 2>/dev/null || true
  } | sed 's/^/  /'
}
# measure ROUND ARM FIGURE COMMAND...: one run, its output also in $logs/ROUND-ARM-FIGURE.
measure() {
  local r="$1" a="$2" f="$3"
  shift 3
  echo "## round $r arm $a figure $f $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  if ! "$@" 2>&1 | tee "$logs/$r-$a-$f"; then
    echo "## round $r arm $a figure $f FAILED (output: $logs/$r-$a-$f)"
    failed=$((failed + 1))
  fi
  local left
  left="$(leftovers)"
  if [ -n "$left" ]; then
    echo "## round $r arm $a figure $f LEFT on the host after it (its own, or another's):"
    echo "$left"
  fi
}

for round in $(seq 1 "$rounds"); do
  t0=$SECONDS
  for i in 0 1 2; do
    arm="${arms[$(((round - 1 + i) % 3))]}"
    bin="$out/$arm-socialweb" image="$image_new" cg=() serve=()
    case "$arm" in
      old) image="$image_old" ;;
      nocg) bin="$out/new-socialweb" cg=(SOCIALWEB_CGROUP_PARENT=) serve=(-serve-arg=--cgroup-parent=) ;;
    esac
    measure "$round" "$arm" controlplane env ${cg[@]+"${cg[@]}"} "$out/controlplane" -bin "$bin" -tenants 1,5 -idle 30s
    measure "$round" "$arm" wake "$out/density" -bin "$bin" -tenants 4 -awake 0 -mode sleep -wake-samples 4 ${serve[@]+"${serve[@]}"}
    measure "$round" "$arm" warmstart env ${cg[@]+"${cg[@]}"} "$out/nodeboot" -bin "$bin" -image "$image" \
      -runs 1 -pods 1 -warm-pool 1 -memory 1Gi -disk 3Gi -warm-settle 150s
  done
  echo "## round $round took $(((SECONDS - t0) / 60)) min $(((SECONDS - t0) % 60)) s"
done

# Every run's figures, one per line: figure, arm, round, value (a number, or text that is
# listed but not counted).
for round in $(seq 1 "$rounds"); do
  for arm in "${arms[@]}"; do
    f="$logs/$round-$arm-controlplane"
    [ ! -f "$f" ] || awk -F'|' -v a="$arm" -v r="$round" '/^\| socialweb/ {
      n = $3 + 0; v = $4; gsub(/[ s]/, "", v); p = $6; gsub(/ /, "", p); q = $7; gsub(/ /, "", q)
      at = (n == 1 ? "1 tenant" : n " at once")
      c = c sprintf("create -> Ready, %s, median (s)\t%s\t%s\t%s\n", at, a, r, v)
      m = m sprintf("idle PSS per tenant, %s (MiB)\t%s\t%s\t%s\n", at, a, r, p)
      m = m sprintf("idle RSS per tenant, %s (MiB)\t%s\t%s\t%s\n", at, a, r, q)
    }
    END { printf "%s%s", c, m }' "$f"
    f="$logs/$round-$arm-wake"
    [ ! -f "$f" ] || awk -F'|' -v a="$arm" -v r="$round" '
      /^\| first request p50/ { v = $3; gsub(/[ s]/, "", v); printf "wake p50 of 4 (s)\t%s\t%s\t%s\n", a, r, v }
      /^\| first request p99/ { v = $3; gsub(/[ s]/, "", v); printf "wake p99 of 4 (s)\t%s\t%s\t%s\n", a, r, v }
      /^\| first requests answered/ { v = $3; gsub(/^ +| +$/, "", v); split(v, w, " "); if (w[1] != w[3]) printf "wake: answered\t%s\t%s\t%s\n", a, r, v }' "$f"
    f="$logs/$round-$arm-warmstart"
    # nodeboot's run table (its header has "Pending ->"): column 2 is 1 Pending -> 1
    # Running, the last the claims that hit the pool.
    [ ! -f "$f" ] || awk -F'|' -v a="$arm" -v r="$round" '/Pending -> /{t = 1; next} t && /^\| 1 \|/ {
      v = $3; gsub(/[ s]/, "", v); h = $(NF - 1); gsub(/ /, "", h)
      if (h != "1") v = v " (missed the pool: " h " hits)"
      printf "warm Pod Pending -> Running (s)\t%s\t%s\t%s\n", a, r, v; exit }' "$f"
  done
done >"$logs/values"
echo
echo "## summary: every run ($logs/values)"
echo "| figure | round | new | old | nocg |"
echo "|---|---|---|---|---|"
awk -F'\t' '
  !($1 in seen) { seen[$1] = 1; order[++nf] = $1 }
  { v[$1, $3, $2] = $4; if ($3 > nr) nr = $3 }
  END {
    for (i = 1; i <= nf; i++) for (r = 1; r <= nr; r++)
      printf "| %s | %d | %s | %s | %s |\n", order[i], r, v[order[i], r, "new"], v[order[i], r, "old"], v[order[i], r, "nocg"]
  }' "$logs/values"
echo
echo "## summary: medians over $rounds round(s), runs of each arm"
echo "| figure | new | old | nocg | new/old |"
echo "|---|---|---|---|---|"
awk -F'\t' '
  $4 ~ /^[0-9.]+$/ {
    if (!($1 in seen)) { seen[$1] = 1; order[++nf] = $1 }
    k = $1 SUBSEP $2; vals[k] = vals[k] " " $4
  }
  function median(s,    v, n, i, j, t) {
    n = split(s, v, " ")
    if (n == 0) return ""
    for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    return n % 2 ? v[(n + 1) / 2] + 0 : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  END {
    for (i = 1; i <= nf; i++) {
      f = order[i]; line = "| " f " |"
      for (j = 1; j <= 3; j++) {
        a = j == 1 ? "new" : j == 2 ? "old" : "nocg"
        m[a] = median(vals[f SUBSEP a]); c = split(vals[f SUBSEP a], tmp, " ")
        line = line (m[a] == "" ? " - |" : sprintf(" %g (%d) |", m[a], c))
      }
      ratio = (m["new"] != "" && m["old"] != "" && m["old"] + 0 != 0) ? sprintf("%.2f", m["new"] / m["old"]) : "-"
      print line " " ratio " |"
    }
  }' "$logs/values"
echo "(a cell: the median and, in parentheses, how many runs it is of)"
if [ "$failed" -gt 0 ]; then
  echo "## $failed run(s) FAILED: see the FAILED lines above"
  exit 1
fi
