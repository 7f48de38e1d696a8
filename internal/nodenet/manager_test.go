package nodenet

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// recorder is a Runner that records command lines and answers from a script:
// the first rule whose prefix matches a command line decides its result.
type recorder struct {
	mu    sync.Mutex
	calls []string
	stdin map[string]string // command line -> last stdin
	rules []rule
}

type rule struct {
	prefix string
	out    string
	err    error
}

func newRecorder(rules ...rule) *recorder {
	// Unless a test says otherwise the host has no iptables (like ours), and
	// sampleAddrs' addresses.
	rules = append(rules, rule{prefix: "iptables", err: &exec.Error{Name: "iptables", Err: exec.ErrNotFound}},
		rule{prefix: "ip -j -4 addr show", out: sampleAddrs})
	return &recorder{stdin: map[string]string{}, rules: rules}
}

func (r *recorder) Run(_ context.Context, stdin, name string, args ...string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	line := cmdLine(name, args)
	r.calls = append(r.calls, line)
	if stdin != "" {
		r.stdin[line] = stdin
	}
	for _, ru := range r.rules {
		if strings.HasPrefix(line, ru.prefix) {
			return ru.out, ru.err
		}
	}
	return "", nil
}

func failed(stderr string) error {
	return &CmdError{Cmd: "x", Err: errors.New("exit status 2"), Stderr: stderr}
}

func plan(t *testing.T, i int) Plan {
	t.Helper()
	p, err := ForIndex(i)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func sameCalls(t *testing.T, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("commands:\n got  %q\n want %q", got, want)
	}
}

func TestEnsureCommands(t *testing.T) {
	base := []string{
		"ip link add swb3 type bridge",
		"ip addr replace 10.250.3.1/24 dev swb3",
		"ip link set dev swb3 up",
		"sysctl -q -w net.ipv4.ip_forward=1",
		"ip -j -4 addr show",
		"nft -f -",
		"iptables -w -S DOCKER-USER",
	}
	docker := func(rest ...string) []string { return append(slices.Clone(base), rest...) }
	for _, tc := range []struct {
		name    string
		rules   []rule
		want    []string
		wantErr string
	}{
		{name: "fresh host", want: base},
		{name: "bridge already there", rules: []rule{{prefix: "ip link add", err: failed("RTNETLINK answers: File exists")}}, want: base},
		{name: "not root", rules: []rule{{prefix: "ip link add", err: failed("RTNETLINK answers: Operation not permitted")}},
			want: base[:1], wantErr: "creating bridge swb3 for cluster c1: x: RTNETLINK answers: Operation not permitted: run as root (needs CAP_NET_ADMIN)"},
		{name: "no nft", rules: []rule{{prefix: "nft", err: &exec.Error{Name: "nft", Err: exec.ErrNotFound}}},
			want: base[:6], wantErr: "apt-get install nftables"},
		{name: "kernel lacks nat", rules: []rule{{prefix: "nft", err: failed("Error: Could not process rule: No such file or directory")}},
			want: base[:6], wantErr: "modprobe"},
		// The host's networks are walled off: no table without them.
		{name: "ip without JSON", rules: []rule{{prefix: "ip -j", err: failed(`Option "-j" is unknown, try "ip -help".`)}},
			want: base[:5], wantErr: "listing the host's addresses"},
		{name: "ip JSON unreadable", rules: []rule{{prefix: "ip -j", out: "{"}},
			want: base[:5], wantErr: "reading `ip -j -4 addr show`"},
		{name: "docker host", rules: []rule{{prefix: "iptables -w -S", out: "-N DOCKER-USER\n"}, {prefix: "iptables -w -C", err: failed("Bad rule")}, {prefix: "iptables -w -I"}},
			want: docker(
				"iptables -w -C DOCKER-USER -i swb3 -m comment --comment socialweb-3 -j ACCEPT",
				"iptables -w -I DOCKER-USER 1 -i swb3 -m comment --comment socialweb-3 -j ACCEPT",
				"iptables -w -C DOCKER-USER -o swb3 -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment socialweb-3 -j ACCEPT",
				"iptables -w -I DOCKER-USER 1 -o swb3 -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment socialweb-3 -j ACCEPT")},
		{name: "docker host, rules present", rules: []rule{{prefix: "iptables -w -S", out: "-N DOCKER-USER\n"}, {prefix: "iptables -w -C"}},
			want: docker(
				"iptables -w -C DOCKER-USER -i swb3 -m comment --comment socialweb-3 -j ACCEPT",
				"iptables -w -C DOCKER-USER -o swb3 -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment socialweb-3 -j ACCEPT")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder(tc.rules...)
			err := NewManager(r, nil).Ensure(context.Background(), "c1", plan(t, 3), testServed(), Narrowing{})
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Ensure: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Ensure error = %v, want one containing %q", err, tc.wantErr)
			}
			sameCalls(t, r.calls, tc.want)
			if slices.Contains(r.calls, "nft -f -") && r.stdin["nft -f -"] != Ruleset("c1", plan(t, 3), testServed(), EgressPolicy{}, sampleHostNets(t)) {
				t.Errorf("nft got script:\n%s", r.stdin["nft -f -"])
			}
		})
	}
	for _, bad := range []struct {
		name   string
		plan   Plan
		served Served
		egress EgressPolicy
	}{
		{"a plan not made by ForIndex", Plan{Index: 3}, testServed(), EgressPolicy{}},
		{"no apiserver port", plan(t, 3), Served{Registry: 5000}, EgressPolicy{}},
		{"a port past 65535", plan(t, 3), Served{APIServer: 70000}, EgressPolicy{}},
		{"a build cache port past 65535", plan(t, 3), Served{APIServer: 7501, BuildCache: 70000}, EgressPolicy{}},
		{"an egress mode ParseEgress refuses", plan(t, 3), testServed(), EgressPolicy{Mode: "lan"}},
		{"an IPv6 range", plan(t, 3), testServed(), EgressPolicy{Allow: []netip.Prefix{netip.MustParsePrefix("fd00::/8")}}},
		{"a range with host bits", plan(t, 3), testServed(), EgressPolicy{Deny: []netip.Prefix{netip.MustParsePrefix("10.1.2.3/8")}}},
	} {
		r := newRecorder()
		m := NewManager(r, nil)
		m.Egress = bad.egress
		if err := m.Ensure(context.Background(), "c1", bad.plan, bad.served, Narrowing{}); err == nil {
			t.Errorf("Ensure accepted %s", bad.name)
		}
		sameCalls(t, r.calls, nil) // refused before anything is made
	}
}

