// Package dnswire moves raw DNS messages: the TCP length framing (RFC 1035 4.2.2) and
// one query-answer exchange with a server. The host's gateway forwarder, the node's
// cluster DNS and the node's health probe all use it; none of them parses here.
package dnswire

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"time"
)

// HeaderLen is the fixed DNS header; anything shorter is not a DNS message.
const HeaderLen = 12

// ReadTCP reads one length-prefixed message.
func ReadTCP(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	msg := make([]byte, binary.BigEndian.Uint16(l[:]))
	_, err := io.ReadFull(r, msg)
	return msg, err
}

// WriteTCP writes msg with its length prefix, in one write.
func WriteTCP(w io.Writer, msg []byte) error {
	if len(msg) > 0xffff {
		return errors.New("DNS message too long for TCP")
	}
	_, err := w.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(msg))), msg...))
	return err
}

// Exchange sends query to server (host:port) over network ("udp" or "tcp") and returns
// the first answer whose ID matches, within timeout.
func Exchange(ctx context.Context, network, server string, query []byte, timeout time.Duration) ([]byte, error) {
	if len(query) < HeaderLen {
		return nil, errors.New("not a DNS query")
	}
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, network, server)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	deadline := time.Now().Add(timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = c.SetDeadline(deadline)
	if network == "tcp" {
		if err := WriteTCP(c, query); err != nil {
			return nil, err
		}
		resp, err := ReadTCP(c)
		if err != nil {
			return nil, err
		}
		if len(resp) < HeaderLen || resp[0] != query[0] || resp[1] != query[1] {
			return nil, errors.New("malformed or mismatched response")
		}
		return resp, nil
	}
	if _, err := c.Write(query); err != nil {
		return nil, err
	}
	buf := make([]byte, 65535)
	for {
		n, err := c.Read(buf) // a connected socket: only the server's datagrams arrive
		if err != nil {
			return nil, err
		}
		if n >= HeaderLen && buf[0] == query[0] && buf[1] == query[1] && buf[2]&0x80 != 0 {
			return buf[:n:n], nil
		}
	}
}
