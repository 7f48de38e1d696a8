package main

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
)

var summaryNow = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) metav1.Time { return metav1.NewTime(summaryNow.Add(-d)) }

// readyCluster is a Ready cluster the daemon has defaulted, with a node up.
func readyCluster() *v1.Cluster {
	return &v1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: "ci", CreationTimestamp: ago(2 * time.Hour), Finalizers: []string{v1.Finalizer}},
		Spec: v1.ClusterSpec{
			MaxNodes: 5, Hold: metav1.Duration{Duration: time.Minute},
			NodeCPUs: 1, MaxNodeCPUs: 4,
			NodeMemory: resource.MustParse("1Gi"), MaxNodeMemory: resource.MustParse("8Gi"),
			NodeDisk: resource.MustParse("10Gi"), MaxNodeDisk: resource.MustParse("40Gi"),
			PodsPerNode: 110, ControlPlaneMemory: resource.MustParse("2Gi"), ControlPlanePIDs: 4096, ControlPlaneCPUWeight: 100,
			Datastore: "sqlite", SleepAfter: &metav1.Duration{Duration: 10 * time.Minute},
			IdleNodes: 2, IdleSchedule: "Mon-Fri 08:00-18:00 Europe/Berlin", FreshNodePerJob: true,
		},
		Status: v1.ClusterStatus{
			Phase: v1.PhaseReady, URL: "https://127.0.0.1:7500", Port: 7500,
			Gateway: "10.250.1.1", NodeCIDR: "10.250.1.0/24", PodCIDR: "10.1.0.0/16", ServiceCIDR: "10.96.0.0/16",
			Nodes:             2,
			IdleNodes:         &v1.IdleNodesStatus{Wanted: 2, Spare: 1, Booting: 1, Claimed: 1},
			LastScaleDecision: &v1.ScaleDecision{Action: "Provision", Target: 2, Reason: "1 pod unschedulable on 1 node: need 1", Time: ago(3 * time.Minute)},
			Restarts:          1,
			PodStarts: []v1.PodStartPercentiles{
				{Path: v1.PodStartIdle, Count: 3, P50: metav1.Duration{Duration: 4100 * time.Millisecond}, P90: metav1.Duration{Duration: 6 * time.Second}},
				{Path: v1.PodStartCold, Count: 1, P50: metav1.Duration{Duration: 41300 * time.Millisecond}, P90: metav1.Duration{Duration: 41300 * time.Millisecond}},
			},
			Conditions: []metav1.Condition{
				{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", Message: "the apiserver answers /readyz", LastTransitionTime: ago(2 * time.Hour)},
				{Type: v1.ConditionNodeAccelerator, Status: metav1.ConditionTrue, Reason: "TCG", Message: "the KVM probe's guest did not reach user space", LastTransitionTime: ago(2 * time.Hour)},
				{Type: v1.ConditionNodeBoot, Status: metav1.ConditionFalse, Reason: "NodeDied", Message: "node ci-abc exited before it joined\n[    0.1] console one\n[    0.2] console two", LastTransitionTime: ago(5 * time.Minute)},
			},
		},
	}
}

