package qemu

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/socialweb-computer/socialweb/internal/livetest"
	"github.com/socialweb-computer/socialweb/internal/nodeimage"
)

// Console markers printed by liveInit, one per line, prefixed "SWQT ".
const (
	markStart    = "SWQT START"
	markName     = "SWQT NAME "
	markReadOnly = "SWQT VDB-READONLY"
	markWritable = "SWQT VDB-WRITABLE"
	markGateway  = "SWQT GATEWAY-OK"
)

// liveInitPath is where liveInit is staged in the rootfs.
const liveInitPath = "/usr/local/bin/socialweb-qemu-test-init"

// liveInit is the rootfs init (PID 1) of the live test. It reads the identity disk
// (/dev/vdb: JSON padded with NULs), prints the node name, shows that /dev/vdb cannot be
// written, configures eth0 with the identity's address and opens a TCP connection to the
// identity's apiServer (the test's listener on the bridge gateway), sending the node name;
// then it idles. Debian minbase has no ping, but it has bash (/dev/tcp), coreutils, grep
// and iproute2.
const liveInit = `#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
say() { echo "SWQT $*"; }
say "START uptime=$(cut -d' ' -f1 /proc/uptime)"
doc=$(tr -d '\000' </dev/vdb)
field() { printf '%s' "$doc" | grep -o "\"$1\":\"[^\"]*\"" | head -n 1 | cut -d'"' -f4; }
name=$(field nodeName)
addr=$(field address)
api=$(field apiServer)
say "NAME $name"
if dd if=/dev/zero of=/dev/vdb bs=512 count=1 conv=notrunc,fsync 2>/dev/null; then
	say "VDB-WRITABLE"
else
	say "VDB-READONLY ro=$(cat /sys/block/vdb/ro)"
fi
hp=${api#*://}
hp=${hp%%/*}
host=${hp%:*}
port=${hp##*:}
ip link set lo up
ip addr add "$addr" dev eth0 && ip link set eth0 up || say "NET-FAIL $(ip -o link 2>&1 | tr '\n' ' ')"
i=0
while [ "$i" -lt 40 ]; do
	if timeout 5 bash -c 'echo "$0" >"/dev/tcp/$1/$2"' "$name" "$host" "$port" 2>/dev/null; then
		say "GATEWAY-OK $host:$port uptime=$(cut -d' ' -f1 /proc/uptime)"
		break
	fi
	i=$((i + 1))
	sleep 0.5
done
[ "$i" -lt 40 ] || say "GATEWAY-FAIL $host:$port"
while :; do sleep 3600; done
`

// liveImage builds (or reuses) a small node image whose init is liveInit. Images go to a
// temporary cache removed by the test, unless SOCIALWEB_QEMU_TEST_IMAGE_CACHE names a
// directory to keep them in (re-runs then skip the build); debootstrap layers and .debs
// use the shared layer cache, as nodeimage's own boot test does.
func liveImage(t *testing.T, tmp string) string {
	t.Helper()
	return liveImageWithInit(t, tmp, liveInit)
}

// liveImageWithInit is liveImage with another init script.
func liveImageWithInit(t *testing.T, tmp, liveInit string) string {
	t.Helper()
	if err := nodeimage.CheckTools(nil, nodeimage.BuildTools...); err != nil {
		livetest.Skip(t, "building the test node image: "+err.Error())
	}
	if _, err := exec.LookPath("apt-cache"); err != nil {
		livetest.Skip(t, "apt-cache not found: apt-get install apt")
	}
	initFile := filepath.Join(tmp, "socialweb-qemu-test-init")
	if err := os.WriteFile(initFile, []byte(liveInit), 0o755); err != nil {
		t.Fatal(err)
	}
	spec, err := nodeimage.ParseSpec([]byte(`{"memMiB":512,"headroomMiB":128,"init":"` + liveInitPath + `"}`))
	if err != nil {
		t.Fatal(err)
	}
	cache := os.Getenv("SOCIALWEB_QEMU_TEST_IMAGE_CACHE")
	if cache == "" {
		cache = filepath.Join(tmp, "imagecache")
	}
	opts := nodeimage.Options{
		CacheDir:      cache,
		LayerCacheDir: filepath.Join(nodeimage.DefaultCacheDir(), "layers"),
		ExtraFiles:    map[string]string{liveInitPath: initFile},
		Progress: func(step, msg string) {
			if !strings.HasPrefix(msg, "I: ") {
				t.Logf("[image %s] %s", step, msg)
			}
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	res, err := nodeimage.Ensure(ctx, spec, opts)
	if err != nil {
		t.Fatalf("building the test node image: %v", err)
	}
	t.Logf("node image %s: %s in %s", res.Fingerprint[:16], res.State, res.Duration.Round(time.Millisecond))
	return res.Dir
}
