package window

import (
	"strings"
	"testing"
	"time"
)

func TestParseAndOpen(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skipf("no time zone data: %v", err)
	}
	// 2026-12-07 is a Monday.
	at := func(day, hour, min int, loc *time.Location) time.Time {
		return time.Date(2026, 12, 7+day, hour, min, 0, 0, loc)
	}
	tests := []struct {
		spec string
		at   time.Time
		open bool
	}{
		{"", at(0, 3, 0, time.UTC), true},
		{"Mon-Fri 08:00-18:00", at(0, 8, 0, time.UTC), true},
		{"Mon-Fri 08:00-18:00", at(0, 7, 59, time.UTC), false},
		{"Mon-Fri 08:00-18:00", at(0, 18, 0, time.UTC), false},
		{"Mon-Fri 08:00-18:00", at(5, 12, 0, time.UTC), false},                // Saturday
		{"Mon-Fri 08:00-18:00 Europe/Berlin", at(0, 7, 30, time.UTC), true},   // 08:30 in Berlin
		{"Mon-Fri 08:00-18:00 Europe/Berlin", at(0, 17, 30, time.UTC), false}, // 18:30 in Berlin
		{"Mon-Fri 08:00-18:00 Europe/Berlin", at(0, 9, 0, berlin), true},
		{"sat,sun 00:00-24:00", at(6, 23, 59, time.UTC), true}, // Sunday
		{"MON-fRi 08:00-18:00", at(0, 8, 0, time.UTC), true},
		{"sat,sun 00:00-24:00", at(0, 0, 0, time.UTC), false},
		{"Fri-Mon 10:00-11:00", at(0, 10, 30, time.UTC), true}, // wraps the week
		{"Fri-Mon 10:00-11:00", at(1, 10, 30, time.UTC), false},
		{"Mon 22:00-06:00", at(0, 23, 0, time.UTC), true},
		{"Mon 22:00-06:00", at(1, 5, 59, time.UTC), true}, // Tuesday morning
		{"Mon 22:00-06:00", at(1, 23, 0, time.UTC), false},
		{"Mon 22:00-06:00", at(0, 5, 0, time.UTC), false}, // Monday morning: Sunday's night
	}
	for _, tt := range tests {
		w, err := Parse(tt.spec)
		if err != nil {
			t.Fatalf("Parse(%q): %v", tt.spec, err)
		}
		if got := w.Open(tt.at); got != tt.open {
			t.Errorf("%q at %s: open %t, want %t", tt.spec, tt.at.Format(time.RFC1123), got, tt.open)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	tests := []struct{ spec, want string }{
		{"weekdays 08:00-18:00", `day "weekdays"`},
		{"Mon-Fri", "not two or three fields"},
		{"Mon-Fri 8-18", `"8" is not HH:MM`}, {"Mon-Fri 08:00", "not HH:MM-HH:MM"},
		{"Mon-Fri 08:00-25:00", "not a time of day"},
		{"Mon-Fri 24:00-08:00", "not a time of day"},
		{"Mon-Fri 08:00-08:00", "empty"},
		{"Mon-Fri 08:00-18:00 Mars/Olympus", "not an IANA time zone"},
		{"Mon-Fri 08:00-18:00 UTC extra", "not two or three fields"},
		// Strict HH:MM and ASCII day names: what the CRD's pattern refuses too.
		{"Mon-Fri 8:5xx-18:00", `"8:5xx" is not HH:MM`},
		{"Mon-Fri +8:00-18:00", `"+8:00" is not HH:MM`},
		{"Mon-Fri 08:00-1:000", `"1:000" is not HH:MM`},
		{"Mon-FRİ 08:00-18:00", `day "Mon-FRİ"`},
		{"ſun 08:00-18:00", `day "ſun"`},
		{"Mon,,Tue 08:00-18:00", `day ""`},
	}
	for _, tt := range tests {
		_, err := Parse(tt.spec)
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "e.g.") {
			t.Errorf("Parse(%q) = %v, want an error saying %q and what would be right", tt.spec, err, tt.want)
		}
	}
}

func TestNextOpen(t *testing.T) {
	// 2026-12-07 is a Monday.
	mon := func(day, hour, min int) time.Time { return time.Date(2026, 12, 7+day, hour, min, 30, 0, time.UTC) }
	tests := []struct {
		spec string
		at   time.Time
		want time.Time
	}{
		{"Mon-Fri 08:00-18:00", mon(0, 18, 0), time.Date(2026, 12, 8, 8, 0, 0, 0, time.UTC)},
		{"Mon-Fri 08:00-18:00", mon(4, 19, 0), time.Date(2026, 12, 14, 8, 0, 0, 0, time.UTC)}, // Friday evening: Monday
		{"Mon-Fri 08:00-18:00", mon(0, 7, 59), time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC)},
		{"", mon(0, 7, 0), time.Time{}},
	}
	for _, tt := range tests {
		w, err := Parse(tt.spec)
		if err != nil {
			t.Fatal(err)
		}
		if got := w.NextOpen(tt.at); !got.Equal(tt.want) {
			t.Errorf("%q after %s: %s, want %s", tt.spec, tt.at, got, tt.want)
		}
	}
}
