package clusterdns

import (
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
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

func svc(ns, name, clusterIP string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{ClusterIP: clusterIP}}
}

func slice(ns, svcName string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: svcName + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps,
	}
}

func ep(ip, hostname string, ready bool) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}
	if hostname != "" {
		e.Hostname = &hostname
	}
	return e
}

func TestLookup(t *testing.T) {
	tab := Build("cluster.local",
		[]*corev1.Service{svc("default", "web", "10.251.3.4"), svc("ci", "db", corev1.ClusterIPNone), svc("ci", "empty", corev1.ClusterIPNone),
			{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ext"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"}}},
		[]*discoveryv1.EndpointSlice{
			slice("ci", "db", ep("10.1.0.5", "db-0", true), ep("10.1.1.6", "db-1", true), ep("10.1.2.7", "db-2", false)),
			slice("default", "web", ep("10.1.0.9", "", true)),
		})
	for _, tc := range []struct {
		name           string
		ips            []string
		exists, inZone bool
	}{
		{"web.default.svc.cluster.local.", []string{"10.251.3.4"}, true, true},
		{"WEB.Default.svc.cluster.local", []string{"10.251.3.4"}, true, true},
		{"db.ci.svc.cluster.local.", []string{"10.1.0.5", "10.1.1.6"}, true, true}, // headless: ready endpoints
		{"db-1.db.ci.svc.cluster.local.", []string{"10.1.1.6"}, true, true},        // StatefulSet Pod
		{"db-2.db.ci.svc.cluster.local.", nil, false, true},                        // not ready
		{"empty.ci.svc.cluster.local.", nil, true, true},                           // headless, no endpoints yet
		{"ext.default.svc.cluster.local.", nil, false, true},                       // ExternalName: not served
		{"nope.default.svc.cluster.local.", nil, false, true},
		{"10-1-0-5.ci.pod.cluster.local.", []string{"10.1.0.5"}, true, true},
		{"10-1-0-x.ci.pod.cluster.local.", nil, false, true},
		{"deb.debian.org.", nil, false, false},
		{"cluster.local.example.", nil, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ips, exists, inZone := tab.Lookup(tc.name)
			var got []string
			for _, ip := range ips {
				got = append(got, ip.String())
			}
			if !slices.Equal(got, tc.ips) || exists != tc.exists || inZone != tc.inZone {
				t.Errorf("Lookup = %v, exists %v, inZone %v; want %v, %v, %v", got, exists, inZone, tc.ips, tc.exists, tc.inZone)
			}
		})
	}
}

func query(t *testing.T, name string, typ dnsmessage.Type) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 42, RecursionDesired: true})
	_ = b.StartQuestions()
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	m, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// The server answers cluster names itself (A records, NXDOMAIN for unknown ones, an
// empty answer for other types) and relays other names to its upstream, here a stand-in
// that answers everything with 192.0.2.1.
func TestServerAnswersAndForwards(t *testing.T) {
	up, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := up.ReadFrom(buf)
			if err != nil {
				return
			}
			var m dnsmessage.Message
			if m.Unpack(buf[:n]) != nil {
				continue
			}
			m.Header.Response = true
			m.Answers = []dnsmessage.Resource{{Header: dnsmessage.ResourceHeader{Name: m.Questions[0].Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 1},
				Body: &dnsmessage.AResource{A: [4]byte{192, 0, 2, 1}}}}
			out, _ := m.Pack()
			_, _ = up.WriteTo(out, from)
		}
	}()
	s := &Server{Upstream: up.LocalAddr().String()}
	s.SetTable(Build("cluster.local", []*corev1.Service{svc("default", "web", "10.251.3.4")}, nil))
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		typ   dnsmessage.Type
		rcode dnsmessage.RCode
		a     []string
	}{
		{"web.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"10.251.3.4"}},
		{"web.default.svc.cluster.local.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, nil},
		{"gone.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"deb.debian.org.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"192.0.2.1"}},
	} {
		resp := s.Answer(ctx, query(t, tc.name, tc.typ))
		var m dnsmessage.Message
		if err := m.Unpack(resp); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var got []string
		for _, a := range m.Answers {
			if r, ok := a.Body.(*dnsmessage.AResource); ok {
				got = append(got, net.IP(r.A[:]).String())
			}
		}
		if m.Header.ID != 42 || m.Header.RCode != tc.rcode || !slices.Equal(got, tc.a) {
			t.Errorf("%s %v: id %d rcode %v answers %v; want rcode %v answers %v", tc.name, tc.typ, m.Header.ID, m.Header.RCode, got, tc.rcode, tc.a)
		}
	}
	// Before any table (caches not synced) cluster names are forwarded, never NXDOMAIN.
	fresh := &Server{}
	if resp := fresh.Answer(ctx, query(t, "web.default.svc.cluster.local.", dnsmessage.TypeA)); resp != nil {
		t.Errorf("a server without a table and upstream answered %d bytes", len(resp))
	}
}

// exchange sends query to addr over network (udp or tcp) and returns the A answers.
func exchange(network, addr string, query []byte) ([]string, error) {
	resp, err := dnswire.Exchange(context.Background(), network, addr, query, time.Second)
	if err != nil {
		return nil, err
	}
	var m dnsmessage.Message
	if err := m.Unpack(resp); err != nil {
		return nil, err
	}
	var got []string
	for _, a := range m.Answers {
		if r, ok := a.Body.(*dnsmessage.AResource); ok {
			got = append(got, net.IP(r.A[:]).String())
		}
	}
	return got, nil
}

// TestRunServesAndRestarts: Run answers from the tenant's Services over UDP and TCP, and
// when its sockets die it listens again and answers.
func TestRunServesAndRestarts(t *testing.T) {
	probe, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.LocalAddr().String()
	probe.Close()
	client := k8sfake.NewClientset(svc("default", "web", "10.251.3.4"))
	listened := make(chan [2]io.Closer, 4)
	s := &Server{Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
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
	answers := func(what string) {
		t.Helper()
		for _, network := range []string{"udp", "tcp"} {
			livetest.Eventually(t, 5*time.Second, 50*time.Millisecond, what+" over "+network, func() bool {
				got, err := exchange(network, addr, query(t, "web.default.svc.cluster.local.", dnsmessage.TypeA))
				return err == nil && slices.Equal(got, []string{"10.251.3.4"})
			})
		}
	}
	first := <-listened
	answers("the server to answer")
	first[0].Close() // the UDP socket dies
	answers("the server to answer again after its UDP socket died")
	if len(listened) != 1 {
		t.Errorf("listened %d more times, want once after the death", len(listened))
	}
}
