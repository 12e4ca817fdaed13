package tsdb

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

var kolkata = mustLoad("Asia/Kolkata")

// aggQuestions are the aggregate questions asked of the kept partials:
// 1h buckets over a week to now (the open hour included), a day around
// the last month change, a range crossing months, days, weeks and months,
// and a range older than the window (read from ClickHouse).
func aggQuestions(now time.Time, loc *time.Location) []AggQuery {
	month := time.Date(now.Year(), now.Month()-1, 1, 0, 0, 0, 0, loc)
	return []AggQuery{
		{Interval: Hour, From: now.AddDate(0, 0, -7), To: now},
		{Interval: Hour, From: month.Add(-12 * time.Hour), To: month.Add(12 * time.Hour)},
		{Interval: Hour, From: now.AddDate(0, 0, -75), To: now.AddDate(0, 0, -40), Limit: 24 * 40},
		{Interval: Day, From: now.AddDate(0, 0, -60), To: now},
		{Interval: Week, From: now.AddDate(0, 0, -90), To: now.AddDate(0, 0, -20)},
		{Interval: Month, From: now.AddDate(0, -12, 0), To: now},
		{Interval: Day, From: now.AddDate(0, 0, -420), To: now.AddDate(0, 0, -380)}, // older than the window
	}
}

// rawAggs returns q's answer from device_property (raw: a DB with
// NoRollup on the same database).
func rawAggs(t *testing.T, raw *DB, q AggQuery) []AggSeries {
	t.Helper()
	r, err := newBucketRange(q.Interval, q.From, q.To, raw.loc, q.Limit)
	if err != nil {
		t.Fatal(err)
	}
	want, err := raw.propertyAggregates(ctxT(t), r, q, q.Properties)
	if err != nil {
		t.Fatal(err)
	}
	return want
}

// TestPropAggsFromMemory: product-wide aggregates of whole-UTC-hour
// buckets are answered from the kept partials (no ClickHouse query once
// kept), equal for every function to ClickHouse's answer from
// device_property, in UTC and Europe/Berlin (DST), across months and up
// to the open hour; Asia/Kolkata, one device's questions and ranges
// older than the window read ClickHouse; late values through this DB
// (changing the first, last, min and max of a kept hour) patch the kept
// chunk and totals and show in the next answer, no chunk read again.
func TestPropAggsFromMemory(t *testing.T) {
	for _, loc := range []*time.Location{time.UTC, berlin, kolkata} {
		t.Run(loc.String(), func(t *testing.T) {
			ctx := ctxT(t)
			name := map[*time.Location]string{time.UTC: "utc", berlin: "berlin", kolkata: "kolkata"}[loc]
			opt := testOptions("paggs_"+name, loc)
			opt.ResultTTL = time.Hour // nothing expires during the test: loads are counted
			db := openDBWith(t, opt)
			opt.NoRollup = true
			raw := openDBWith(t, opt)

			now := time.Now()
			var vals []PropertyValue
			add := func(tm time.Time, p, dev, prop string, v float64) {
				vals = append(vals, PropertyValue{Time: tm, ProductID: p, DeviceID: dev, Property: prop, ValueType: "number", Num: v})
			}
			for h := 0; h < 430*24; h += 5 {
				tm := now.Add(-time.Duration(h)*time.Hour - time.Duration(h%60)*time.Minute)
				add(tm, "pa", "d1", "t", float64(h%37)/4-3)
				add(tm, "pa", "d2", "t", float64(h%11)) // the same ms: first/last by value
				add(tm.Add(time.Duration(h%7)*time.Second), "pa", "d1", "u", float64(h%5)*0.25)
				add(tm.Add(17*time.Minute), "pb", "d1", "t", -float64(h%13))
				vals = append(vals, PropertyValue{Time: tm, ProductID: "pa", DeviceID: "d1", Property: "t", ValueType: "string", Str: "x"})
			}
			add(now, "pa", "d1", "t", 42) // the open hour
			if err := db.Insert(ctx, nil, vals); err != nil {
				t.Fatal(err)
			}
			aggs := []string{AggAvg, AggMin, AggMax, AggSum, AggCount, AggFirst, AggLast}
			memory := loc != kolkata
			check := func() {
				t.Helper()
				for _, p := range []string{"pa", "pb", "none"} {
					for qi, q := range aggQuestions(now, loc) {
						for _, agg := range aggs {
							q.ProductID, q.Properties, q.Agg = p, []string{"t", "u"}, agg
							answers := propMemoryAnswers.Load()
							got, err := db.PropertyAggregates(ctx, q)
							if err != nil {
								t.Fatal(err)
							}
							if want := rawAggs(t, raw, q); !slices.EqualFunc(got, want, func(a, b AggSeries) bool {
								return a.Property == b.Property && slices.Equal(a.Buckets, b.Buckets)
							}) {
								t.Fatalf("%s %q question %d (%s) %s:\n got %v\nwant %v", loc, p, qi, q.Interval, agg, got, want)
							}
							old := qi == len(aggQuestions(now, loc))-1
							if fromMemory := propMemoryAnswers.Load() != answers; fromMemory != (memory && !old) {
								t.Fatalf("%s %q question %d %s: from memory %v", loc, p, qi, agg, fromMemory)
							}
						}
					}
				}
				// One device's aggregates read ClickHouse.
				answers := propMemoryAnswers.Load()
				if _, err := db.PropertyAggregates(ctx, AggQuery{Interval: Hour, From: now.AddDate(0, 0, -1), To: now, ProductID: "pa", DeviceID: "d1",
					Properties: []string{"t"}, Agg: AggMax}); err != nil || propMemoryAnswers.Load() != answers {
					t.Fatalf("one device: %v, from memory %v", err, propMemoryAnswers.Load() != answers)
				}
			}
			loads := func() (uint64, uint64) { return propTotalsLoads.Load(), db.props.chunkReads.Load() }
			t0, c0 := loads()
			check()
			t1, c1 := loads()
			if memory && (t1-t0 != 1 || c1 == c0) {
				t.Fatalf("%d totals and %d chunks read", t1-t0, c1-c0)
			}
			check()
			if t2, c2 := loads(); t2 != t1 || c2 != c1 {
				t.Fatalf("asked again: %d totals and %d chunks read", t2-t1, c2-c1)
			}
			// Late values through this DB: a new first (earlier, in the
			// same hour as a kept value), last, min and max of a kept
			// hour 40 days back, and one of a month without values yet
			// (its chunk is read when asked for), and today's.
			kept := now.Add(-40 * 24 * time.Hour).Truncate(time.Hour)
			var late []PropertyValue
			for _, v := range []struct {
				at time.Time
				v  float64
			}{{kept, -1000}, {kept.Add(59*time.Minute + 59*time.Second), 1000}, {kept.Add(time.Minute), 0.5}, {now.Add(-time.Minute), -7},
				{kept, 5}, {kept, -2000}, {kept.Add(59*time.Minute + 59*time.Second), 999}, {kept.Add(59*time.Minute + 59*time.Second), 2000}} {
				late = append(late, PropertyValue{Time: v.at, ProductID: "pa", DeviceID: "d3", Property: "t", ValueType: "number", Num: v.v})
			}
			// Ties at one ms, within a batch and across inserts: first
			// and last order by value too.
			if err := db.Insert(ctx, nil, late[:6]); err != nil {
				t.Fatal(err)
			}
			for _, v := range late[6:] {
				if err := db.Insert(ctx, nil, []PropertyValue{v}); err != nil {
					t.Fatal(err)
				}
			}
			check()
			if t3, c3 := loads(); t3 != t1 || c3 != c1 {
				t.Fatalf("after late values: %d totals and %d chunks read, want none (patched)", t3-t1, c3-c1)
			}
		})
	}
}

