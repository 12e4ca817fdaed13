package tsdb

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// rollupData is values of product aggp around aggData's edges plus a bulk
// of random ones over 40 days before end, multiples of 0.25 (sums exact
// in Float64), with repeats at the same millisecond and duplicates of
// whole rows (a message delivered twice).
func rollupData(loc *time.Location, end time.Time, seed uint64) []PropertyValue {
	r := rand.New(rand.NewPCG(seed, 1))
	vs := aggData(loc)
	span := int64(40 * 24 * time.Hour / time.Millisecond)
	for i := range 3000 {
		v := PropertyValue{
			Time:      time.UnixMilli(end.UnixMilli() - r.Int64N(span)),
			ProductID: "aggp",
			DeviceID:  fmt.Sprint("d", 1+r.IntN(4)),
			Property:  []string{"temp", "hum"}[r.IntN(2)],
			ValueType: "number",
			Num:       float64(r.IntN(400))/4 - 50,
		}
		vs = append(vs, v)
		if i%50 == 0 {
			vs = append(vs, v) // the same row twice
			v.Num += 0.25      // and another value at the same millisecond
			vs = append(vs, v)
		}
	}
	return vs
}

// TestRollupMatchesRaw: every aggregate of every bucket interval, per
// device and product-wide, is the same from the rollup as from
// device_property, on the same data, in a fixed-offset zone and a DST
// zone; buckets the rollup cannot answer (minutes, a +05:30 zone) read
// device_property.
func TestRollupMatchesRaw(t *testing.T) {
	ctx := ctxT(t)
	end := time.Date(2024, 3, 5, 0, 0, 0, 0, time.UTC)
	kolkata := mustLoad("Asia/Kolkata")
	for i, loc := range []*time.Location{shanghai, berlin, kolkata} {
		name := fmt.Sprintf("rollup%d_%d", i, rand.IntN(1e6))
		db := openDB(t, name, loc)
		opt := testOptions(name, loc)
		opt.NoRollup = true
		raw, err := Open(ctx, opt)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		vs := rollupData(loc, end, uint64(i))
		// In three inserts: the rollup holds three states per hour to merge.
		for k := 0; k < len(vs); k += len(vs)/3 + 1 {
			if err := db.Insert(ctx, nil, vs[k:min(k+len(vs)/3+1, len(vs))]); err != nil {
				t.Fatal(err)
			}
		}
		if n, m, err := db.rollupCheck(ctx); err != nil || n != m || n == 0 {
			t.Fatalf("%s: rollup holds %d values, device_property %d (%v)", loc, n, m, err)
		}
		f := func(interval string, from, to time.Time, wantRollup bool) {
			t.Helper()
			for _, agg := range []string{AggAvg, AggMin, AggMax, AggSum, AggCount, AggFirst, AggLast} {
				for _, device := range []string{"d1", ""} {
					q := AggQuery{Interval: interval, From: from, To: to, ProductID: "aggp", DeviceID: device,
						Properties: []string{"temp", "hum"}, Agg: agg}
					before := rollupQueries.Load()
					got, err := db.PropertyAggregates(ctx, q)
					if err != nil {
						t.Fatal(err)
					}
					if used := rollupQueries.Load() > before; used != wantRollup {
						t.Fatalf("%s %s from %v: rollup used %v, want %v", loc, interval, from, used, wantRollup)
					}
					before = rollupQueries.Load()
					want, err := raw.PropertyAggregates(ctx, q)
					if err != nil {
						t.Fatal(err)
					}
					if rollupQueries.Load() != before {
						t.Fatal("NoRollup read the rollup")
					}
					values := 0
					for s := range want {
						if len(got[s].Buckets) != len(want[s].Buckets) {
							t.Fatalf("%s %s: %d buckets, want %d", loc, interval, len(got[s].Buckets), len(want[s].Buckets))
						}
						for b, w := range want[s].Buckets {
							g := got[s].Buckets[b]
							if !g.Start.Equal(w.Start) || g.Values != w.Values || g.Value != w.Value {
								t.Errorf("%s %s %s device %q %s bucket %v: %d values, %v; raw %d, %v",
									loc, interval, agg, device, want[s].Property, w.Start, g.Values, g.Value, w.Values, w.Value)
							}
							values += int(w.Values)
						}
					}
					if values == 0 {
						t.Fatalf("%s %s %s: no values in range", loc, interval, agg)
					}
				}
			}
		}
		aligned := loc != kolkata
		from := end.Add(-45 * 24 * time.Hour)
		f(Minute, end.Add(-3*time.Hour), end, false)
		f(FifteenMinutes, end.Add(-24*time.Hour), end, false)
		f(Hour, from, end, aligned)
		f(Hour, end.Add(-7*24*time.Hour), end.Add(-time.Second), aligned)
		f(Day, from, end, aligned)
		f(Week, from, end, aligned)
		f(Month, from.AddDate(-1, 0, 0), end, aligned)
		f(Year, from.AddDate(-3, 0, 0), end, aligned)
	}
}

