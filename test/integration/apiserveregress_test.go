package integration

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/socialweb-computer/socialweb/internal/livetest"
)

// TestApiserverCannotReachTheHostsLAN attacks the tenant apiserver's outbound
// connections as a tenant's admin may: a selectorless Service whose Endpoints name a
// machine on the host's LAN (a network namespace behind a veth, answering HTTP), then
// services/proxy to it; a Node object whose address is that machine, then nodes/proxy.
// The host itself reaches the machine; the apiserver is refused by its egress proxy and
// the machine sees no request from it.
func TestApiserverCannotReachTheHostsLAN(t *testing.T) {
	lan := livetest.NewPeer(t)
	ln := lan.Listen(t, 8080)
	var hits atomic.Int32
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Write([]byte("the host's LAN answered\n"))
	}))
	target := "http://" + lan.Addr.String() + ":8080/"
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(target)
	if err != nil {
		t.Fatalf("the host cannot reach the LAN stand-in itself (%v): the test would prove nothing", err)
	}
	resp.Body.Close()
	hits.Store(0)

	d := newDaemon(t, 1)
	d.start()
	d.mustCLI("cluster", "create", "egress", "--wait")
	_, k := d.tenant("egress")
	ctx := ctxT(t, 3*time.Minute)

	if _, err := k.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "lan"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 8080, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	//nolint:staticcheck // Endpoints: what a selectorless Service's proxy reads
	if _, err := k.CoreV1().Endpoints("default").Create(ctx, &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "lan"},
		Subsets: []corev1.EndpointSubset{{Addresses: []corev1.EndpointAddress{{IP: lan.Addr.String()}}, Ports: []corev1.EndpointPort{{Name: "http", Port: 8080}}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "lan-node"}}
	if node, err = k.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: lan.Addr.String()}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = 8080
	if _, err := k.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		do   func() ([]byte, error)
	}{
		{"services/proxy", func() ([]byte, error) {
			return k.CoreV1().Services("default").ProxyGet("http", "lan", "8080", "/", nil).DoRaw(ctx)
		}},
		{"nodes/proxy", func() ([]byte, error) {
			return k.CoreV1().RESTClient().Get().Resource("nodes").Name("lan-node:8080").SubResource("proxy").Suffix("/").DoRaw(ctx)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, err := tc.do()
			if err == nil || strings.Contains(string(body), "LAN answered") {
				t.Fatalf("the apiserver reached the host's LAN: %q, %v", body, err)
			}
			// The apiserver answers a refused dial with 503; the egress proxy's own
			// refusal is in the control plane's log (below).
			if !apierrors.IsServiceUnavailable(err) && !apierrors.IsForbidden(err) {
				t.Errorf("refused with %v; want 503 (the dial refused) or 403", err)
			}
			t.Logf("refused: %v", err)
		})
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the LAN stand-in answered %d requests from the apiserver", n)
	}
	// It was the egress proxy that said no, for that address (the apiserver may not dial
	// again for the second attempt, so at least once).
	log, err := os.ReadFile(filepath.Join(d.stateDir, "clusters", "egress", "run", "controlplane.log"))
	if err != nil {
		t.Fatal(err)
	}
	refusals := 0
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, "apiserver egress refused") && strings.Contains(l, lan.Addr.String()+":8080") {
			refusals++
		}
	}
	if refusals == 0 {
		t.Errorf("the control plane's log has no egress refusal naming %s:8080:\n%s", lan.Addr, grepLines(string(log), "egress"))
	}
}
