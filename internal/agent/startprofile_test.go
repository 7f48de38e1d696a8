package agent

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"
	"time"
)

func TestStartProfileFor(t *testing.T) {
	for _, tc := range []struct {
		args      map[string]string
		want      time.Duration
		wantAfter time.Duration
		wantErr   string
	}{
		{want: 0},
		{args: map[string]string{"socialweb.start-profile": "8s"}, want: 8 * time.Second},
		{args: map[string]string{"socialweb.start-profile": "10m"}, want: 10 * time.Minute},
		{args: map[string]string{"socialweb.start-profile": "1m", "socialweb.start-profile-after": "2m"}, want: time.Minute, wantAfter: 2 * time.Minute},
		{args: map[string]string{"socialweb.start-profile-after": "2m"}, want: 0}, // no window, no profile
		{args: map[string]string{"socialweb.start-profile": "500ms"}, wantErr: "from 1s to 10m"},
		{args: map[string]string{"socialweb.start-profile": "11m"}, wantErr: "from 1s to 10m"},
		{args: map[string]string{"socialweb.start-profile": "eight"}, wantErr: `"eight"`},
		{args: map[string]string{"socialweb.start-profile": ""}, wantErr: "want a duration"},
		{args: map[string]string{"socialweb.start-profile": "1m", "socialweb.start-profile-after": "2h"}, wantErr: "from 0s to 1h"},
		{args: map[string]string{"socialweb.start-profile": "1m", "socialweb.start-profile-after": "-1s"}, wantErr: "from 0s to 1h"},
	} {
		got, after, err := startProfileFor(func(name string) (string, bool) {
			v, ok := tc.args[name]
			return v, ok
		})
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%v: err %v, want one containing %q", tc.args, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || got != tc.want || after != tc.wantAfter):
			t.Errorf("%v: got %v, %v, %v; want %v, %v", tc.args, got, after, err, tc.want, tc.wantAfter)
		}
	}
}

func TestSplitChunks(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want []string
	}{
		{"", 3, []string{""}},
		{"abc", 3, []string{"abc"}},
		{"abcd", 3, []string{"abc", "d"}},
		{"abcdefg", 2, []string{"ab", "cd", "ef", "g"}},
	} {
		got := splitChunks(tc.s, tc.n)
		if strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("splitChunks(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
}

func acctBytes(pid, ppid uint32, comm string, utime, stime uint16, etime float32) []byte {
	b := make([]byte, acctRecordSize)
	b[1] = 3
	le := binary.LittleEndian
	le.PutUint32(b[16:], pid)
	le.PutUint32(b[20:], ppid)
	le.PutUint32(b[28:], math.Float32bits(etime))
	le.PutUint16(b[32:], utime)
	le.PutUint16(b[34:], stime)
	copy(b[48:], comm)
	return b
}

func TestParseAcct(t *testing.T) {
	var file []byte
	file = append(file, acctBytes(10, 1, "iptables", 12, 3, 40)...)
	file = append(file, acctBytes(11, 1, "iptables", 1<<13|2, 0, 500)...) // 2 << 3 = 16 ticks
	file = append(file, acctBytes(12, 7, "runc:[2:INIT]", 0, 1, 2)...)
	recs, err := parseAcct(file)
	if err != nil {
		t.Fatal(err)
	}
	want := []acctRecord{
		{PID: 10, PPID: 1, Comm: "iptables", CPU: 0.15, Elapsed: 0.4},
		{PID: 11, PPID: 1, Comm: "iptables", CPU: 0.16, Elapsed: 5},
		{PID: 12, PPID: 7, Comm: "runc:[2:INIT]", CPU: 0.01, Elapsed: 0.02},
	}
	if len(recs) != len(want) {
		t.Fatalf("got %d records, want %d", len(recs), len(want))
	}
	for i := range want {
		g, w := recs[i], want[i]
		if g.PID != w.PID || g.PPID != w.PPID || g.Comm != w.Comm || math.Abs(g.CPU-w.CPU) > 1e-9 || math.Abs(g.Elapsed-w.Elapsed) > 1e-6 {
			t.Errorf("record %d: got %+v, want %+v", i, g, w)
		}
	}
	got := strings.Join(acctSummary(recs), "; ")
	if want := "iptables 2x 0.31s; runc:[2:INIT] 1x 0.01s"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
	for _, bad := range [][]byte{file[:63], append(acctBytes(1, 1, "x", 0, 0, 0)[:1:1], append([]byte{2}, make([]byte, 62)...)...)} {
		if _, err := parseAcct(bad); err == nil {
			t.Errorf("parseAcct of %d bad bytes: no error", len(bad))
		}
	}
}
