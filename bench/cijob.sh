#!/usr/bin/env bash
# A real CI job (issue 11): TestCIJob's build of google/uuid in the 1.34 GiB builder image
# on a microVM node booted for it from zero nodes, then the same script on this host in a
# chroot of the same image, in one run. Prints the figures table (with ratios) and the
# raw figures as JSON.
#   bench/cijob.sh
set -euo pipefail
cd "$(dirname "$0")/.."
./hack/build bin/socialweb >&2
out="$(mktemp /tmp/socialweb-cijob.XXXXXX)"
trap 'rm -f "$out"' EXIT
SOCIALWEB_BIN="$PWD/bin/socialweb" SOCIALWEB_REQUIRE_LIVE=1 SOCIALWEB_BENCH_CIJOB_OUT="$out" \
	go test -count=1 -v -timeout 60m -run 'TestCIJob$' ./test/integration/ >&2
grep -q . "$out" || { echo "bench/cijob: the test wrote no figures" >&2; exit 1; }
cat "$out"
