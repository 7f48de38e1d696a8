package sleep

import (
	"time"

	"github.com/robfig/cron/v3"
	batchv1 "k8s.io/api/batch/v1"
)

// NextCron is when the earliest of jobs is next due after now; zero when none
// is scheduled. Suspended CronJobs and schedules that do not parse (the
// CronJob controller runs those never either) are left out. The parsing is the
// controller's own: standard five fields or a descriptor, in spec.timeZone.
func NextCron(jobs []batchv1.CronJob, now time.Time) time.Time {
	var next time.Time
	for _, j := range jobs {
		if j.Spec.Suspend != nil && *j.Spec.Suspend {
			continue
		}
		spec := j.Spec.Schedule
		if tz := j.Spec.TimeZone; tz != nil && *tz != "" {
			spec = "CRON_TZ=" + *tz + " " + spec
		}
		s, err := cron.ParseStandard(spec)
		if err != nil {
			continue
		}
		if t := s.Next(now); !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	return next
}
