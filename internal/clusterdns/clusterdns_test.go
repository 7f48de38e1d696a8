package clusterdns

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sfake "k8s.io/client-go/kubernetes/fake"

	"github.com/socialweb-computer/socialweb/internal/dnswire"
	"github.com/socialweb-computer/socialweb/internal/livetest"
)

func svc(ns, name, clusterIP string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{ClusterIP: clusterIP, Ports: ports}}
}

func port(name string, proto corev1.Protocol, number int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: number}
}

func external(ns, name, target string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: target}}
}

func slice(ns, svcName string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: svcName + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps,
	}
}

func withPorts(es *discoveryv1.EndpointSlice, name string, proto corev1.Protocol, number int32) *discoveryv1.EndpointSlice {
	es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: &name, Protocol: &proto, Port: &number})
	return es
}

func ep(ip, hostname string, ready bool) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}
	if hostname != "" {
		e.Hostname = &hostname
	}
	return e
}

// fixture is a small cluster with one Service of each kind.
func fixture() ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	dual := svc("default", "web6", "10.251.3.6")
	dual.Spec.ClusterIPs = []string{"10.251.3.6", "fd00::6"}
	unready := svc("ci", "unready", corev1.ClusterIPNone)
	unready.Spec.PublishNotReadyAddresses = true
	return []*corev1.Service{
			svc("default", "web", "10.251.3.4", port("http", corev1.ProtocolTCP, 80), port("", corev1.ProtocolTCP, 8080), port("dns", corev1.ProtocolUDP, 53)),
			dual,
			svc("ci", "db", corev1.ClusterIPNone, port("pg", corev1.ProtocolTCP, 15432)),
			svc("ci", "empty", corev1.ClusterIPNone),
			unready,
			external("default", "ext", "example.com"),
			external("default", "alias", "web.default.svc.cluster.local"),
			external("default", "dangling", "host.nx.example"),
		}, []*discoveryv1.EndpointSlice{
			withPorts(slice("ci", "db", ep("10.1.0.5", "db-0", true), ep("10.1.1.6", "db-1", true), ep("10.1.2.7", "db-2", false), ep("10.1.0.8", "", true)),
				"pg", corev1.ProtocolTCP, 5432), // the endpoint's port, not the Service's, for a headless Service
			slice("default", "web", ep("10.1.0.9", "", true)),
			slice("ci", "unready", ep("10.1.3.3", "", false)),
			slice("ci", "orphan", ep("10.1.4.4", "x", true)), // no such Service
		}
}

// upstream is a stand-in for the gateway's resolver on loopback: A 192.0.2.1, AAAA
// 2001:db8::1 and PTR upstream.example. for every name, NXDOMAIN under nx.example.
func upstream(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var m dnsmessage.Message
			if m.Unpack(buf[:n]) != nil || len(m.Questions) != 1 {
				continue
			}
			q := m.Questions[0]
			m.Header.Response, m.Additionals = true, nil
			h := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}
			switch {
			case strings.HasSuffix(q.Name.String(), "nx.example."):
				m.Header.RCode = dnsmessage.RCodeNameError
			case q.Type == dnsmessage.TypeA:
				m.Answers = []dnsmessage.Resource{{Header: h, Body: &dnsmessage.AResource{A: [4]byte{192, 0, 2, 1}}}}
			case q.Type == dnsmessage.TypeAAAA:
				m.Answers = []dnsmessage.Resource{{Header: h, Body: &dnsmessage.AAAAResource{AAAA: netip.MustParseAddr("2001:db8::1").As16()}}}
			case q.Type == dnsmessage.TypePTR:
				m.Answers = []dnsmessage.Resource{{Header: h, Body: &dnsmessage.PTRResource{PTR: dnsmessage.MustNewName("upstream.example.")}}}
			}
			out, _ := m.Pack()
			_, _ = pc.WriteTo(out, from)
		}
	}()
	return pc.LocalAddr().String()
}

