package dnswire

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestTCPFraming(t *testing.T) {
	tests := []struct {
		name    string
		msg     []byte
		wantErr string
	}{
		{"empty", []byte{}, ""},
		{"header", make([]byte, HeaderLen), ""},
		{"largest", make([]byte, 0xffff), ""},
		{"too long", make([]byte, 0x10000), "too long"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			err := WriteTCP(&b, tt.msg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || b.Len() != 0 {
					t.Fatalf("err %v, wrote %d bytes; want %q and nothing written", err, b.Len(), tt.wantErr)
				}
				return
			}
			got, err := ReadTCP(&b)
			if err != nil || !bytes.Equal(got, tt.msg) {
				t.Fatalf("round trip: %d bytes, %v; want %d", len(got), err, len(tt.msg))
			}
		})
	}
}

func TestExchangeRefusesAShortQuery(t *testing.T) {
	if _, err := Exchange(context.Background(), "udp", "127.0.0.1:1", []byte{1, 2}, time.Second); err == nil {
		t.Fatal("a 2-byte query was sent")
	}
}
