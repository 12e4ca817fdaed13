package tsdb

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// convertFleet is a fleet's values over three months: numbers, text,
// booleans and JSON, reports every few minutes with milliseconds, and
// values of different properties and devices at the same millisecond.
func convertFleet(start time.Time) ([]Message, []PropertyValue) {
	rng := rand.New(rand.NewPCG(6, 46))
	var msgs []Message
	var props []PropertyValue
	for d := range 6 {
		dev := fmt.Sprintf("cv-%d", d)
		t := start.Add(time.Duration(d) * time.Minute)
		for j := 0; t.Before(start.AddDate(0, 3, 0)); j++ {
			t = t.Add(time.Duration(60+rng.IntN(90))*time.Minute + time.Duration(rng.IntN(1000))*time.Millisecond)
			msgs = append(msgs, Message{Time: t, ProductID: "cvp", DeviceID: dev, Direction: "up", MessageType: "REPORT_PROPERTY",
				MessageID: fmt.Sprint(dev, "-", j), Topic: "/cvp/" + dev, Payload: []byte(`{"x":1}`)})
			props = append(props,
				PropertyValue{Time: t, ProductID: "cvp", DeviceID: dev, Property: "temp", ValueType: "number", Num: float64(rng.IntN(400)) / 10},
				PropertyValue{Time: t, ProductID: "cvp", DeviceID: dev, Property: "count", ValueType: "number", Num: float64(j)},
				PropertyValue{Time: t, ProductID: "cvp", DeviceID: dev, Property: "on", ValueType: "bool", Num: float64(j % 2), Str: []string{"false", "true"}[j%2]},
				PropertyValue{Time: t, ProductID: "cvp", DeviceID: dev, Property: "status", ValueType: "string", Str: []string{"idle", "run", "fault"}[rng.IntN(3)]},
				PropertyValue{Time: t, ProductID: "cvp", DeviceID: dev, Property: "cfg", ValueType: "json", Str: fmt.Sprintf(`{"n":%d}`, j/50)})
			if j%17 == 0 { // a second temperature at the same millisecond
				props = append(props, PropertyValue{Time: t, ProductID: "cvp", DeviceID: dev, Property: "temp", ValueType: "number", Num: -1})
			}
		}
	}
	return msgs, props
}

// convertStart is when convertFleet's values start, in the tests.
var convertStart = time.Date(2024, 1, 10, 0, 0, 0, 0, time.UTC)

// oldLayoutDB opens a new database in the layout before version 6
// (schema version 5: device_property sorted by property) holding
// convertFleet(convertStart)'s values. It returns the database's name
// for testOptions (prefix and a random number), the options it was
// opened with (testOptions' changed by with, if not nil) and the values.
func oldLayoutDB(ctx context.Context, t *testing.T, prefix string, with func(*Options)) (name string, old Options, db *DB, props []PropertyValue) {
	t.Helper()
	name = fmt.Sprint(prefix, rand.IntN(1e6))
	old = testOptions(name, time.UTC)
	old.SchemaVersion = 5
	if with != nil {
		with(&old)
	}
	db = openDBWith(t, old)
	if !db.oldLayout {
		t.Fatal("a version 5 database is not in the old layout")
	}
	msgs, props := convertFleet(convertStart)
	if err := db.Insert(ctx, msgs, props); err != nil {
		t.Fatal(err)
	}
	return name, old, db, props
}

