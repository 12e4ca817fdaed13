package tsdb

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"devicehub/schema"
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

	if _, err := Buckets("2m", time.Now(), time.Now(), time.UTC, 0); !errors.Is(err, schema.ErrIllegalArgument) {
		t.Errorf("unknown interval: err %v, want schema.ErrIllegalArgument", err)
	}
	many, _ := Buckets(Hour, time.Time{}, time.Now(), time.UTC, 0)
	if len(many) != MaxBuckets {
		t.Errorf("unlimited hours over centuries: %d buckets, want MaxBuckets", len(many))
	}
}

// A range without from is RangeStart(to, n) .. to: exactly n buckets,
// the newest holding to, for every interval, zone and kind of to.
func TestRangeStart(t *testing.T) {
	santiago := mustLoad("America/Santiago")
	f := func(interval string, loc *time.Location, to string, n int, want string) {
		t.Helper()
		tm := parseIn(t, loc, to)
		from, err := RangeStart(interval, tm, n, loc)
		if err != nil {
			t.Fatalf("RangeStart(%s, %s, %d): %v", interval, to, n, err)
		}
		if got := from.Format(layoutZ); got != want {
			t.Fatalf("RangeStart(%s, %s, %d) = %s, want %s", interval, to, n, got, want)
		}
	}
	f(Month, shanghai, "2026-07-31 12:00:00 CST", 30, "2024-02-01 00:00:00 CST")
	f(Month, shanghai, "2026-07-31 00:00:00 CST", 30, "2024-02-01 00:00:00 CST")
	f(Month, shanghai, "2026-12-31 23:59:59 CST", 11, "2026-02-01 00:00:00 CST")
	f(Month, shanghai, "2026-04-30 12:00:00 CST", 3, "2026-02-01 00:00:00 CST")
	f(Month, shanghai, "2026-04-30 12:00:00 CST", 1, "2026-04-01 00:00:00 CST")
	f(Year, shanghai, "2024-02-29 12:00:00 CST", 30, "1995-01-01 00:00:00 CST")
	f(Week, shanghai, "2026-07-31 12:00:00 CST", 30, "2026-01-05 00:00:00 CST")
	f(Day, shanghai, "2024-03-01 00:30:00 CST", 30, "2024-02-01 00:00:00 CST")
	f(Hour, shanghai, "2026-07-31 23:59:59 CST", 30, "2026-07-30 18:00:00 CST")
	f(Day, berlin, "2026-03-30 00:30:00 CEST", 30, "2026-03-01 00:00:00 CET")
	f(Day, berlin, "2026-10-25 23:30:00 CET", 30, "2026-09-26 00:00:00 CEST")
	f(Hour, berlin, "2026-03-29 04:30:00 CEST", 30, "2026-03-27 22:00:00 CET")
	f(Hour, berlin, "2026-10-25 02:30:00 CET", 30, "2026-10-23 22:00:00 CEST")
	f(Hour, berlin, "2026-10-25 02:30:00 CET", 2, "2026-10-25 02:00:00 CEST")
	f(Day, santiago, "2026-09-07 12:00:00 -03", 2, "2026-09-06 01:00:00 -03")

	tos := map[*time.Location][]string{
		shanghai: {
			"2026-07-31 12:00:00 CST", "2026-07-31 00:00:00 CST", "2026-12-31 23:59:59 CST", "2026-01-01 00:00:00 CST",
			"2024-02-29 23:59:59 CST", "2024-02-29 00:00:00 CST", "2026-04-30 07:59:59 CST", "2026-03-31 08:00:00 CST",
		},
		berlin: {
			"2026-07-31 12:00:00 CEST", "2026-03-29 23:30:00 CEST", "2026-03-30 00:30:00 CEST", "2026-03-29 03:00:00 CEST",
			"2026-03-29 01:59:59 CET", "2026-10-25 23:30:00 CET", "2026-10-25 02:30:00 CEST", "2026-10-25 02:30:00 CET",
			"2026-10-26 00:00:00 CET", "2024-02-29 12:00:00 CET", "2026-12-31 23:59:59 CET",
		},
		santiago: {"2026-09-06 01:00:00 -03", "2026-09-07 00:30:00 -03", "2026-04-04 23:30:00 -03", "2026-04-04 23:30:00 -04"},
	}
	for loc, list := range tos {
		for _, to := range list {
			tm := parseIn(t, loc, to)
			for _, interval := range []string{Hour, Day, Week, Month, Year} {
				for _, n := range []int{1, 2, 12, 30, 31, 100} {
					if interval == Year && n > 50 {
						continue // before 1970
					}
					from, err := RangeStart(interval, tm, n, loc)
					if err != nil {
						t.Fatal(err)
					}
					got, err := Buckets(interval, from, tm, loc, 0)
					if err != nil {
						t.Fatalf("%s %s n=%d: %v", interval, to, n, err)
					}
					if len(got) != n || !got[0].Equal(truncate(interval, tm, loc)) || !got[n-1].Equal(from) {
						t.Fatalf("%s, %s, to %s, n %d: from %s gives %d buckets %s .. %s", loc, interval, to, n,
							from.Format(layoutZ), len(got), got[0].Format(layoutZ), got[len(got)-1].Format(layoutZ))
					}
				}
			}
		}
	}

	if _, err := RangeStart("2d", time.Now(), 30, shanghai); !errors.Is(err, schema.ErrIllegalArgument) {
		t.Errorf("unknown interval: err %v, want schema.ErrIllegalArgument", err)
	}
	if _, err := RangeStart(Day, time.Now(), 0, shanghai); !errors.Is(err, schema.ErrIllegalArgument) {
		t.Errorf("0 buckets: err %v, want schema.ErrIllegalArgument", err)
	}
}