const readySummary = `Name:                    ci
Phase:                   Ready
URL:                     https://127.0.0.1:7500
Port:                    7500
Gateway:                 10.250.1.1
Node CIDR:               10.250.1.0/24
Pod CIDR:                10.1.0.0/16
Service CIDR:            10.96.0.0/16
Created:                 2026-05-01T10:00:00Z (2h ago)
Spec:
  Node size:             1-4 vCPU, 1Gi-8Gi memory, 10Gi-40Gi disk
  Max nodes:             5
  Pods per node:         110
  Hold:                  1m
  Idle nodes:            2 (Mon-Fri 08:00-18:00 Europe/Berlin)
  Fresh node per job:    yes
  Egress:                the host's policy
  Sleep after:           10m
  Datastore:             sqlite
  Control plane:         memory 2Gi, pids 4096, cpu weight 100
Nodes:                   2
Idle nodes:              wanted 2, spare 1 (0 joined, 1 booting), 1 claimed
Accelerator:             TCG (the KVM probe's guest did not reach user space)
Last scale decision:
  Action:                Provision
  Target:                2 nodes
  Reason:                1 pod unschedulable on 1 node: need 1
  When:                  2026-05-01T11:57:00Z (3m ago)
Restarts:                1
Pod starts (last hour):  idle n=3 p50 4.1s p90 6.0s, cold n=1 p50 41.3s p90 41.3s
Conditions:
  TYPE             STATUS  REASON    AGE  MESSAGE
  Ready            True    Ready     2h   the apiserver answers /readyz
  NodeAccelerator  True    TCG       2h   the KVM probe's guest did not reach user space
  NodeBoot         False   NodeDied  5m   node ci-abc exited before it joined (2 more lines: -o wide)
`

func TestClusterSummary(t *testing.T) {
	if got := clusterSummary(readyCluster(), summaryNow); got != readySummary {
		t.Fatalf("summary of a Ready cluster:\n%s\nwant:\n%s", got, readySummary)
	}

	asleep := readyCluster()
	asleep.Status.Phase = v1.PhaseAsleep
	asleep.Status.Gateway, asleep.Status.NodeCIDR, asleep.Status.PodCIDR, asleep.Status.ServiceCIDR = "", "", "", ""
	asleep.Status.Nodes = 0
	asleep.Status.AsleepSince = &metav1.Time{Time: summaryNow.Add(-20 * time.Minute)}
	asleep.Status.NextWake = &metav1.Time{Time: summaryNow.Add(3 * time.Minute)}
	asleep.Status.PodStarts = nil

	fresh := &v1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "new", CreationTimestamp: ago(2 * time.Second)}}

	neverSleeps := readyCluster()
	neverSleeps.Spec.SleepAfter = nil
	neverSleeps.Spec.NodeDisk, neverSleeps.Spec.MaxNodeDisk = resource.Quantity{}, resource.Quantity{}
	neverSleeps.Spec.MaxNodeCPUs = 1
	neverSleeps.Spec.MaxNodeMemory = resource.MustParse("1Gi")
	neverSleeps.Spec.ControlPlaneMemory = resource.Quantity{}
	neverSleeps.Status.LastScaleDecision = nil
	neverSleeps.Spec.IdleSchedule = ""
	neverSleeps.Status.IdleNodes = nil
	neverSleeps.Status.Conditions = []metav1.Condition{{Type: v1.ConditionNodeNetwork, Status: metav1.ConditionTrue, Message: "a\tb", LastTransitionTime: ago(time.Minute)}}
	now := metav1.NewTime(summaryNow)
	neverSleeps.DeletionTimestamp = &now

	tests := []struct {
		name    string
		c       *v1.Cluster
		want    []string
		notWant []string
	}{
		{"asleep", asleep, []string{
			"Phase:                   Asleep\n",
			"Gateway:                 <none while asleep>\n",
			"Service CIDR:            <none while asleep>\n",
			"Nodes:                   0\n",
			"Asleep since:            2026-05-01T11:40:00Z (20m ago)\n",
			"Next wake:               2026-05-01T12:03:00Z (in 3m)\n",
			"Pod starts (last hour):  none recorded\n",
		}, nil},
		{"not yet defaulted by the daemon", fresh, []string{
			"Phase:                   <none>\n",
			"URL:                     <none>\n",
			"Port:                    <none>\n",
			"Gateway:                 <none>\n",
			"Created:                 2026-05-01T11:59:58Z (2s ago)\n",
			"  Node size:             default vCPU, default memory, default disk\n",
			"  Max nodes:             default\n",
			"  Hold:                  default\n",
			"  Idle nodes:            none\n",
			"  Fresh node per job:    no\n",
			"  Egress:                the host's policy\n",
			"  Sleep after:           default\n",
			"  Datastore:             default\n",
			"  Control plane:         memory default, pids default, cpu weight default\n",
			"Accelerator:             <not reported yet>\n",
			"Last scale decision:     <none>\n",
			"Restarts:                0\n",
			"Conditions:              <none>\n",
		}, []string{"Asleep since", "Next wake", "Deleting", "Idle nodes:              wanted"}},
		{"one node size, no disk, never sleeps, being deleted", neverSleeps, []string{
			"Deleting since:          2026-05-01T12:00:00Z (0s ago)\n",
			"  Node size:             1 vCPU, 1Gi memory, no disk\n",
			"  Sleep after:           never\n",
			"  Control plane:         memory no limit, pids 4096, cpu weight 100\n",
			"Accelerator:             <not reported yet>\n",
			"Last scale decision:     <none>\n",
			"  Idle nodes:            2 (always)\n",
			"  NodeNetwork  True    <none>  1m   a b\n",
		}, nil},
	}
	for _, tt := range tests {
		got := clusterSummary(tt.c, summaryNow)
		for _, w := range tt.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: summary lacks %q:\n%s", tt.name, w, got)
			}
		}
		for _, w := range tt.notWant {
			if strings.Contains(got, w) {
				t.Errorf("%s: summary has %q:\n%s", tt.name, w, got)
			}
		}
	}
}