// convertAnswers asks db what the dashboard asks: aggregates of every
// function at several intervals (product-wide and per device), latest and
// ranged history, latest values, exports and message counts.
func convertAnswers(t *testing.T, db *DB, start time.Time) map[string]any {
	t.Helper()
	ctx := ctxT(t)
	out := map[string]any{}
	end := start.AddDate(0, 3, 0)
	for _, agg := range []string{AggAvg, AggMax, AggCount, AggFirst, AggLast} {
		for _, iv := range []string{"15m", "1h", "1d", "1M"} {
			for _, dev := range []string{"", "cv-1"} {
				from, to := start, end
				if iv == "15m" || iv == "1h" {
					from, to = start.AddDate(0, 1, 3), start.AddDate(0, 1, 5)
				}
				s, err := db.PropertyAggregates(ctx, AggQuery{Interval: iv, From: from, To: to, ProductID: "cvp", DeviceID: dev,
					Properties: []string{"temp", "count"}, Agg: agg})
				if err != nil {
					t.Fatal(err)
				}
				out[fmt.Sprint("agg ", agg, iv, dev)] = s
			}
		}
	}
	for d := range 6 {
		dev := fmt.Sprintf("cv-%d", d)
		h, err := db.PropertyHistory(ctx, "cvp", dev, []string{"temp", "status", "cfg", "on"}, 50)
		if err != nil {
			t.Fatal(err)
		}
		out["history "+dev] = h
		r, err := db.HistoryRange(ctx, HistoryQuery{ProductID: "cvp", DeviceID: dev, From: start.AddDate(0, 0, 20), To: start.AddDate(0, 1, 20).Add(123 * time.Millisecond), N: 500, Bounded: true})
		if err != nil {
			t.Fatal(err)
		}
		out["range "+dev] = r
		e, err := db.PrepareExport(ctx, ExportQuery{ProductID: "cvp", DeviceID: dev, From: start.AddDate(0, 0, 40)})
		if err != nil {
			t.Fatal(err)
		}
		var rows []PropertyValue
		if err := e.Each(ctx, func(v *PropertyValue) error { rows = append(rows, *v); return nil }); err != nil {
			t.Fatal(err)
		}
		out["export "+dev] = rows
	}
	l, err := db.LatestValues(ctx, "cvp", []string{"cv-0", "cv-3", "cv-5"}, []string{"temp", "status", "on"})
	if err != nil {
		t.Fatal(err)
	}
	out["latest"] = l
	c, err := db.MessageCounts(ctx, CountQuery{Interval: "1d", From: start, To: end, ProductID: "cvp"})
	if err != nil {
		t.Fatal(err)
	}
	out["counts"] = c
	return out
}

