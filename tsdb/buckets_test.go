package tsdb

import (
	"errors"
	"slices"
	"testing"
	"time"
)

func TestBuckets(t *testing.T) {
	f := func(interval string, from, to time.Time, loc *time.Location, limit int, want ...string) {
		t.Helper()
		got, err := Buckets(interval, from, to, loc, limit)
		if err != nil {
			t.Fatalf("Buckets(%s, %v, %v): %v", interval, from, to, err)
		}
		var gs []string
		for _, b := range got {
			if b.Location() != loc {
				t.Errorf("bucket %v not in %v", b, loc)
			}
			gs = append(gs, b.Format("2006-01-02 15:04 MST"))
		}
		if len(gs) != len(want) {
			t.Fatalf("Buckets(%s, %v, %v, %d)\n got %q\nwant %q", interval, from, to, limit, gs, want)
		}
		for i := range gs {
			if gs[i] != want[i] {
				t.Fatalf("Buckets(%s, %v, %v, %d)\n got %q\nwant %q", interval, from, to, limit, gs, want)
			}
		}
	}
	sh := func(s string) time.Time {
		tm, err := time.ParseInLocation("2006-01-02 15:04:05", s, shanghai)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	be := func(s string) time.Time {
		tm, err := time.ParseInLocation("2006-01-02 15:04:05", s, berlin)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}

	// Leap day, days.
	f(Day, sh("2024-02-27 10:00:00"), sh("2024-03-01 00:00:00"), shanghai, 0,
		"2024-03-01 00:00 CST", "2024-02-29 00:00 CST", "2024-02-28 00:00 CST", "2024-02-27 00:00 CST")
	// Swapped from/to, same result; limit keeps the newest.
	f(Day, sh("2024-03-01 00:00:00"), sh("2024-02-27 10:00:00"), shanghai, 2,
		"2024-03-01 00:00 CST", "2024-02-29 00:00 CST")
	// Near midnight: 23:59:59 is still the previous day.
	f(Day, sh("2024-02-28 23:59:59"), sh("2024-02-29 23:59:59"), shanghai, 10,
		"2024-02-29 00:00 CST", "2024-02-28 00:00 CST")
	// The same instant is Feb 29 in Shanghai and Feb 28 in UTC.
	f(Day, sh("2024-02-29 07:59:59"), sh("2024-02-29 07:59:59"), time.UTC, 0, "2024-02-28 00:00 UTC")
	f(Day, sh("2024-02-29 07:59:59"), sh("2024-02-29 07:59:59"), shanghai, 0, "2024-02-29 00:00 CST")
	// Months across month ends and a year end.
	f(Month, sh("2023-12-31 23:59:59"), sh("2024-03-01 00:00:00"), shanghai, 0,
		"2024-03-01 00:00 CST", "2024-02-01 00:00 CST", "2024-01-01 00:00 CST", "2023-12-01 00:00 CST")
	f(Month, sh("2024-01-31 23:59:59"), sh("2024-02-29 23:59:59"), shanghai, 0,
		"2024-02-01 00:00 CST", "2024-01-01 00:00 CST")
	// Limit larger than the range.
	f(Month, sh("2024-01-01 00:00:00"), sh("2024-01-31 23:59:59"), shanghai, 12, "2024-01-01 00:00 CST")
	// Weeks start on Monday; Feb 29 2024 is a Thursday.
	f(Week, sh("2024-02-29 12:00:00"), sh("2024-03-04 00:00:00"), shanghai, 0,
		"2024-03-04 00:00 CST", "2024-02-26 00:00 CST")
	f(Year, sh("2023-12-31 23:59:59"), sh("2024-01-01 00:00:00"), shanghai, 0,
		"2024-01-01 00:00 CST", "2023-01-01 00:00 CST")
	f(Hour, sh("2024-02-29 22:59:59"), sh("2024-03-01 00:00:00"), shanghai, 0,
		"2024-03-01 00:00 CST", "2024-02-29 23:00 CST", "2024-02-29 22:00 CST")

	// Berlin, spring forward (Mar 31 2024, 02:00 CET -> 03:00 CEST): a 23h day.
	f(Day, be("2024-03-30 23:59:59"), be("2024-03-31 23:59:59"), berlin, 0,
		"2024-03-31 00:00 CET", "2024-03-30 00:00 CET")
	f(Hour, be("2024-03-31 01:30:00"), be("2024-03-31 03:30:00"), berlin, 0,
		"2024-03-31 03:00 CEST", "2024-03-31 01:00 CET")
	// Fall back (Oct 27 2024, 03:00 CEST -> 02:00 CET): a 25h day, 02:00 twice.
	f(Day, be("2024-10-26 23:59:59"), be("2024-10-28 00:00:00"), berlin, 0,
		"2024-10-28 00:00 CET", "2024-10-27 00:00 CEST", "2024-10-26 00:00 CEST")
	fallFrom := time.Date(2024, 10, 26, 23, 30, 0, 0, time.UTC) // 01:30 CEST
	f(Hour, fallFrom, fallFrom.Add(2*time.Hour), berlin, 0,
		"2024-10-27 02:00 CET", "2024-10-27 02:00 CEST", "2024-10-27 01:00 CEST")
	f(Month, be("2024-03-31 23:59:59"), be("2024-04-01 00:00:00"), berlin, 0,
		"2024-04-01 00:00 CEST", "2024-03-01 00:00 CET")

	// Day buckets are whole local days: 23h, 24h, 25h in Berlin.
	days, _ := Buckets(Day, be("2024-10-26 12:00:00"), be("2024-10-28 12:00:00"), berlin, 0)
	if d := days[0].Sub(days[1]); d != 25*time.Hour {
		t.Errorf("Oct 27 2024 in Berlin lasts %v, want 25h", d)
	}

	if _, err := Buckets("5m", time.Now(), time.Now(), time.UTC, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("unknown interval: err %v, want ErrInvalidArgument", err)
	}
	many, _ := Buckets(Hour, time.Time{}, time.Now(), time.UTC, 0)
	if len(many) != MaxBuckets {
		t.Errorf("unlimited hours over centuries: %d buckets, want MaxBuckets", len(many))
	}
}

func TestSplitDDL(t *testing.T) {
	src := "-- c; not a split;\nCREATE TABLE a (x Int8) ENGINE = Memory;\n\n-- x\nCREATE VIEW v AS SELECT toDate(now(), '{{TZ}}');\n" +
		"--@if SELECT count() FROM system.columns WHERE name = 'y'\n-- why\nALTER TABLE a\n    DROP COLUMN y;\nSELECT 1"
	got := splitDDL(src, "Asia/Shanghai")
	want := []ddl{
		{sql: "CREATE TABLE a (x Int8) ENGINE = Memory"},
		{sql: "CREATE VIEW v AS SELECT toDate(now(), 'Asia/Shanghai')"},
		{sql: "ALTER TABLE a\n    DROP COLUMN y", cond: "SELECT count() FROM system.columns WHERE name = 'y'"},
		{sql: "SELECT 1"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("splitDDL: %q, want %q", got, want)
	}
}