// testServed is a cluster's gateway services: its apiserver on its leased
// port and the registry.
func testServed() Served { return Served{APIServer: 7501, Registry: 5000} }

// sampleAddrs is `ip -j -4 addr show` on a host with a LAN, Docker, a
// cluster bridge and a /32 on a tunnel.
const sampleAddrs = `[{"ifindex":1,"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"],"mtu":65536,"addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8,"scope":"host","label":"lo"}]},` +
	`{"ifindex":4,"ifname":"eth0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],"mtu":1500,"addr_info":[{"family":"inet","local":"203.0.113.45","prefixlen":26,"broadcast":"203.0.113.63","scope":"global","label":"eth0"},{"family":"inet","local":"192.168.1.20","prefixlen":24,"scope":"global","secondary":true,"label":"eth0"}]},` +
	`{"ifindex":5,"ifname":"docker0","flags":["NO-CARRIER","BROADCAST","MULTICAST","UP"],"mtu":1500,"addr_info":[{"family":"inet","local":"172.17.0.1","prefixlen":16,"scope":"global","label":"docker0"}]},` +
	`{"ifindex":7,"ifname":"swb3","flags":["BROADCAST","MULTICAST","UP"],"mtu":1500,"addr_info":[{"family":"inet","local":"10.250.3.1","prefixlen":24,"scope":"global","label":"swb3"}]},` +
	`{"ifindex":9,"ifname":"wg0","flags":["POINTOPOINT","NOARP","UP","LOWER_UP"],"mtu":1420,"addr_info":[{"family":"inet","local":"198.18.7.1","prefixlen":32,"scope":"global","label":"wg0"}]},` +
	`{"ifindex":10,"ifname":"ens5","flags":["BROADCAST","MULTICAST"],"mtu":1500,"addr_info":[]}]
`

func sampleHostNets(t *testing.T) []netip.Prefix {
	t.Helper()
	nets, err := parseHostNetworks(sampleAddrs)
	if err != nil {
		t.Fatal(err)
	}
	return nets
}

func TestRuleset(t *testing.T) {
	want := `table inet socialweb-3
delete table inet socialweb-3
table inet socialweb-3 {
	comment "socialweb cluster team_a_prod network 3 (managed: edits are overwritten)"
	counter egress_denied {
		comment "forwarded packets from swb3 the egress policy refused"
	}
	counter host_denied {
		comment "packets from swb3 to the host on no port it serves the cluster"
	}
	set egress_deny {
		type ipv4_addr
		flags interval
	}
	set egress_allow {
		type ipv4_addr
		flags interval
	}
	set egress_walled {
		type ipv4_addr
		flags interval
		elements = { 0.0.0.0/8, 10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, 169.254.0.0/16, 172.16.0.0/12, 192.168.0.0/16, 198.18.7.1/32, 203.0.113.0/26, 224.0.0.0/4, 240.0.0.0/4 }
	}
	chain forward {
		type filter hook forward priority filter - 10; policy accept;
		iifname "swb3" meta nfproto ipv6 drop
		oifname "swb3" meta nfproto ipv6 drop
		iifname "swb3" ip saddr != { 10.250.3.0/24, 10.3.0.0/16 } counter name "egress_denied" drop
		iifname "swb3" oifname "swb3" accept
		iifname "swb3" oifname "swb*" counter name "egress_denied" drop
		oifname "swb3" iifname "swb*" drop
		iifname "swb3" ip daddr 10.251.0.0/16 meta l4proto tcp reject with tcp reset
		iifname "swb3" ip daddr 10.251.0.0/16 reject with icmpx admin-prohibited
		iifname "swb3" tcp flags & (syn | rst) == syn tcp option maxseg size set rt mtu
		iifname "swb3" ip daddr @egress_deny counter name "egress_denied" reject with icmpx admin-prohibited
		iifname "swb3" ip daddr @egress_allow accept
		iifname "swb3" ip daddr @egress_walled counter name "egress_denied" reject with icmpx admin-prohibited
		iifname "swb3" accept
		oifname "swb3" ct state established,related accept
		oifname "swb3" drop
	}
	chain input {
		type filter hook input priority filter - 10; policy accept;
		iifname != { "swb3", "lo" } ip daddr 10.250.3.1 drop
		iifname "swb3" meta nfproto ipv6 drop
		iifname "swb3" ct state established,related accept
		iifname "swb3" ip daddr 10.250.3.1 tcp dport { 53, 5000, 7501 } accept
		iifname "swb3" ip daddr 10.250.3.1 udp dport 53 accept
		iifname "swb3" ip daddr 10.250.3.1 icmp type { echo-request, destination-unreachable, time-exceeded, parameter-problem } accept
		iifname "swb3" meta pkttype { broadcast, multicast } drop
		iifname "swb3" counter name "host_denied" drop
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		oifname != "swb3" ip saddr { 10.250.3.0/24, 10.3.0.0/16 } ip daddr != { 10.250.3.0/24, 10.3.0.0/16, 10.251.0.0/16 } masquerade
	}
}
`
	// The cluster name lands in a quoted comment: quotes and the like must not.
	// The host's networks: the LAN's /24 and Docker's /16 lie in walled ranges
	// already, the public uplink's /26 and the tunnel's /32 are added, the
	// cluster bridge is not the host's network.
	if got := Ruleset(`team a"prod`, plan(t, 3), testServed(), EgressPolicy{}, sampleHostNets(t)); got != want {
		t.Errorf("ruleset:\n%s\nwant:\n%s", got, want)
	}
	// Every index's rules name only its own bridge and ranges.
	for i := 1; i <= MaxIndex; i++ {
		p := plan(t, i)
		rs := Ruleset("c", p, testServed(), EgressPolicy{}, nil)
		for _, must := range []string{`"` + BridgeName(i) + `"`, p.NodeCIDR.String(), p.PodCIDR.String(), "socialweb-" + itoa(i) + " {",
			"ip daddr " + p.Gateway.String() + " tcp dport"} {
			if !strings.Contains(rs, must) {
				t.Fatalf("index %d ruleset lacks %s", i, must)
			}
		}
		if strings.Count(rs, `"swb`) != strings.Count(rs, `"`+BridgeName(i)+`"`)+2 { // +2: the "swb*" wildcards
			t.Fatalf("index %d ruleset names another bridge:\n%s", i, rs)
		}
	}
}

