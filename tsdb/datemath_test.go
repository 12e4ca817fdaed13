package tsdb

import (
	"errors"
	"strings"
	"testing"
	"time"

	"devicehub/schema"
)

func TestParseTime(t *testing.T) {
	newYork := mustLoad("America/New_York")
	f := func(loc *time.Location, now, expr, want string) {
		t.Helper()
		n := parseIn(t, loc, now)
		// The same instant carried in any zone gives the same answer: only
		// the platform zone loc counts.
		for _, in := range []*time.Location{time.UTC, newYork, loc} {
			got, err := ParseTime(expr, n.In(in), loc)
			if err != nil {
				t.Fatalf("%s at %s (%s): %v", expr, now, in, err)
			}
			if got.Location() != loc {
				t.Fatalf("%s at %s (%s): %v not in %s", expr, now, in, got, loc)
			}
			if s := got.Format(layoutZ); s != want {
				t.Fatalf("%s at %s in %s (now carried in %s): got %s, want %s", expr, now, loc, in, s, want)
			}
		}
	}
	// Rounding in the platform zone: 2026-05-10 20:00 UTC is already
	// May 11 in Shanghai.
	f(shanghai, "2026-05-11 04:00:00 CST", "now-7d/d", "2026-05-04 00:00:00 CST")
	f(shanghai, "2026-05-11 04:00:00 CST", "now/d", "2026-05-11 00:00:00 CST")
	f(shanghai, "2026-05-11 04:00:00 CST", "now/w", "2026-05-11 00:00:00 CST") // a Monday
	f(shanghai, "2026-05-10 23:59:59 CST", "now/w", "2026-05-04 00:00:00 CST")
	f(shanghai, "2026-05-01 01:00:00 CST", "now/M", "2026-05-01 00:00:00 CST")
	f(shanghai, "2026-01-01 07:59:59 CST", "now/y", "2026-01-01 00:00:00 CST")
	f(shanghai, "2026-05-11 04:35:12 CST", "now/h", "2026-05-11 04:00:00 CST")
	f(shanghai, "2026-05-11 04:35:12 CST", "now/m", "2026-05-11 04:35:00 CST")
	f(shanghai, "2026-05-11 04:35:12 CST", "now-1y+2h", "2025-05-11 06:35:12 CST")
	f(shanghai, "2026-05-11 04:35:12 CST", "now", "2026-05-11 04:35:12 CST")
	f(shanghai, "2026-05-11 04:35:12 CST", "now+90s", "2026-05-11 04:36:42 CST")
	f(shanghai, "2026-05-11 04:35:12 CST", "1700000000000", "2023-11-15 06:13:20 CST")
	// Months and years keep the day of the month, clamped to the month's end.
	f(shanghai, "2026-07-31 12:00:00 CST", "now-1M", "2026-06-30 12:00:00 CST")
	f(shanghai, "2026-07-31 12:00:00 CST", "now-29M", "2024-02-29 12:00:00 CST")
	f(shanghai, "2026-03-31 12:00:00 CST", "now-1M", "2026-02-28 12:00:00 CST")
	f(shanghai, "2026-03-31 12:00:00 CST", "now-1M-1M", "2026-01-28 12:00:00 CST")
	f(shanghai, "2024-02-29 12:00:00 CST", "now-1y", "2023-02-28 12:00:00 CST")
	f(shanghai, "2024-02-29 12:00:00 CST", "now+4y", "2028-02-29 12:00:00 CST")
	f(shanghai, "2026-01-31 12:00:00 CST", "now+1M/M", "2026-02-01 00:00:00 CST")
	f(shanghai, "2026-12-31 12:00:00 CST", "now+2M", "2027-02-28 12:00:00 CST")

	// Berlin: the spring DST day (2026-03-29) has 23 hours, the autumn one
	// (2026-10-25) 25. Days keep the local time of day; hours are exact.
	f(berlin, "2026-03-30 12:00:00 CEST", "now-1d", "2026-03-29 12:00:00 CEST")
	f(berlin, "2026-03-30 12:00:00 CEST", "now-2d", "2026-03-28 12:00:00 CET")
	f(berlin, "2026-03-30 12:00:00 CEST", "now-1d/d", "2026-03-29 00:00:00 CET")
	f(berlin, "2026-03-29 12:00:00 CEST", "now/d", "2026-03-29 00:00:00 CET")
	f(berlin, "2026-03-29 12:00:00 CEST", "now-12h", "2026-03-28 23:00:00 CET")
	f(berlin, "2026-03-29 03:30:00 CEST", "now-1h", "2026-03-29 01:30:00 CET")
	f(berlin, "2026-03-29 03:30:00 CEST", "now/h", "2026-03-29 03:00:00 CEST")
	f(berlin, "2026-03-28 02:30:00 CET", "now+1d", "2026-03-29 03:30:00 CEST") // 02:30 does not exist: later by the gap
	f(berlin, "2026-10-26 12:00:00 CET", "now-1d", "2026-10-25 12:00:00 CET")
	f(berlin, "2026-10-26 12:00:00 CET", "now-2d", "2026-10-24 12:00:00 CEST")
	f(berlin, "2026-10-25 23:59:59 CET", "now/d", "2026-10-25 00:00:00 CEST")
	f(berlin, "2026-10-25 12:00:00 CET", "now-12h", "2026-10-25 01:00:00 CEST")
	f(berlin, "2026-10-25 02:30:00 CET", "now/h", "2026-10-25 02:00:00 CET") // the repeated hour, second time
	f(berlin, "2026-10-25 02:30:00 CET", "now-1h", "2026-10-25 02:30:00 CEST")
	f(berlin, "2026-10-25 12:00:00 CET", "now/w", "2026-10-19 00:00:00 CEST")
	f(berlin, "2026-11-01 12:00:00 CET", "now-1M/M", "2026-10-01 00:00:00 CEST")
	f(berlin, "2026-04-15 12:00:00 CEST", "now/M", "2026-04-01 00:00:00 CEST")
	f(berlin, "2026-04-15 12:00:00 CEST", "now-1M/M", "2026-03-01 00:00:00 CET")

	// A day without midnight (Santiago moves 00:00 to 01:00 on 2026-09-06)
	// starts at its first instant, not at 23:00 the day before.
	santiago := mustLoad("America/Santiago")
	f(santiago, "2026-09-06 12:00:00 -03", "now/d", "2026-09-06 01:00:00 -03")
	f(santiago, "2026-09-07 12:00:00 -03", "now-1d/d", "2026-09-06 01:00:00 -03")
	f(santiago, "2026-09-05 12:00:00 -04", "now+1d/d", "2026-09-06 01:00:00 -03")
	f(santiago, "2026-09-06 12:00:00 -03", "now/w", "2026-08-31 00:00:00 -04")

	bad := func(expr, mention string) {
		t.Helper()
		_, err := ParseTime(expr, parseIn(t, shanghai, "2026-05-11 04:00:00 CST"), shanghai)
		if !errors.Is(err, schema.ErrIllegalArgument) || !strings.Contains(err.Error(), mention) {
			t.Fatalf("%q: err %v, want schema.ErrIllegalArgument mentioning %q", expr, err, mention)
		}
	}
	for _, expr := range []string{"", "yesterday", "now-", "now-7q", "now/q", "now-1d/", "now-1d/d/d", "now-1234567d", "NOW", " now", "1e12", "now-1.5d"} {
		bad(expr, "date math")
	}
	bad("-99999999999999", "1971")
	bad("99999999999999", "2105")
	bad("now-60y", "1971")
	bad("now+999999y", "2105")
	bad("now+999999M", "2105")
	bad("now-999999w", "1971")
}

