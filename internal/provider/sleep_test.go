package provider

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/lease"
	"github.com/socialweb-computer/socialweb/internal/sleep"
	"github.com/socialweb-computer/socialweb/internal/supervisor"
)

// What observe reports of sleep, from the Cluster and the daemon's default: a
// cluster whose status says Asleep stays asleep after a daemon restart, and a
// cluster that may not sleep gets no sleep state at all (nothing changes).
func TestObserveSleep(t *testing.T) {
	d := func(x time.Duration) *metav1.Duration { return &metav1.Duration{Duration: x} }
	tests := []struct {
		name       string
		spec       *metav1.Duration
		def        time.Duration
		phase      v1.Phase
		wantAsleep bool
		wantState  bool
	}{
		{"sleep off, awake", nil, 0, v1.PhaseReady, false, false},
		{"spec 0 overrides a default", d(0), time.Minute, v1.PhaseReady, false, false},
		{"the default turns it on", nil, time.Minute, v1.PhaseReady, false, true},
		{"spec on, awake", d(time.Minute), 0, v1.PhaseReady, false, true},
		{"asleep before the restart stays asleep", d(time.Minute), 0, v1.PhaseAsleep, true, true},
		{"asleep with sleep since turned off: asleep until the loop wakes it", d(0), 0, v1.PhaseAsleep, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &Provider{cfg: Config{Defaults: Defaults{SleepAfter: tc.def}}, sleepers: map[string]*sleeper{}}
			c := &v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "ci"}, Spec: v1.ClusterSpec{SleepAfter: tc.spec}, Status: v1.ClusterStatus{Phase: tc.phase}}
			var o Observed
			p.observeSleep(c, &o)
			if o.Asleep != tc.wantAsleep || (p.sleepers["ci"] != nil) != tc.wantState {
				t.Errorf("Asleep %v, sleep state %v; want %v, %v", o.Asleep, p.sleepers["ci"] != nil, tc.wantAsleep, tc.wantState)
			}
			// A second look does not read the status again: the daemon's word counts.
			c.Status.Phase = v1.PhaseReady
			p.observeSleep(c, &o)
			if o.Asleep != tc.wantAsleep {
				t.Errorf("second observation: Asleep %v, want %v", o.Asleep, tc.wantAsleep)
			}
		})
	}
}

// A cluster going to sleep keeps its port (the gate accepts on it) and drops
// the daemon's client of it; the gate answers a failed wake with the
// cluster's serving certificate.
func TestGoToSleepKeepsOnlyThePort(t *testing.T) {
	dir := t.TempDir()
	p := &Provider{
		cfg:          Config{StateDir: dir, Defaults: Defaults{SleepAfter: time.Minute}},
		log:          slog.New(slog.DiscardHandler),
		sup:          supervisor.New(slog.New(slog.DiscardHandler), supervisor.DefaultBackoff(), nil),
		probes:       map[string]*probe{},
		sleepers:     map[string]*sleeper{},
		sleepMetrics: sleep.NewMetrics(),
	}
	c := &v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "ci"}, Status: v1.ClusterStatus{Phase: v1.PhaseReady}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	p.sleepers["ci"] = &sleeper{known: true, tenant: fake.NewClientset()}
	p.probes["ci"] = &probe{}
	if err := p.goToSleep(context.Background(), c, lease.Lease{Port: port}); err != nil {
		t.Fatal(err)
	}
	defer p.forgetSleeper("ci")
	s := p.sleepers["ci"]
	if s.tenant != nil || p.probes["ci"] != nil {
		t.Errorf("asleep with a tenant client (%v) or a probe (%v)", s.tenant != nil, p.probes["ci"] != nil)
	}
	if s.gate == nil || !s.gate.Listening() {
		t.Fatal("asleep without a gate accepting on its port")
	}
	if l, err := net.Listen("tcp", s.gate.Addr()); err == nil {
		l.Close()
		t.Errorf("the port %s is free while the cluster sleeps", s.gate.Addr())
	}
}
