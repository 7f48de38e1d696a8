package scale

import (
	"fmt"
	"testing"
	"time"
)

// benchObserved is a busy cluster: 100 nodes, 900 bound pods (a DaemonSet pod on each
// node among them), 100 pending pods of which a tenth carry hostname anti-affinity.
func benchObserved() Observed {
	o := obs(func(o *Observed) { o.MaxNodes = 200; o.IdleSince = map[string]time.Time{} })
	for i := range 100 {
		name := fmt.Sprintf("node-%03d", i)
		o.Nodes = append(o.Nodes, node(name))
		o.Pods = append(o.Pods, pod("ds-"+name, on(name), ownedBy("DaemonSet", "proxy"), req("50m", "32Mi")))
		for k := range 8 {
			o.Pods = append(o.Pods, pod(fmt.Sprintf("run-%d-%d", i, k), on(name), req("200m", "200Mi"), lbl("app", "web")))
		}
	}
	for i := range 100 {
		opts := []podOpt{req(fmt.Sprintf("%dm", 100+(i%7)*100), "256Mi")}
		if i%10 == 0 {
			opts = append(opts, lbl("ci", "1"), antiExists("ci"))
		}
		o.Pods = append(o.Pods, pod(fmt.Sprintf("pending-%d", i), opts...))
	}
	if len(o.Pods) != 1000 || len(o.Nodes) != 100 {
		panic("bench shape")
	}
	return o
}

func BenchmarkDecide(b *testing.B) {
	o := benchObserved()
	d, err := Decide(o)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%s", d)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decide(o); err != nil {
			b.Fatal(err)
		}
	}
}

// The benchmark's cluster is one where the simulation has real work to do.
func TestBenchShape(t *testing.T) {
	d, err := Decide(benchObserved())
	if err != nil {
		t.Fatal(err)
	}
	if d.Action != Provision || d.Unplaced == 0 {
		t.Errorf("bench cluster decides %s; want a Provision with unplaced pods", d)
	}
}
