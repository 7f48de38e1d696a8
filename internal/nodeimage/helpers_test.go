package nodeimage

import (
	"os"
	"testing"
)

// needLive skips a test whose environment is missing (root, a tool, apt lists), unless
// SOCIALWEB_REQUIRE_LIVE=1 makes every such skip a failure (CI on a prepared machine).
func needLive(t *testing.T, reason string) {
	t.Helper()
	if os.Getenv("SOCIALWEB_REQUIRE_LIVE") == "1" {
		t.Fatalf("SOCIALWEB_REQUIRE_LIVE=1 but: %s", reason)
	}
	t.Skip(reason)
}

func needRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		needLive(t, "needs root: "+why)
	}
}

func needTools(t *testing.T, names ...string) {
	t.Helper()
	if err := CheckTools(nil, names...); err != nil {
		needLive(t, err.Error())
	}
}