// The policy variants change only the egress sets, the forward chain's last
// verdicts and the gateway's ports.
func TestRulesetPolicies(t *testing.T) {
	pfx := func(ss ...string) []netip.Prefix {
		var ps []netip.Prefix
		for _, s := range ss {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		return ps
	}
	const (
		deny   = `iifname "swb3" ip daddr @egress_deny counter name "egress_denied" reject with icmpx admin-prohibited`
		allow  = `iifname "swb3" ip daddr @egress_allow accept`
		walled = `iifname "swb3" ip daddr @egress_walled counter name "egress_denied" reject with icmpx admin-prohibited`
		open   = `iifname "swb3" accept`
		closed = `iifname "swb3" counter name "egress_denied" reject with icmpx admin-prohibited`
	)
	for _, tc := range []struct {
		name     string
		served   Served
		egress   EgressPolicy
		hostNets []netip.Prefix
		want     []string // lines, in this order
		wantNot  []string
	}{
		{name: "default: the internet", served: testServed(),
			want:    []string{deny, allow, walled, open, "tcp dport { 53, 5000, 7501 } accept", "udp dport 53 accept"},
			wantNot: []string{closed, "elements = { 192.168.5.0/24 }"}},
		{name: "internet said", served: testServed(), egress: EgressPolicy{Mode: EgressInternet},
			want: []string{deny, allow, walled, open}, wantNot: []string{closed}},
		{name: "none: nothing forwarded", served: testServed(), egress: EgressPolicy{Mode: EgressNone},
			want: []string{deny, allow, closed, "oifname \"swb3\" ct state established,related accept"}, wantNot: []string{walled, "\t\t" + open + "\n"}},
		{name: "none with an allowed registry", served: testServed(), egress: EgressPolicy{Mode: EgressNone, Allow: pfx("192.168.5.0/24")},
			want: []string{"set egress_allow {\n\t\ttype ipv4_addr\n\t\tflags interval\n\t\telements = { 192.168.5.0/24 }\n\t}", deny, allow, closed}},
		{name: "allow and deny, merged and sorted", served: testServed(),
			egress: EgressPolicy{Allow: pfx("192.168.5.0/24", "10.20.0.0/16", "10.20.3.0/24"), Deny: pfx("8.8.8.8/32", "1.1.1.0/24", "8.8.0.0/16")},
			want: []string{"set egress_deny {\n\t\ttype ipv4_addr\n\t\tflags interval\n\t\telements = { 1.1.1.0/24, 8.8.0.0/16 }",
				"set egress_allow {\n\t\ttype ipv4_addr\n\t\tflags interval\n\t\telements = { 10.20.0.0/16, 192.168.5.0/24 }", deny, allow, walled, open}},
		{name: "host networks walled beside the built-in ranges", served: testServed(), hostNets: pfx("192.0.2.0/24", "10.9.0.0/16", "198.51.100.7/32"),
			want: []string{"elements = { 0.0.0.0/8, 10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, 169.254.0.0/16, 172.16.0.0/12, 192.0.2.0/24, 192.168.0.0/16, 198.51.100.7/32, 224.0.0.0/4, 240.0.0.0/4 }"}},
		{name: "no registry", served: Served{APIServer: 7501},
			want: []string{"tcp dport { 53, 7501 } accept"}, wantNot: []string{"5000"}},
		{name: "an apiserver port below DNS's and the registry's, each once", served: Served{APIServer: 53, Registry: 5000},
			want: []string{"tcp dport { 53, 5000 } accept"}},
		{name: "the build cache beside the registry", served: Served{APIServer: 7501, Registry: 5000, BuildCache: 5001},
			want: []string{"tcp dport { 53, 5000, 5001, 7501 } accept"}},
		{name: "the build cache off", served: testServed(),
			want: []string{"tcp dport { 53, 5000, 7501 } accept"}, wantNot: []string{"5001"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := Ruleset("c1", plan(t, 3), tc.served, tc.egress, tc.hostNets)
			at := 0
			for _, w := range tc.want {
				i := strings.Index(rs[at:], w)
				if i < 0 {
					t.Fatalf("ruleset lacks (after byte %d) %q:\n%s", at, w, rs)
				}
				at += i + len(w)
			}
			for _, w := range tc.wantNot {
				if strings.Contains(rs, w) {
					t.Errorf("ruleset has %q:\n%s", w, rs)
				}
			}
			// Whatever the policy: the cluster's own traffic is accepted before any
			// egress verdict, and the host's input ends in the counted drop.
			if i, j := strings.Index(rs, `iifname "swb3" oifname "swb3" accept`), strings.Index(rs, deny); i < 0 || j < i {
				t.Errorf("own-bridge accept missing or after the egress verdicts:\n%s", rs)
			}
			if !strings.Contains(rs, "iifname \"swb3\" counter name \"host_denied\" drop\n\t}\n\tchain postrouting") {
				t.Errorf("input chain does not end in the counted drop:\n%s", rs)
			}
		})
	}
}

// A cluster narrows the host's policy: it closes more, and "none" takes even the host's
// allow list away; nothing a cluster says opens anything.
func TestNarrow(t *testing.T) {
	pfx := func(ss ...string) []netip.Prefix {
		var ps []netip.Prefix
		for _, s := range ss {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		return ps
	}
	host := EgressPolicy{Allow: pfx("192.168.5.0/24"), Deny: pfx("1.1.1.0/24"), HostTCP: []int{2222}}
	for _, tc := range []struct {
		name   string
		host   EgressPolicy
		narrow Narrowing
		want   EgressPolicy
	}{
		{"nothing narrowed is the host's", host, Narrowing{}, EgressPolicy{Allow: pfx("192.168.5.0/24"), Deny: pfx("1.1.1.0/24"), HostTCP: []int{2222}}},
		{"more denied", host, Narrowing{Deny: pfx("203.0.113.0/24")},
			EgressPolicy{Allow: pfx("192.168.5.0/24"), Deny: pfx("1.1.1.0/24", "203.0.113.0/24"), HostTCP: []int{2222}}},
		{"none drops the host's allow list", host, Narrowing{None: true},
			EgressPolicy{Mode: EgressNone, Deny: pfx("1.1.1.0/24"), HostTCP: []int{2222}}},
		{"a host at none stays none", EgressPolicy{Mode: EgressNone}, Narrowing{}, EgressPolicy{Mode: EgressNone}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.host.Narrow(tc.narrow)
			if got.mode() != tc.want.mode() || !slices.Equal(got.Allow, tc.want.Allow) || !slices.Equal(got.Deny, tc.want.Deny) || !slices.Equal(got.HostTCP, tc.want.HostTCP) {
				t.Errorf("Narrow = %+v, want %+v", got, tc.want)
			}
		})
	}
	// The host's own slices are not written through.
	before := slices.Clone(host.Deny)
	_ = host.Narrow(Narrowing{Deny: pfx("8.8.8.8/32")})
	if !slices.Equal(host.Deny, before) {
		t.Errorf("Narrow changed the host's deny list to %v", host.Deny)
	}
}

func TestParseEgress(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Egress
		err  string
	}{
		{"internet", EgressInternet, ""},
		{"none", EgressNone, ""},
		{"", EgressInternet, ""}, // the zero value is the default
		{" none", "", `" none": want internet`},
		{"Internet", "", "want internet"},
		{"lan", "", "or none"},
	} {
		got, err := ParseEgress(tc.in)
		if got != tc.want || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("ParseEgress(%q) = %q, %v; want %q, %q", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestParsePrefixes(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string // joined
		err  string
	}{
		{nil, "", ""},
		{[]string{"192.168.10.0/24", " 10.0.0.0/8"}, "192.168.10.0/24, 10.0.0.0/8", ""},
		{[]string{"203.0.113.9/32"}, "203.0.113.9/32", ""},
		{[]string{"0.0.0.0/0"}, "0.0.0.0/0", ""},
		{[]string{"10.1.2.3/8"}, "", `"10.1.2.3/8" has bits set past its length: want 10.0.0.0/8`},
		{[]string{"10.1.2.3"}, "", `"10.1.2.3" has no length: want 10.1.2.3/32`},
		{[]string{"fd00::/8"}, "", "IPv4 only"},
		{[]string{"10.0.0.0/33"}, "", "not a CIDR: want ADDRESS/BITS"},
		{[]string{"registry.lan"}, "", "not a CIDR"},
		{[]string{"10.0.0.0/8", ""}, "", "an empty entry"},
	} {
		got, err := ParsePrefixes(tc.in)
		if (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) || err == nil && joinPrefixes(got) != tc.want {
			t.Errorf("ParsePrefixes(%q) = %v, %v; want %q, %q", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestParseHostNetworks(t *testing.T) {
	got := joinPrefixes(sampleHostNets(t))
	// Sorted, each subnet once, the cluster bridge left out.
	if want := "127.0.0.0/8, 172.17.0.0/16, 192.168.1.0/24, 198.18.7.1/32, 203.0.113.0/26"; got != want {
		t.Errorf("host networks %s, want %s", got, want)
	}
	for _, bad := range []string{"", "{", `[{"ifname":"eth0","addr_info":[{"family":"inet","local":"192.0.2.1","prefixlen":40}]}]`} {
		if _, err := parseHostNetworks(bad); err == nil {
			t.Errorf("parseHostNetworks(%q) accepted", bad)
		}
	}
	r := newRecorder(rule{prefix: "ip -j", err: &exec.Error{Name: "ip", Err: exec.ErrNotFound}})
	if _, err := NewManager(r, nil).HostNetworks(context.Background()); err == nil || !strings.Contains(err.Error(), "iproute2") {
		t.Errorf("HostNetworks without ip: %v", err)
	}
}

func TestDeniedCounters(t *testing.T) {
	out := `{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
{"counter": {"family": "inet", "name": "egress_denied", "table": "socialweb-3", "handle": 4, "packets": 7, "bytes": 420}},
{"counter": {"family": "inet", "name": "host_denied", "table": "socialweb-3", "handle": 5, "packets": 2, "bytes": 120}},
{"counter": {"family": "inet", "name": "egress_denied", "table": "socialweb-31", "handle": 4, "packets": 0, "bytes": 0}},
{"counter": {"family": "inet", "name": "other", "table": "socialweb-3", "handle": 6, "packets": 9, "bytes": 9}},
{"counter": {"family": "ip", "name": "egress_denied", "table": "socialweb-4", "handle": 1, "packets": 9, "bytes": 9}},
{"counter": {"family": "inet", "name": "egress_denied", "table": "filter", "handle": 1, "packets": 9, "bytes": 9}}]}`
	r := newRecorder(rule{prefix: "nft -j list counters", out: out})
	m := NewManager(r, nil)
	got, err := m.DeniedCounters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]map[string]uint64{3: {"egress": 7, "host": 2}, 31: {"egress": 0}}
	if len(got) != len(want) || got[3]["egress"] != 7 || got[3]["host"] != 2 || len(got[3]) != 2 || len(got[31]) != 1 {
		t.Errorf("counters %v, want %v", got, want)
	}
	sameCalls(t, r.calls, []string{"nft -j list counters"})

	// The metrics name only clusters this Manager ensured.
	if err := m.Ensure(context.Background(), "c1", plan(t, 3), testServed(), Narrowing{}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m.Collector())
	const wantText = `
# HELP socialweb_node_network_denied_packets_total Packets from a cluster's bridge its walls refused: wall=host (to the host, on no port it serves the cluster) or wall=egress (forwarded, where the egress policy does not let them go). Reset when the cluster's network is ensured again (each start of its control plane).
# TYPE socialweb_node_network_denied_packets_total counter
socialweb_node_network_denied_packets_total{cluster="c1",wall="egress"} 7
socialweb_node_network_denied_packets_total{cluster="c1",wall="host"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(wantText)); err != nil {
		t.Error(err)
	}
	// Removed: no longer reported. A failing nft fails no scrape.
	if err := m.Remove(context.Background(), "c1", plan(t, 3)); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Errorf("after Remove: %d metrics, %v", n, err)
	}
	r = newRecorder(rule{prefix: "nft -j", err: failed("Error: Could not process rule: Operation not permitted")})
	m = NewManager(r, nil)
	if err := m.Ensure(context.Background(), "c1", plan(t, 3), testServed(), Narrowing{}); err != nil {
		t.Fatal(err)
	}
	reg = prometheus.NewPedanticRegistry()
	reg.MustRegister(m.Collector())
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Errorf("with nft failing: %d metrics, %v", n, err)
	}
}

func itoa(i int) string { return BridgeName(i)[len(bridgePrefix):] }

func TestAddTapCommands(t *testing.T) {
	name := TapName(3, "c1", "node-a")
	for _, tc := range []struct {
		name    string
		rules   []rule
		want    []string
		wantErr string
	}{
		{name: "fresh", want: []string{
			"ip tuntap add dev " + name + " mode tap",
			"ip link set dev " + name + " master swb3 up"}},
		{name: "tap already there", rules: []rule{{prefix: "ip tuntap", err: failed("ioctl(TUNSETIFF): Device or resource busy")}},
			want: []string{
				"ip tuntap add dev " + name + " mode tap",
				"ip -o link show dev " + name,
				"ip link set dev " + name + " master swb3 up"}},
		{name: "no tun", rules: []rule{
			{prefix: "ip tuntap", err: failed("open: No such file or directory\nFailed to open /dev/net/tun")},
			{prefix: "ip -o link show", err: failed(`Device "` + name + `" does not exist.`)}},
			want: []string{
				"ip tuntap add dev " + name + " mode tap",
				"ip -o link show dev " + name}, wantErr: "modprobe tun"},
		{name: "no bridge", rules: []rule{{prefix: "ip link set", err: failed("Cannot find device \"swb3\"")}},
			want: []string{
				"ip tuntap add dev " + name + " mode tap",
				"ip link set dev " + name + " master swb3 up"}, wantErr: "run Ensure for cluster c1 first"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder(tc.rules...)
			tap, err := NewManager(r, nil).AddTap(context.Background(), "c1", plan(t, 3), "node-a")
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("AddTap: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("AddTap error = %v, want one containing %q", err, tc.wantErr)
			}
			sameCalls(t, r.calls, tc.want)
			if err == nil && (tap.Name != name || tap.Bridge != "swb3" || tap.MAC.String() != NodeMAC("c1", "node-a").String()) {
				t.Errorf("tap = %+v", tap)
			}
		})
	}
}

func TestRemoveTap(t *testing.T) {
	name := TapName(3, "c1", "node-a")
	r := newRecorder(rule{prefix: "ip link del", err: failed(`Cannot find device "` + name + `"`)})
	m := NewManager(r, nil)
	if err := m.RemoveTap(context.Background(), name); err != nil {
		t.Errorf("removing a missing tap: %v", err)
	}
	pool := PoolTapName(testOwner, "pool-0")
	if err := m.RemoveTap(context.Background(), pool); err != nil {
		t.Errorf("removing a missing pool tap: %v", err)
	}
	// An older daemon's pool tap name (no owner), named by its VM's record.
	if err := m.RemoveTap(context.Background(), "swp-0a1b2c3d"); err != nil {
		t.Errorf("removing a legacy pool tap: %v", err)
	}
	for _, foreign := range []string{"eth0", "swb3", "docker0", "swt3-xyz", "swp-xyz", "swp-0a1b2c3d4", "swp0a1b2c3d", "swp-0A1B2C3D", "swp0a1b-c3d4e5", "swp0A1B-c3d4e5f", "swp0a1b2-c3d4e5"} {
		if err := m.RemoveTap(context.Background(), foreign); err == nil {
			t.Errorf("RemoveTap(%q) accepted a name that is not a socialweb tap", foreign)
		}
	}
	sameCalls(t, r.calls, []string{"ip link del dev " + name, "ip link del dev " + pool, "ip link del dev swp-0a1b2c3d"})
	r = newRecorder(rule{prefix: "ip link del", err: failed("RTNETLINK answers: Operation not permitted")})
	if err := NewManager(r, nil).RemoveTap(context.Background(), name); err == nil || !strings.Contains(err.Error(), "run as root") {
		t.Errorf("RemoveTap as non-root: %v", err)
	}
}

func TestAddPoolTapCommands(t *testing.T) {
	name := PoolTapName(testOwner, "pool-0")
	for _, tc := range []struct {
		name    string
		rules   []rule
		want    []string
		wantErr string
	}{
		{name: "fresh", want: []string{"ip tuntap add dev " + name + " mode tap"}},
		{name: "tap already there", rules: []rule{{prefix: "ip tuntap", err: failed("ioctl(TUNSETIFF): Device or resource busy")}},
			want: []string{
				"ip tuntap add dev " + name + " mode tap",
				"ip -o link show dev " + name}},
		{name: "no tun", rules: []rule{
			{prefix: "ip tuntap", err: failed("open: No such file or directory\nFailed to open /dev/net/tun")},
			{prefix: "ip -o link show", err: failed(`Device "` + name + `" does not exist.`)}},
			want: []string{
				"ip tuntap add dev " + name + " mode tap",
				"ip -o link show dev " + name}, wantErr: "modprobe tun"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder(tc.rules...)
			tap, err := NewManager(r, nil).AddPoolTap(context.Background(), testOwner, "pool-0")
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("AddPoolTap: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("AddPoolTap error = %v, want one containing %q", err, tc.wantErr)
			}
			// Down and on no bridge: nothing but the tap's creation.
			sameCalls(t, r.calls, tc.want)
			if err == nil && (tap.Name != name || tap.Bridge != "" || tap.MAC.String() != PoolMAC("pool-0").String()) {
				t.Errorf("tap = %+v", tap)
			}
		})
	}
	if _, err := NewManager(newRecorder(), nil).AddPoolTap(context.Background(), testOwner, ""); err == nil {
		t.Error("AddPoolTap accepted an empty VM name")
	}
	for _, owner := range []string{"", "0a1", "0a1b2", "0A1B", "0a1-"} {
		r := newRecorder()
		if _, err := NewManager(r, nil).AddPoolTap(context.Background(), owner, "pool-0"); err == nil || !strings.Contains(err.Error(), "PoolTapOwner") {
			t.Errorf("AddPoolTap with owner %q: %v, want an error naming PoolTapOwner", owner, err)
		}
		sameCalls(t, r.calls, nil)
	}
}

func TestClaimTapCommands(t *testing.T) {
	pool, name := PoolTapName(testOwner, "pool-0"), TapName(3, "c1", "node-a")
	rename := "ip link set dev " + pool + " name " + name
	attach := "ip link set dev " + name + " master swb3"
	up := "ip link set dev " + name + " up"
	for _, tc := range []struct {
		name    string
		poolTap string
		plan    Plan
		rules   []rule
		want    []string
		wantErr string
	}{
		// Rename first: Linux refuses to rename an interface that is up.
		{name: "claimed", want: []string{rename, attach, up}},
		{name: "retried after the rename", rules: []rule{{prefix: rename, err: failed(`Cannot find device "` + pool + `"`)}},
			want: []string{rename, "ip -o link show dev " + name, attach, up}},
		{name: "pool tap gone", rules: []rule{
			{prefix: rename, err: failed(`Cannot find device "` + pool + `"`)},
			{prefix: "ip -o link show", err: failed(`Device "` + name + `" does not exist.`)}},
			want: []string{rename, "ip -o link show dev " + name}, wantErr: "destroy that VM and claim another"},
		{name: "pool tap up", rules: []rule{{prefix: rename, err: failed("RTNETLINK answers: Device or resource busy")}},
			want: []string{rename}, wantErr: "set it down (ip link set dev " + pool + " down)"},
		{name: "node's tap exists", rules: []rule{{prefix: rename, err: failed("RTNETLINK answers: File exists")}},
			want: []string{rename}, wantErr: "remove it (RemoveTap)"},
		{name: "no bridge", rules: []rule{{prefix: attach, err: failed(`Cannot find device "swb3"`)}},
			want: []string{rename, attach}, wantErr: "run Ensure for cluster c1 first"},
		{name: "not root", rules: []rule{{prefix: rename, err: failed("RTNETLINK answers: Operation not permitted")}},
			want: []string{rename}, wantErr: "run as root"},
		{name: "not a pool tap", poolTap: "swt3-0a1b2c3d", wantErr: "not a pool tap name"},
		{name: "plan not from ForIndex", plan: Plan{Index: 3}, wantErr: "build it with nodenet.ForIndex"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder(tc.rules...)
			p, pt := tc.plan, tc.poolTap
			if p.Index == 0 {
				p = plan(t, 3)
			}
			if pt == "" {
				pt = pool
			}
			tap, err := NewManager(r, nil).ClaimTap(context.Background(), pt, "c1", p, "node-a")
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("ClaimTap: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("ClaimTap error = %v, want one containing %q", err, tc.wantErr)
			}
			sameCalls(t, r.calls, tc.want)
			if err == nil && (tap.Name != name || tap.Bridge != "swb3" || tap.MAC != nil) {
				t.Errorf("tap = %+v, want %s on swb3 without a MAC (the VM keeps its pool MAC)", tap, name)
			}
		})
	}
}

func TestPoolTaps(t *testing.T) {
	other := PoolTapOwner("/var/lib/another-daemon")
	links := sampleLinks + `13: ` + PoolTapName(testOwner, "pool-a") + `: <BROADCAST,MULTICAST> mtu 1500 qdisc noop state DOWN mode DEFAULT group default qlen 1000\    link/ether 1a:2b:3c:4d:5e:63 brd ff:ff:ff:ff:ff:ff
14: ` + PoolTapName(testOwner, "pool-b") + `: <BROADCAST,MULTICAST> mtu 1500 qdisc noop state DOWN mode DEFAULT group default qlen 1000\    link/ether 1a:2b:3c:4d:5e:64 brd ff:ff:ff:ff:ff:ff
15: swp-other: <BROADCAST,MULTICAST> mtu 1500 qdisc noop state DOWN mode DEFAULT group default qlen 1000\    link/ether 1a:2b:3c:4d:5e:65 brd ff:ff:ff:ff:ff:ff
16: ` + PoolTapName(other, "pool-c") + `: <BROADCAST,MULTICAST> mtu 1500 qdisc noop state DOWN mode DEFAULT group default qlen 1000\    link/ether 1a:2b:3c:4d:5e:66 brd ff:ff:ff:ff:ff:ff
17: swp-deadbeef: <BROADCAST,MULTICAST> mtu 1500 qdisc noop state DOWN mode DEFAULT group default qlen 1000\    link/ether 1a:2b:3c:4d:5e:67 brd ff:ff:ff:ff:ff:ff
`
	for _, tc := range []struct {
		owner string
		want  []string
	}{
		// Only the owner's: another daemon's, and an older daemon's without an owner, are
		// not this one's to remove.
		{testOwner, []string{PoolTapName(testOwner, "pool-a"), PoolTapName(testOwner, "pool-b")}},
		{other, []string{PoolTapName(other, "pool-c")}},
		{PoolTapOwner("/nowhere"), nil},
	} {
		r := newRecorder(rule{prefix: "ip -o link show", out: links})
		got, err := NewManager(r, nil).PoolTaps(context.Background(), tc.owner)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("PoolTaps(%s) = %q, want %q", tc.owner, got, tc.want)
		}
		sameCalls(t, r.calls, []string{"ip -o link show"})
	}
	r := newRecorder(rule{prefix: "ip -o link show", err: &exec.Error{Name: "ip", Err: exec.ErrNotFound}})
	if _, err := NewManager(r, nil).PoolTaps(context.Background(), testOwner); err == nil || !strings.Contains(err.Error(), "iproute2") {
		t.Errorf("PoolTaps without ip: %v", err)
	}
	if _, err := NewManager(newRecorder(), nil).PoolTaps(context.Background(), "swp"); err == nil {
		t.Error("PoolTaps accepted an owner that PoolTapOwner never returns")
	}
}

const sampleLinks = `1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen 1000\    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00
4: eth0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1400 qdisc pfifo_fast state UP mode DEFAULT group default qlen 1000\    link/ether 02:fc:00:00:00:01 brd ff:ff:ff:ff:ff:ff
7: swb3: <NO-CARRIER,BROADCAST,MULTICAST,UP> mtu 1500 qdisc noqueue state DOWN mode DEFAULT group default qlen 1000\    link/ether 6a:1b:2c:3d:4e:5f brd ff:ff:ff:ff:ff:ff
8: swt3-0a1b2c3d: <BROADCAST,MULTICAST,UP> mtu 1500 qdisc fq_codel master swb3 state DOWN mode DEFAULT group default qlen 1000\    link/ether 1a:2b:3c:4d:5e:6f brd ff:ff:ff:ff:ff:ff
9: swt3-deadbeef: <BROADCAST,MULTICAST> mtu 1500 qdisc noop state DOWN mode DEFAULT group default qlen 1000\    link/ether 1a:2b:3c:4d:5e:60 brd ff:ff:ff:ff:ff:ff
10: swb31: <BROADCAST,MULTICAST,UP> mtu 1500 qdisc noqueue state DOWN mode DEFAULT group default qlen 1000\    link/ether 6a:1b:2c:3d:4e:50 brd ff:ff:ff:ff:ff:ff
11: swt31-0a1b2c3d: <BROADCAST,MULTICAST,UP> mtu 1500 qdisc fq_codel master swb31 state DOWN mode DEFAULT group default qlen 1000\    link/ether 1a:2b:3c:4d:5e:61 brd ff:ff:ff:ff:ff:ff
12: veth9@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue master swb3 state UP mode DEFAULT group default qlen 1000\    link/ether 1a:2b:3c:4d:5e:62 brd ff:ff:ff:ff:ff:ff link-netnsid 0
`

func TestRemoveCommands(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rules []rule
		want  []string
	}{
		{name: "present", rules: []rule{{prefix: "ip -o link show", out: sampleLinks}}, want: []string{
			"ip -o link show",
			"ip link del dev swt3-0a1b2c3d",
			"ip link del dev swt3-deadbeef", // not attached: found by name
			"ip link del dev swb3",          // routes through it go with it
			"nft -f -",
			"iptables -w -S DOCKER-USER",
		}},
		{name: "already gone", rules: []rule{{prefix: "ip link del", err: failed(`Cannot find device "swb3"`)}}, want: []string{
			"ip -o link show",
			"ip link del dev swb3",
			"nft -f -",
			"iptables -w -S DOCKER-USER",
		}},
		{name: "docker host", rules: []rule{
			{prefix: "iptables -w -S", out: "-N DOCKER-USER\n"},
			{prefix: "iptables -w -D DOCKER-USER -o", err: failed("Bad rule")},                        // never added
			{prefix: "iptables -w -D DOCKER-USER -i swb3 -m comment --comment socialweb-3 -j ACCEPT"}, // added twice by hand
		}, want: []string{
			"ip -o link show",
			"ip link del dev swb3",
			"nft -f -",
			"iptables -w -S DOCKER-USER",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder(tc.rules...)
			if err := NewManager(r, nil).Remove(context.Background(), "c1", plan(t, 3)); err != nil {
				t.Fatalf("Remove: %v", err)
			}
			if tc.name == "docker host" {
				// deletes the -i rule until iptables says it is gone: here it never does, so the cap (8) ends it
				n := 0
				for _, c := range r.calls {
					if strings.HasPrefix(c, "iptables -w -D DOCKER-USER -i swb3") {
						n++
					}
				}
				if n != 8 || !slices.Contains(r.calls, "iptables -w -D DOCKER-USER -o swb3 -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment socialweb-3 -j ACCEPT") {
					t.Errorf("DOCKER-USER deletes: %q", r.calls)
				}
				r.calls = slices.DeleteFunc(r.calls, func(c string) bool { return strings.HasPrefix(c, "iptables -w -D") })
			}
			sameCalls(t, r.calls, tc.want)
			if got, want := r.stdin["nft -f -"], "table inet socialweb-3\ndelete table inet socialweb-3\n"; got != want {
				t.Errorf("nft script %q, want %q", got, want)
			}
		})
	}
}

func TestList(t *testing.T) {
	r := newRecorder(
		rule{prefix: "ip -o link show", out: sampleLinks},
		rule{prefix: "ip route show", out: "default via 192.0.2.1 dev eth0\n" +
			"10.250.3.0/24 dev swb3 proto kernel scope link src 10.250.3.1 linkdown\n" +
			"10.3.2.0/24 via 10.250.3.12 dev swb3\n" +
			"10.9.0.0/24 via 10.250.3.13 dev swb3x\n"},
		rule{prefix: "nft list tables", out: "table ip filter\ntable inet socialweb-3\ntable inet socialweb-31\ntable ip socialweb-4\ntable inet socialweb-test\n"},
	)
	o, err := NewManager(r, nil).List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, got, want []string) {
		if !slices.Equal(got, want) {
			t.Errorf("%s = %q, want %q", what, got, want)
		}
	}
	check("bridges", o.Bridges, []string{"swb3", "swb31"})
	check("taps", o.Taps, []string{"swt3-0a1b2c3d", "swt3-deadbeef", "swt31-0a1b2c3d"})
	check("routes", o.Routes, []string{"10.3.2.0/24 via 10.250.3.12 dev swb3"})
	check("tables", o.Tables, []string{"inet socialweb-3", "inet socialweb-31"})
	if got := o.Indexes(); !slices.Equal(got, []int{3, 31}) {
		t.Errorf("indexes = %v", got)
	}
	if o.Empty() || !(Owned{}).Empty() {
		t.Error("Empty is wrong")
	}
}

func TestPodRoutes(t *testing.T) {
	r := newRecorder(rule{prefix: "ip route del", err: failed("RTNETLINK answers: No such process")})
	m := NewManager(r, nil)
	ctx := context.Background()
	p := plan(t, 3)
	node := net.ParseIP("10.250.3.12")
	if err := m.AddPodRoute(ctx, p, "10.3.2.0/24", node); err != nil {
		t.Fatal(err)
	}
	if err := m.RemovePodRoute(ctx, p, "10.3.2.0/24", node); err != nil {
		t.Errorf("removing a missing route: %v", err)
	}
	sameCalls(t, r.calls, []string{
		"ip route replace 10.3.2.0/24 via 10.250.3.12 dev swb3",
		"ip route del 10.3.2.0/24 via 10.250.3.12 dev swb3",
	})
	for _, bad := range []struct {
		cidr string
		node string
	}{
		{"10.4.2.0/24", "10.250.3.12"}, // another cluster's pods
		{"10.3.2.5/24", "10.250.3.12"}, // not a network address
		{"10.0.0.0/8", "10.250.3.12"},  // wider than the pod range
		{"10.3.2.0/24", "10.250.4.12"}, // another cluster's node
		{"10.3.2.0/24", "10.250.3.1"},  // the gateway
		{"fd00::/64", "10.250.3.12"},
	} {
		if err := m.AddPodRoute(ctx, p, bad.cidr, net.ParseIP(bad.node)); err == nil {
			t.Errorf("AddPodRoute(%s via %s) accepted", bad.cidr, bad.node)
		}
	}
	r = newRecorder(rule{prefix: "ip route replace", err: failed(`Cannot find device "swb3"`)})
	if err := NewManager(r, nil).AddPodRoute(ctx, p, "10.3.2.0/24", node); err == nil || !strings.Contains(err.Error(), "run Ensure") {
		t.Errorf("AddPodRoute without bridge: %v", err)
	}
}

func TestParsePodRoutes(t *testing.T) {
	plan, err := ForIndex(3)
	if err != nil {
		t.Fatal(err)
	}
	out := "10.3.0.0/24 via 10.250.3.2 \n10.3.1.0/24 via 10.250.3.3 proto static\n10.250.3.0/24 proto kernel scope link src 10.250.3.1 \n10.9.0.0/24 via 10.250.3.4\n"
	got := parsePodRoutes(out, plan)
	if len(got) != 2 || !got["10.3.0.0/24"].Equal(net.ParseIP("10.250.3.2")) || !got["10.3.1.0/24"].Equal(net.ParseIP("10.250.3.3")) {
		t.Errorf("parsePodRoutes = %v, want the two routes inside 10.3.0.0/16", got)
	}
}
