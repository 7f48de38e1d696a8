// Package clienthello reads the ClientHello that opens a TLS connection
// without answering it, so that a connection can be routed or refused by the
// server name (SNI) it asks for, and then handed on with every byte intact:
// the front door routes by it, and a sleeping cluster's gate wakes only for a
// hello that names the cluster. The parsing is crypto/tls's own.
package clienthello

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// MaxBytes bounds the bytes read before the name is known. A ClientHello is
// a few hundred bytes to about 2 KiB (post-quantum key shares); two full TLS
// records leave room for any real one.
const MaxBytes = 2 * (16384 + 5)

// Read reads c's ClientHello, within timeout and at most max bytes, and
// returns the server name it asks for ("" for none) and every byte read,
// which whoever answers the handshake must see first (Replay). On success the
// read deadline is cleared. crypto/tls parses it: a server handshake over a
// connection that records what it reads and refuses every write, stopped as
// soon as the hello has been parsed.
func Read(c net.Conn, timeout time.Duration, max int) (string, []byte, error) {
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return "", nil, fmt.Errorf("setting the ClientHello deadline: %w", err)
	}
	rec := &recording{Conn: c, r: io.LimitReader(c, int64(max))}
	var (
		name string
		seen bool
	)
	srv := tls.Server(rec, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			name, seen = h.ServerName, true
			return nil, errHelloRead
		},
	})
	err := srv.Handshake()
	if !seen {
		if err == nil {
			err = errors.New("handshake ended without a ClientHello")
		}
		return "", nil, fmt.Errorf("reading the ClientHello (%d bytes read): %w", rec.buf.Len(), err)
	}
	// No deadline from here on: a watch may stay quiet for a long time.
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		return "", nil, fmt.Errorf("clearing the ClientHello deadline: %w", err)
	}
	return name, rec.buf.Bytes(), nil
}

// errHelloRead stops the handshake once the hello is parsed.
var errHelloRead = errors.New("ClientHello read")

// recording is the connection Read gives crypto/tls: reads are kept, writes
// refused (nothing is answered in the tenant's name), Close left to the
// caller.
type recording struct {
	net.Conn
	r   io.Reader
	buf bytes.Buffer
}

func (r *recording) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

func (r *recording) Write([]byte) (int, error) {
	return 0, errors.New("a ClientHello is read here, never answered")
}
func (r *recording) Close() error { return nil }

// Reason is the metric label of a hello that Read could not read:
// hello_timeout when it did not come within the timeout, else bad_hello (not
// TLS, or larger than allowed).
func Reason(err error) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "hello_timeout"
	}
	return "bad_hello"
}

// Replay is c with hello read again before what follows it, so whoever
// answers the handshake sees the connection as the client sent it.
func Replay(c net.Conn, hello []byte) net.Conn {
	return &replayed{Conn: c, pending: hello}
}

// replayed serves pending before reading c. It keeps CloseWrite, which
// passing a clean end on as a half-close needs.
type replayed struct {
	net.Conn
	pending []byte
}

func (r *replayed) Read(p []byte) (int, error) {
	if len(r.pending) > 0 {
		n := copy(p, r.pending)
		r.pending = r.pending[n:]
		return n, nil
	}
	return r.Conn.Read(p)
}

// CloseWrite half-closes the underlying connection, if it can.
func (r *replayed) CloseWrite() error {
	if cw, ok := r.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("half-closing a %T: %w", r.Conn, errors.ErrUnsupported)
}

// refusal is the whole answer to a hello that is not carried on: one fatal
// TLS alert, unrecognized_name (RFC 6066). The same bytes go to a client
// that named an unknown cluster, named none, or named one that is down, so
// the answer does not tell which names exist.
var refusal = [...]byte{
	21,         // content type: alert
	0x03, 0x03, // legacy record version TLS 1.2
	0x00, 0x02, // length
	2,   // level: fatal
	112, // description: unrecognized_name
}

// Refuse answers a hello with the unrecognized_name alert. It half-closes
// first and reads what the client still sends for a moment, so the kernel
// does not reset the connection before the client has read the alert. The
// caller closes c.
func Refuse(c net.Conn) {
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	if _, err := c.Write(refusal[:]); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}