// -o wide is the summary and then the whole of each message the table cut short.
func TestClusterSummaryWide(t *testing.T) {
	c := readyCluster()
	want := strings.Replace(readySummary, "(2 more lines: -o wide)", "(2 more lines: below)", 1) +
		"NodeBoot message:\n  node ci-abc exited before it joined\n  [    0.1] console one\n  [    0.2] console two\n"
	if got := clusterSummaryWide(c, summaryNow); got != want {
		t.Errorf("wide summary:\n%s\nwant:\n%s", got, want)
	}
	c.Status.Conditions = c.Status.Conditions[:2]
	if got := clusterSummaryWide(c, summaryNow); got != clusterSummary(c, summaryNow) {
		t.Errorf("wide summary with one-line messages differs from the summary:\n%s", got)
	}
}

func TestRoughDuration(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"},
		{0, "0s"},
		{59 * time.Second, "59s"},
		{90 * time.Second, "1m"},
		{59 * time.Minute, "59m"},
		{47 * time.Hour, "47h"},
		{49 * time.Hour, "2d"},
	}
	for _, tt := range tests {
		if got := roughDuration(tt.d); got != tt.want {
			t.Errorf("roughDuration(%s) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestShortDuration(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{30 * time.Second, "30s"},
		{time.Minute, "1m"},
		{90 * time.Second, "1m30s"},
		{2 * time.Hour, "2h"},
		{2*time.Hour + 5*time.Minute, "2h5m"},
		{time.Hour + time.Second, "1h0m1s"},
		{1500 * time.Millisecond, "1.5s"},
	}
	for _, tt := range tests {
		if got := shortDuration(tt.d); got != tt.want {
			t.Errorf("shortDuration(%s) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestEgressSummary(t *testing.T) {
	for _, tc := range []struct {
		spec v1.ClusterSpec
		want string
	}{
		{v1.ClusterSpec{}, "the host's policy"},
		{v1.ClusterSpec{Egress: v1.EgressHost, EgressDeny: []string{"192.168.10.0/24"}}, "the host's policy; also denied: 192.168.10.0/24"},
		{v1.ClusterSpec{Egress: v1.EgressNone, EgressDeny: []string{"1.1.1.0/24", "8.8.8.8/32"}}, "none (nothing forwarded); also denied: 1.1.1.0/24, 8.8.8.8/32"},
	} {
		if got := egressSummary(tc.spec); got != tc.want {
			t.Errorf("egressSummary(%+v) = %q, want %q", tc.spec, got, tc.want)
		}
	}
}
