// Package window is a weekly time window in a time zone, such as "Mon-Fri 08:00-18:00
// Europe/Berlin": when a cluster keeps idle nodes up. Written here rather than taken
// from a cron library because a window has a start and an end, which a cron expression
// (a point in time) does not.
package window

import (
	"fmt"
	"strings"
	"time"
)

// Window is a set of days, a daily span and a zone. The zero Window is always open.
type Window struct {
	days       [7]bool // by time.Weekday
	start, end int     // minutes after midnight; end may be 24*60
	loc        *time.Location
	text       string
}

// dayIndex is the time.Weekday of a three-letter day name in any ASCII case, -1 for
// none. ASCII only, not strings.ToLower or EqualFold: those also take "FRİ" or "ſun",
// which the CRD's pattern (api/v1alpha1) could only match by listing such letters.
func dayIndex(name string) int {
	lower := []byte(name)
	for i, c := range lower {
		if 'A' <= c && c <= 'Z' {
			lower[i] = c + 'a' - 'A'
		}
	}
	for d := time.Sunday; d <= time.Saturday; d++ {
		if strings.ToLower(d.String()[:3]) == string(lower) {
			return int(d)
		}
	}
	return -1
}

// Parse reads "DAYS HH:MM-HH:MM [ZONE]": DAYS is a day (Mon, in any case), a range
// (Mon-Fri, which may wrap: Fri-Mon) or a comma list of either; HH:MM is two digits each,
// the span's end may be 24:00, and an end before its start runs past midnight
// (22:00-06:00) into the next day; ZONE is an IANA name (default UTC). "" is always open.
// The CRD restates this grammar as a pattern (api/v1alpha1, idleSchedulePattern): change
// both together; a test holds them in step.
func Parse(s string) (Window, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Window{}, nil
	}
	bad := func(why string) (Window, error) {
		return Window{}, fmt.Errorf("window %q: %s; want DAYS HH:MM-HH:MM [ZONE], e.g. \"Mon-Fri 08:00-18:00 Europe/Berlin\"", s, why)
	}
	f := strings.Fields(s)
	if len(f) < 2 || len(f) > 3 {
		return bad("not two or three fields")
	}
	w := Window{loc: time.UTC, text: s}
	for _, part := range strings.Split(f[0], ",") {
		from, to, isRange := strings.Cut(part, "-")
		a, b := dayIndex(from), dayIndex(to)
		if !isRange {
			b = a
		}
		if a < 0 || b < 0 {
			return bad(fmt.Sprintf("day %q is not one of Mon Tue Wed Thu Fri Sat Sun", part))
		}
		for d := a; ; d = (d + 1) % 7 {
			w.days[d] = true
			if d == b {
				break
			}
		}
	}
	from, to, ok := strings.Cut(f[1], "-")
	if !ok {
		return bad("the span is not HH:MM-HH:MM")
	}
	var err error
	if w.start, err = minutes(from, false); err != nil {
		return bad(err.Error())
	}
	if w.end, err = minutes(to, true); err != nil {
		return bad(err.Error())
	}
	if w.start == w.end {
		return bad("the span is empty")
	}
	if len(f) == 3 {
		if w.loc, err = time.LoadLocation(f[2]); err != nil {
			return bad(fmt.Sprintf("zone %q is not an IANA time zone name (they are case-sensitive, e.g. Europe/Berlin or UTC)", f[2]))
		}
	}
	return w, nil
}

// minutes reads HH:MM, two digits each; 24:00 only as an end. Strict, where Sscanf
// would also take "8:5xx" (as 08:05) or "+8:00".
func minutes(s string, end bool) (int, error) {
	digit := func(i int) bool { return s[i] >= '0' && s[i] <= '9' }
	if len(s) != 5 || s[2] != ':' || !digit(0) || !digit(1) || !digit(3) || !digit(4) {
		return 0, fmt.Errorf("%q is not HH:MM", s)
	}
	h, m := int(s[0]-'0')*10+int(s[1]-'0'), int(s[3]-'0')*10+int(s[4]-'0')
	if h == 24 && m == 0 && end {
		return 24 * 60, nil
	}
	if h > 23 || m > 59 {
		return 0, fmt.Errorf("%q is not a time of day", s)
	}
	return h*60 + m, nil
}

// Open says whether t falls in the window.
func (w Window) Open(t time.Time) bool {
	if w.loc == nil {
		return true
	}
	t = t.In(w.loc)
	m := t.Hour()*60 + t.Minute()
	day := int(t.Weekday())
	if w.start < w.end {
		return w.days[day] && m >= w.start && m < w.end
	}
	// Past midnight: the evening of a listed day, or the morning after one.
	return (w.days[day] && m >= w.start) || (w.days[(day+6)%7] && m < w.end)
}

// NextOpen is the first minute after t at which the window is open, for a window that
// is closed at t; the zero time for the always-open window. A week of minutes is
// enough to find it.
func (w Window) NextOpen(t time.Time) time.Time {
	if w.loc == nil {
		return time.Time{}
	}
	m := t.Truncate(time.Minute)
	for range 7*24*60 + 1 {
		m = m.Add(time.Minute)
		if w.Open(m) {
			return m
		}
	}
	return time.Time{} // no day listed: cannot happen for a parsed window
}

// String is the window as parsed, "" for always.
func (w Window) String() string { return w.text }
