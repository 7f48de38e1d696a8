package nodehealth

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sfake "k8s.io/client-go/kubernetes/fake"
)

func TestConditions(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	t1 := t0.Add(time.Minute)
	healthy := Conditions(nil, []Result{{GatewayUnreachable, nil}, {ClusterDNSUnavailable, nil}}, t0)
	tests := []struct {
		name           string
		prev           []corev1.NodeCondition
		results        []Result
		wantStatus     []corev1.ConditionStatus
		wantTransition []time.Time
		wantChanged    bool
	}{
		{"first report", nil, []Result{{GatewayUnreachable, nil}, {ClusterDNSUnavailable, nil}},
			[]corev1.ConditionStatus{"False", "False"}, []time.Time{t1, t1}, true},
		{"still healthy keeps transition times", healthy, []Result{{GatewayUnreachable, nil}, {ClusterDNSUnavailable, nil}},
			[]corev1.ConditionStatus{"False", "False"}, []time.Time{t0, t0}, false},
		{"DNS fails", healthy, []Result{{GatewayUnreachable, nil}, {ClusterDNSUnavailable, errors.New("no answer")}},
			[]corev1.ConditionStatus{"False", "True"}, []time.Time{t0, t1}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Conditions(tt.prev, tt.results, t1)
			for i, c := range got {
				if c.Status != tt.wantStatus[i] || !c.LastTransitionTime.Time.Equal(tt.wantTransition[i]) {
					t.Errorf("%s: status %s since %s, want %s since %s", c.Type, c.Status, c.LastTransitionTime, tt.wantStatus[i], tt.wantTransition[i])
				}
				if c.Status == corev1.ConditionTrue && (c.Reason != string(c.Type) || c.Message != "no answer") {
					t.Errorf("%s: reason %q message %q", c.Type, c.Reason, c.Message)
				}
			}
			if ch := Changed(tt.prev, got); ch != tt.wantChanged {
				t.Errorf("Changed = %v, want %v", ch, tt.wantChanged)
			}
		})
	}
}

func TestProblems(t *testing.T) {
	node := func(name string, conds ...corev1.NodeCondition) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Conditions: conds}}
	}
	bad := func(ty corev1.NodeConditionType, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: ty, Status: corev1.ConditionTrue, Message: msg}
	}
	tests := []struct {
		name  string
		nodes []*corev1.Node
		want  []string
	}{
		{"no nodes", nil, nil},
		{"healthy and not yet reported", []*corev1.Node{
			node("a", corev1.NodeCondition{Type: GatewayUnreachable, Status: corev1.ConditionFalse}), node("b")}, nil},
		{"kubelet conditions are not ours", []*corev1.Node{node("a", corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionTrue})}, nil},
		{"two problems, sorted", []*corev1.Node{
			node("b", bad(ClusterDNSUnavailable, "dns down")),
			node("a", bad(GatewayUnreachable, "no route")),
		}, []string{"node a: GatewayUnreachable: no route", "node b: ClusterDNSUnavailable: dns down"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Problems(tt.nodes); !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// dnsServer answers A queries for name with ip on a loopback UDP port and returns it.
func dnsServer(t *testing.T, name string, ip [4]byte) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var p dnsmessage.Parser
			h, err := p.Start(buf[:n])
			if err != nil {
				continue
			}
			q, err := p.Question()
			if err != nil {
				continue
			}
			rh := dnsmessage.Header{ID: h.ID, Response: true}
			if q.Name.String() != name {
				rh.RCode = dnsmessage.RCodeNameError
			}
			b := dnsmessage.NewBuilder(nil, rh)
			_ = b.StartQuestions()
			_ = b.Question(q)
			_ = b.StartAnswers()
			if rh.RCode == dnsmessage.RCodeSuccess {
				_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}, dnsmessage.AResource{A: ip})
			}
			out, _ := b.Finish()
			_, _ = pc.WriteTo(out, from)
		}
	}()
	return pc.LocalAddr().String()
}

func TestProbe(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedAddr := closed.Addr().String()
	closed.Close()
	dns := dnsServer(t, "kubernetes.default.svc.cluster.local.", [4]byte{10, 251, 0, 1})
	const name = "kubernetes.default.svc.cluster.local"
	tests := []struct {
		name    string
		p       Prober
		wantBad []corev1.NodeConditionType
		wantMsg string
	}{
		{"healthy", Prober{Gateway: l.Addr().String(), ClusterDNS: dns, Name: name}, nil, ""},
		{"gateway refuses", Prober{Gateway: closedAddr, ClusterDNS: dns, Name: name}, []corev1.NodeConditionType{GatewayUnreachable}, "cannot reach the gateway"},
		{"name missing", Prober{Gateway: l.Addr().String(), ClusterDNS: dns, Name: "nope.default.svc.cluster.local"},
			[]corev1.NodeConditionType{ClusterDNSUnavailable}, "no such name (NXDOMAIN)"},
		{"no DNS server", Prober{Gateway: l.Addr().String(), ClusterDNS: closedAddr, Name: name, Timeout: 500 * time.Millisecond},
			[]corev1.NodeConditionType{ClusterDNSUnavailable}, "cluster DNS at"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var bad []corev1.NodeConditionType
			var msgs []string
			for _, r := range tt.p.Probe(context.Background()) {
				if r.Err != nil {
					bad = append(bad, r.Type)
					msgs = append(msgs, r.Err.Error())
				}
			}
			if !slices.Equal(bad, tt.wantBad) || !strings.Contains(strings.Join(msgs, "\n"), tt.wantMsg) {
				t.Errorf("problems %v %q; want %v containing %q", bad, msgs, tt.wantBad, tt.wantMsg)
			}
		})
	}
}

// TestRunPatchesTheNode: the conditions land on the Node next to the kubelet's own.
func TestRunPatchesTheNode(t *testing.T) {
	client := k8sfake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}})
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedAddr := closed.Addr().String()
	closed.Close()
	dns := dnsServer(t, "kubernetes.default.svc.cluster.local.", [4]byte{10, 251, 0, 1})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		Run(ctx, client, "n1", Prober{Gateway: closedAddr, ClusterDNS: dns, Name: "kubernetes.default.svc.cluster.local"},
			20*time.Millisecond, time.Minute, slog.New(slog.NewTextHandler(io.Discard, nil)))
		close(done)
	}()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got := map[corev1.NodeConditionType]corev1.ConditionStatus{}
		for _, c := range n.Status.Conditions {
			got[c.Type] = c.Status
		}
		if got[corev1.NodeReady] == "True" && got[GatewayUnreachable] == "True" && got[ClusterDNSUnavailable] == "False" {
			if p := Problems([]*corev1.Node{n}); len(p) != 1 || !strings.Contains(p[0], "node n1: GatewayUnreachable: cannot reach the gateway") {
				t.Errorf("Problems = %q", p)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node conditions %v", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
