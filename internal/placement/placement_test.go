package placement

import (
	"errors"
	"strings"
	"testing"
)

func TestDecide(t *testing.T) {
	const gib = 1 << 30
	tests := []struct {
		name    string
		hosts   []Host
		want    string
		reason  string // a part of the reason
		wantErr string // a part of the error
	}{
		{"one host", []Host{{Name: "a", Live: true, FreeMemory: 4 * gib}}, "a", "the only host", ""},
		{"most free memory", []Host{
			{Name: "a", Live: true, FreeMemory: 4 * gib},
			{Name: "b", Live: true, FreeMemory: 8 * gib},
		}, "b", "the most of 2 hosts", ""},
		{"tenants reserve memory", []Host{
			{Name: "a", Live: true, FreeMemory: 8 * gib, Tenants: 20},
			{Name: "b", Live: true, FreeMemory: 6 * gib, Tenants: 1},
		}, "b", "its 1 tenants", ""},
		{"tie goes to fewer tenants", []Host{
			{Name: "a", Live: true, FreeMemory: 4*gib + TenantReserve, Tenants: 1},
			{Name: "b", Live: true, FreeMemory: 4 * gib},
		}, "b", "", ""},
		{"tie goes to the name", []Host{
			{Name: "c", Live: true, FreeMemory: 4 * gib},
			{Name: "b", Live: true, FreeMemory: 4 * gib},
		}, "b", "", ""},
		{"a dead host gets nothing", []Host{
			{Name: "a", Live: false, FreeMemory: 64 * gib},
			{Name: "b", Live: true, FreeMemory: 1 * gib},
		}, "b", "", ""},
		{"a draining host gets nothing", []Host{
			{Name: "a", Live: true, Draining: true, FreeMemory: 64 * gib},
			{Name: "b", Live: true, FreeMemory: 1 * gib},
		}, "b", "", ""},
		{"a full host gets nothing", []Host{
			{Name: "a", Live: true, FreeMemory: 64 * gib, Tenants: 2, MaxTenants: 2},
			{Name: "b", Live: true, FreeMemory: 1 * gib, Tenants: 5},
		}, "b", "", ""},
		{"none can", []Host{
			{Name: "b", Live: true, FreeMemory: 64 * gib, Tenants: 2, MaxTenants: 2},
			{Name: "a", Live: false},
			{Name: "c", Live: true, Draining: true},
		}, "", "", "a: its Lease lapsed; b: 2 tenants, its --max-tenants; c: draining"},
		{"no hosts", nil, "", "", "no host has registered"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Decide(tt.hosts)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrNoHost) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want ErrNoHost saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.Host != tt.want {
				t.Errorf("host = %s, want %s (reason %q)", d.Host, tt.want, d.Reason)
			}
			if !strings.Contains(d.Reason, tt.reason) || !strings.Contains(d.Reason, "placed on "+tt.want) {
				t.Errorf("reason = %q, want it to name %s and say %q", d.Reason, tt.want, tt.reason)
			}
		})
	}
}

// TestDecideSpreads: placing tenants one by one, counting each placed one,
// spreads them over equal hosts instead of piling them on one.
func TestDecideSpreads(t *testing.T) {
	hosts := []Host{{Name: "h1", Live: true, FreeMemory: 8 << 30}, {Name: "h2", Live: true, FreeMemory: 8 << 30}, {Name: "h3", Live: true, FreeMemory: 8 << 30}}
	count := map[string]int{}
	for range 6 {
		d, err := Decide(hosts)
		if err != nil {
			t.Fatal(err)
		}
		count[d.Host]++
		for i := range hosts {
			if hosts[i].Name == d.Host {
				hosts[i].Tenants++
			}
		}
	}
	for _, h := range hosts {
		if count[h.Name] != 2 {
			t.Errorf("six tenants on three equal hosts: %v, want two each", count)
			break
		}
	}
}

func TestRewake(t *testing.T) {
	const gib = 1 << 30
	tests := []struct {
		name    string
		hosts   []Host
		want    string
		moved   bool
		reason  string // a part of the reason
		wantErr string
	}{
		{"alone it stays", []Host{{Name: "a", Live: true, FreeMemory: gib, Tenants: 1}}, "a", false, "no other host", ""},
		{"as free elsewhere it stays", []Host{
			{Name: "a", Live: true, FreeMemory: 4 * gib, Tenants: 2},
			{Name: "b", Live: true, FreeMemory: 4*gib + 10<<20, Tenants: 1},
		}, "a", false, "no other host has 192 MiB more", ""},
		{"its own reserve is not counted against it", []Host{
			{Name: "a", Live: true, FreeMemory: 4 * gib, Tenants: 1},
			{Name: "b", Live: true, FreeMemory: 4 * gib, Tenants: 0},
		}, "a", false, "", ""},
		{"a host a tenant emptier takes it", []Host{
			{Name: "a", Live: true, FreeMemory: 4 * gib, Tenants: 2},
			{Name: "b", Live: true, FreeMemory: 4*gib - 20<<20, Tenants: 0},
		}, "b", true, "more room than its host a", ""},
		{"a freer host takes it", []Host{
			{Name: "a", Live: true, FreeMemory: 1 * gib, Tenants: 1},
			{Name: "b", Live: true, FreeMemory: 8 * gib, Tenants: 3},
		}, "b", true, "wakes on b", ""},
		{"a draining host gives it away", []Host{
			{Name: "a", Live: true, Draining: true, FreeMemory: 64 * gib, Tenants: 1},
			{Name: "b", Live: true, FreeMemory: 1 * gib, Tenants: 9},
		}, "b", true, "its host a cannot take it", ""},
		{"a host over its cap gives it away", []Host{
			{Name: "a", Live: true, FreeMemory: 64 * gib, Tenants: 3, MaxTenants: 2},
			{Name: "b", Live: true, FreeMemory: 1 * gib, Tenants: 1},
		}, "b", true, "cannot take it", ""},
		{"at its cap with it, it stays", []Host{
			{Name: "a", Live: true, FreeMemory: 4 * gib, Tenants: 2, MaxTenants: 2},
			{Name: "b", Live: true, FreeMemory: 4 * gib, Tenants: 1},
		}, "a", false, "", ""},
		{"a lost host gives it away", []Host{
			{Name: "a", Live: false, FreeMemory: 64 * gib, Tenants: 1},
			{Name: "b", Live: true, FreeMemory: 1 * gib},
		}, "b", true, "", ""},
		{"nowhere to go", []Host{
			{Name: "a", Live: true, Draining: true, FreeMemory: 64 * gib, Tenants: 1},
			{Name: "b", Live: false, FreeMemory: 1 * gib},
		}, "", false, "", "b: its Lease lapsed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, moved, err := Rewake(tt.hosts, "a")
			if tt.wantErr != "" {
				if !errors.Is(err, ErrNoHost) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want ErrNoHost saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.Host != tt.want || moved != tt.moved || !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("Rewake = %+v moved %v, want %s moved %v, reason with %q", d, moved, tt.want, tt.moved, tt.reason)
			}
		})
	}
}