func tableCount(t *testing.T, db *DB, pattern string) uint64 {
	t.Helper()
	var n uint64
	if err := db.Conn().QueryRow(ctxT(t), "SELECT count() FROM system.tables WHERE database = currentDatabase() AND name LIKE ?", pattern).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A database written in the layout before version 6 (time and ts,
// sorted by property), converted by Open after a conversion was
// interrupted (one month copied and recorded, a second copied in part),
// answers every dashboard query as before, in full and with the rollups
// bypassed; each value is stored and rolled up once; a value stored
// afterwards is rolled up by the new views.
func TestConvertPropertyLayout(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // two databases' answers, three times
	defer cancel()
	name, old, db, props := oldLayoutDB(ctx, t, "convert", func(o *Options) { o.QueryTimeout = 2 * time.Minute }) // a busy machine
	start := convertStart
	before := convertAnswers(t, db, start)
	oldRaw := old
	oldRaw.NoRollup, oldRaw.ResultTTL = true, -1
	rawBefore := convertAnswers(t, openDBWith(t, oldRaw), start)

	// An interrupted conversion: the new table and its record made, the
	// first month copied and recorded, the second copied in part only.
	full := &DB{opt: db.opt, version: db.version, tzName: db.tzName}
	full.opt.SchemaVersion = 0
	stmts, err := full.statements()
	if err != nil {
		t.Fatal(err)
	}
	made := 0
	for _, s := range stmts {
		if strings.Contains(s.sql, "device_property_v6") && strings.HasPrefix(s.sql, "CREATE TABLE") {
			if err := db.apply(ctx, s); err != nil {
				t.Fatal(err)
			}
			made++
		}
	}
	if made != 2 {
		t.Fatalf("%d CREATE TABLE statements of the conversion, want 2", made)
	}
	if _, err := db.convertMonth(ctx, "device_property", "device_property_v6", "202401"); err != nil {
		t.Fatal(err)
	}
	if err := db.Conn().Exec(ctx, "INSERT INTO device_property_v6 ("+convertColumns+") SELECT "+convertColumns+
		" FROM device_property WHERE toYYYYMM(time) = 202402 LIMIT 100"); err != nil {
		t.Fatal(err)
	}

	conv := openDB(t, name, time.UTC)
	if conv.oldLayout {
		t.Fatal("still the old layout after Open")
	}
	st := conv.LastConversion()
	if st.Months != 3 || st.Rows != uint64(len(props))-countMonth(props, 1) {
		t.Errorf("conversion copied %d months, %d rows; want 3 and %d (January was done)", st.Months, st.Rows, uint64(len(props))-countMonth(props, 1))
	}
	for _, p := range []string{"device_property_v%", "device_property_hourly_mv", "device_property_product_hourly_mv", "device_property_daily_mv"} {
		if n := tableCount(t, conv, p); n != 0 {
			t.Errorf("%d tables %s left after the conversion", n, p)
		}
	}
	if n := tableCount(t, conv, "%_mv6"); n != 3 {
		t.Errorf("%d views of the new layout, want 3", n)
	}
	var stored uint64
	if err := conv.Conn().QueryRow(ctx, "SELECT count() FROM device_property").Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != uint64(len(props)) {
		t.Fatalf("%d values after the conversion, want %d", stored, len(props))
	}
	after := convertAnswers(t, conv, start)
	raw := testOptions(name, time.UTC)
	raw.NoRollup, raw.ResultTTL = true, -1
	rawAfter := convertAnswers(t, openDBWith(t, raw), start)
	for k, v := range before {
		if !reflect.DeepEqual(v, after[k]) {
			t.Errorf("%s differs after the conversion:\n before %.400v\n after  %.400v", k, fmt.Sprint(v), fmt.Sprint(after[k]))
		}
		if !reflect.DeepEqual(rawBefore[k], rawAfter[k]) {
			t.Errorf("%s (no rollup) differs after the conversion", k)
		}
		if !reflect.DeepEqual(v, rawAfter[k]) {
			t.Errorf("%s: rollups and raw values disagree after the conversion", k)
		}
	}

	// New values reach the rollups once, through the new views.
	late := PropertyValue{Time: start.AddDate(0, 1, 1), ProductID: "cvp", DeviceID: "cv-2", Property: "temp", ValueType: "number", Num: 99}
	if err := conv.Insert(ctx, nil, []PropertyValue{late}); err != nil {
		t.Fatal(err)
	}
	rollup, rawN, err := conv.rollupCheck(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rollup != rawN {
		t.Fatalf("rollup counts %d numeric values, device_property holds %d", rollup, rawN)
	}
	// A second Open finds nothing to convert.
	again := openDB(t, name, time.UTC)
	if st := again.LastConversion(); st.Months != 0 {
		t.Errorf("a converted database converted again: %+v", st)
	}
}

func countMonth(props []PropertyValue, m time.Month) uint64 {
	var n uint64
	for _, p := range props {
		if p.Time.UTC().Month() == m {
			n++
		}
	}
	return n
}

// Four instances starting together on a database in the old layout, all
// honouring Options.ConvertLock: one converts, the others wait and find
// the new layout; every value is there once (count and sum of
// device_property, rollups exact) and each month was copied once.
// Without the lock they copy, drop and recount the same months at once
// (a start fails, or months are copied twice).
func TestConvertConcurrent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	name, _, _, props := oldLayoutDB(ctx, t, "convertcc", nil)
	start := convertStart
	var wantSum float64
	for _, p := range props {
		wantSum += p.Num
	}

	// The lock every instance honours: one process here, so a channel
	// (devicehub passes meta's PostgreSQL advisory lock).
	sem := make(chan struct{}, 1)
	lock := func(ctx context.Context) (<-chan struct{}, func(), error) {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		return make(chan struct{}), func() { <-sem }, nil
	}
	opt := testOptions(name, time.UTC)
	opt.QueryTimeout = 2 * time.Minute // a busy machine
	opt.ConvertLock = lock
	dbs := make([]*DB, 4)
	errs := make([]error, len(dbs))
	var wg sync.WaitGroup
	ready := make(chan struct{})
	for i := range dbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-ready
			dbs[i], errs[i] = Open(ctx, opt)
		}()
	}
	close(ready)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("instance %d: %v", i, err)
		}
		defer dbs[i].Close()
	}
	var months int
	for _, d := range dbs {
		if d.oldLayout {
			t.Fatal("an instance still sees the old layout")
		}
		months += d.LastConversion().Months
	}
	if months != 4 { // January to April
		t.Errorf("the two instances copied %d months, want 4 (one converts, the other finds it done)", months)
	}
	var n uint64
	var sum float64
	if err := dbs[0].Conn().QueryRow(ctx, "SELECT count(), sum(num_value) FROM device_property").Scan(&n, &sum); err != nil {
		t.Fatal(err)
	}
	if n != uint64(len(props)) || math.Abs(sum-wantSum) > 1e-6*math.Abs(wantSum) {
		t.Fatalf("%d values summing to %v after two conversions at once, want %d summing to %v", n, sum, len(props), wantSum)
	}
	for _, p := range []string{"device_property_v%", "device_property_hourly_mv", "device_property_product_hourly_mv", "device_property_daily_mv"} {
		if c := tableCount(t, dbs[0], p); c != 0 {
			t.Errorf("%d tables %s left after the conversion", c, p)
		}
	}
	if c := tableCount(t, dbs[0], "%_mv6"); c != 3 {
		t.Errorf("%d views of the new layout, want 3", c)
	}
	late := PropertyValue{Time: start.AddDate(0, 1, 1), ProductID: "cvp", DeviceID: "cv-2", Property: "temp", ValueType: "number", Num: 99}
	if err := dbs[1].Insert(ctx, nil, []PropertyValue{late}); err != nil {
		t.Fatal(err)
	}
	rollup, rawN, err := dbs[1].rollupCheck(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rollup != rawN {
		t.Fatalf("rollup counts %d numeric values, device_property holds %d", rollup, rawN)
	}
}

