package tsdb

import (
	"fmt"
	"time"

	"devicehub/schema"
)

// MaxBuckets caps Buckets and MessageCounts when no smaller limit is given.
const MaxBuckets = 10000

// Bucket intervals understood by Buckets, MessageCounts and
// PropertyAggregates, all in the platform time zone. Minute buckets
// follow the local wall clock (a 15m bucket starts at :00, :15, :30 or
// :45 local time); weeks start on Monday, as ClickHouse's toMonday.
const (
	Minute         = "1m"
	FiveMinutes    = "5m"
	FifteenMinutes = "15m"
	Hour           = "1h"
	Day            = "1d"
	Week           = "1w"
	Month          = "1M"
	Year           = "1y"
)

// bucketSpan is a bucket interval as n date math units (s, m, h, d, w, M, y).
type bucketSpan struct {
	unit byte
	n    int
}

// spans are the bucket intervals; every other text is unknown.
var spans = map[string]bucketSpan{
	Minute: {'m', 1}, FiveMinutes: {'m', 5}, FifteenMinutes: {'m', 15},
	Hour: {'h', 1}, Day: {'d', 1}, Week: {'w', 1}, Month: {'M', 1}, Year: {'y', 1},
}

// intervalSpan returns the span of an interval; it panics on an unknown
// one, which CheckInterval refuses before.
func intervalSpan(interval string) bucketSpan {
	s, ok := spans[interval]
	if !ok {
		panic("tsdb: unknown interval " + interval)
	}
	return s
}

// subDay reports whether buckets of interval are shorter than a day: they
// are instants, where day and longer buckets are local dates.
func subDay(interval string) bool {
	u := intervalSpan(interval).unit
	return u == 'm' || u == 'h'
}

// truncate returns the start of the bucket holding t, in loc.
func truncate(interval string, t time.Time, loc *time.Location) time.Time {
	s := intervalSpan(interval)
	if s.unit == 'm' && s.n > 1 {
		// The local minute rounded down to a multiple of n, as bucketSQL.
		t = t.In(loc)
		return floor('m', t, loc).Add(-time.Duration(t.Minute()%s.n) * time.Minute)
	}
	return floor(s.unit, t, loc)
}

// step returns the start of the bucket n buckets after the one starting at b
// (n may be negative).
func step(interval string, b time.Time, n int, loc *time.Location) time.Time {
	s := intervalSpan(interval)
	return truncate(interval, add(s.unit, b, n*s.n, loc), loc)
}

// subDaySpan is the length of a bucket of interval when it is shorter
// than a day; 0 otherwise.
func subDaySpan(interval string) time.Duration {
	switch s := intervalSpan(interval); s.unit {
	case 'm':
		return time.Duration(s.n) * time.Minute
	case 'h':
		return time.Duration(s.n) * time.Hour
	}
	return 0
}

// CheckInterval refuses an interval other than 1m, 5m, 15m, 1h, 1d, 1w,
// 1M and 1y.
func CheckInterval(interval string) error {
	if _, ok := spans[interval]; !ok {
		return fmt.Errorf("interval %q: want 1m, 5m, 15m, 1h, 1d, 1w, 1M or 1y: %w", interval, schema.ErrIllegalArgument)
	}
	return nil
}

// RangeStart returns the start of the range of n buckets (n >= 1) that
// ends with the bucket holding to, in loc (nil: time.Local): Buckets from
// it to to holds exactly n buckets, whatever the month length, leap day or
// DST change in between.
func RangeStart(interval string, to time.Time, n int, loc *time.Location) (time.Time, error) {
	if err := CheckInterval(interval); err != nil {
		return time.Time{}, err
	}
	if n < 1 {
		return time.Time{}, fmt.Errorf("%d buckets: want at least 1: %w", n, schema.ErrIllegalArgument)
	}
	if loc == nil {
		loc = time.Local
	}
	return step(interval, truncate(interval, to, loc), -(n - 1), loc), nil
}

// maxDateTime is the last second ClickHouse's DateTime holds (2106-02-07
// 06:28:15 UTC); the first is the Unix epoch.
const maxDateTime = 1<<32 - 1

// Buckets returns the starts of every bucket of interval that holds a
// moment between from and to (either order), in loc, newest first, at most
// limit of them (MaxBuckets when limit <= 0 or larger). Buckets that
// ClickHouse's DateTime cannot hold (before 1970 or after 2106-02-07 UTC)
// are schema.ErrIllegalArgument.
func Buckets(interval string, from, to time.Time, loc *time.Location, limit int) ([]time.Time, error) {
	if err := CheckInterval(interval); err != nil {
		return nil, err
	}
	if loc == nil {
		loc = time.Local
	}
	if from.After(to) {
		from, to = to, from
	}
	if limit <= 0 || limit > MaxBuckets {
		limit = MaxBuckets
	}
	first := truncate(interval, from, loc)
	var out []time.Time
	if span := subDaySpan(interval); span > 0 {
		// Buckets shorter than a day, at a dashboard's sizes (1h x168):
		// within one offset of the zone a bucket starts span before the
		// next (the local wall clock moves with the instant, so stays
		// aligned); step, which truncates on the local clock, only where
		// the offset changes in between. TestBucketsFast holds it to the
		// step loop below.
		out = make([]time.Time, 0, min(limit, int(to.Sub(from)/span)+2))
		var zoneStart time.Time
		zoned := false // zoneStart is that of b's offset
		for b := truncate(interval, to, loc); !b.Before(first) && len(out) < limit; {
			out = append(out, b)
			if !zoned {
				zoneStart, _ = b.ZoneBounds()
				zoned = true
			}
			if prev := b.Add(-span); zoneStart.IsZero() || !prev.Before(zoneStart) {
				b = prev
				continue
			}
			b, zoned = step(interval, b, -1, loc), false
		}
	} else {
		for b := truncate(interval, to, loc); !b.Before(first) && len(out) < limit; b = step(interval, b, -1, loc) {
			out = append(out, b)
		}
	}
	if oldest, end := out[len(out)-1], step(interval, out[0], 1, loc); oldest.Unix() < 0 || end.Unix() > maxDateTime {
		return nil, fmt.Errorf("%s buckets from %s to %s: outside what ClickHouse's DateTime holds (1970-01-01 to 2106-02-07 UTC): %w",
			interval, oldest.Format("2006-01-02 15:04 MST"), end.Format("2006-01-02 15:04 MST"), schema.ErrIllegalArgument)
	}
	return out, nil
}

