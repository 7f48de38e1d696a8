#!/usr/bin/env bash
# The Kubernetes conformance suite (e2e.test of k8s.io/kubernetes at go.mod's version)
# against a fresh cluster of a fresh daemon; prints `conformance: N passed, M failed`,
# the skips with their reasons and the failures' names. For docs/benchmarks.md.
#   bench/conformance.sh -mode api                  # no nodes: [sig-api-machinery]
#   bench/conformance.sh -mode nodes [-nodes 2]     # [sig-network] and [sig-node] on kept nodes
#   bench/conformance.sh -mode nodes -focus 'DNS|Services'
#   bench/conformance.sh -dry-run -mode nodes       # list the selected tests; no cluster
# The first run compiles e2e.test, agnhost and kubectl and debootstraps two test images;
# later runs take them from ~/.cache/socialweb (conformance/, images-oci/).
set -euo pipefail
cd "$(dirname "$0")/.."
need_image=1
for a in "$@"; do
  case "$a" in -dry-run|--dry-run|-build-only|--build-only) need_image=0 ;; esac
done
# Built, then exec'd: SIGINT/SIGTERM reach it directly and it tears the daemon down.
go build -o bin/conformance ./bench/conformance
if [ "$need_image" = 0 ]; then
  exec bin/conformance "$@"
fi
./hack/build bin/socialweb >&2
image="$(bin/socialweb image build --ensure 2>/dev/null | tail -1 | sed -n 's/.*"dir":"\([^"]*\)".*/\1/p')"
exec bin/conformance -bin bin/socialweb -image "$image" "$@"
