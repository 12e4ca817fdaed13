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

// unit is the date math unit of a bucket interval, 0 for an unknown one.
func unit(interval string) byte {
	switch interval {
	case Hour, Day, Week, Month, Year:
		return interval[1]
	}
	return 0
}

// truncate returns the start of the bucket holding t, in loc.
func truncate(interval string, t time.Time, loc *time.Location) time.Time {
	u := unit(interval)
	if u == 0 {
		panic("tsdb: unknown interval " + interval)
	}
	return floor(u, t, loc)
}

// step returns the start of the bucket n buckets after the one starting at b
// (n may be negative).
func step(interval string, b time.Time, n int, loc *time.Location) time.Time {
	u := unit(interval)
	if u == 0 {
		panic("tsdb: unknown interval " + interval)
	}
	return floor(u, add(u, b, n, loc), loc)
}

// CheckInterval refuses an interval other than 1h, 1d, 1w, 1M and 1y.
func CheckInterval(interval string) error {
	if unit(interval) == 0 {
		return fmt.Errorf("interval %q: want 1h, 1d, 1w, 1M or 1y: %w", interval, ErrInvalidArgument)
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
		return time.Time{}, fmt.Errorf("%d buckets: want at least 1: %w", n, ErrInvalidArgument)
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
// are ErrInvalidArgument.
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
	for b := truncate(interval, to, loc); !b.Before(first) && len(out) < limit; b = step(interval, b, -1, loc) {
		out = append(out, b)
	}
	if oldest, end := out[len(out)-1], step(interval, out[0], 1, loc); oldest.Unix() < 0 || end.Unix() > maxDateTime {
		return nil, fmt.Errorf("%s buckets from %s to %s: outside what ClickHouse's DateTime holds (1970-01-01 to 2106-02-07 UTC): %w",
			interval, oldest.Format("2006-01-02 15:04 MST"), end.Format("2006-01-02 15:04 MST"), ErrInvalidArgument)
	}
	return out, nil
}
