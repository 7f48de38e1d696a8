package podroutes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func node(name, podCIDR, internal string, deleting bool) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDR: podCIDR}}
	if internal != "" {
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: internal}}
	}
	if deleting {
		now := metav1.Now()
		n.DeletionTimestamp = &now
	}
	return n
}

func ips(m map[string]string) map[string]net.IP {
	out := map[string]net.IP{}
	for k, v := range m {
		out[k] = net.ParseIP(v).To4()
	}
	return out
}

func TestDesired(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []*corev1.Node
		want  map[string]string
	}{
		{"none", nil, map[string]string{}},
		{"two nodes", []*corev1.Node{node("a", "10.1.0.0/24", "10.250.1.2", false), node("b", "10.1.1.0/24", "10.250.1.3", false)},
			map[string]string{"10.1.0.0/24": "10.250.1.2", "10.1.1.0/24": "10.250.1.3"}},
		{"no pod CIDR yet", []*corev1.Node{node("a", "", "10.250.1.2", false)}, map[string]string{}},
		{"no address yet", []*corev1.Node{node("a", "10.1.0.0/24", "", false)}, map[string]string{}},
		{"being deleted", []*corev1.Node{node("a", "10.1.0.0/24", "10.250.1.2", true)}, map[string]string{}},
		{"unparsable CIDR", []*corev1.Node{node("a", "10.1.0.0/33", "10.250.1.2", false)}, map[string]string{}},
		{"non-canonical CIDR", []*corev1.Node{node("a", "10.1.0.7/24", "10.250.1.2", false)}, map[string]string{"10.1.0.0/24": "10.250.1.2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Desired(tc.nodes); !reflect.DeepEqual(got, ips(tc.want)) {
				t.Errorf("Desired = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPlan(t *testing.T) {
	r := func(c, v string) Route { return Route{c, net.ParseIP(v).To4()} }
	for _, tc := range []struct {
		name       string
		want, have map[string]string
		changes    Changes
	}{
		{"in step", map[string]string{"10.1.0.0/24": "10.250.1.2"}, map[string]string{"10.1.0.0/24": "10.250.1.2"}, Changes{}},
		{"new node", map[string]string{"10.1.0.0/24": "10.250.1.2", "10.1.1.0/24": "10.250.1.3"}, map[string]string{"10.1.0.0/24": "10.250.1.2"},
			Changes{Add: []Route{r("10.1.1.0/24", "10.250.1.3")}}},
		{"node gone", map[string]string{}, map[string]string{"10.1.0.0/24": "10.250.1.2"},
			Changes{Remove: []Route{r("10.1.0.0/24", "10.250.1.2")}}},
		{"subnet moved", map[string]string{"10.1.0.0/24": "10.250.1.4"}, map[string]string{"10.1.0.0/24": "10.250.1.2"},
			Changes{Add: []Route{r("10.1.0.0/24", "10.250.1.4")}, Remove: []Route{r("10.1.0.0/24", "10.250.1.2")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Plan(ips(tc.want), ips(tc.have)); !reflect.DeepEqual(got, tc.changes) {
				t.Errorf("Plan = %+v, want %+v", got, tc.changes)
			}
		})
	}
}

type fakeTable struct {
	routes  map[string]net.IP
	calls   []string
	failAdd error
}

func (f *fakeTable) PodRoutes(context.Context) (map[string]net.IP, error) { return f.routes, nil }
func (f *fakeTable) AddPodRoute(_ context.Context, c string, via net.IP) error {
	f.calls = append(f.calls, fmt.Sprintf("add %s %s", c, via))
	if f.failAdd != nil {
		return f.failAdd
	}
	f.routes[c] = via
	return nil
}
func (f *fakeTable) RemovePodRoute(_ context.Context, c string, via net.IP) error {
	f.calls = append(f.calls, fmt.Sprintf("del %s %s", c, via))
	delete(f.routes, c)
	return nil
}

// Sync removes before it adds (a moved subnet ends routed via its new node), and goes on
// past a failure, which it returns.
func TestSync(t *testing.T) {
	f := &fakeTable{routes: ips(map[string]string{"10.1.0.0/24": "10.250.1.2", "10.1.5.0/24": "10.250.1.9"})}
	c := Plan(ips(map[string]string{"10.1.0.0/24": "10.250.1.4", "10.1.1.0/24": "10.250.1.3"}), f.routes)
	if err := Sync(context.Background(), f, c); err != nil {
		t.Fatal(err)
	}
	want := []string{"del 10.1.0.0/24 10.250.1.2", "del 10.1.5.0/24 10.250.1.9", "add 10.1.0.0/24 10.250.1.4", "add 10.1.1.0/24 10.250.1.3"}
	if !reflect.DeepEqual(f.calls, want) {
		t.Errorf("calls %v, want %v", f.calls, want)
	}
	if !reflect.DeepEqual(f.routes, ips(map[string]string{"10.1.0.0/24": "10.250.1.4", "10.1.1.0/24": "10.250.1.3"})) {
		t.Errorf("routes after sync %v", f.routes)
	}
	f.failAdd = errors.New("boom")
	err := Sync(context.Background(), f, Changes{Add: []Route{{"10.1.7.0/24", net.ParseIP("10.250.1.7")}, {"10.1.8.0/24", net.ParseIP("10.250.1.8")}}})
	if err == nil || len(f.calls) != 6 {
		t.Errorf("Sync with failing adds: err %v, calls %v; want an error after trying both", err, f.calls)
	}
}
