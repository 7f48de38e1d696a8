// Package livetest decides what a test does when the machine lacks something
// it needs: skip with the reason, or fail when SOCIALWEB_REQUIRE_LIVE=1 says
// the run must exercise everything.
package livetest

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"testing"
	"time"
)

// Required reports whether missing prerequisites must fail tests.
func Required() bool { return os.Getenv("SOCIALWEB_REQUIRE_LIVE") == "1" }

// Skip skips t with reason, or fails it when live runs are required.
func Skip(t testing.TB, reason string) {
	t.Helper()
	if Required() {
		t.Fatalf("SOCIALWEB_REQUIRE_LIVE=1 but: %s", reason)
	}
	t.Skip(reason)
}

// Postgres returns the admin URL of the test PostgreSQL server, from
// SOCIALWEB_TEST_POSTGRES_URL, skipping (or failing) when none is set or it
// does not accept connections.
func Postgres(t testing.TB) string {
	t.Helper()
	u := os.Getenv("SOCIALWEB_TEST_POSTGRES_URL")
	if u == "" {
		Skip(t, "SOCIALWEB_TEST_POSTGRES_URL is not set (.ci/run starts a PostgreSQL and sets it)")
	}
	return u
}

// FreePort returns a loopback TCP port nothing uses right now, below the kernel's
// ephemeral range (32768-60999 by default): a port from that range can be taken as the
// source port of any outgoing connection while a test's daemon restarts, and then the
// daemon cannot listen on it again (seen in CI).
func FreePort(t testing.TB) int {
	t.Helper()
	for range 1000 {
		port := 10000 + rand.IntN(22000)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		l.Close()
		return port
	}
	t.Fatal("no free loopback port in 10000-31999")
	return 0
}

// Eventually polls cond every interval until it holds or timeout passes.
func Eventually(t testing.TB, timeout, interval time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(interval)
	}
}
