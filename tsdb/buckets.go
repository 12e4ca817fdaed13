package tsdb

import (
	"fmt"
	"time"
)

// MaxBuckets caps Buckets and MessageCounts when no smaller limit is given.
const MaxBuckets = 10000

// Bucket intervals understood by Buckets and MessageCounts. Weeks start on
// Monday, as ClickHouse's toMonday.
const (
	Hour  = "1h"
	Day   = "1d"
	Week  = "1w"
	Month = "1M"
	Year  = "1y"
)

// truncate returns the start of the bucket holding t, in loc.
func truncate(interval string, t time.Time, loc *time.Location) time.Time {
	t = t.In(loc)
	y, m, d := t.Date()
	switch interval {
	case Hour:
		// Subtract the local minutes rather than time.Date(...h...), which is
		// ambiguous in the repeated hour at the end of DST.
		return t.Add(-time.Duration(t.Minute())*time.Minute - time.Duration(t.Second())*time.Second - time.Duration(t.Nanosecond()))
	case Day:
		return time.Date(y, m, d, 0, 0, 0, 0, loc)
	case Week:
		return time.Date(y, m, d-(int(t.Weekday())+6)%7, 0, 0, 0, 0, loc)
	case Month:
		return time.Date(y, m, 1, 0, 0, 0, 0, loc)
	case Year:
		return time.Date(y, 1, 1, 0, 0, 0, 0, loc)
	}
	panic("tsdb: unknown interval " + interval)
}

// step returns the start of the bucket n buckets after the one starting at b
// (n may be negative).
func step(interval string, b time.Time, n int, loc *time.Location) time.Time {
	b = b.In(loc)
	y, m, d := b.Date()
	switch interval {
	case Hour:
		return truncate(Hour, b.Add(time.Duration(n)*time.Hour), loc)
	case Day:
		return time.Date(y, m, d+n, 0, 0, 0, 0, loc)
	case Week:
		return time.Date(y, m, d+7*n, 0, 0, 0, 0, loc)
	case Month:
		return time.Date(y, m+time.Month(n), 1, 0, 0, 0, 0, loc)
	case Year:
		return time.Date(y+n, 1, 1, 0, 0, 0, 0, loc)
	}
	panic("tsdb: unknown interval " + interval)
}

func checkInterval(interval string) error {
	switch interval {
	case Hour, Day, Week, Month, Year:
		return nil
	}
	return fmt.Errorf("tsdb: interval %q (want 1h, 1d, 1w, 1M or 1y): %w", interval, ErrInvalidArgument)
}

// Buckets returns the starts of every bucket of interval that holds a
// moment between from and to (either order), in loc, newest first, at most
// limit of them (MaxBuckets when limit <= 0 or larger).
func Buckets(interval string, from, to time.Time, loc *time.Location, limit int) ([]time.Time, error) {
	if err := checkInterval(interval); err != nil {
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
	for b := truncate(interval, to, loc); !b.Before(first) && len(out) < limit; b = step(interval, b, -1, loc) {
		out = append(out, b)
	}
	return out, nil
}
