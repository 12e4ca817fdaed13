package tsdb

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"devicehub/schema"
)

// aggKey names the bucket of a local time by its wall clock, computed
// here without the package's bucket arithmetic: the expected answers and
// the buckets returned are both keyed by it.
func aggKey(interval string, t time.Time, loc *time.Location) string {
	lt := t.In(loc)
	switch interval {
	case Minute:
		return lt.Format("2006-01-02 15:04 MST")
	case FiveMinutes, FifteenMinutes:
		n := map[string]int{FiveMinutes: 5, FifteenMinutes: 15}[interval]
		return fmt.Sprintf("%s:%02d %s", lt.Format("2006-01-02 15"), lt.Minute()/n*n, lt.Format("MST"))
	case Hour:
		return lt.Format("2006-01-02 15 MST")
	case Day:
		return lt.Format("2006-01-02")
	case Week:
		return lt.AddDate(0, 0, -(int(lt.Weekday())+6)%7).Format("2006-01-02")
	case Month:
		return lt.Format("2006-01")
	case Year:
		return lt.Format("2006")
	}
	panic(interval)
}

// aggWant computes every aggregate per bucket key from the values, as the
// package documents them.
func aggWant(vs []PropertyValue, interval, agg, device, property string, loc *time.Location) map[string]AggBucket {
	type acc struct {
		n             uint64
		sum, min, max float64
		firstT, lastT int64
		first, last   float64
	}
	accs := map[string]*acc{}
	for _, v := range vs {
		if v.ProductID != "aggp" || v.ValueType != "number" || v.Property != property || (device != "" && v.DeviceID != device) {
			continue
		}
		k := aggKey(interval, v.Time, loc)
		a := accs[k]
		ms := v.Time.UnixMilli()
		if a == nil {
			a = &acc{min: v.Num, max: v.Num, firstT: ms, lastT: ms, first: v.Num, last: v.Num}
			accs[k] = a
		}
		a.n++
		a.sum += v.Num
		a.min, a.max = math.Min(a.min, v.Num), math.Max(a.max, v.Num)
		if ms < a.firstT || (ms == a.firstT && v.Num < a.first) {
			a.firstT, a.first = ms, v.Num
		}
		if ms > a.lastT || (ms == a.lastT && v.Num > a.last) {
			a.lastT, a.last = ms, v.Num
		}
	}
	out := map[string]AggBucket{}
	for k, a := range accs {
		v := map[string]float64{AggAvg: a.sum / float64(a.n), AggMin: a.min, AggMax: a.max, AggSum: a.sum,
			AggCount: float64(a.n), AggFirst: a.first, AggLast: a.last}[agg]
		out[k] = AggBucket{Values: a.n, Value: v}
	}
	return out
}

// aggData stores values of product aggp for two devices around the
// bucket edges that matter in loc: local midnights, month and year ends,
// quarter hours, and the given extra instants (DST changes); values are
// multiples of 0.25, so sums are exact in Float64.
func aggData(loc *time.Location, extra ...time.Time) []PropertyValue {
	var times []time.Time
	for _, s := range []string{
		"2023-12-31 23:59:59.999", "2024-01-01 00:00:00.000", "2024-01-31 23:45:00.000", "2024-02-01 00:14:59.999",
		"2024-02-01 00:15:00.000", "2024-02-29 23:59:59.000", "2024-03-01 00:00:00.000", "2024-03-04 00:00:00.500",
		"2024-03-03 23:59:59.500", "2024-03-04 10:29:59.000", "2024-03-04 10:30:00.000", "2024-03-04 10:44:00.000",
		"2024-03-04 10:45:00.000", "2024-03-04 10:59:59.999", "2024-03-04 11:00:00.000", "2024-03-04 11:04:59.000",
		"2024-03-04 11:05:00.000",
	} {
		tm, err := time.ParseInLocation("2006-01-02 15:04:05.000", s, loc)
		if err != nil {
			panic(err)
		}
		times = append(times, tm)
	}
	times = append(times, extra...)
	var vs []PropertyValue
	for i, tm := range times {
		for d, dev := range []string{"d1", "d2"} {
			num := float64((i*7+d*3)%40)/4 - 3
			vs = append(vs, PropertyValue{Time: tm, ProductID: "aggp", DeviceID: dev, Property: "temp", ValueType: "number", Num: num})
			if i%3 == 0 {
				vs = append(vs, PropertyValue{Time: tm.Add(time.Second), ProductID: "aggp", DeviceID: dev, Property: "hum", ValueType: "number", Num: float64(i)})
			}
		}
	}
	// Two values at the same millisecond: first takes the smaller, last
	// the larger. A text value of temp is not a number and never counted.
	tie, _ := time.ParseInLocation(time.DateTime, "2024-03-04 10:50:00", loc)
	vs = append(vs,
		PropertyValue{Time: tie, ProductID: "aggp", DeviceID: "d1", Property: "temp", ValueType: "number", Num: 100},
		PropertyValue{Time: tie, ProductID: "aggp", DeviceID: "d1", Property: "temp", ValueType: "number", Num: -100},
		PropertyValue{Time: tie.Add(time.Minute), ProductID: "aggp", DeviceID: "d1", Property: "temp", ValueType: "string", Str: "n/a"},
		PropertyValue{Time: tie, ProductID: "other", DeviceID: "d1", Property: "temp", ValueType: "number", Num: 1e6},
	)
	return vs
}

