package nodenet

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestControlPlaneRuleset(t *testing.T) {
	plan, err := ForIndex(3)
	if err != nil {
		t.Fatal(err)
	}
	reach := ControlPlaneReach{UID: 2000007512, Port: 7512, Plan: &plan,
		Datastore: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:5432"), netip.MustParseAddrPort("[::1]:5432")},
		Resolvers: []netip.Addr{netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("fd00::53")}}
	hostNets := []netip.Prefix{netip.MustParsePrefix("203.0.113.0/26")}
	want := `table inet socialweb-cp-7512
delete table inet socialweb-cp-7512
table inet socialweb-cp-7512 {
	comment "socialweb cluster team_a_prod control plane, uid 2000007512 (managed: edits are overwritten)"
	counter controlplane_denied {
		comment "new connections of uid 2000007512 its wall refused"
	}
	chain output {
		type filter hook output priority filter - 10; policy accept;
		meta skuid 2000007512 ct state new jump wall
	}
	chain wall {
		ip daddr 127.0.0.1 tcp dport 7512 accept
		ip6 daddr ::1 tcp dport 7512 accept
		ip daddr 127.0.0.1 tcp dport 5432 accept
		ip6 daddr ::1 tcp dport 5432 accept
		ip daddr != 10.250.3.1 ip daddr { 10.250.3.0/24, 10.3.0.0/16 } accept
		ip daddr 192.168.1.1 meta l4proto { tcp, udp } th dport 53 accept
		ip6 daddr fd00::53 meta l4proto { tcp, udp } th dport 53 accept
		ip daddr { 198.51.100.0/24 } counter name "controlplane_denied" reject with icmpx admin-prohibited
		ip daddr != { 0.0.0.0/8, 10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, 169.254.0.0/16, 172.16.0.0/12, 192.168.0.0/16, 203.0.113.0/26, 224.0.0.0/4, 240.0.0.0/4 } accept
		meta l4proto tcp counter name "controlplane_denied" reject with tcp reset
		counter name "controlplane_denied" reject with icmpx admin-prohibited
	}
}
`
	egress := EgressPolicy{Deny: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}}
	got := ControlPlaneRuleset("team a/prod", reach, egress, hostNets)
	if got != want {
		t.Errorf("ControlPlaneRuleset:\n%s\nwant:\n%s", got, want)
	}
	nftCheck(t, got)
}

// What a control plane may reach as its cluster's egress and network change.
func TestControlPlaneRulesetPolicies(t *testing.T) {
	plan, _ := ForIndex(3)
	const (
		nodes    = `ip daddr != 10.250.3.1 ip daddr { 10.250.3.0/24, 10.3.0.0/16 } accept`
		dns      = `ip daddr 192.168.1.1 meta l4proto { tcp, udp } th dport 53 accept`
		internet = `ip daddr != {`
		refused  = `counter name "controlplane_denied" reject with icmpx admin-prohibited`
	)
	for _, tc := range []struct {
		name     string
		plan     *Plan
		egress   EgressPolicy
		has, not []string
	}{
		{"internet, with a network", &plan, EgressPolicy{}, []string{nodes, dns, internet, refused}, nil},
		{"asleep: no network", nil, EgressPolicy{}, []string{dns, internet}, []string{nodes}},
		{"egress none: nodes only", &plan, EgressPolicy{Mode: EgressNone}, []string{nodes, refused}, []string{dns, internet}},
		{"the host's openings are the nodes' only", &plan, EgressPolicy{Mode: EgressNone, Allow: []netip.Prefix{netip.MustParsePrefix("192.168.10.0/24")}},
			[]string{nodes}, []string{"192.168.10.0/24", internet}},
		{"narrowed to none", &plan, EgressPolicy{}.Narrow(Narrowing{None: true}), []string{nodes}, []string{dns, internet}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ControlPlaneReach{UID: 2000007512, Port: 7512, Plan: tc.plan, Resolvers: []netip.Addr{netip.MustParseAddr("192.168.1.1")}}
			got := ControlPlaneRuleset("c", r, tc.egress, nil)
			for _, s := range tc.has {
				if !strings.Contains(got, s) {
					t.Errorf("no %q in\n%s", s, got)
				}
			}
			for _, s := range tc.not {
				if strings.Contains(got, s) {
					t.Errorf("%q in\n%s", s, got)
				}
			}
			// The last rules refuse: nothing is accepted after them.
			if !strings.HasSuffix(got, "\t\tcounter name \"controlplane_denied\" reject with icmpx admin-prohibited\n\t}\n}\n") {
				t.Errorf("the wall does not end in a refusal:\n%s", got)
			}
			nftCheck(t, got)
		})
	}
}

// nftCheck has nft parse script without applying it (nft -c), where the host
// lets it: the text is what the kernel is given.
func nftCheck(t *testing.T, script string) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil || os.Geteuid() != 0 {
		return // TestRuleset's text comparison stands alone
	}
	cmd := exec.Command("nft", "-c", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("nft -c refuses the ruleset: %v\n%s", err, out)
	}
}