func TestCheckTime(t *testing.T) {
	f := func(utc string, ok bool) {
		t.Helper()
		tm, err := time.Parse(time.DateTime, utc)
		if err != nil {
			t.Fatal(err)
		}
		// The year is the UTC one whatever zone the time carries.
		for _, loc := range []*time.Location{time.UTC, shanghai, mustLoad("America/Los_Angeles")} {
			if err := CheckTime(tm.In(loc)); (err == nil) != ok || err != nil && !errors.Is(err, schema.ErrIllegalArgument) {
				t.Fatalf("%s in %s: %v, want ok %v", utc, loc, err, ok)
			}
		}
	}
	f("1971-01-01 00:00:00", true)
	f("1970-12-31 23:59:59", false)
	f("2105-12-31 23:59:59", true)
	f("2106-01-01 00:00:00", false)
}

const layoutZ = "2006-01-02 15:04:05 MST"

// parseIn reads "2006-01-02 15:04:05 MST" in loc; the abbreviation must be
// the one loc uses then, which picks the instant in a repeated hour.
func parseIn(t *testing.T, loc *time.Location, s string) time.Time {
	t.Helper()
	tm, err := time.ParseInLocation(layoutZ, s, loc)
	if err != nil {
		t.Fatal(err)
	}
	if got := tm.Format(layoutZ); got != s {
		t.Fatalf("%s reads %s in %s", s, got, loc)
	}
	return tm
}
