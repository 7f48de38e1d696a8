package sleep

import (
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/utils/ptr"
)

func TestDecide(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	idle := Observed{Now: now, SleepAfter: time.Minute, AwakeSince: now.Add(-time.Hour), LastRequest: now.Add(-2 * time.Minute)}
	with := func(f func(*Observed)) Observed { o := idle; f(&o); return o }
	tests := []struct {
		name     string
		o        Observed
		sleep    bool
		why      string
		nextWake time.Time
	}{
		{"idle long enough", idle, true, "no request", time.Time{}},
		{"never", with(func(o *Observed) { o.SleepAfter = 0 }), false, "never", time.Time{}},
		{"a recent request", with(func(o *Observed) { o.LastRequest = now.Add(-30 * time.Second) }), false, "idle for 30s of 1m0s", time.Time{}},
		{"just woken, no request since", with(func(o *Observed) { o.AwakeSince = now.Add(-10 * time.Second); o.LastRequest = time.Time{} }), false, "idle for 10s", time.Time{}},
		{"no request ever, up long enough", with(func(o *Observed) { o.LastRequest = time.Time{} }), true, "no request", time.Time{}},
		{"a node", with(func(o *Observed) { o.Nodes = 1 }), false, "1 nodes", time.Time{}},
		{"pods want a node", with(func(o *Observed) { o.WantsNodes = 2 }), false, "2 pods wait", time.Time{}},
		{"cronjob due soon", with(func(o *Observed) { o.NextCron = now.Add(90 * time.Second) }), false, "CronJob is due", time.Time{}},
		{"cronjob due later: wake ahead of it", with(func(o *Observed) { o.NextCron = now.Add(time.Hour) }), true, "no request", now.Add(time.Hour - WakeLead)},
		{"idle nodes wanted now", with(func(o *Observed) { o.IdleNodesWanted = true }), false, "idle nodes are wanted", time.Time{}},
		{"idle window later: wake ahead of it", with(func(o *Observed) { o.NextIdleWindow = now.Add(3 * time.Hour) }), true, "no request", now.Add(3*time.Hour - WakeLead)},
		{"the earlier of a CronJob and the idle window", with(func(o *Observed) {
			o.NextIdleWindow, o.NextCron = now.Add(3*time.Hour), now.Add(5*time.Hour)
		}), true, "no request", now.Add(3*time.Hour - WakeLead)},
		{"exactly at sleepAfter", with(func(o *Observed) { o.LastRequest = now.Add(-time.Minute) }), true, "no request", time.Time{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := Decide(tc.o)
			if v.Sleep != tc.sleep || !strings.Contains(v.Why, tc.why) || !v.NextWake.Equal(tc.nextWake) {
				t.Errorf("Decide = %+v, want sleep %v, why containing %q, next wake %v", v, tc.sleep, tc.why, tc.nextWake)
			}
		})
	}
}

func TestNextCron(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 7, 30, 0, time.UTC)
	job := func(schedule string, mod func(*batchv1.CronJob)) batchv1.CronJob {
		j := batchv1.CronJob{Spec: batchv1.CronJobSpec{Schedule: schedule}}
		if mod != nil {
			mod(&j)
		}
		return j
	}
	tests := []struct {
		name string
		jobs []batchv1.CronJob
		want time.Time
	}{
		{"none", nil, time.Time{}},
		{"every 15 minutes", []batchv1.CronJob{job("*/15 * * * *", nil)}, time.Date(2026, 12, 1, 12, 15, 0, 0, time.UTC)},
		{"the earliest of two", []batchv1.CronJob{job("@daily", nil), job("0 13 * * *", nil)}, time.Date(2026, 12, 1, 13, 0, 0, 0, time.UTC)},
		{"suspended is left out", []batchv1.CronJob{job("*/15 * * * *", func(j *batchv1.CronJob) { j.Spec.Suspend = ptr.To(true) }), job("@hourly", nil)}, time.Date(2026, 12, 1, 13, 0, 0, 0, time.UTC)},
		{"a bad schedule is left out", []batchv1.CronJob{job("not a schedule", nil)}, time.Time{}},
		{"in its time zone", []batchv1.CronJob{job("0 14 * * *", func(j *batchv1.CronJob) { j.Spec.TimeZone = ptr.To("Europe/Berlin") })}, time.Date(2026, 12, 1, 13, 0, 0, 0, time.UTC)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := NextCron(tc.jobs, now); !got.Equal(tc.want) {
				t.Errorf("NextCron = %v, want %v", got, tc.want)
			}
		})
	}
}
