#!/usr/bin/env bash
# Builds socialweb and the upstream baseline (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, all from Go modules at the versions
# go.mod pins) and prints the side-by-side table for docs/benchmarks.md.
#   bench/controlplane.sh [-tenants 1,5,10] [-idle 60s]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${SOCIALWEB_BENCH_BIN:-$HOME/.cache/socialweb/bench-bin}"
mkdir -p "$out"
./hack/build bin/socialweb
kver="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
ld="-X k8s.io/component-base/version.gitVersion=$kver -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$kver" | cut -d. -f2)"
for c in kube-apiserver kube-controller-manager kube-scheduler; do
  echo "building $c..." >&2
  go build -ldflags "$ld" -o "$out/$c" "k8s.io/kubernetes/cmd/$c"
done
echo "building etcd..." >&2
go build -o "$out/etcd" go.etcd.io/etcd/server/v3
go run ./bench/controlplane -bin bin/socialweb -baseline-dir "$out" "$@"
