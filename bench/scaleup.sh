#!/usr/bin/env bash
# Scale-up from zero: one Pod on one new node against two, then five, Pods on as many new
# nodes booted in parallel (each node's timeline, Pending -> Running, qemu RSS per microVM), then one
# node and then five nodes pulling a large locally built image from the host registry (per-node
# pull time, bytes over the bridge and the uplink, registry size). For docs/benchmarks.md.
#   bench/scaleup.sh [-large 256] [-memory 512Mi]
# The default large image is 256 MiB: under TCG on a 2-core host five nodes pulling 1 GiB each
# took 28-37 minutes; -large 1024 where there are cores or KVM.
set -euo pipefail
cd "$(dirname "$0")/.."
large=256 memory=512Mi
while [ $# -gt 0 ]; do
  case "$1" in
    -large) large="$2"; shift 2 ;;
    -memory) memory="$2"; shift 2 ;;
    *) echo "usage: bench/scaleup.sh [-large MiB] [-memory 512Mi]" >&2; exit 2 ;;
  esac
done
./hack/build bin/socialweb >&2
image() { bin/socialweb image build --ensure "$@" 2>/dev/null | tail -1 | sed -n 's/.*"dir":"\([^"]*\)".*/\1/p'; }
img="$(image)"
echo "## one node"
go run ./bench/nodeboot -bin bin/socialweb -image "$img" -runs 1 -pods 1 -memory "$memory"
echo
# Two guests on a 2-core host: the most this machine has the cores for.
echo "## two nodes at once"
go run ./bench/nodeboot -bin bin/socialweb -image "$img" -runs 1 -pods 2 -memory "$memory"
echo
echo "## five nodes at once"
go run ./bench/nodeboot -bin bin/socialweb -image "$img" -runs 1 -pods 5 -memory "$memory"
if [ "$large" -gt 0 ]; then
  # The node disk needs room for the image twice (content store and unpacked snapshot).
  spec="$(mktemp /tmp/socialweb-nodeimage.XXXXXX.json)"
  trap 'rm -f "$spec"' EXIT
  printf '{"headroomMiB": %d}\n' $(( large * 2 + 1024 )) > "$spec"
  bigimg="$(image -f "$spec")"
  echo
  echo "## one node pulling a ${large} MiB image from the host registry"
  go run ./bench/nodeboot -bin bin/socialweb -image "$bigimg" -runs 1 -pods 1 -memory "$memory" -large "$large" -timeout 60m
  echo
  echo "## five nodes pulling a ${large} MiB image from the host registry"
  go run ./bench/nodeboot -bin bin/socialweb -image "$bigimg" -runs 1 -pods 5 -memory "$memory" -large "$large" -timeout 60m
fi