// TestRollupBackfill: a database whose values were stored before the
// rollup existed (as version 2 left it) gets them rolled up at the next
// Open, once, and values stored after that are rolled up by the view.
func TestRollupBackfill(t *testing.T) {
	ctx := ctxT(t)
	name := fmt.Sprint("rollupfill", rand.IntN(1e6))
	db := openDB(t, name, shanghai)
	end := time.Date(2024, 3, 5, 0, 0, 0, 0, time.UTC)
	vs := rollupData(shanghai, end, 7)
	half := len(vs) / 2
	if err := db.Insert(ctx, nil, vs[:half]); err != nil {
		t.Fatal(err)
	}
	// Version 2: no rollup; values stored meanwhile.
	for _, q := range []string{"DROP TABLE device_property_hourly_mv6", "DROP TABLE device_property_hourly_filled", "DROP TABLE device_property_hourly"} {
		if err := db.Conn().Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Insert(ctx, nil, vs[half:]); err != nil {
		t.Fatal(err)
	}
	// The interrupted upgrade: table and view made, then a crash before
	// the mark; a value stored through the view meanwhile.
	again := func() {
		t.Helper()
		d, err := Open(ctx, testOptions(name, shanghai))
		if err != nil {
			t.Fatal(err)
		}
		d.Close()
	}
	again()
	if err := db.Conn().Exec(ctx, "DROP TABLE device_property_hourly_filled"); err != nil {
		t.Fatal(err)
	}
	extra := PropertyValue{Time: end.Add(-time.Hour), ProductID: "aggp", DeviceID: "d1", Property: "temp", ValueType: "number", Num: 1}
	if err := db.Insert(ctx, nil, []PropertyValue{extra}); err != nil {
		t.Fatal(err)
	}
	again()
	again() // filled: nothing rolled up twice
	if err := db.Insert(ctx, nil, []PropertyValue{extra}); err != nil {
		t.Fatal(err)
	}
	n, m, err := db.rollupCheck(ctx)
	if err != nil || n != m || m != uint64(len(vs)+2-countText(vs)) {
		t.Fatalf("rollup holds %d values, device_property %d of %d (%v)", n, m, len(vs)+2-countText(vs), err)
	}
	opt := testOptions(name, shanghai)
	opt.NoRollup = true
	raw, err := Open(ctx, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, agg := range []string{AggSum, AggCount, AggFirst, AggLast} {
		q := AggQuery{Interval: Day, From: end.Add(-50 * 24 * time.Hour), To: end, ProductID: "aggp", Properties: []string{"temp"}, Agg: agg}
		got, err := db.PropertyAggregates(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		want, err := raw.PropertyAggregates(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for b, w := range want[0].Buckets {
			if g := got[0].Buckets[b]; g != w {
				t.Errorf("%s bucket %v: %+v, raw %+v", agg, w.Start, g, w)
			}
		}
	}
}

func countText(vs []PropertyValue) int {
	n := 0
	for _, v := range vs {
		if v.ValueType != "number" {
			n++
		}
	}
	return n
}

// TestRollupAligned: the rollup answers a range only when every bucket
// start and the range's end are whole UTC hours.
func TestRollupAligned(t *testing.T) {
	kolkata := mustLoad("Asia/Kolkata")
	at := time.Date(2024, 3, 4, 10, 0, 0, 0, time.UTC)
	f := func(interval string, from, to time.Time, loc *time.Location, want bool) {
		t.Helper()
		r, err := newBucketRange(interval, from, to, loc, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := rollupAligned(r); got != want {
			t.Errorf("%s %v..%v in %s: %v, want %v", interval, from, to, loc, got, want)
		}
	}
	f(Minute, at, at, shanghai, false) // one minute starting on the hour
	f(FifteenMinutes, at, at.Add(time.Hour), shanghai, false)
	f(Hour, at, at, shanghai, true)
	f(Hour, at.Add(-48*time.Hour), at, berlin, true)
	f(Day, at.AddDate(0, -1, 0), at.AddDate(0, 1, 0), berlin, true) // across a DST change
	f(Year, at.AddDate(-5, 0, 0), at, shanghai, true)
	f(Hour, at, at, kolkata, false)
	f(Day, at, at, kolkata, false)
}

// TestRollupFillOutlastsQueryTimeout: the one-time fill of a large
// device_property takes as long as it takes, beyond Options.QueryTimeout.
// The table grows fourfold until its fill takes more than twice the
// timeout, so that the test shows the fill outlasting it on a machine of
// any speed. The values are 2 s apart (each device's 200 s apart), so
// that 2,400,000 of them span 56 days: spread over years, the
// fill of a few hundred thousand wrote thousands of small parts, one per
// month and block of ClickHouse's two-level aggregation, and took from
// under a second to a minute (and the database's drop as long) with the
// disk's load.
func TestRollupFillOutlastsQueryTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	name := fmt.Sprint("rollupslow", rand.IntN(1e6))
	db := openDB(t, name, shanghai)
	opt := testOptions(name, shanghai)
	opt.QueryTimeout = 200 * time.Millisecond
	stored := 0
	for _, n := range []int{150_000, 450_000, 1_800_000, 7_200_000} {
		// n more values of 100 devices, a value of each device every
		// 200 s after the ones before; the rollup dropped, to be filled
		// again at the next Open.
		for _, q := range []string{
			"DROP TABLE IF EXISTS device_property_hourly_mv6", "DROP TABLE IF EXISTS device_property_hourly_filled",
			"DROP TABLE IF EXISTS device_property_hourly",
			fmt.Sprintf(`INSERT INTO device_property (ts, product_id, device_id, property, value_type, num_value, str_value)
SELECT ts, 'slowp', concat('d', toString(number %% 100)), 'm', 'number', toFloat64(number %% 1000) / 4, ''
FROM (SELECT number, toInt64(1500000000000 + number * 2000) AS ts FROM numbers(%d, %d))`, stored, n),
		} {
			if err := db.Conn().Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		stored += n
		start := time.Now()
		again, err := Open(ctx, opt)
		if err != nil {
			t.Fatalf("open after %v with %d values: %v", time.Since(start), stored, err)
		}
		again.Close()
		d := time.Since(start)
		if got, want, err := db.rollupCheck(ctx); err != nil || got != want || want != uint64(stored) {
			t.Fatalf("rollup holds %d values, device_property %d, want %d (%v)", got, want, stored, err)
		}
		if d >= 2*opt.QueryTimeout {
			t.Logf("filled %d values in %v (query timeout %v)", stored, d, opt.QueryTimeout)
			return
		}
	}
	t.Fatalf("the fill of %d values took less than %v: the test shows nothing", stored, 2*opt.QueryTimeout)
}