// bucketRange is the buckets of interval between from and to as Buckets
// returns them, with the instants ClickHouse reads between: lo (the oldest
// start) inclusive, hi (the end of the newest) exclusive.
type bucketRange struct {
	interval string
	starts   []time.Time // newest first
	lo, hi   time.Time
}

func newBucketRange(interval string, from, to time.Time, loc *time.Location, limit int) (bucketRange, error) {
	starts, err := Buckets(interval, from, to, loc, limit)
	if err != nil {
		return bucketRange{}, err
	}
	return bucketRange{interval: interval, starts: starts, lo: starts[len(starts)-1], hi: step(interval, starts[0], 1, loc)}, nil
}

// Range is a resolved bucket range: the buckets of an interval that a
// query returns, newest first, computed once (NewRange) and handed to the
// queries that run on it (CountQuery.Range, AggQuery.Range).
type Range struct{ r bucketRange }

// NewRange computes the buckets of interval in loc (nil: time.Local)
// holding a moment between from and to (either order), at most limit
// (<= 0: MaxBuckets), newest kept. An unknown interval, or a range
// outside what ClickHouse's DateTime holds, is an error wrapping
// schema.ErrIllegalArgument.
func NewRange(interval string, from, to time.Time, loc *time.Location, limit int) (Range, error) {
	r, err := newBucketRange(interval, from, to, loc, limit)
	if err != nil {
		return Range{}, err
	}
	return Range{r: r}, nil
}

// Interval is the range's interval.
func (r Range) Interval() string { return r.r.interval }

// Starts are the starts of the range's buckets, newest first (shared: not
// to be modified).
func (r Range) Starts() []time.Time { return r.r.starts }

// Len is how many buckets the range holds.
func (r Range) Len() int { return len(r.r.starts) }

// End is the end of the range's newest bucket (exclusive): with Starts,
// what a store other than ClickHouse (alarm counts in PostgreSQL) buckets
// its rows between.
func (r Range) End() time.Time { return r.r.hi }

// resolved is the range of a query given either resolved (r non-nil) or
// by its interval, ends and limit.
func resolved(r *Range, interval string, from, to time.Time, loc *time.Location, limit int) (bucketRange, error) {
	if r != nil {
		if len(r.r.starts) == 0 {
			return bucketRange{}, fmt.Errorf("tsdb: an unresolved Range: %w", schema.ErrIllegalArgument)
		}
		return r.r, nil
	}
	return newBucketRange(interval, from, to, loc, limit)
}

// bucketSQL is the ClickHouse expression of the bucket holding the
// DateTime column col, in the zone tz (an IANA name): epoch seconds of the
// bucket's start for buckets shorter than a day, the Date (days since
// 1970-01-01) of its first day otherwise, as a UInt32 either way. It
// computes what truncate does: minutes and hours on the local wall clock,
// days, Monday weeks, months and years as local dates (bucketStart maps a
// date to its first instant).
func bucketSQL(interval, col, tz string) string {
	z := quoteString(tz)
	s := intervalSpan(interval)
	switch s.unit {
	case 'm':
		// Hours start at local :00 in every zone ClickHouse and Go know;
		// the local minute is counted from there.
		return fmt.Sprintf("toUInt32(toUInt32(toStartOfHour(%[1]s, %[2]s)) + intDiv(toMinute(%[1]s, %[2]s), %[3]d) * %[4]d)", col, z, s.n, s.n*60)
	case 'h':
		return "toUInt32(toStartOfHour(" + col + ", " + z + "))"
	case 'd':
		return "toUInt32(toDate(" + col + ", " + z + "))"
	case 'w':
		return "toUInt32(toMonday(toDate(" + col + ", " + z + ")))"
	case 'M':
		return "toUInt32(toStartOfMonth(toDate(" + col + ", " + z + ")))"
	case 'y':
		return "toUInt32(toStartOfYear(toDate(" + col + ", " + z + ")))"
	}
	panic("tsdb: unknown interval " + interval)
}

// bucketStart turns a value of bucketSQL into the start instant of its
// bucket, as Buckets makes it: for dates, the day's first instant in loc
// (localTime), so the keys match even where midnight does not exist.
func bucketStart(interval string, v uint32, loc *time.Location) time.Time {
	if subDay(interval) {
		return time.Unix(int64(v), 0).In(loc)
	}
	return dayStart(v, loc)
}

// dayStart is the first instant in loc of the Date day (days since
// 1970-01-01).
func dayStart(day uint32, loc *time.Location) time.Time {
	y, m, d := time.Unix(int64(day)*86400, 0).UTC().Date()
	return localTime(y, m, d, 0, 0, 0, 0, loc)
}
