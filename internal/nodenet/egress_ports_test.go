package nodenet

import (
	"strings"
	"testing"
)

func TestParsePorts(t *testing.T) {
	for _, tc := range []struct {
		in      []string
		want    []int
		wantErr string
	}{
		{nil, nil, ""},
		{[]string{"9418", " 8080"}, []int{9418, 8080}, ""},
		{[]string{"0"}, nil, `"0" is not a TCP port`},
		{[]string{"65536"}, nil, `"65536" is not a TCP port`},
		{[]string{"git"}, nil, `"git" is not a TCP port: want 1 to 65535`},
	} {
		got, err := ParsePorts(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParsePorts(%q) = %v, %v; want an error saying %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("ParsePorts(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("ParsePorts(%q) = %v, want %v", tc.in, got, tc.want)
			}
		}
	}
}

// A port the operator opens is on the gateway's accept list, beside socialweb's own.
func TestServedExtraPorts(t *testing.T) {
	got := Served{APIServer: 7500, Registry: 5000, Extra: []int{9418, 5000}}.tcpPorts()
	want := []int{53, 5000, 7500, 9418}
	if len(got) != len(want) {
		t.Fatalf("tcpPorts = %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("tcpPorts = %v, want %v", got, want)
		}
	}
}