// query is a query message for name and type, with an EDNS0 OPT record advertising
// ednsSize unless it is 0.
func query(t testing.TB, name string, typ dnsmessage.Type, ednsSize int) []byte {
	t.Helper()
	m := dnsmessage.Message{Header: dnsmessage.Header{ID: 42, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}}}
	if ednsSize > 0 {
		var h dnsmessage.ResourceHeader
		_ = h.SetEDNS0(ednsSize, dnsmessage.RCodeSuccess, false)
		m.Additionals = []dnsmessage.Resource{{Header: h, Body: &dnsmessage.OPTResource{}}}
	}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rrs renders a section as "owner TTL TYPE data" lines; OPT records are left out.
func rrs(section []dnsmessage.Resource) []string {
	var out []string
	for _, r := range section {
		var data string
		switch b := r.Body.(type) {
		case *dnsmessage.AResource:
			data = "A " + netip.AddrFrom4(b.A).String()
		case *dnsmessage.AAAAResource:
			data = "AAAA " + netip.AddrFrom16(b.AAAA).String()
		case *dnsmessage.CNAMEResource:
			data = "CNAME " + b.CNAME.String()
		case *dnsmessage.PTRResource:
			data = "PTR " + b.PTR.String()
		case *dnsmessage.SRVResource:
			data = fmt.Sprintf("SRV %d %d %d %s", b.Priority, b.Weight, b.Port, b.Target)
		case *dnsmessage.TXTResource:
			data = "TXT " + strings.Join(b.TXT, " ")
		case *dnsmessage.SOAResource:
			data = fmt.Sprintf("SOA %s %s %d", b.NS, b.MBox, b.MinTTL)
		case *dnsmessage.OPTResource:
			continue
		default:
			data = r.Header.Type.String()
		}
		out = append(out, fmt.Sprintf("%s %d %s", r.Header.Name, r.Header.TTL, data))
	}
	return out
}

const soa = "cluster.local. 5 SOA ns.dns.cluster.local. hostmaster.cluster.local. 5"

