package sleep

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/socialweb-computer/socialweb/internal/frontdoor"
	"github.com/socialweb-computer/socialweb/internal/pki"
)

const (
	doorDomain = "tenants.test"
	// why is the reason a failing start gives; the answer must carry it.
	why = "the control plane exited while waking: exit status 1"
)

// tenantPKI makes a tenant's CAs and serving certificate, as the daemon does:
// valid for loopback and the cluster's front-door name.
func tenantPKI(t *testing.T, cluster string) pki.Paths {
	t.Helper()
	p, err := pki.Ensure(t.TempDir(), pki.Options{ServingIPs: []net.IP{net.IPv4(127, 0, 0, 1)}, ServingNames: []string{cluster + "." + doorDomain}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// failingGate is a sleeping gate whose every start fails after delay: the
// daemon fails the wake, stops the control plane and gates the port again.
func failingGate(t *testing.T, p *pki.Paths, delay time.Duration) (*Gate, *atomic.Int32) {
	t.Helper()
	g, starts, _ := failingGateOn(t, freePort(t), p, delay)
	return g, starts
}

// failingGateOn is failingGate on port; it also returns the count of answers.
func failingGateOn(t *testing.T, port int, p *pki.Paths, delay time.Duration) (*Gate, *atomic.Int32, prometheus.Counter) {
	t.Helper()
	g, err := Listen("ci", "ci."+doorDomain, port, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	answered := prometheus.NewCounter(prometheus.CounterOpts{Name: "answers"})
	if p != nil {
		g.AnswerWith(p.ServingCert, p.ServingKey, answered)
	}
	starts := new(atomic.Int32)
	var wake func()
	wake = func() {
		starts.Add(1)
		go func() {
			time.Sleep(delay) // the control plane starting, then exiting
			g.Fail(errors.New(why))
			// Closed: the test is over.
			if err := g.Sleep(wake); err != nil && !errors.Is(err, net.ErrClosed) {
				t.Error(err)
			}
		}()
	}
	if err := g.Sleep(wake); err != nil {
		t.Fatal(err)
	}
	return g, starts, answered
}

// tlsClient trusts the tenant's server CA only. h2 offers h2 first in ALPN,
// as client-go does.
func tlsClient(p pki.Paths, serverName string, h2 bool) *http.Client {
	b, _ := os.ReadFile(p.ServerCA)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b)
	return &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: serverName},
		ForceAttemptHTTP2: h2,
		DisableKeepAlives: true,
	}}
}

// want503 checks an answer is the failed wake's: a 503 with a Retry-After and
// a Kubernetes Status saying why and what to do.
func want503(t *testing.T, resp *http.Response) {
	t.Helper()
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("answer %d, Content-Type %q; want 503, JSON:\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	// No Retry-After header: client-go would retry silently (see newFailure).
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		t.Errorf("Retry-After %q: client-go retries such a 503 up to 10 times before kubectl prints it", ra)
	}
	if w := resp.Header.Get("Warning"); !strings.HasPrefix(w, `299 - "cluster ci is asleep`) || !strings.Contains(w, why) {
		t.Errorf("Warning header %q; want the message, for kubectl's discovery requests", w)
	}
	var st metav1.Status
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("the body is not a Status: %v\n%s", err, body)
	}
	if st.Kind != "Status" || st.APIVersion != "v1" || st.Status != metav1.StatusFailure ||
		st.Reason != metav1.StatusReasonServiceUnavailable || st.Code != 503 || st.Details == nil || st.Details.RetryAfterSeconds < 1 {
		t.Errorf("Status %+v; want kind Status, v1, Failure, ServiceUnavailable, 503, retryAfterSeconds", st)
	}
	for _, want := range []string{"cluster ci", "could not be woken", why, "socialweb cluster get ci"} {
		if !strings.Contains(st.Message, want) {
			t.Errorf("the message %q does not say %q", st.Message, want)
		}
	}
}

// A failed wake answers the client that woke the cluster with a 503 over TLS
// with the tenant's own serving certificate, over HTTP/1.1 whether or not the
// client offers h2.
func TestGateFailedWakeAnswers503(t *testing.T) {
	tests := []struct {
		name       string
		serverName string
		h2         bool
	}{
		{"HTTP/1.1 client", "ci." + doorDomain, false},
		{"client offering h2 first, as client-go", "ci." + doorDomain, true},
		{"the name in capitals (SNI is case-insensitive)", "CI." + strings.ToUpper(doorDomain), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tenantPKI(t, "ci")
			g, starts := failingGate(t, &p, 100*time.Millisecond)
			resp, err := tlsClient(p, tt.serverName, tt.h2).Get("https://" + g.Addr() + "/api/v1/pods")
			if err != nil {
				t.Fatalf("the client of a failed wake got no answer: %v", err)
			}
			if resp.ProtoMajor != 1 {
				t.Errorf("answered over %s, want HTTP/1.1", resp.Proto)
			}
			want503(t, resp)
			if n := starts.Load(); n != 1 {
				t.Errorf("%d starts, want 1", n)
			}
		})
	}
}

