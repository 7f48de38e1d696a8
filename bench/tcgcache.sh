#!/usr/bin/env bash
# qemu's own memory under TCG against the size of its translation cache (issue 12 item 3):
# bench/nodeboot with the daemon's --tcg-cache-mib at qemu's default (1024) and smaller,
# interleaved round by round so a noisy host weighs on each setting alike.
#   bench/tcgcache.sh [ROUNDS] [SIZES...]     default: 2 rounds of 1024 256 128 64
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-2}"; shift || true
sizes=("${@:-1024 256 128 64}")
read -r -a sizes <<<"${sizes[*]}"
./hack/build bin/socialweb >&2
image="$(bin/socialweb image build --ensure 2>/dev/null | tail -1 | sed -n 's/.*"dir":"\([^"]*\)".*/\1/p')"
for r in $(seq 1 "$rounds"); do
	for mib in "${sizes[@]}"; do
		echo "### round $r, --tcg-cache-mib $mib"
		go run ./bench/nodeboot -bin bin/socialweb -image "$image" -runs 1 -tcg-cache-mib "$mib"
		echo
	done
done
