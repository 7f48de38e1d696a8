package clienthello

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// serving is a self-signed certificate for name, and a pool that trusts it.
func serving(t *testing.T, name string) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// pair is a loopback TCP connection: the client's end and the server's.
func pair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// Read returns the name a real crypto/tls client asks for and the bytes it
// sent; a hello that is not TLS, too large or too slow is an error with its
// reason.
func TestRead(t *testing.T) {
	const name = "ci.tenants.test"
	_, pool := serving(t, name)
	tests := []struct {
		name       string
		send       func(net.Conn)
		wantName   string
		wantReason string // "" for a hello read
	}{
		{"a name", func(c net.Conn) {
			_ = tls.Client(c, &tls.Config{ServerName: name, RootCAs: pool}).Handshake()
		}, name, ""},
		{"no name (crypto/tls sends none for an IP address)", func(c net.Conn) {
			_ = tls.Client(c, &tls.Config{ServerName: "127.0.0.1", RootCAs: pool}).Handshake()
		}, "", ""},
		{"silent", func(net.Conn) {}, "", "hello_timeout"},
		{"a partial record", func(c net.Conn) { c.Write([]byte{22, 3, 1}) }, "", "hello_timeout"},
		{"plain HTTP", func(c net.Conn) { io.WriteString(c, "GET / HTTP/1.1\r\nHost: ci\r\n\r\n") }, "", "bad_hello"},
		{"an endless hello", func(c net.Conn) {
			c.Write([]byte{22, 3, 1, 0x40, 0x00, 1, 0x00, 0xea, 0x60})
			c.Write(make([]byte, 0x4000-4))
			for range 8 {
				c.Write(append([]byte{22, 3, 1, 0x40, 0x00}, make([]byte, 0x4000)...))
			}
		}, "", "bad_hello"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client, server := pair(t)
			sent := &writeLog{Conn: client}
			go tc.send(sent)
			got, hello, err := Read(server, 300*time.Millisecond, MaxBytes)
			if tc.wantReason != "" {
				if err == nil || Reason(err) != tc.wantReason {
					t.Fatalf("Read: %q, %v; want an error, reason %s", got, err, tc.wantReason)
				}
				return
			}
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			if got != tc.wantName {
				t.Errorf("server name %q, want %q", got, tc.wantName)
			}
			if len(hello) == 0 || !bytes.HasPrefix(sent.bytes(), hello) {
				t.Errorf("Read returned %d bytes that are not what the client sent first", len(hello))
			}
		})
	}
}

// A handshake over Replay completes as if nothing had been read, and the
// application bytes after it pass both ways.
func TestReplayHandsTheConnectionOnIntact(t *testing.T) {
	const name = "ci.tenants.test"
	cert, pool := serving(t, name)
	client, server := pair(t)
	done := make(chan error, 1)
	go func() {
		c := tls.Client(client, &tls.Config{ServerName: name, RootCAs: pool})
		if _, err := io.WriteString(c, "ping"); err != nil {
			done <- err
			return
		}
		b := make([]byte, 4)
		_, err := io.ReadFull(c, b)
		if err == nil && string(b) != "pong" {
			err = io.ErrUnexpectedEOF
		}
		done <- err
	}()
	got, hello, err := Read(server, 5*time.Second, MaxBytes)
	if err != nil || got != name {
		t.Fatalf("Read: %q, %v", got, err)
	}
	tc := tls.Server(Replay(server, hello), &tls.Config{Certificates: []tls.Certificate{cert}})
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 4)
	if _, err := io.ReadFull(tc, b); err != nil || string(b) != "ping" {
		t.Fatalf("the server read %q, %v after the replay; want the handshake and ping", b, err)
	}
	if _, err := io.WriteString(tc, "pong"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the client: %v", err)
	}
	if _, ok := Replay(server, nil).(interface{ CloseWrite() error }); !ok {
		t.Error("a replayed connection cannot half-close")
	}
}

// Refuse answers with exactly one unrecognized_name alert, which the client
// reports as such.
func TestRefuse(t *testing.T) {
	client, server := pair(t)
	rec := &readLog{Conn: client}
	errs := make(chan error, 1)
	go func() {
		c := tls.Client(rec, &tls.Config{ServerName: "nosuch.tenants.test"})
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		errs <- c.Handshake()
	}()
	if _, _, err := Read(server, 5*time.Second, MaxBytes); err != nil {
		t.Fatal(err)
	}
	Refuse(server)
	server.Close()
	if err := <-errs; err == nil || !strings.Contains(err.Error(), "unrecognized name") {
		t.Errorf("handshake: %v, want the alert unrecognized_name", err)
	}
	_, _ = io.Copy(io.Discard, rec)
	if want := []byte{21, 3, 3, 0, 2, 2, 112}; !bytes.Equal(rec.buf.Bytes(), want) {
		t.Errorf("answered %x, want exactly %x", rec.buf.Bytes(), want)
	}
}

// writeLog keeps every byte written to a connection.
type writeLog struct {
	net.Conn
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *writeLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.buf.Write(p)
	w.mu.Unlock()
	return w.Conn.Write(p)
}

func (w *writeLog) bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.buf.Bytes())
}

// readLog keeps every byte read from a connection.
type readLog struct {
	net.Conn
	buf bytes.Buffer
}

func (r *readLog) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	r.buf.Write(p[:n])
	return n, err
}