// TestAnswers: every record kind of the specification, the negative answers (NXDOMAIN
// against NODATA, with the SOA for the TTL), ExternalName CNAMEs chased in the zone and
// through the upstream, and the names that are forwarded.
func TestAnswers(t *testing.T) {
	services, endpointSlices := fixture()
	s := &Server{Upstream: upstream(t), Domain: "cluster.local"}
	s.SetTable(Build("cluster.local", services, endpointSlices))
	const (
		A, AAAA, SRV, PTR, CNAME, TXT = dnsmessage.TypeA, dnsmessage.TypeAAAA, dnsmessage.TypeSRV, dnsmessage.TypePTR, dnsmessage.TypeCNAME, dnsmessage.TypeTXT
		ok, nx                        = dnsmessage.RCodeSuccess, dnsmessage.RCodeNameError
	)
	for _, tc := range []struct {
		name        string
		typ         dnsmessage.Type
		rcode       dnsmessage.RCode
		answers     []string
		authorities []string // the SOA of negative answers
		additionals []string
		notAuth     bool // forwarded: the upstream's answer as it came
	}{
		// 2.2 schema version
		{name: "dns-version.cluster.local.", typ: TXT, rcode: ok, answers: []string{"dns-version.cluster.local. 5 TXT 1.1.0"}},
		// 2.3.1 ClusterIP A/AAAA, case-insensitive, the owner as asked
		{name: "web.default.svc.cluster.local.", typ: A, rcode: ok, answers: []string{"web.default.svc.cluster.local. 5 A 10.251.3.4"}},
		{name: "WEB.Default.svc.Cluster.Local.", typ: A, rcode: ok, answers: []string{"WEB.Default.svc.Cluster.Local. 5 A 10.251.3.4"}},
		{name: "web.default.svc.cluster.local.", typ: AAAA, rcode: ok, authorities: []string{soa}}, // NODATA
		{name: "web6.default.svc.cluster.local.", typ: AAAA, rcode: ok, answers: []string{"web6.default.svc.cluster.local. 5 AAAA fd00::6"}},
		{name: "web6.default.svc.cluster.local.", typ: A, rcode: ok, answers: []string{"web6.default.svc.cluster.local. 5 A 10.251.3.6"}},
		{name: "nope.default.svc.cluster.local.", typ: A, rcode: nx, authorities: []string{soa}},
		// 2.3.2 SRV per named port (unnamed ports have none), the address as additional
		{name: "_http._tcp.web.default.svc.cluster.local.", typ: SRV, rcode: ok,
			answers:     []string{"_http._tcp.web.default.svc.cluster.local. 5 SRV 0 100 80 web.default.svc.cluster.local."},
			additionals: []string{"web.default.svc.cluster.local. 5 A 10.251.3.4"}},
		{name: "_dns._udp.web.default.svc.cluster.local.", typ: SRV, rcode: ok,
			answers:     []string{"_dns._udp.web.default.svc.cluster.local. 5 SRV 0 100 53 web.default.svc.cluster.local."},
			additionals: []string{"web.default.svc.cluster.local. 5 A 10.251.3.4"}},
		{name: "_http._udp.web.default.svc.cluster.local.", typ: SRV, rcode: nx, authorities: []string{soa}},
		{name: "_tcp.web.default.svc.cluster.local.", typ: SRV, rcode: ok, authorities: []string{soa}}, // empty non-terminal
		{name: "_http._tcp.web.default.svc.cluster.local.", typ: A, rcode: ok, authorities: []string{soa}},
		// 2.3.3 PTR of ClusterIPs (IPv4 and IPv6) and of endpoint addresses
		{name: "4.3.251.10.in-addr.arpa.", typ: PTR, rcode: ok, answers: []string{"4.3.251.10.in-addr.arpa. 5 PTR web.default.svc.cluster.local."}},
		{name: "6.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.", typ: PTR, rcode: ok,
			answers: []string{"6.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa. 5 PTR web6.default.svc.cluster.local."}},
		{name: "9.0.1.10.in-addr.arpa.", typ: PTR, rcode: ok, answers: []string{"9.0.1.10.in-addr.arpa. 5 PTR 10-1-0-9.web.default.svc.cluster.local."}},
		{name: "5.0.1.10.in-addr.arpa.", typ: PTR, rcode: ok, answers: []string{"5.0.1.10.in-addr.arpa. 5 PTR db-0.db.ci.svc.cluster.local."}},
		{name: "4.3.251.10.in-addr.arpa.", typ: A, rcode: ok}, // NODATA; not our zone to give a SOA for
		// 2.4.1 headless: every ready endpoint, each by its hostname (or dashed address)
		{name: "db.ci.svc.cluster.local.", typ: A, rcode: ok, answers: []string{
			"db.ci.svc.cluster.local. 5 A 10.1.0.5", "db.ci.svc.cluster.local. 5 A 10.1.1.6", "db.ci.svc.cluster.local. 5 A 10.1.0.8"}},
		{name: "db-1.db.ci.svc.cluster.local.", typ: A, rcode: ok, answers: []string{"db-1.db.ci.svc.cluster.local. 5 A 10.1.1.6"}},
		{name: "10-1-0-8.db.ci.svc.cluster.local.", typ: A, rcode: ok, answers: []string{"10-1-0-8.db.ci.svc.cluster.local. 5 A 10.1.0.8"}},
		{name: "db-2.db.ci.svc.cluster.local.", typ: A, rcode: nx, authorities: []string{soa}}, // not ready
		{name: "empty.ci.svc.cluster.local.", typ: A, rcode: nx, authorities: []string{soa}},   // no ready endpoint
		{name: "unready.ci.svc.cluster.local.", typ: A, rcode: ok, answers: []string{"unready.ci.svc.cluster.local. 5 A 10.1.3.3"}},
		{name: "x.orphan.ci.svc.cluster.local.", typ: A, rcode: nx, authorities: []string{soa}},
		// 2.4.2 headless SRV: one per ready endpoint and named port, the endpoint's port
		{name: "_pg._tcp.db.ci.svc.cluster.local.", typ: SRV, rcode: ok,
			answers: []string{
				"_pg._tcp.db.ci.svc.cluster.local. 5 SRV 0 100 5432 db-0.db.ci.svc.cluster.local.",
				"_pg._tcp.db.ci.svc.cluster.local. 5 SRV 0 100 5432 db-1.db.ci.svc.cluster.local.",
				"_pg._tcp.db.ci.svc.cluster.local. 5 SRV 0 100 5432 10-1-0-8.db.ci.svc.cluster.local."},
			additionals: []string{"db-0.db.ci.svc.cluster.local. 5 A 10.1.0.5", "db-1.db.ci.svc.cluster.local. 5 A 10.1.1.6", "10-1-0-8.db.ci.svc.cluster.local. 5 A 10.1.0.8"}},
		// 2.5 ExternalName: the CNAME, then the target's records from the upstream (their
		// TTL), from the zone, or none when the target does not resolve
		{name: "ext.default.svc.cluster.local.", typ: A, rcode: ok, answers: []string{"ext.default.svc.cluster.local. 5 CNAME example.com.", "example.com. 1 A 192.0.2.1"}},
		{name: "ext.default.svc.cluster.local.", typ: AAAA, rcode: ok, answers: []string{"ext.default.svc.cluster.local. 5 CNAME example.com.", "example.com. 1 AAAA 2001:db8::1"}},
		{name: "ext.default.svc.cluster.local.", typ: CNAME, rcode: ok, answers: []string{"ext.default.svc.cluster.local. 5 CNAME example.com."}},
		{name: "alias.default.svc.cluster.local.", typ: A, rcode: ok, answers: []string{
			"alias.default.svc.cluster.local. 5 CNAME web.default.svc.cluster.local.", "web.default.svc.cluster.local. 5 A 10.251.3.4"}},
		{name: "dangling.default.svc.cluster.local.", typ: A, rcode: ok, answers: []string{"dangling.default.svc.cluster.local. 5 CNAME host.nx.example."}},
		// Pods by address
		{name: "10-1-0-5.ci.pod.cluster.local.", typ: A, rcode: ok, answers: []string{"10-1-0-5.ci.pod.cluster.local. 5 A 10.1.0.5"}},
		{name: "fd00--5.ci.pod.cluster.local.", typ: AAAA, rcode: ok, answers: []string{"fd00--5.ci.pod.cluster.local. 5 AAAA fd00::5"}},
		{name: "10-1-0-x.ci.pod.cluster.local.", typ: A, rcode: nx, authorities: []string{soa}},
		{name: "ci.pod.cluster.local.", typ: A, rcode: ok, authorities: []string{soa}},
		// the zone's own names: the apex and the empty non-terminals above Services
		{name: "cluster.local.", typ: dnsmessage.TypeSOA, rcode: ok, answers: []string{soa}},
		{name: "svc.cluster.local.", typ: A, rcode: ok, authorities: []string{soa}},
		{name: "default.svc.cluster.local.", typ: A, rcode: ok, authorities: []string{soa}},
		{name: "nope.svc.cluster.local.", typ: A, rcode: nx, authorities: []string{soa}},
		{name: "nope.cluster.local.", typ: A, rcode: nx, authorities: []string{soa}},
		// a type we do not serve: NODATA, not a hang
		{name: "web.default.svc.cluster.local.", typ: dnsmessage.TypeMX, rcode: ok, authorities: []string{soa}},
		// everything else goes to the upstream, unknown reverse names too
		{name: "deb.debian.org.", typ: A, rcode: ok, answers: []string{"deb.debian.org. 1 A 192.0.2.1"}, notAuth: true},
		{name: "x.nx.example.", typ: A, rcode: nx, notAuth: true},
		{name: "7.2.1.10.in-addr.arpa.", typ: PTR, rcode: ok, answers: []string{"7.2.1.10.in-addr.arpa. 1 PTR upstream.example."}, notAuth: true},
		{name: "cluster.local.example.", typ: A, rcode: ok, answers: []string{"cluster.local.example. 1 A 192.0.2.1"}, notAuth: true},
	} {
		t.Run(tc.typ.String()+" "+tc.name, func(t *testing.T) {
			var m dnsmessage.Message
			if err := m.Unpack(s.Answer(context.Background(), query(t, tc.name, tc.typ, 0))); err != nil {
				t.Fatal(err)
			}
			if m.Header.ID != 42 || !m.Header.Response || m.Header.Truncated || m.Header.Authoritative == tc.notAuth || len(m.Questions) != 1 {
				t.Errorf("header %+v, %d questions", m.Header, len(m.Questions))
			}
			if m.Header.RCode != tc.rcode {
				t.Errorf("rcode %v, want %v", m.Header.RCode, tc.rcode)
			}
			for _, sec := range []struct {
				what      string
				got, want []string
			}{{"answers", rrs(m.Answers), tc.answers}, {"authorities", rrs(m.Authorities), tc.authorities}, {"additionals", rrs(m.Additionals), tc.additionals}} {
				if !slices.Equal(sec.got, sec.want) {
					t.Errorf("%s:\n got %q\nwant %q", sec.what, sec.got, sec.want)
				}
			}
		})
	}
}

