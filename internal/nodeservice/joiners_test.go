package nodeservice

import (
	"context"
	"net"
	"strings"
	"testing"

	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/socialweb-computer/socialweb/internal/join"
	"github.com/socialweb-computer/socialweb/internal/nodenet"
	"github.com/socialweb-computer/socialweb/internal/nodes"
	"github.com/socialweb-computer/socialweb/internal/nodes/qemu"
)

var _ qemu.Joiner = (*Joiners)(nil)

func TestJoiners(t *testing.T) {
	plan, err := nodenet.ForIndex(7)
	if err != nil {
		t.Fatal(err)
	}
	minter := func(apiServer string) join.Minter {
		return join.Minter{Tenant: kubefake.NewSimpleClientset(), APIServer: apiServer, CACert: []byte("PEM"), ClientCA: []byte("CLIENT PEM"), Plan: plan}
	}
	for _, tc := range []struct {
		name    string
		ops     func(j *Joiners)
		cluster string
		want    string // the APIServer of the identity minted; "" wants errWant
		errWant string
	}{
		{name: "empty", ops: func(*Joiners) {}, cluster: "a", errWant: "cluster a has no node services running"},
		{name: "registered", ops: func(j *Joiners) { j.Register("a", minter("https://10.250.7.1:7500")) }, cluster: "a", want: "https://10.250.7.1:7500"},
		{name: "unknown cluster", ops: func(j *Joiners) { j.Register("a", minter("https://10.250.7.1:7500")) }, cluster: "b", errWant: "cluster b has no node services running"},
		{name: "removed", ops: func(j *Joiners) { j.Register("a", minter("https://10.250.7.1:7500")); j.Remove("a") }, cluster: "a", errWant: "no node services"},
		{name: "removing another keeps it", ops: func(j *Joiners) { j.Register("a", minter("https://10.250.7.1:7500")); j.Remove("b") }, cluster: "a", want: "https://10.250.7.1:7500"},
		{name: "registered again replaces", ops: func(j *Joiners) {
			j.Register("a", minter("https://10.250.7.1:7500"))
			j.Register("a", minter("https://10.250.7.1:7501"))
		}, cluster: "a", want: "https://10.250.7.1:7501"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var j Joiners
			tc.ops(&j)
			_, registered := j.Minter(tc.cluster)
			if registered != (tc.want != "") {
				t.Errorf("Minter(%s) registered = %v", tc.cluster, registered)
			}
			id, err := j.Identity(context.Background(), nodes.NodeRequest{Cluster: tc.cluster, Name: tc.cluster + "-1", MaxPods: 110},
				net.ParseIP("10.250.7.2"), "02:00:00:00:00:07")
			if tc.errWant != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errWant) {
					t.Fatalf("Identity error = %v, want one saying %q", err, tc.errWant)
				}
				return
			}
			if err != nil || id.APIServer != tc.want || id.NodeName != tc.cluster+"-1" {
				t.Errorf("Identity = %+v, %v; want APIServer %s", id, err, tc.want)
			}
		})
	}
}

// Nodes of many clusters boot at once: the provider asks for identities while
// the Host starts and stops clusters (go test -race).
func TestJoinersConcurrentUse(t *testing.T) {
	plan, _ := nodenet.ForIndex(7)
	m := join.Minter{Tenant: kubefake.NewSimpleClientset(), APIServer: "https://10.250.7.1:7500", CACert: []byte("PEM"), ClientCA: []byte("CLIENT PEM"), Plan: plan}
	var j Joiners
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 200 {
			j.Register("a", m)
			j.Remove("a")
		}
	}()
	for range 200 {
		_, _ = j.Identity(context.Background(), nodes.NodeRequest{Cluster: "a", Name: "a-1"}, net.ParseIP("10.250.7.2"), "")
	}
	<-done
}
