package lease

import (
	"errors"
	"maps"
	"strings"
	"testing"
)

func TestAcquire(t *testing.T) {
	ports, nets := Range{6500, 6502}, Range{1, 3}
	tests := []struct {
		name      string
		table     Table
		cluster   string
		busy      map[int]bool
		want      Lease
		wantErr   string
		exhausted bool
	}{
		{"first lease takes the lowest", Table{}, "a", nil, Lease{6500, 1}, "", false},
		{"an existing lease is returned unchanged", Table{"a": {6502, 3}}, "a", nil, Lease{6502, 3}, "", false},
		{"leased slots are skipped", Table{"a": {6500, 1}}, "b", nil, Lease{6501, 2}, "", false},
		{"a port busy on the host is skipped", Table{}, "a", map[int]bool{6500: true}, Lease{6501, 1}, "", false},
		{"a released hole is reused", Table{"a": {6500, 1}, "c": {6502, 3}}, "b", nil, Lease{6501, 2}, "", false},
		{"exhausted ports say what to do", Table{"a": {6500, 1}, "b": {6501, 2}, "c": {6502, 3}}, "d", nil, Lease{}, "widen --port-range", true},
		{"a cluster that gave its network back keeps its port", Table{"a": {6500, 1}, "b": {6502, 0}}, "b", nil, Lease{6502, 2}, "", false},
		{"a released network is taken by the next cluster", Table{"a": {6500, 0}}, "b", nil, Lease{6501, 1}, "", false},
		{"no free network says what to do", Table{"a": {6500, 1}, "b": {6501, 2}, "c": {6502, 3}, "d": {6503, 0}}, "d", nil, Lease{}, "let one sleep", true},
		{"busy host ports can exhaust too", Table{}, "a", map[int]bool{6500: true, 6501: true, 6502: true}, Lease{}, "no free apiserver port in 6500-6502", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := maps.Clone(tt.table)
			got, err := tt.table.Acquire(tt.cluster, ports, nets, func(p int) bool { return !tt.busy[p] })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
				}
				if errors.Is(err, ErrExhausted) != tt.exhausted {
					t.Errorf("errors.Is(err, ErrExhausted) = %v", !tt.exhausted)
				}
				if !maps.Equal(tt.table, before) {
					t.Errorf("a failed Acquire changed the table")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
			if tt.table[tt.cluster] != tt.want {
				t.Errorf("table not updated")
			}
		})
	}
}

func TestReleaseFreesTheSlot(t *testing.T) {
	tab := Table{}
	r := Range{7000, 7000}
	if _, err := tab.Acquire("a", r, r, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := tab.Acquire("b", r, r, nil); !errors.Is(err, ErrExhausted) {
		t.Fatalf("second lease in a one-slot range: %v", err)
	}
	tab.Release("a")
	tab.Release("a")
	if l, err := tab.Acquire("b", r, r, nil); err != nil || l.Port != 7000 {
		t.Fatalf("after release: %+v %v", l, err)
	}
}

func TestReleaseNetworkKeepsThePort(t *testing.T) {
	ports, nets := Range{7000, 7001}, Range{1, 1}
	tab := Table{}
	a, err := tab.Acquire("a", ports, nets, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tab.Acquire("b", ports, nets, nil); !errors.Is(err, ErrExhausted) {
		t.Fatalf("a second network from a one-network range: %v", err)
	}
	tab.ReleaseNetwork("a")
	tab.ReleaseNetwork("a")
	tab.ReleaseNetwork("nobody")
	if got := tab["a"]; got.Port != a.Port || got.HasNetwork() {
		t.Fatalf("after ReleaseNetwork a holds %+v, want port %d and no network", got, a.Port)
	}
	b, err := tab.Acquire("b", ports, nets, nil)
	if err != nil || b.Network != a.Network || b.Port == a.Port {
		t.Fatalf("b got %+v %v, want a's network %d and another port", b, err, a.Network)
	}
	if _, err := tab.Acquire("a", ports, nets, nil); !errors.Is(err, ErrExhausted) || tab["a"].HasNetwork() {
		t.Fatalf("a took a network b holds: %+v %v", tab["a"], err)
	}
	if len(tab.Networks()) != 1 {
		t.Fatalf("held networks %v, want only b's", tab.Networks())
	}
}

func TestParseRange(t *testing.T) {
	tests := []struct {
		in      string
		want    Range
		wantErr bool
	}{
		{"6500-6599", Range{6500, 6599}, false},
		{"7000-7000", Range{7000, 7000}, false},
		{"6599-6500", Range{}, true},
		{"abc", Range{}, true},
		{"0-10", Range{}, true},
		{"1-70000", Range{}, true},
	}
	for _, tt := range tests {
		got, err := ParseRange(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseRange(%q) = %v, %v", tt.in, got, err)
		}
	}
}
