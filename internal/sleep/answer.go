package sleep

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// failHold is how long after a failed wake connections are answered
	// with the failure at once instead of starting the control plane again:
	// a broken tenant that clients keep calling must not start a process per
	// connection.
	failHold = 30 * time.Second
	// answerTimeout bounds the handshake, the request and the answer, so a
	// client that sends nothing does not hold a goroutine.
	answerTimeout = 10 * time.Second
)

// failure is a failed wake, answered to clients until until.
type failure struct {
	cert    tls.Certificate
	body    []byte // the Status
	warning string // the message again, as a Warning header
	until   time.Time
}

// newFailure loads the tenant's serving certificate and writes the Status
// the clients of a failed wake are answered with, from now for hold.
func newFailure(cluster, certFile, keyFile string, why error, now time.Time, hold time.Duration) (*failure, error) {
	until := now.Add(hold)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("loading the serving certificate of %s: %w", cluster, err)
	}
	msg := fmt.Sprintf("cluster %s is asleep and could not be woken: %s. "+
		"Its Wake condition says why: socialweb cluster get %s. A request after %s tries a new wake.",
		cluster, why, cluster, until.UTC().Format(time.RFC3339))
	st := metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Reason:   metav1.StatusReasonServiceUnavailable,
		Code:     http.StatusServiceUnavailable,
		Message:  msg,
		// Here and not in a Retry-After header: client-go retries a 5xx
		// that has one, silently, up to 10 times per request, so kubectl
		// printed the message after 10 s, or after 52 s and only the generic
		// text when its discovery cache was cold.
		Details: &metav1.StatusDetails{Name: cluster, RetryAfterSeconds: int32(max(1, hold/time.Second))},
	}
	body, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("the answer for %s: %w", cluster, err)
	}
	return &failure{cert: cert, body: append(body, '\n'), warning: warning(msg), until: until}, nil
}

// warning is msg as a Warning header (RFC 7234 code 299, as the apiserver's
// own). client-go prints warnings of any response, also of the discovery
// requests kubectl makes first, whose errors it reduces to the generic "the
// server is currently unable to handle the request".
func warning(msg string) string {
	var b strings.Builder
	b.WriteString(`299 - "`)
	for _, r := range msg {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			b.WriteByte(' ')
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// answer completes the TLS handshake as the apiserver would (its
// certificate, so the client's CA check passes), reads one HTTP/1.1 request
// and answers it with a 503 and the Status. Only http/1.1 is offered in
// ALPN: client-go and kubectl fall back to it from h2. Client certificates
// are not asked for: the answer is an error, the same for anyone.
func (f *failure) answer(c net.Conn) error {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(answerTimeout))
	tc := tls.Server(c, &tls.Config{
		Certificates: []tls.Certificate{f.cert},
		NextProtos:   []string{"http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("TLS handshake: %w", err)
	}
	req, err := http.ReadRequest(bufio.NewReader(tc))
	if err != nil {
		return fmt.Errorf("reading the request: %w", err)
	}
	resp := &http.Response{
		StatusCode: http.StatusServiceUnavailable,
		ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{
			"Content-Type":           {"application/json"},
			"Warning":                {f.warning},
			"X-Content-Type-Options": {"nosniff"},
			"Cache-Control":          {"no-store"},
		},
		Body:          io.NopCloser(bytes.NewReader(f.body)),
		ContentLength: int64(len(f.body)),
		Close:         true,
		Request:       req,
	}
	if err := resp.Write(tc); err != nil {
		return fmt.Errorf("writing the answer: %w", err)
	}
	// Close the sending side and let the client read the answer before the
	// socket goes: closing with unread request bytes would send a reset that
	// can overtake the answer.
	_ = tc.CloseWrite()
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	_, _ = io.Copy(io.Discard, tc)
	return nil
}
