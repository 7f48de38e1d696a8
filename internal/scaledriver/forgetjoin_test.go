package scaledriver

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/socialweb-computer/socialweb/internal/nodes/fake"
	"github.com/socialweb-computer/socialweb/internal/scale"
)

// Once a Node registers, the provider hears it once (so its machine's join secret goes);
// its updates do not repeat the call, a failed call is tried again at the next update,
// and a Node present when the driver starts (a daemon restart) is told too.
func TestRegisteredNodesForgetTheirJoin(t *testing.T) {
	r := newRig(t, Config{}, false, nil, "already-up")
	ctx := context.Background()
	r.start(ctx)
	forgot := func() map[string]int {
		n := map[string]int{}
		for _, c := range r.prov.Calls() {
			if c.Op == fake.OpForgetJoin && c.Err == nil {
				n[c.Name]++
			}
		}
		return n
	}
	waitFor := func(what string, ok func(map[string]int) bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !ok(forgot()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: ForgetJoin calls %v", what, forgot())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("a Node there at start", func(m map[string]int) bool { return m["already-up"] == 1 })

	r.prov.FailNext(fake.OpForgetJoin, errors.New("disk busy"))
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "joined", Labels: scale.NodeLabels("joined", testSize)}}
	if _, err := r.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		time.Sleep(50 * time.Millisecond)
		node.Labels["bump"] = string(rune('a' + i))
		if _, err := r.client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor("a new Node, after one failed call", func(m map[string]int) bool { return m["joined"] == 1 })
	time.Sleep(200 * time.Millisecond)
	if got := forgot(); got["joined"] != 1 || got["already-up"] != 1 {
		t.Errorf("ForgetJoin calls %v, want one success per Node", got)
	}
}
