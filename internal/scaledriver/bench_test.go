package scaledriver

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	k8sfake "k8s.io/client-go/kubernetes/fake"

	"github.com/socialweb-computer/socialweb/internal/nodes/fake"
	"github.com/socialweb-computer/socialweb/internal/scale"
)

// BenchmarkPendingToCreate measures, through a running driver, the time from a Pod
// being created Pending in the tenant to Create being called on the provider. Each
// iteration starts from an empty cluster; resetting it is not timed.
func BenchmarkPendingToCreate(b *testing.B) {
	for _, batch := range []time.Duration{defaultBatch, time.Millisecond} {
		b.Run(fmt.Sprint("batch=", batch), func(b *testing.B) { benchPendingToCreate(b, batch) })
	}
}

func benchPendingToCreate(b *testing.B, batch time.Duration) {
	client := k8sfake.NewClientset()
	created := make(chan fake.Call, 1)
	prov := fake.New(fake.WithTenant(client), fake.WithOnCall(func(c fake.Call) {
		if c.Op == fake.OpCreate && c.Err == nil {
			created <- c
		}
	}))
	d, err := New(Config{Cluster: cluster, NodeSize: testSize, MaxNodes: 10, Resync: time.Hour, Batch: batch},
		Deps{Tenant: client, Provider: prov, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for testutil.ToFloat64(d.metrics.decisions.WithLabelValues(cluster, string(scale.None))) == 0 {
		time.Sleep(time.Millisecond)
	}

	var total, worst time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p := testPod(fmt.Sprintf("p-%d", i))
		p.CreationTimestamp = metav1.Now()
		start := time.Now()
		if _, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		var c fake.Call
		select {
		case c = <-created:
		case <-time.After(10 * time.Second):
			b.Fatal("no Create within 10s")
		}
		lat := c.At.Sub(start)
		total += lat
		worst = max(worst, lat)

		b.StopTimer()
		// Reset in order: the Pod first, so no pass sees it pending without a node.
		if err := client.CoreV1().Pods("default").Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			b.Fatal(err)
		}
		waitFor(b, func() bool { ps, _ := d.pods.List(labels.Everything()); return len(ps) == 0 })
		if err := prov.Delete(ctx, c.Name); err != nil { // removes the Node as well
			b.Fatal(err)
		}
		waitFor(b, func() bool { ns, _ := d.nodeLister.List(labels.Everything()); return len(ns) == 0 })
		select {
		case extra := <-created:
			b.Fatalf("a second Create (%s) for one pending pod", extra.Name)
		default:
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms-pending-to-create")
	b.ReportMetric(float64(worst.Microseconds())/1000, "ms-max")
}

func waitFor(b *testing.B, cond func() bool) {
	b.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("driver caches did not catch up within 10s")
		}
	}
}
