package tsdb

import (
	"fmt"
	"regexp"
	"strconv"
	"time"

	"devicehub/schema"
)

// The calendar arithmetic of the dashboard lives here, once: date math such
// as now-7d/d and the bucket edges of Buckets both use add and floor, in the
// platform time zone given to them, never in the process's zone nor in the
// zone a time.Time happens to carry.
//
// Units: s, m and h are exact durations; d, w, M and y are calendar units
// of the platform zone, so a day lasts 23, 24 or 25 hours.

// dateMath matches now, now-7d, now+1h, now-1M/d (rounded down to the unit).
var (
	dateMath     = regexp.MustCompile(`^now((?:[+-]\d{1,6}[smhdwMy])*)(?:/([smhdwMy]))?$`)
	dateMathTerm = regexp.MustCompile(`([+-])(\d{1,6})([smhdwMy])`)
)

// ParseTime reads a time parameter: epoch milliseconds in decimal, or date
// math relative to now: "now", then any number of "+n<unit>" or "-n<unit>",
// then optionally "/<unit>", which rounds down to the start of that unit
// (weeks start on Monday). Months and years keep the day of the month,
// clamped to the month's last day, as Elasticsearch's date math does
// (Mar 31 -1M is the last day of February). Calendar units and rounding are
// in loc (nil: time.Local), whatever now's location; the result is in loc
// and passes CheckTime. Malformed text and out-of-range times are
// schema.ErrIllegalArgument.
func ParseTime(s string, now time.Time, loc *time.Location) (time.Time, error) {
	if loc == nil {
		loc = time.Local
	}
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		t := time.UnixMilli(ms).In(loc)
		return t, CheckTime(t)
	}
	m := dateMath.FindStringSubmatch(s)
	if m == nil {
		return time.Time{}, fmt.Errorf("%q is neither epoch milliseconds nor date math like now-7d or now-1M/M: %w", s, schema.ErrIllegalArgument)
	}
	t := now.In(loc)
	for _, term := range dateMathTerm.FindAllStringSubmatch(m[1], -1) {
		n, _ := strconv.Atoi(term[2]) // at most 6 digits
		if term[1] == "-" {
			n = -n
		}
		t = add(term[3][0], t, n, loc)
	}
	if m[2] != "" {
		t = floor(m[2][0], t, loc)
	}
	return t, CheckTime(t)
}

// CheckTime refuses a time outside the years 1971 to 2105 (UTC), a year
// inside what ClickHouse's DateTime holds (1970-01-01 to 2106-02-07 UTC).
// Buckets checks the exact range of the buckets it returns.
func CheckTime(t time.Time) error {
	if y := t.UTC().Year(); y < 1971 || y > 2105 {
		return fmt.Errorf("must be between 1971 and 2105 (got year %d): %w", y, schema.ErrIllegalArgument)
	}
	return nil
}

// add returns t moved by n units (s, m, h, d, w, M or y), in loc. Days and
// weeks keep the local time of day; months and years keep the day of the
// month, clamped to the last day of the month reached.
func add(unit byte, t time.Time, n int, loc *time.Location) time.Time {
	switch unit {
	case 's':
		return t.Add(time.Duration(n) * time.Second).In(loc)
	case 'm':
		return t.Add(time.Duration(n) * time.Minute).In(loc)
	case 'h':
		return t.Add(time.Duration(n) * time.Hour).In(loc)
	}
	t = t.In(loc)
	y, mo, d := t.Date()
	hh, mm, ss := t.Clock()
	switch unit {
	case 'd':
		d += n
	case 'w':
		d += 7 * n
	case 'M':
		y, mo, _ = time.Date(y, mo+time.Month(n), 1, 0, 0, 0, 0, time.UTC).Date()
		d = min(d, daysIn(y, mo))
	case 'y':
		y += n
		d = min(d, daysIn(y, mo))
	default:
		panic("tsdb: unknown date math unit " + string(unit))
	}
	return localTime(y, mo, d, hh, mm, ss, t.Nanosecond(), loc)
}

// floor returns the start of the unit (s, m, h, d, w, M or y) holding t, in
// loc. Weeks start on Monday, as ClickHouse's toMonday.
func floor(unit byte, t time.Time, loc *time.Location) time.Time {
	t = t.In(loc)
	y, mo, d := t.Date()
	ns := time.Duration(t.Nanosecond())
	switch unit {
	case 's':
		return t.Add(-ns)
	case 'm':
		return t.Add(-time.Duration(t.Second())*time.Second - ns)
	case 'h':
		// Subtract the local minutes rather than time.Date(...h...), which is
		// ambiguous in the hour a DST change repeats.
		return t.Add(-time.Duration(t.Minute())*time.Minute - time.Duration(t.Second())*time.Second - ns)
	case 'd':
		return localTime(y, mo, d, 0, 0, 0, 0, loc)
	case 'w':
		return localTime(y, mo, d-(int(t.Weekday())+6)%7, 0, 0, 0, 0, loc)
	case 'M':
		return localTime(y, mo, 1, 0, 0, 0, 0, loc)
	case 'y':
		return localTime(y, 1, 1, 0, 0, 0, 0, loc)
	}
	panic("tsdb: unknown date math unit " + string(unit))
}

// localTime is time.Date in loc (fields out of range are normalized), with
// one answer for a local time that a DST change skips: it moves later by
// the length of the gap, as java.time does. So the start of a day that has
// no midnight (America/Santiago, Asia/Beirut) is its first instant, where
// time.Date may answer an instant of the day before.
func localTime(y int, mo time.Month, d, hh, mm, ss, ns int, loc *time.Location) time.Time {
	t := time.Date(y, mo, d, hh, mm, ss, ns, loc)
	want := time.Date(y, mo, d, hh, mm, ss, ns, time.UTC) // the wall clock asked for
	got := time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
	if got.Before(want) { // in a gap, time.Date read it with the offset after the change
		t = t.Add(want.Sub(got))
	}
	return t
}

// daysIn is the number of days of month mo of year y.
func daysIn(y int, mo time.Month) int {
	return time.Date(y, mo+1, 0, 0, 0, 0, 0, time.UTC).Day()
}