// TestPropertyAggregates: every aggregate of every interval is exact
// against values stored here, in a fixed-offset zone (Asia/Shanghai), a
// DST zone (Europe/Berlin, around both 2024 changes) and a half-hour
// zone (Asia/Kolkata), per device and product-wide; every bucket of the
// range is present, newest first, empty ones with Values 0.
func TestPropertyAggregates(t *testing.T) {
	ctx := ctxT(t)
	kolkata := mustLoad("Asia/Kolkata")
	bt := func(s string) time.Time { return parseIn(t, berlin, s) }
	zones := []struct {
		loc   *time.Location
		db    *DB
		extra []time.Time
	}{
		{shanghai, shared(t), nil},
		{berlin, openDB(t, "aggberlin", berlin), []time.Time{
			bt("2024-03-31 01:59:59 CET"), bt("2024-03-31 03:00:00 CEST"), bt("2024-03-31 03:14:00 CEST"),
			bt("2024-10-27 02:20:00 CEST"), bt("2024-10-27 02:20:00 CET"), bt("2024-10-27 02:59:00 CET"), bt("2024-10-27 03:00:00 CET"),
		}},
		{kolkata, openDB(t, "aggkolkata", kolkata), nil},
	}
	for _, z := range zones {
		vs := aggData(z.loc, z.extra...)
		if err := z.db.Insert(ctx, nil, vs); err != nil {
			t.Fatal(err)
		}
		at := func(s string) time.Time { return parseIn(t, z.loc, s) }
		ranges := []struct {
			interval string
			from, to time.Time
		}{
			{Minute, at("2024-03-04 10:28:00 " + zn(z.loc, "2024-03-04")), at("2024-03-04 11:06:00 " + zn(z.loc, "2024-03-04"))},
			{FiveMinutes, at("2024-03-04 09:00:00 " + zn(z.loc, "2024-03-04")), at("2024-03-04 12:00:00 " + zn(z.loc, "2024-03-04"))},
			{FifteenMinutes, at("2024-01-31 23:00:00 " + zn(z.loc, "2024-01-31")), at("2024-03-04 12:00:00 " + zn(z.loc, "2024-03-04"))},
			{Hour, at("2024-02-29 20:00:00 " + zn(z.loc, "2024-02-29")), at("2024-03-04 12:00:00 " + zn(z.loc, "2024-03-04"))},
			{Day, at("2023-12-30 00:00:00 " + zn(z.loc, "2023-12-30")), at("2024-03-05 00:00:00 " + zn(z.loc, "2024-03-05"))},
			{Week, at("2023-12-20 00:00:00 " + zn(z.loc, "2023-12-20")), at("2024-03-05 00:00:00 " + zn(z.loc, "2024-03-05"))},
			{Month, at("2023-11-20 00:00:00 " + zn(z.loc, "2023-11-20")), at("2024-11-05 00:00:00 " + zn(z.loc, "2024-11-05"))},
			{Year, at("2022-11-20 00:00:00 " + zn(z.loc, "2022-11-20")), at("2024-11-05 00:00:00 " + zn(z.loc, "2024-11-05"))},
		}
		if z.loc == berlin {
			ranges = append(ranges,
				struct {
					interval string
					from, to time.Time
				}{FifteenMinutes, bt("2024-10-27 01:00:00 CEST"), bt("2024-10-27 04:00:00 CET")},
				struct {
					interval string
					from, to time.Time
				}{Hour, bt("2024-03-30 22:00:00 CET"), bt("2024-03-31 05:00:00 CEST")},
				struct {
					interval string
					from, to time.Time
				}{Day, bt("2024-10-20 00:00:00 CEST"), bt("2024-10-29 00:00:00 CET")})
		}
		for _, r := range ranges {
			starts, err := Buckets(r.interval, r.from, r.to, z.loc, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, agg := range []string{AggAvg, AggMin, AggMax, AggSum, AggCount, AggFirst, AggLast} {
				for _, device := range []string{"d1", ""} {
					got, err := z.db.PropertyAggregates(ctx, AggQuery{Interval: r.interval, From: r.from, To: r.to, ProductID: "aggp",
						DeviceID: device, Properties: []string{"temp", "hum", "temp", "none"}, Agg: agg})
					if err != nil {
						t.Fatal(err)
					}
					if len(got) != 3 || got[0].Property != "temp" || got[1].Property != "hum" || got[2].Property != "none" {
						t.Fatalf("%s %s: series %+v", r.interval, agg, got)
					}
					nonEmpty := 0
					for _, s := range got {
						want := aggWant(vs, r.interval, agg, device, s.Property, z.loc)
						if len(s.Buckets) != len(starts) {
							t.Fatalf("%s %s %s %s: %d buckets, want %d", z.loc, r.interval, agg, s.Property, len(s.Buckets), len(starts))
						}
						for i, b := range s.Buckets {
							if !b.Start.Equal(starts[i]) || b.Start.Location() != z.loc {
								t.Fatalf("%s %s: bucket %d starts %v, want %v", z.loc, r.interval, i, b.Start, starts[i])
							}
							k := aggKey(r.interval, b.Start, z.loc)
							if w := want[k]; b.Values != w.Values || b.Value != w.Value {
								t.Errorf("%s %s %s device %q %s bucket %s: %d values, %v; want %d, %v",
									z.loc, r.interval, agg, device, s.Property, k, b.Values, b.Value, w.Values, w.Value)
							}
							if b.Values > 0 {
								nonEmpty++
							}
						}
					}
					if nonEmpty == 0 || nonEmpty == len(starts)*2 {
						t.Fatalf("%s %s: %d non-empty buckets of %d: the range tests nothing", z.loc, r.interval, nonEmpty, len(starts)*2)
					}
				}
			}
		}
	}
}

// zn is loc's zone abbreviation on a local date, for parseIn.
func zn(loc *time.Location, date string) string {
	tm, err := time.ParseInLocation(time.DateTime, date+" 12:00:00", loc)
	if err != nil {
		panic(err)
	}
	return tm.Format("MST")
}

func TestPropertyAggregatesRefused(t *testing.T) {
	db := shared(t)
	ctx := ctxT(t)
	now := time.Now()
	for _, q := range []AggQuery{
		{Interval: Hour, From: now, To: now, ProductID: "p", Properties: []string{"t"}, Agg: "median"},
		{Interval: "2h", From: now, To: now, ProductID: "p", Properties: []string{"t"}, Agg: AggAvg},
		{Interval: Hour, From: now, To: now, ProductID: "", Properties: []string{"t"}, Agg: AggAvg},
		{Interval: Hour, From: now, To: now, ProductID: "p", Agg: AggAvg},
		{Interval: Year, From: time.Unix(0, 0), To: now, ProductID: "p", Properties: []string{"t"}, Agg: AggAvg},
	} {
		if _, err := db.PropertyAggregates(ctx, q); !errors.Is(err, schema.ErrIllegalArgument) {
			t.Errorf("%+v: %v, want schema.ErrIllegalArgument", q, err)
		}
	}
}

// TestPropertyAggregatesReadLittle: a per-device 24-bucket query reads the
// device's values of the range through the primary key, a few granules,
// not the table: 1.2M rows of 200 devices, one device's day read.
func TestPropertyAggregatesReadLittle(t *testing.T) {
	t.Parallel()
	db := openDB(t, "aggread", shanghai)
	ctx := ctxT(t)
	end := sh(t, "2024-06-01 00:00:00")
	const devices, props, perSeries = 200, 3, 2000
	span := int64(30 * 24 * time.Hour / time.Millisecond)
	// Row j: device j mod 200, property (j / 200) mod 3, value number
	// j / 600 of that series, spread evenly over the 30 days before end.
	err := db.conn.Exec(ctx, fmt.Sprintf(`INSERT INTO device_property (ts, product_id, device_id, property, value_type, num_value, str_value)
SELECT ts, 'readp', concat('r', toString(dev)), concat('t', toString(k)), 'number', toFloat64(i), ''
FROM (SELECT modulo(number, %[1]d) AS dev, modulo(intDiv(number, %[1]d), %[2]d) AS k, intDiv(number, %[1]d * %[2]d) AS i,
  toInt64(%[3]d - %[4]d + intDiv(i * %[4]d, %[5]d)) AS ts FROM numbers(%[6]d))`,
		devices, props, end.UnixMilli(), span, perSeries, devices*props*perSeries))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.conn.Exec(ctx, "OPTIMIZE TABLE device_property FINAL"); err != nil {
		t.Fatal(err)
	}
	read := func(device string) (uint64, uint64) {
		t.Helper()
		var rows uint64
		pctx := clickhouse.Context(ctx, clickhouse.WithProgress(func(p *clickhouse.Progress) { rows += p.Rows }))
		got, err := db.PropertyAggregates(pctx, AggQuery{Interval: Hour, From: end.Add(-24 * time.Hour), To: end.Add(-time.Second),
			ProductID: "readp", DeviceID: device, Properties: []string{"t1"}, Agg: AggCount, Limit: 24})
		if err != nil {
			t.Fatal(err)
		}
		var values uint64
		for _, b := range got[0].Buckets {
			values += b.Values
		}
		return values, rows
	}
	values, rows := read("r7")
	// 2000 values in 30 days: about 67 in the day.
	if values < 60 || values > 70 {
		t.Fatalf("%d values in the day", values)
	}
	if rows > 3*8192 {
		t.Fatalf("one device's day read %d rows of %d", rows, devices*props*perSeries)
	}
	allValues, allRows := read("")
	t.Logf("one device: %d values, %d rows read; product-wide: %d values, %d rows read of %d",
		values, rows, allValues, allRows, devices*props*perSeries)
}