// TestSearchPath resolves partial names as a Pod's resolver does with the resolv.conf
// the kubelet writes for clusterDNS/clusterDomain (search <ns>.svc.<zone> svc.<zone>
// <zone>, options ndots:5). It walks the list as musl does, the strictest: only NXDOMAIN
// moves on to the next candidate, so a wrong NODATA on the way would stop it.
func TestSearchPath(t *testing.T) {
	services, endpointSlices := fixture()
	s := &Server{Domain: "cluster.local"}
	s.SetTable(Build("cluster.local", services, endpointSlices))
	resolve := func(ns, name string, typ dnsmessage.Type) []string {
		var candidates []string
		if strings.Count(name, ".") < 5 {
			for _, d := range []string{ns + ".svc.cluster.local", "svc.cluster.local", "cluster.local"} {
				candidates = append(candidates, name+"."+d+".")
			}
		}
		candidates = append(candidates, name+".")
		for _, c := range candidates {
			var m dnsmessage.Message
			if err := m.Unpack(s.Answer(context.Background(), query(t, c, typ, 0))); err != nil {
				t.Fatal(err)
			}
			if m.Header.RCode != dnsmessage.RCodeNameError {
				return rrs(m.Answers)
			}
		}
		return nil
	}
	for _, tc := range []struct {
		ns, name string
		typ      dnsmessage.Type
		want     string
	}{
		{"default", "web", dnsmessage.TypeA, "web.default.svc.cluster.local. 5 A 10.251.3.4"},
		{"ci", "web.default", dnsmessage.TypeA, "web.default.svc.cluster.local. 5 A 10.251.3.4"},
		{"ci", "web.default.svc", dnsmessage.TypeA, "web.default.svc.cluster.local. 5 A 10.251.3.4"},
		{"ci", "web.default.svc.cluster.local", dnsmessage.TypeA, "web.default.svc.cluster.local. 5 A 10.251.3.4"},
		{"default", "db-1.db.ci", dnsmessage.TypeA, "db-1.db.ci.svc.cluster.local. 5 A 10.1.1.6"},
		{"ci", "db-1.db", dnsmessage.TypeA, "db-1.db.ci.svc.cluster.local. 5 A 10.1.1.6"},
		{"default", "_http._tcp.web", dnsmessage.TypeSRV, "_http._tcp.web.default.svc.cluster.local. 5 SRV 0 100 80 web.default.svc.cluster.local."},
		{"ci", "_http._tcp.web.default", dnsmessage.TypeSRV, "_http._tcp.web.default.svc.cluster.local. 5 SRV 0 100 80 web.default.svc.cluster.local."},
		{"ci", "_http._tcp.web.default.svc", dnsmessage.TypeSRV, "_http._tcp.web.default.svc.cluster.local. 5 SRV 0 100 80 web.default.svc.cluster.local."},
		{"ci", "10-1-0-5.ci.pod", dnsmessage.TypeA, "10-1-0-5.ci.pod.cluster.local. 5 A 10.1.0.5"},
	} {
		if got := resolve(tc.ns, tc.name, tc.typ); len(got) == 0 || got[0] != tc.want {
			t.Errorf("from namespace %s, %s %v = %q, want %q first", tc.ns, tc.name, tc.typ, got, tc.want)
		}
	}
}

