package sleep

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// apiserver stands in for a control plane started on the gate's socket, as the
// daemon starts one with the socket in ExtraFiles.
func apiserver(t *testing.T, g *Gate) (stop func()) {
	t.Helper()
	ln, err := net.FileListener(g.File())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "pods") })}
	go srv.Serve(ln)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}
}

func get(addr string) (string, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/api/v1/pods")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// Clients that arrive together at a sleeping cluster cause one start, and every
// one of them is answered by the apiserver (a gate that could answer a
// failure answers nothing itself); the cluster can then sleep and be
// woken again on the same port.
func TestGateConcurrentWakersCauseOneStart(t *testing.T) {
	g, err := Listen("ci", freePort(t), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	p := tenantPKI(t, "ci")
	g.AnswerWith(p.ServingCert, p.ServingKey, nil) // no failure: changes nothing
	var starts atomic.Int32
	var mu sync.Mutex
	var stopAPI func()
	wake := func() {
		starts.Add(1)
		go func() {
			time.Sleep(300 * time.Millisecond) // the control plane starting
			mu.Lock()
			stopAPI = apiserver(t, g)
			mu.Unlock()
			if took, ok := g.Awake(); !ok || took < 300*time.Millisecond {
				t.Errorf("Awake = %v, %v: want the time since the first connection", took, ok)
			}
		}()
	}
	for round := 1; round <= 2; round++ {
		if err := g.Sleep(wake); err != nil {
			t.Fatal(err)
		}
		if !g.Listening() {
			t.Fatal("a sleeping gate does not accept")
		}
		var wg sync.WaitGroup
		for range 5 {
			wg.Go(func() {
				body, err := get(g.Addr())
				if err != nil || body != "pods" {
					t.Errorf("round %d: a waking client got %q, %v; want the apiserver's answer", round, body, err)
				}
			})
		}
		wg.Wait()
		if got := starts.Load(); got != int32(round) {
			t.Fatalf("round %d: %d starts, want %d", round, got, round)
		}
		if w, _ := g.Waking(); w || g.Listening() {
			t.Fatalf("round %d: the gate still waking (%v) or accepting (%v) once awake", round, w, g.Listening())
		}
		mu.Lock()
		stopAPI() // the cluster sleeps again
		mu.Unlock()
	}
}

// Stop (a wake for a CronJob) stops accepting without a connection; Close
// releases the port.
func TestGateStopAndClose(t *testing.T) {
	port := freePort(t)
	g, err := Listen("ci", port, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Sleep(func() { t.Error("woken without a connection") }); err != nil {
		t.Fatal(err)
	}
	g.Stop()
	if g.Listening() {
		t.Fatal("still accepting after Stop")
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", g.Addr())
	if err != nil {
		t.Fatalf("the port is still held after Close: %v", err)
	}
	l.Close()
}

// What a sleeping cluster's gate costs the daemon: its heap and goroutine
// stack, measured over many gates (the density target is 5 MiB per sleeping
// tenant, all of it; a gate is a small part of that).
func TestSleepingGateCost(t *testing.T) {
	const n = 200
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	gates := make([]*Gate, 0, n)
	for range n {
		g, err := Listen("ci", 0, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		if err := g.Sleep(func() { t.Error("woken without a connection") }); err != nil {
			t.Fatal(err)
		}
		gates = append(gates, g)
	}
	time.Sleep(100 * time.Millisecond) // every accept goroutine parked
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := (int64(after.HeapInuse) - int64(before.HeapInuse)) / n
	stack := (int64(after.StackInuse) - int64(before.StackInuse)) / n
	t.Logf("a sleeping gate: %d B heap, %d B goroutine stack", heap, stack)
	if heap+stack > 64<<10 {
		t.Errorf("a sleeping gate costs %d B; want under 64 KiB", heap+stack)
	}
	runtime.KeepAlive(gates)
}