// TestPropChunkViewOrder: a closed month whose
// device_property_product_hourly and device_property_daily disagree, as
// while an insert has written one of its two views and not yet the other
// (either order, simulated by adding rows to one table only), is never
// answered from the hours: each answer equals ClickHouse's and the
// fallback is counted; once both tables agree the month's chunk is kept
// and answers, the simulated value included.
func TestPropChunkViewOrder(t *testing.T) {
	ctx := ctxT(t)
	opt := testOptions("paggs_order", berlin)
	opt.ResultTTL = time.Hour // expiry is simulated (expire)
	db := openDBWith(t, opt)

	now := time.Now().UTC()
	day := time.Date(now.Year(), now.Month(), now.Day()-45, 0, 0, 0, 0, time.UTC)
	var vals []PropertyValue
	for i := range 8 {
		for _, p := range []string{"pq", "pd"} {
			vals = append(vals, PropertyValue{Time: day.Add(time.Duration(i) * 97 * time.Minute), ProductID: p, DeviceID: "d", Property: "t", ValueType: "number", Num: float64(i)})
		}
	}
	if err := db.Insert(ctx, nil, vals); err != nil {
		t.Fatal(err)
	}
	// The row of the simulated insert: 1000 at 10:20 UTC.
	at := day.Add(10*time.Hour + 20*time.Minute)
	hourRows := func(p string) string {
		return fmt.Sprintf("INSERT INTO device_property_product_hourly (hour, product_id, property, n, v_sum, v_min, v_max, t_first, v_first, t_last, v_last)"+
			" SELECT toDateTime(%d), '%s', 't', countState(), sumState(x), minState(x), maxState(x), minState(ts), argMinState(x, (ts, x)), maxState(ts), argMaxState(x, (ts, x))"+
			" FROM (SELECT toFloat64(1000) AS x, toInt64(%d) AS ts)", at.Unix()-at.Unix()%hourSec, p, at.UnixMilli())
	}
	dailyRows := func(p string) string {
		return fmt.Sprintf("INSERT INTO device_property_daily (day, product_id, property, n) SELECT toDate('%s'), '%s', 't', toUInt64(1)", day.Format(time.DateOnly), p)
	}
	expire := func() {
		db.props.dropped()
		db.invalidate()
	}
	// check asks p's 1h max and count over the day: equal to ClickHouse's
	// (device_property has no simulated rows), plus the simulated value
	// when extra.
	check := func(p string, extra bool) {
		t.Helper()
		for _, agg := range []string{AggMax, AggCount} {
			q := AggQuery{Interval: Hour, From: day.In(berlin), To: day.In(berlin).Add(23 * time.Hour), ProductID: p, Properties: []string{"t"}, Agg: agg}
			got, err := db.PropertyAggregates(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			r, err := newBucketRange(q.Interval, q.From, q.To, berlin, 0)
			if err != nil {
				t.Fatal(err)
			}
			want, err := db.propertyAggregates(ctx, r, q, q.Properties)
			if err != nil {
				t.Fatal(err)
			}
			if extra {
				for i, b := range want[0].Buckets {
					if !b.Start.After(at) && at.Sub(b.Start) < time.Hour {
						want[0].Buckets[i].Values++
						want[0].Buckets[i].Value = map[string]float64{AggMax: 1000, AggCount: float64(b.Values + 1)}[agg]
					}
				}
			}
			if !slices.Equal(got[0].Buckets, want[0].Buckets) {
				t.Fatalf("%q %s:\n got %v\nwant %v", p, agg, got[0].Buckets, want[0].Buckets)
			}
		}
	}
	month := chunkKey{month: dayMonth(dayNumber(day, time.UTC))}
	for _, c := range []struct {
		product       string
		first, second string // the simulated insert's views, in order
	}{
		{"pq", hourRows("pq"), dailyRows("pq")},
		{"pd", dailyRows("pd"), hourRows("pd")},
	} {
		p := c.product
		month.product = propKey(p, "t")
		expire()
		fallbacks := db.PropertyAggregateFallbacks()
		check(p, false)
		if _, ok := db.props.chunks.Peek(month); !ok || db.PropertyAggregateFallbacks() != fallbacks {
			t.Fatalf("%s: chunk kept %v, %d fallbacks", p, ok, db.PropertyAggregateFallbacks()-fallbacks)
		}
		// The first view written, not the second: read from ClickHouse.
		if err := db.conn.Exec(ctx, c.first); err != nil {
			t.Fatal(err)
		}
		expire()
		check(p, false)
		if _, ok := db.props.chunks.Peek(month); ok || db.PropertyAggregateFallbacks() == fallbacks {
			t.Fatalf("%s, tables disagreeing: chunk kept %v, %d fallbacks", p, ok, db.PropertyAggregateFallbacks()-fallbacks)
		}
		// Both written: the chunk holds them, is kept and answers.
		if err := db.conn.Exec(ctx, c.second); err != nil {
			t.Fatal(err)
		}
		expire()
		fallbacks = db.PropertyAggregateFallbacks()
		check(p, true)
		if kept, ok := db.props.chunks.Peek(month); !ok || db.PropertyAggregateFallbacks() != fallbacks || kept.total != 9 {
			t.Fatalf("%s, tables agreeing: chunk kept %v, %d fallbacks", p, ok, db.PropertyAggregateFallbacks()-fallbacks)
		}
	}
}

// BenchmarkDistinctAggs asks 64 different product-wide aggregate
// questions in turn (1h x168, each its own end and function), as a
// dashboard's users do: from the kept hourly partials, and (ResultTTL
// -1) from ClickHouse each time.
func BenchmarkDistinctAggs(b *testing.B) {
	ctx := ctxT(b)
	now := time.Now().In(shanghai)
	var vals []PropertyValue
	for h := range 100 * 24 {
		for d := range 4 {
			vals = append(vals, PropertyValue{Time: now.Add(-time.Duration(h)*time.Hour - time.Duration(d)*time.Minute), ProductID: "bench_aggs",
				DeviceID: fmt.Sprint("d", d), Property: "t", ValueType: "number", Num: float64(h % 97)})
		}
	}
	aggs := []string{AggAvg, AggMin, AggMax, AggSum, AggCount, AggFirst, AggLast}
	for _, c := range []struct {
		name string
		ttl  time.Duration
	}{{"memory", time.Second}, {"clickhouse", -1}} {
		b.Run(c.name, func(b *testing.B) {
			opt := testOptions("bench_aggs_"+c.name, shanghai)
			opt.ResultTTL = c.ttl
			db := openDBWith(b, opt)
			if err := db.Insert(ctx, nil, vals); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				k := i % 64
				to := now.Add(-time.Duration(k*13) * time.Hour)
				q := AggQuery{Interval: Hour, From: to.AddDate(0, 0, -7), To: to, Limit: 168, ProductID: "bench_aggs", Properties: []string{"t"}, Agg: aggs[k%7]}
				if _, err := db.PropertyAggregates(ctx, q); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
