#!/usr/bin/env bash
# Node boot timeline and node image build times, for docs/benchmarks.md.
#   bench/nodeboot.sh [-runs 3]
# Prints: the image build times (a cold build into an empty cache, guest programs from
# their own cache; then --ensure on that cache), then one row per measured boot.
set -euo pipefail
cd "$(dirname "$0")/.."
./hack/build bin/socialweb >&2
cold="$(mktemp -d /tmp/socialweb-coldcache.XXXXXX)"
trap 'rm -rf "$cold"' EXIT
# The guest programs (agent, containerd) are Go builds cached by the Go build cache
# and by fingerprint: copy them in so "cold" means the image (debootstrap, kernel,
# initramfs, mkfs), not a 45-minute kubelet compile.
mkdir -p "$cold/guestbuild"
cp -a "${XDG_CACHE_HOME:-$HOME/.cache}/socialweb/guestbuild/." "$cold/guestbuild/" 2>/dev/null || true
t0=$(date +%s.%N)
bin/socialweb image build --cache-dir "$cold" >/dev/null 2>&1
t1=$(date +%s.%N)
bin/socialweb image build --cache-dir "$cold" --ensure >/dev/null 2>&1
t2=$(date +%s.%N)
echo "| image build | seconds |"
echo "|---|---|"
awk -v s="$t0" -v e="$t1" 'BEGIN{printf "| cold (empty image and layer cache; debootstrap from the Debian mirror) | %.1f |\n", e-s}'
awk -v s="$t1" -v e="$t2" 'BEGIN{printf "| --ensure on a matching image | %.1f |\n", e-s}'
echo
image="$(bin/socialweb image build --ensure 2>/dev/null | tail -1 | sed -n 's/.*"dir":"\([^"]*\)".*/\1/p')"
go run ./bench/nodeboot -bin bin/socialweb -image "$image" "$@"
