package frontdoor

import (
	"strings"
	"testing"
)

func TestValidateDomain(t *testing.T) {
	for _, tc := range []struct {
		domain string
		ok     bool
	}{
		{DefaultDomain, true},
		{"tenants.example.com", true},
		{"k8s", true},
		{"", false},
		{"Tenants.example.com", false},
		{"tenants.example.com.", false},
		{"*.example.com", false},
		{"-x.example.com", false},
		{"a_b.example.com", false},
		{"tenants example.com", false},
		{"https://tenants.example.com", false},
		{strings.Repeat("a", 60) + "." + strings.Repeat("b", 60) + "." + strings.Repeat("c", 60) + "." + strings.Repeat("d", 30), false},
	} {
		err := ValidateDomain(tc.domain)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateDomain(%q) = %v, want ok %v", tc.domain, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "want a lowercase DNS name") {
			t.Errorf("ValidateDomain(%q) = %v: does not say what would be accepted", tc.domain, err)
		}
	}
}

func TestValidateAddress(t *testing.T) {
	for _, tc := range []struct {
		address string
		ok      bool
	}{
		{"0.0.0.0:8443", true},
		{"127.0.0.1:8443", true},
		{":8443", true},
		{"[::]:443", true},
		{"door.example.com:8443", true},
		{"8443", false},
		{"127.0.0.1", false},
		{"127.0.0.1:0", false},
		{"127.0.0.1:65536", false},
		{"127.0.0.1:https", false},
		{"no_such host:8443", false},
	} {
		err := ValidateAddress(tc.address)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateAddress(%q) = %v, want ok %v", tc.address, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "want HOST:PORT") {
			t.Errorf("ValidateAddress(%q) = %v: does not say what would be accepted", tc.address, err)
		}
	}
}

func TestClusterOfName(t *testing.T) {
	c := Config{Domain: "tenants.example.com"}
	for _, tc := range []struct {
		sni, cluster string
		ok           bool
	}{
		{"ci.tenants.example.com", "ci", true},
		{"CI.Tenants.Example.com", "ci", true},
		{"", "", false},
		{"tenants.example.com", "", false},
		{".tenants.example.com", "", false},
		{"a.ci.tenants.example.com", "", false},
		{"ci.other.example.com", "", false},
		{"citenants.example.com", "", false},
		{"ci", "", false},
	} {
		got, ok := c.cluster(tc.sni)
		if got != tc.cluster || ok != tc.ok {
			t.Errorf("cluster(%q) = %q, %v; want %q, %v", tc.sni, got, ok, tc.cluster, tc.ok)
		}
	}
}

func TestServerURL(t *testing.T) {
	for _, tc := range []struct{ address, want string }{
		{"127.0.0.1:8443", "https://127.0.0.1:8443"},
		{"10.0.0.5:443", "https://10.0.0.5:443"},
		{"0.0.0.0:8443", "https://127.0.0.1:8443"},
		{":8443", "https://127.0.0.1:8443"},
		{"[::]:8443", "https://127.0.0.1:8443"},
		{"[2001:db8::1]:8443", "https://[2001:db8::1]:8443"},
		{"door.example.com:8443", "https://door.example.com:8443"},
	} {
		c := Config{Address: tc.address, Domain: DefaultDomain}
		if got := c.Server(); got != tc.want {
			t.Errorf("Server() of %s = %s, want %s", tc.address, got, tc.want)
		}
	}
	if got := (Config{Domain: DefaultDomain}).ServerName("ci"); got != "ci."+DefaultDomain {
		t.Errorf("ServerName(ci) = %s", got)
	}
}

func TestValidateMaxConns(t *testing.T) {
	for _, tc := range []struct {
		perSource, total int
		wantErr          string // "" for none
	}{
		{DefaultMaxConnsPerSource, DefaultMaxConns, ""},
		{1, 1, ""},
		{MaxMaxConns, MaxMaxConns, ""},
		{64, 0, "0: want 1 to 1048576 connections carried at once from everyone (default 4096)"},
		{64, -1, "-1: want 1 to 1048576"},
		{64, MaxMaxConns + 1, "1048577: want 1 to 1048576"},
		{0, 4096, "0: want 1 to the limit from everyone (4096) connections carried at once from one source"},
		{4097, 4096, "4097: want 1 to the limit from everyone (4096)"},
	} {
		err := ValidateMaxConns(tc.total)
		if err == nil {
			err = ValidateMaxConnsPerSource(tc.perSource, tc.total)
		}
		if (err == nil) != (tc.wantErr == "") || err != nil && !strings.HasPrefix(err.Error(), tc.wantErr) {
			t.Errorf("limits %d per source, %d in total: %v, want %q", tc.perSource, tc.total, err, tc.wantErr)
		}
	}
}