// Without the serving certificate the gate cannot answer: the connection
// ends instead of waiting forever.
func TestGateFailedWakeWithoutCertificateEndsTheConnection(t *testing.T) {
	p := tenantPKI(t, "ci")
	g, _ := failingGate(t, nil, 0)
	if resp, err := tlsClient(p, "ci."+doorDomain, false).Get("https://" + g.Addr() + "/api/v1/pods"); err == nil {
		resp.Body.Close()
		t.Fatalf("a client of a failed wake without a certificate was answered %s", resp.Status)
	}
}

// Clients that wake a cluster together, whose start fails, are each answered
// with the 503, by one start; within the hold a new client is answered at once
// without a start, and after it a client wakes the cluster again.
func TestGateConcurrentWakersOfAFailedWakeEach503(t *testing.T) {
	p := tenantPKI(t, "ci")
	g, starts, answered := failingGateOn(t, freePort(t), &p, 300*time.Millisecond)
	g.hold = 2 * time.Second
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Go(func() {
			resp, err := tlsClient(p, "ci."+doorDomain, true).Get("https://" + g.Addr() + "/api/v1/pods")
			if err != nil {
				t.Errorf("client %d: %v", i, err)
				return
			}
			want503(t, resp)
		})
	}
	wg.Wait()
	if n := starts.Load(); n != 1 {
		t.Fatalf("%d starts for clients that came together, want 1", n)
	}
	t0 := time.Now()
	resp, err := tlsClient(p, "ci."+doorDomain, true).Get("https://" + g.Addr() + "/api/v1/pods")
	if err != nil {
		t.Fatal(err)
	}
	want503(t, resp)
	if took := time.Since(t0); starts.Load() != 1 || took > time.Second {
		t.Errorf("within the hold: %d starts, answered in %s; want no new start, at once", starts.Load(), took)
	}
	// Within the hold too, a client that does not name the cluster is
	// refused at the handshake, not answered.
	if resp, err := tlsClient(p, "", true).Get("https://" + g.Addr() + "/api/v1/pods"); err == nil || !strings.Contains(err.Error(), "unrecognized name") {
		if err == nil {
			resp.Body.Close()
		}
		t.Errorf("within the hold, a client naming nothing got %v; want the unrecognized_name alert", err)
	}
	time.Sleep(2 * time.Second)
	resp, err = tlsClient(p, "ci."+doorDomain, true).Get("https://" + g.Addr() + "/api/v1/pods")
	if err != nil {
		t.Fatal(err)
	}
	want503(t, resp)
	if n := starts.Load(); n != 2 {
		t.Errorf("after the hold: %d starts, want 2 (a fresh wake)", n)
	}
	// Counted once the gate is done with the connection, just after the client.
	for deadline := time.Now().Add(3 * time.Second); testutil.ToFloat64(answered) != 7 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := testutil.ToFloat64(answered); n != 7 {
		t.Errorf("%v answers counted, want 7", n)
	}
}

// client-go (what kubectl is made of) gets the Status as its error, at once,
// and the Warning header through its warning handler.
func TestGateFailedWakeReachesClientGo(t *testing.T) {
	p := tenantPKI(t, "ci")
	g, starts := failingGate(t, &p, 100*time.Millisecond)
	ca, err := os.ReadFile(p.ServerCA)
	if err != nil {
		t.Fatal(err)
	}
	warned := &warnings{}
	cs := kubernetes.NewForConfigOrDie(&rest.Config{Host: "https://" + g.Addr(), TLSClientConfig: rest.TLSClientConfig{CAData: ca, ServerName: "ci." + doorDomain}, WarningHandler: warned})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t0 := time.Now()
	_, err = cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	took := time.Since(t0)
	if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), "socialweb cluster get ci") {
		t.Fatalf("client-go got %v; want ServiceUnavailable saying why and what to do", err)
	}
	if took > 5*time.Second {
		t.Errorf("client-go's error came after %s: it retried", took.Round(time.Millisecond))
	}
	if w := warned.get(); len(w) != 1 || !strings.Contains(w[0], why) {
		t.Errorf("warnings %q; want the message once", w)
	}
	if n := starts.Load(); n != 1 {
		t.Errorf("%d starts, want 1", n)
	}
}

// warnings records what client-go's warning handler is given.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) HandleWarningHeader(code int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if code == 299 {
		w.msgs = append(w.msgs, text)
	}
}

func (w *warnings) get() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

// Through the front door (which passes TLS through to the port) the answer is
// the same.
func TestGateFailedWakeThroughTheFrontDoor(t *testing.T) {
	p := tenantPKI(t, "ci")
	g, _ := failingGate(t, &p, 100*time.Millisecond)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	door := frontdoor.New(frontdoor.Config{Address: l.Addr().String(), Domain: doorDomain},
		frontdoor.BackendsFunc(func(c string, _ bool) (string, bool) { return g.Addr(), c == "ci" }),
		slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- door.Serve(ctx, l) }()
	defer func() { cancel(); <-done }()
	c := tlsClient(p, "ci."+doorDomain, true)
	resp, err := c.Get("https://" + l.Addr().String() + "/api/v1/pods")
	if err != nil {
		t.Fatalf("through the door: %v", err)
	}
	want503(t, resp)
}