// TestTruncation: a headless Service with 300 endpoints answers within 512 bytes, or the
// EDNS0 size the client advertises (up to maxUDPSize), with TC set and as many whole
// records as fit; over TCP it answers all of them, so a real client (Go's resolver, which
// retries over TCP on TC) gets every address.
func TestTruncation(t *testing.T) {
	var eps []discoveryv1.Endpoint
	for i := range 300 {
		eps = append(eps, ep(fmt.Sprintf("10.2.%d.%d", i/250, i%250+1), "", true))
	}
	s := &Server{Domain: "cluster.local"}
	s.SetTable(Build("cluster.local",
		[]*corev1.Service{svc("big", "many", corev1.ClusterIPNone, port("http", corev1.ProtocolTCP, 80))},
		[]*discoveryv1.EndpointSlice{withPorts(slice("big", "many", eps...), "http", corev1.ProtocolTCP, 8080)}))
	for _, tc := range []struct {
		network  string
		typ      dnsmessage.Type
		edns     int
		limit    int
		all      bool // every record, no TC
		minCount int
	}{
		{"udp", dnsmessage.TypeA, 0, 512, false, 20},
		{"udp", dnsmessage.TypeA, 100, 512, false, 20}, // below 512 counts as 512
		{"udp", dnsmessage.TypeA, 1232, 1232, false, 60},
		{"udp", dnsmessage.TypeA, 65000, maxUDPSize, false, 200},
		{"udp", dnsmessage.TypeSRV, 1232, 1232, false, 10},
		{"tcp", dnsmessage.TypeA, 0, 0xffff, true, 300},
		{"tcp", dnsmessage.TypeSRV, 1232, 0xffff, true, 300},
	} {
		t.Run(fmt.Sprintf("%s %v edns %d", tc.network, tc.typ, tc.edns), func(t *testing.T) {
			name := "many.big.svc.cluster.local."
			if tc.typ == dnsmessage.TypeSRV {
				name = "_http._tcp." + name
			}
			resp := s.answer(context.Background(), tc.network, query(t, name, tc.typ, tc.edns))
			var m dnsmessage.Message
			if err := m.Unpack(resp); err != nil {
				t.Fatal(err)
			}
			if len(resp) > tc.limit || m.Header.Truncated == tc.all || len(m.Answers) < tc.minCount || tc.all && len(m.Answers) != 300 {
				t.Errorf("%d bytes (limit %d), TC %v, %d answers (want at least %d)", len(resp), tc.limit, m.Header.Truncated, len(m.Answers), tc.minCount)
			}
			if hasOPT := slices.ContainsFunc(m.Additionals, func(r dnsmessage.Resource) bool { return r.Header.Type == dnsmessage.TypeOPT }); hasOPT != (tc.edns > 0) {
				t.Errorf("OPT in the answer %v, want %v", hasOPT, tc.edns > 0)
			}
		})
	}

	addr := serve(t, s)
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ips, err := r.LookupHost(ctx, "many.big.svc.cluster.local.")
	if err != nil || len(ips) != 300 {
		t.Errorf("Go's resolver got %d addresses, err %v; want 300 (UDP, TC, then TCP)", len(ips), err)
	}
}