// A month recorded as copied whose copy then gained rows (an INSERT ...
// SELECT of a converter that lost its lock, finished by the server) is
// copied again before the swap: every value is there once.
func TestConvertStrayRows(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	name, _, db, props := oldLayoutDB(ctx, t, "convertst", nil)
	full := &DB{opt: db.opt, version: db.version, tzName: db.tzName}
	full.opt.SchemaVersion = 0
	stmts, err := full.statements()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stmts {
		if strings.Contains(s.sql, "device_property_v6") && strings.HasPrefix(s.sql, "CREATE TABLE") {
			if err := db.apply(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := db.convertMonth(ctx, "device_property", "device_property_v6", "202401"); err != nil {
		t.Fatal(err)
	}
	if err := db.Conn().Exec(ctx, "INSERT INTO device_property_v6 ("+convertColumns+") SELECT "+convertColumns+
		" FROM device_property WHERE toYYYYMM(time) = 202401 LIMIT 100"); err != nil {
		t.Fatal(err)
	}
	conv := openDB(t, name, time.UTC)
	if st := conv.LastConversion(); st.Months != 4 {
		t.Errorf("conversion copied %d months, want 4 (January again)", st.Months)
	}
	var n uint64
	if err := conv.Conn().QueryRow(ctx, "SELECT count() FROM device_property").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != uint64(len(props)) {
		t.Fatalf("%d values after the conversion, want %d", n, len(props))
	}
}