// Bucket edges are local midnights even where midnight does not exist, and
// every bucket returned is one ClickHouse's DateTime holds.
func TestBucketsEdges(t *testing.T) {
	santiago := mustLoad("America/Santiago") // 2026-09-06 starts at 01:00
	beirut := mustLoad("Asia/Beirut")        // 2024-03-31 starts at 01:00
	f := func(interval string, loc *time.Location, from, to string, want ...string) {
		t.Helper()
		got, err := Buckets(interval, parseIn(t, loc, from), parseIn(t, loc, to), loc, 0)
		if err != nil {
			t.Fatal(err)
		}
		var gs []string
		for _, b := range got {
			gs = append(gs, b.Format(layoutZ))
		}
		if !slices.Equal(gs, want) {
			t.Fatalf("Buckets(%s, %s, %s)\n got %q\nwant %q", interval, from, to, gs, want)
		}
	}
	f(Day, santiago, "2026-09-05 12:00:00 -04", "2026-09-07 12:00:00 -03",
		"2026-09-07 00:00:00 -03", "2026-09-06 01:00:00 -03", "2026-09-05 00:00:00 -04")
	f(Day, beirut, "2024-03-30 12:00:00 EET", "2024-04-01 12:00:00 EEST",
		"2024-04-01 00:00:00 EEST", "2024-03-31 01:00:00 EEST", "2024-03-30 00:00:00 EET")
	// Berlin's DST days last 23 and 25 hours.
	for to, want := range map[string]int{"2026-03-29 23:59:59 CEST": 23, "2026-10-25 23:59:59 CET": 25, "2026-10-26 23:59:59 CET": 24} {
		tm := parseIn(t, berlin, to)
		if hours, err := Buckets(Hour, floor('d', tm, berlin), tm, berlin, 0); err != nil || len(hours) != want {
			t.Errorf("the day of %s: %d hours, err %v, want %d", to, len(hours), err, want)
		}
	}
	days, _ := Buckets(Day, parseIn(t, berlin, "2026-03-28 12:00:00 CET"), parseIn(t, berlin, "2026-10-26 12:00:00 CET"), berlin, 0)
	lengths := map[time.Duration]int{}
	for i := 1; i < len(days); i++ {
		lengths[days[i-1].Sub(days[i])]++
	}
	if len(days) != 213 || lengths[23*time.Hour] != 1 || lengths[25*time.Hour] != 1 || lengths[24*time.Hour] != 210 {
		t.Errorf("Berlin 2026-03-28 .. 2026-10-26: %d days, lengths %v", len(days), lengths)
	}

	refused := func(interval string, from, to time.Time, limit int) {
		t.Helper()
		if _, err := Buckets(interval, from, to, shanghai, limit); !errors.Is(err, schema.ErrIllegalArgument) || !strings.Contains(err.Error(), "1970") {
			t.Errorf("Buckets(%s, %v, %v, %d): err %v, want schema.ErrIllegalArgument", interval, from, to, limit, err)
		}
	}
	utc := func(s string) time.Time {
		tm, err := time.Parse(time.DateTime, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	refused(Month, utc("1969-06-01 00:00:00"), utc("1971-06-01 00:00:00"), 0)
	refused(Day, utc("1970-01-01 00:00:00"), utc("1970-01-01 00:00:00"), 0) // 1970-01-01 in Shanghai starts at 16:00 UTC the day before
	refused(Hour, utc("2106-02-07 06:30:00"), utc("2106-02-07 06:30:00"), 0)
	refused(Year, utc("2105-06-01 00:00:00"), utc("2106-01-01 00:00:00"), 0)
	if got, err := Buckets(Day, utc("1970-01-01 16:00:00"), utc("2106-02-06 15:59:59"), shanghai, 0); err != nil || len(got) != MaxBuckets {
		t.Errorf("first to last whole day of DateTime: %d buckets, err %v", len(got), err)
	}
	if got, err := Buckets(Hour, utc("1970-01-01 00:00:00"), utc("1970-01-01 01:59:59"), shanghai, 0); err != nil || len(got) != 2 {
		t.Errorf("first hours of DateTime: %d buckets, err %v", len(got), err)
	}
	if got, err := Buckets(Hour, utc("2106-02-07 05:00:00"), utc("2106-02-07 05:59:59"), shanghai, 0); err != nil || len(got) != 1 {
		t.Errorf("last whole hour of DateTime: %d buckets, err %v", len(got), err)
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

// Minute buckets follow the local wall clock: a 15m bucket starts at :00,
// :15, :30 or :45 local time, also where the zone is half an hour off UTC
// and across DST changes; each lasts its minutes of real time.
func TestBucketsMinutes(t *testing.T) {
	kolkata := mustLoad("Asia/Kolkata")
	f := func(interval string, loc *time.Location, from, to string, limit int, want ...string) {
		t.Helper()
		got, err := Buckets(interval, parseIn(t, loc, from), parseIn(t, loc, to), loc, limit)
		if err != nil {
			t.Fatal(err)
		}
		var gs []string
		for _, b := range got {
			gs = append(gs, b.Format(layoutZ))
		}
		if !slices.Equal(gs, want) {
			t.Fatalf("Buckets(%s, %s, %s)\n got %q\nwant %q", interval, from, to, gs, want)
		}
	}
	f(Minute, shanghai, "2024-02-29 23:58:30 CST", "2024-03-01 00:00:59 CST", 0,
		"2024-03-01 00:00:00 CST", "2024-02-29 23:59:00 CST", "2024-02-29 23:58:00 CST")
	f(FiveMinutes, shanghai, "2024-02-29 23:54:59 CST", "2024-03-01 00:05:00 CST", 0,
		"2024-03-01 00:05:00 CST", "2024-03-01 00:00:00 CST", "2024-02-29 23:55:00 CST", "2024-02-29 23:50:00 CST")
	f(FifteenMinutes, kolkata, "2024-03-04 10:29:59 IST", "2024-03-04 11:00:00 IST", 0,
		"2024-03-04 11:00:00 IST", "2024-03-04 10:45:00 IST", "2024-03-04 10:30:00 IST", "2024-03-04 10:15:00 IST")
	f(FifteenMinutes, kolkata, "2024-03-04 10:00:00 IST", "2024-03-04 11:59:00 IST", 3,
		"2024-03-04 11:45:00 IST", "2024-03-04 11:30:00 IST", "2024-03-04 11:15:00 IST")
	// Berlin: 02:00-03:00 CET does not exist on 2024-03-31; 02:00-03:00
	// happens twice on 2024-10-27.
	f(FifteenMinutes, berlin, "2024-03-31 01:40:00 CET", "2024-03-31 03:20:00 CEST", 0,
		"2024-03-31 03:15:00 CEST", "2024-03-31 03:00:00 CEST", "2024-03-31 01:45:00 CET", "2024-03-31 01:30:00 CET")
	f(FifteenMinutes, berlin, "2024-10-27 02:40:00 CEST", "2024-10-27 02:20:00 CET", 0,
		"2024-10-27 02:15:00 CET", "2024-10-27 02:00:00 CET", "2024-10-27 02:45:00 CEST", "2024-10-27 02:30:00 CEST")
	days, err := Buckets(FiveMinutes, parseIn(t, berlin, "2024-10-27 00:00:00 CEST"), parseIn(t, berlin, "2024-10-27 23:59:59 CET"), berlin, 0)
	if err != nil || len(days) != 25*12 {
		t.Fatalf("5m buckets of the 25-hour day: %d, %v", len(days), err)
	}
	for i := 1; i < len(days); i++ {
		if d := days[i-1].Sub(days[i]); d != 5*time.Minute {
			t.Fatalf("bucket %v lasts %v", days[i], d)
		}
	}
	for _, iv := range []string{Minute, FiveMinutes, FifteenMinutes} {
		from, err := RangeStart(iv, parseIn(t, berlin, "2024-10-27 02:07:00 CET"), 24, berlin)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := Buckets(iv, from, parseIn(t, berlin, "2024-10-27 02:07:00 CET"), berlin, 0); len(got) != 24 {
			t.Fatalf("%s: RangeStart of 24 gives %d buckets", iv, len(got))
		}
	}
}

// TestBucketsFast: Buckets of intervals shorter than a day, which steps
// by the bucket's length within one zone offset, equals the step loop
// (truncate on the local clock after every step) over random ranges in
// zones with DST, half-hour and 45-minute offsets, 30-minute DST (Lord
// Howe) and offset changes without DST (Pyongyang 2015, Samoa 2011).
func TestBucketsFast(t *testing.T) {
	t.Parallel()
	zones := []string{"UTC", "Europe/Berlin", "America/Santiago", "Asia/Kolkata", "Asia/Kathmandu",
		"Australia/Lord_Howe", "Asia/Pyongyang", "Pacific/Apia", "America/St_Johns", "Asia/Beirut"}
	r := rand.New(rand.NewPCG(1, 2))
	for _, z := range zones {
		loc := mustLoad(z)
		// Ranges of up to 21 days ending at random, and three days around
		// each offset change of the zone from 2010 on.
		type span struct{ from, to time.Time }
		var spans []span
		for range 60 {
			to := time.Unix(1262304000+r.Int64N(16*365*86400), 0) // 2010..2026
			spans = append(spans, span{to.Add(-time.Duration(r.Int64N(int64(21 * 24 * time.Hour)))), to})
		}
		for at := time.Unix(1262304000, 0).In(loc); at.Year() < 2027; {
			_, end := at.ZoneBounds()
			if end.IsZero() {
				break
			}
			spans = append(spans, span{end.Add(-36*time.Hour - time.Duration(r.Int64N(int64(time.Hour)))), end.Add(36 * time.Hour)})
			at = end
		}
		for _, iv := range []string{Minute, FiveMinutes, FifteenMinutes, Hour} {
			for _, sp := range spans {
				from, to := sp.from, sp.to
				limit := []int{0, 1, 24, 168, 1000}[r.IntN(5)]
				got, err := Buckets(iv, from, to, loc, limit)
				if err != nil {
					t.Fatal(err)
				}
				if limit <= 0 {
					limit = MaxBuckets
				}
				first := truncate(iv, from, loc)
				var want []time.Time
				for b := truncate(iv, to, loc); !b.Before(first) && len(want) < limit; b = step(iv, b, -1, loc) {
					want = append(want, b)
				}
				if !slices.EqualFunc(got, want, time.Time.Equal) {
					t.Fatalf("%s %s %s..%s limit %d: %d buckets, want %d; first difference at %d", z, iv, from, to, limit, len(got), len(want),
						slices.IndexFunc(got, func(b time.Time) bool { i := slices.IndexFunc(want, b.Equal); return i < 0 }))
				}
			}
		}
	}
}

// BenchmarkBuckets is a dashboard's week of hours in a zone with DST.
func BenchmarkBuckets(b *testing.B) {
	to := time.Now()
	for b.Loop() {
		if _, err := Buckets(Hour, to.AddDate(0, 0, -7), to, berlin, 168); err != nil {
			b.Fatal(err)
		}
	}
}