// serve runs s on a loopback port over UDP and TCP for the test and returns the address.
func serve(t *testing.T, s *Server) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		pc.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = s.Serve(ctx, pc); done <- struct{}{} }()
	go func() { _ = s.ServeTCP(ctx, l); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done })
	return pc.LocalAddr().String()
}

// TestBadInput: messages that are not one plain query get an error answer with the
// query's ID, or nothing when they are not queries at all; none panics or hangs.
func TestBadInput(t *testing.T) {
	s := &Server{Domain: "cluster.local"}
	services, endpointSlices := fixture()
	s.SetTable(Build("cluster.local", services, endpointSlices))
	good := query(t, "web.default.svc.cluster.local.", dnsmessage.TypeA, 0)
	with := func(b []byte, edit func([]byte) []byte) []byte { return edit(slices.Clone(b)) }
	for _, tc := range []struct {
		name  string
		msg   []byte
		rcode dnsmessage.RCode
		drop  bool
	}{
		{name: "empty", msg: nil, drop: true},
		{name: "short header", msg: good[:7], drop: true},
		{name: "a response", msg: with(good, func(b []byte) []byte { b[2] |= 0x80; return b }), drop: true},
		{name: "no question", msg: with(good[:12], func(b []byte) []byte { b[5] = 0; return b }), rcode: dnsmessage.RCodeFormatError},
		{name: "two questions", msg: with(good, func(b []byte) []byte { b[5] = 2; return append(b, good[12:]...) }), rcode: dnsmessage.RCodeFormatError},
		{name: "question cut short", msg: good[:len(good)-3], rcode: dnsmessage.RCodeFormatError},
		{name: "name pointing at itself", msg: append(slices.Clone(good[:12]), 0xc0, 12, 0, 1, 0, 1), rcode: dnsmessage.RCodeFormatError},
		{name: "NOTIFY", msg: with(good, func(b []byte) []byte { b[2] |= 4 << 3; return b }), rcode: dnsmessage.RCodeNotImplemented},
		{name: "class CHAOS", msg: with(good, func(b []byte) []byte { b[len(b)-1] = 3; return b }), rcode: dnsmessage.RCodeNotImplemented},
		{name: "AXFR", msg: query(t, "cluster.local.", dnsmessage.TypeAXFR, 0), rcode: dnsmessage.RCodeNotImplemented},
		{name: "OPT cut short", msg: query(t, "web.default.svc.cluster.local.", dnsmessage.TypeA, 1232)[:len(good)+5], rcode: dnsmessage.RCodeSuccess},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := s.Answer(context.Background(), tc.msg)
			if tc.drop {
				if resp != nil {
					t.Errorf("answered %d bytes, want nothing", len(resp))
				}
				return
			}
			var m dnsmessage.Message
			if err := m.Unpack(resp); err != nil {
				t.Fatal(err)
			}
			if m.Header.ID != 42 || !m.Header.Response || m.Header.RCode != tc.rcode {
				t.Errorf("id %d response %v rcode %v; want 42, true, %v", m.Header.ID, m.Header.Response, m.Header.RCode, tc.rcode)
			}
		})
	}
}