func TestWallControlPlaneCommands(t *testing.T) {
	plan, _ := ForIndex(3)
	for _, tc := range []struct {
		name    string
		reach   ControlPlaneReach
		rules   []rule
		want    []string
		wantErr string
	}{
		{name: "walled", reach: ControlPlaneReach{UID: 2000007512, Port: 7512, Plan: &plan},
			want: []string{"ip -j -4 addr show", "nft -f -"}},
		{name: "root has no wall", reach: ControlPlaneReach{UID: 0, Port: 7512}, wantErr: "not root"},
		{name: "no port", reach: ControlPlaneReach{UID: 2000007512}, wantErr: "leased port"},
		{name: "nft refuses", reach: ControlPlaneReach{UID: 2000007512, Port: 7512},
			rules: []rule{{prefix: "nft", err: failed("Error: Could not process rule: No such file or directory")}},
			want:  []string{"ip -j -4 addr show", "nft -f -"}, wantErr: "the wall of cluster c1's control plane"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder(tc.rules...)
			m := NewManager(rec, nil)
			err := m.WallControlPlane(context.Background(), "c1", tc.reach, Narrowing{})
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			if !slices.Equal(rec.calls, tc.want) {
				t.Errorf("commands %q, want %q", rec.calls, tc.want)
			}
			if tc.wantErr == "" && !strings.Contains(rec.stdin["nft -f -"], "203.0.113.0/26") {
				t.Errorf("the host's networks are not walled off:\n%s", rec.stdin["nft -f -"])
			}
			if _, walled := m.walled[tc.reach.Port]; walled != (tc.wantErr == "") {
				t.Errorf("walled for the metrics: %v, want %v", walled, tc.wantErr == "")
			}
		})
	}
}

func TestUnwallControlPlane(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rules   []rule
		wantErr string
	}{
		{name: "removed"},
		{name: "already gone", rules: []rule{{prefix: "nft", err: failed("Error: No such file or directory; did you mean table 'socialweb-3' in family inet?")}}},
		{name: "not root", rules: []rule{{prefix: "nft", err: failed("Error: Operation not permitted")}}, wantErr: "run as root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder(tc.rules...)
			m := NewManager(rec, nil)
			m.walled[7512] = "c1"
			err := m.UnwallControlPlane(context.Background(), 7512)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			if want := []string{"nft delete table inet socialweb-cp-7512"}; !slices.Equal(rec.calls, want) {
				t.Errorf("commands %q, want %q", rec.calls, want)
			}
		})
	}
}

func TestHostResolvers(t *testing.T) {
	for _, tc := range []struct {
		name, conf string
		want       []netip.Addr
	}{
		{"systemd-resolved", "# comment\nnameserver 127.0.0.53\noptions edns0 trust-ad\nsearch example.com\n", []netip.Addr{netip.MustParseAddr("127.0.0.53")}},
		{"several, one twice, one zoned", "nameserver 192.168.1.1\nnameserver 2001:db8::53\nnameserver 192.168.1.1\nnameserver fe80::1%eth0\n",
			[]netip.Addr{netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("2001:db8::53")}},
		{"garbage", "nameserver\nnameserver not-an-address\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "resolv.conf")
			if err := os.WriteFile(path, []byte(tc.conf), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := HostResolvers(path)
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("HostResolvers = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	if got, err := HostResolvers(filepath.Join(t.TempDir(), "none")); err != nil || got != nil {
		t.Errorf("a missing resolv.conf: %v, %v; want none", got, err)
	}
}

func TestParseDeniedCounters(t *testing.T) {
	out := `{"nftables": [{"metainfo": {"version": "1.0.6"}},
{"counter": {"family": "inet", "name": "egress_denied", "table": "socialweb-3", "handle": 1, "packets": 4, "bytes": 240}},
{"counter": {"family": "inet", "name": "host_denied", "table": "socialweb-3", "handle": 2, "packets": 2, "bytes": 120}},
{"counter": {"family": "inet", "name": "controlplane_denied", "table": "socialweb-cp-7512", "handle": 1, "packets": 7, "bytes": 420}},
{"counter": {"family": "inet", "name": "controlplane_denied", "table": "other", "handle": 1, "packets": 9, "bytes": 1}},
{"counter": {"family": "ip", "name": "egress_denied", "table": "socialweb-4", "handle": 1, "packets": 9, "bytes": 1}}]}`
	nodes, cps, err := parseDeniedCounters(out)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[int]map[string]uint64{3: {"egress": 4, "host": 2}}; !reflect.DeepEqual(nodes, want) {
		t.Errorf("node counters %v, want %v", nodes, want)
	}
	if want := map[int]uint64{7512: 7}; !reflect.DeepEqual(cps, want) {
		t.Errorf("control-plane counters %v, want %v", cps, want)
	}
}