// Before the caches have synced there is no table: cluster names get SERVFAIL (try
// again), never NXDOMAIN; with no upstream, other names get SERVFAIL too, not silence.
func TestNoTableYet(t *testing.T) {
	s := &Server{Domain: "cluster.local"}
	for _, name := range []string{"web.default.svc.cluster.local.", "deb.debian.org."} {
		var m dnsmessage.Message
		if err := m.Unpack(s.Answer(context.Background(), query(t, name, dnsmessage.TypeA, 0))); err != nil {
			t.Fatal(err)
		}
		if m.Header.RCode != dnsmessage.RCodeServerFailure || len(m.Answers) != 0 {
			t.Errorf("%s: rcode %v, %d answers; want SERVFAIL", name, m.Header.RCode, len(m.Answers))
		}
	}
}

// FuzzAnswer: no input panics the server or makes it answer something malformed: an
// answer parses, carries the query's ID and fits the size the transport allows.
func FuzzAnswer(f *testing.F) {
	for _, q := range []struct {
		name string
		typ  dnsmessage.Type
		edns int
	}{
		{"web.default.svc.cluster.local.", dnsmessage.TypeA, 0},
		{"many.big.svc.cluster.local.", dnsmessage.TypeA, 0},
		{"_http._tcp.many.big.svc.cluster.local.", dnsmessage.TypeSRV, 1232},
		{"_http._tcp.web.default.svc.cluster.local.", dnsmessage.TypeSRV, 0},
		{"4.3.251.10.in-addr.arpa.", dnsmessage.TypePTR, 0},
		{"alias.default.svc.cluster.local.", dnsmessage.TypeA, 4096},
		{"ext.default.svc.cluster.local.", dnsmessage.TypeALL, 0},
		{"10-1-0-5.ci.pod.cluster.local.", dnsmessage.TypeA, 0},
		{"dns-version.cluster.local.", dnsmessage.TypeTXT, 0},
		{"nope.cluster.local.", dnsmessage.TypeMX, 0},
		{"deb.debian.org.", dnsmessage.TypeA, 0},
	} {
		f.Add(query(f, q.name, q.typ, q.edns), false)
		f.Add(query(f, q.name, q.typ, q.edns), true)
	}
	f.Add([]byte{0, 42, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1}, false)
	services, endpointSlices := fixture()
	var eps []discoveryv1.Endpoint
	for i := range 300 {
		eps = append(eps, ep(fmt.Sprintf("10.2.%d.%d", i/250, i%250+1), "", true))
	}
	services = append(services, svc("big", "many", corev1.ClusterIPNone))
	endpointSlices = append(endpointSlices, withPorts(slice("big", "many", eps...), "http", corev1.ProtocolTCP, 8080))
	s := &Server{Domain: "cluster.local"} // no upstream: forwarding fails fast, with SERVFAIL
	s.SetTable(Build("cluster.local", services, endpointSlices))
	f.Fuzz(func(t *testing.T, msg []byte, overTCP bool) {
		network, limit := "udp", minUDPSize
		if overTCP {
			network, limit = "tcp", 0xffff
		} else {
			var p dnsmessage.Parser
			if _, err := p.Start(msg); err == nil {
				if qs, err := p.AllQuestions(); err == nil && len(qs) == 1 {
					if size, ok := edns0Size(&p); ok {
						limit = min(max(size, minUDPSize), maxUDPSize)
					}
				}
			}
		}
		resp := s.answer(context.Background(), network, msg)
		if resp == nil {
			return
		}
		var m dnsmessage.Message
		if err := m.Unpack(resp); err != nil {
			t.Fatalf("answer does not parse: %v", err)
		}
		if len(msg) < 2 || m.Header.ID != uint16(msg[0])<<8|uint16(msg[1]) || !m.Header.Response {
			t.Fatalf("answer header %+v to %x", m.Header, msg)
		}
		if len(resp) > limit {
			t.Fatalf("answer of %d bytes over %s, limit %d", len(resp), network, limit)
		}
	})
}

// TestRunServesAndRestarts: Run answers from the tenant's Services over UDP and TCP,
// follows changes, and when its sockets die it listens again and answers.
func TestRunServesAndRestarts(t *testing.T) {
	probe, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.LocalAddr().String()
	probe.Close()
	web := svc("default", "web", "10.251.3.4", port("http", corev1.ProtocolTCP, 80))
	web.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	client := k8sfake.NewClientset(web)
	listened := make(chan [2]io.Closer, 4)
	s := &Server{Domain: "cluster.local", Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		onListen: func(pc net.PacketConn, l net.Listener) { listened <- [2]io.Closer{pc, l} }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, client, "cluster.local", addr, s) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	answers := func(what, name string, typ dnsmessage.Type, want []string) {
		t.Helper()
		for _, network := range []string{"udp", "tcp"} {
			livetest.Eventually(t, 5*time.Second, 50*time.Millisecond, what+" over "+network, func() bool {
				resp, err := dnswire.Exchange(context.Background(), network, addr, query(t, name, typ, 0), time.Second)
				var m dnsmessage.Message
				if err != nil || m.Unpack(resp) != nil {
					return false
				}
				return slices.Equal(rrs(m.Answers), want)
			})
		}
	}
	first := <-listened
	answers("the ClusterIP", "web.default.svc.cluster.local.", dnsmessage.TypeA, []string{"web.default.svc.cluster.local. 5 A 10.251.3.4"})
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice("default", "web", ep("10.1.0.9", "", true)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	answers("the endpoint's PTR", "9.0.1.10.in-addr.arpa.", dnsmessage.TypePTR, []string{"9.0.1.10.in-addr.arpa. 5 PTR 10-1-0-9.web.default.svc.cluster.local."})
	first[0].Close() // the UDP socket dies
	answers("an answer again after the UDP socket died", "_http._tcp.web.default.svc.cluster.local.", dnsmessage.TypeSRV,
		[]string{"_http._tcp.web.default.svc.cluster.local. 5 SRV 0 100 80 web.default.svc.cluster.local."})
	if len(listened) != 1 {
		t.Errorf("listened %d more times, want once after the death", len(listened))
	}
}
