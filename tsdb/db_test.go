package tsdb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"devicehub/bench/testkit"
	"devicehub/schema"
)

func TestOpenTwiceAndVersion(t *testing.T) {
	db := shared(t)
	if v := db.ServerVersion(); v.Major == 0 {
		t.Fatalf("server version %v", v)
	}
	t.Logf("ClickHouse %s", db.ServerVersion())
	// DDL applied again on the same database is fine.
	db2, err := Open(ctxT(t), testOptions("main", shanghai))
	if err != nil {
		t.Fatalf("second Open: %v", err)
	}
	db2.Close()
	if _, err := Open(ctxT(t), Options{Database: "bad-name;"}); !errors.Is(err, schema.ErrIllegalArgument) {
		t.Fatalf("bad database name: %v", err)
	}
}

// sh parses a wall time in Asia/Shanghai.
func sh(t testing.TB, s string) time.Time {
	tm, err := time.ParseInLocation("2006-01-02 15:04:05", s, shanghai)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// countTimes are the edges the day and month buckets must get right.
var countTimes = []string{
	"2024-02-29 00:00:00", "2024-02-29 23:59:59", "2024-02-28 23:59:59", "2024-03-01 00:00:00",
	"2024-01-31 23:59:59", "2024-02-01 00:00:00", "2023-12-31 23:59:59", "2024-01-01 00:00:00",
	"2024-02-29 07:59:59", "2024-02-29 08:00:00", // UTC midnight
	"2024-04-30 23:59:59", "2024-05-01 00:00:00",
}

func TestMessageCounts(t *testing.T) {
	db := shared(t)
	ctx := ctxT(t)
	product := "count_p1"
	var all []Message
	for i, s := range countTimes {
		all = append(all, Message{Time: sh(t, s), ProductID: product, DeviceID: "d1", Direction: "up", MessageID: fmt.Sprint("edge", i)})
	}
	r := rand.New(rand.NewPCG(1, 2))
	lo, hi := sh(t, "2023-11-01 00:00:00").Unix(), sh(t, "2024-06-01 00:00:00").Unix()
	for i := range 3000 {
		tm := time.Unix(lo+r.Int64N(hi-lo), r.Int64N(1000)*1e6)
		dir := "up"
		if i%5 == 0 {
			dir = "down"
		}
		all = append(all, Message{Time: tm, ProductID: product, DeviceID: fmt.Sprint("d", i%7), Direction: dir, Payload: []byte(`{"x":1}`)})
	}
	// Several inserts, so the per-day table has unmerged parts to sum.
	for i := 0; i < len(all); i += 500 {
		if err := db.Insert(ctx, all[i:min(i+500, len(all))], nil); err != nil {
			t.Fatal(err)
		}
	}
	// Another product, to check the filter.
	other := []Message{{Time: sh(t, "2024-02-29 12:00:00"), ProductID: "count_p2", DeviceID: "x", Direction: "down"}}
	if err := db.Insert(ctx, other, nil); err != nil {
		t.Fatal(err)
	}

	expect := func(layout string) map[string]uint64 {
		m := map[string]uint64{}
		for _, msg := range all {
			m[msg.Time.In(shanghai).Format(layout)]++
		}
		return m
	}
	check := func(interval, layout string, from, to time.Time, limit, wantLen int) []Bucket {
		t.Helper()
		got, err := db.MessageCounts(ctx, CountQuery{Interval: interval, From: from, To: to, ProductID: product, Limit: limit})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != wantLen {
			t.Fatalf("%s %v..%v limit %d: %d buckets, want %d", interval, from, to, limit, len(got), wantLen)
		}
		want := expect(layout)
		for i, b := range got {
			if i > 0 && !b.Start.Before(got[i-1].Start) {
				t.Fatalf("%s: buckets not newest first: %v after %v", interval, b.Start, got[i-1].Start)
			}
			if b.Count != want[b.Start.Format(layout)] {
				t.Errorf("%s bucket %s: count %d, want %d", interval, b.Start.Format(layout), b.Count, want[b.Start.Format(layout)])
			}
		}
		return got
	}
	from, to := sh(t, "2023-10-01 00:00:00"), sh(t, "2024-06-30 23:59:59")
	days := check(Day, "2006-01-02", from, to, 0, 274)
	check(Month, "2006-01", from, to, 0, 9)
	check(Month, "2006-01", to, from, 12, 9) // swapped, limit larger than range
	check(Year, "2006", from, to, 0, 2)
	check(Hour, "2006-01-02 15", sh(t, "2024-02-27 00:00:00"), sh(t, "2024-03-02 12:00:00"), 0, 4*24+13)
	// Limit smaller than the range keeps the newest buckets.
	got := check(Day, "2006-01-02", sh(t, "2024-02-01 00:00:00"), sh(t, "2024-03-01 15:00:00"), 7, 7)
	if s := got[0].Start.Format("2006-01-02"); s != "2024-03-01" {
		t.Fatalf("newest day %s, want 2024-03-01", s)
	}
	if s := got[6].Start.Format("2006-01-02"); s != "2024-02-24" {
		t.Fatalf("oldest of 7 days %s, want 2024-02-24", s)
	}
	var total uint64
	for _, b := range days {
		total += b.Count
	}
	if total != uint64(len(all)) {
		t.Fatalf("day buckets sum to %d, want %d", total, len(all))
	}
	// Weeks: the same total, grouped by Monday.
	var wtotal uint64
	weeks, err := db.MessageCounts(ctx, CountQuery{Interval: Week, From: from, To: to, ProductID: product})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range weeks {
		if b.Start.Weekday() != time.Monday {
			t.Fatalf("week starts on %v", b.Start)
		}
		wtotal += b.Count
	}
	if wtotal != total {
		t.Fatalf("weeks sum to %d, want %d", wtotal, total)
	}

	// Empty range: every bucket present, all zero.
	empty, err := db.MessageCounts(ctx, CountQuery{Interval: Day, From: sh(t, "2022-01-01 00:00:00"), To: sh(t, "2022-01-30 00:00:00"), ProductID: product, Limit: 30})
	if err != nil {
		t.Fatal(err)
	}
	if len(empty) != 30 {
		t.Fatalf("empty range: %d buckets", len(empty))
	}
	for _, b := range empty {
		if b.Count != 0 {
			t.Fatalf("empty range bucket %v: %d", b.Start, b.Count)
		}
	}
	// Unknown product: zeros; every product: includes the other one.
	leap := sh(t, "2024-02-29 12:00:00")
	for _, c := range []struct {
		product string
		want    uint64
	}{{"count_none", 0}, {"count_p2", 1}, {product, expect("2006-01-02")["2024-02-29"]}} {
		got, err := db.MessageCounts(ctx, CountQuery{Interval: Day, From: leap, To: leap, ProductID: c.product})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Count != c.want {
			t.Fatalf("product %q Feb 29: %+v, want %d", c.product, got, c.want)
		}
	}
	if _, err := db.MessageCounts(ctx, CountQuery{Interval: "2d", From: leap, To: leap}); !errors.Is(err, schema.ErrIllegalArgument) {
		t.Fatalf("bad interval: %v", err)
	}
}

func TestPropertyHistory(t *testing.T) {
	db := shared(t)
	ctx := ctxT(t)
	base := sh(t, "2024-02-29 23:59:58")
	var ps []PropertyValue
	for i := range 5 {
		// Two values share each second: ts (ms) orders them.
		tm := base.Add(time.Duration(i) * 400 * time.Millisecond)
		ps = append(ps, PropertyValue{Time: tm, ProductID: "hist_p", DeviceID: "d1", Property: "temp", ValueType: "number", Num: float64(i)})
	}
	ps = append(ps,
		PropertyValue{Time: base, ProductID: "hist_p", DeviceID: "d1", Property: "mode", ValueType: "string", Str: "eco"},
		PropertyValue{Time: base.Add(time.Hour), ProductID: "hist_p", DeviceID: "d1", Property: "mode", ValueType: "string", Str: "boost"},
		PropertyValue{Time: base, ProductID: "hist_p", DeviceID: "d2", Property: "temp", ValueType: "number", Num: 99},
		PropertyValue{Time: base, ProductID: "hist_p", DeviceID: "d1", Property: "cfg", ValueType: "json", Str: `{"a":1}`},
	)
	if err := db.Insert(ctx, nil, ps); err != nil {
		t.Fatal(err)
	}
	f := func(props []string, n int, want ...string) {
		t.Helper()
		got, err := db.PropertyHistory(ctx, "hist_p", "d1", props, n)
		if err != nil {
			t.Fatal(err)
		}
		var gs []string
		for _, v := range got {
			val := v.Str
			if v.ValueType == "number" {
				val = fmt.Sprint(v.Num)
			}
			gs = append(gs, v.Property+"="+val)
		}
		if fmt.Sprint(gs) != fmt.Sprint(want) {
			t.Fatalf("PropertyHistory(%q, %d) = %q, want %q", props, n, gs, want)
		}
	}
	f([]string{"temp", "missing", "mode"}, 3, "temp=2", "temp=3", "temp=4", "mode=eco", "mode=boost")
	f([]string{"mode", "temp"}, 10, "mode=eco", "mode=boost", "temp=0", "temp=1", "temp=2", "temp=3", "temp=4")
	f(nil, 0, "cfg={\"a\":1}", "mode=boost", "temp=4")
	f([]string{"missing"}, 5)

	got, err := db.PropertyHistory(ctx, "hist_p", "d1", []string{"temp"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := ps[4]
	if len(got) != 1 || !got[0].Time.Equal(want.Time) || got[0].Num != 4 || got[0].DeviceID != "d1" || got[0].ValueType != "number" {
		t.Fatalf("latest temp %+v, want time %v (ms kept) and 4", got, want.Time)
	}
	if got[0].Time.Location() != shanghai {
		t.Fatalf("time in %v, want the platform zone", got[0].Time.Location())
	}
}

func TestDropPartitionsBefore(t *testing.T) {
	db := openDB(t, "retention", shanghai)
	ctx := ctxT(t)
	var ms []Message
	var ps []PropertyValue
	for _, s := range []string{"2023-12-31 23:59:59", "2024-01-15 00:00:00", "2024-02-29 23:00:00", "2024-03-01 00:00:00"} {
		ms = append(ms, Message{Time: sh(t, s), ProductID: "p", DeviceID: "d", Direction: "up"})
		ps = append(ps, PropertyValue{Time: sh(t, s), ProductID: "p", DeviceID: "d", Property: "x", ValueType: "bool", Num: 1})
	}
	if err := db.Insert(ctx, ms, ps); err != nil {
		t.Fatal(err)
	}
	// Shanghai 2023-12-31 23:59:59 is December in UTC too; server is UTC here.
	n, err := db.DropPartitionsBefore(ctx, sh(t, "2024-02-10 00:00:00"))
	if err != nil {
		t.Fatal(err)
	}
	count := func(table string) uint64 {
		var c uint64
		if err := db.Conn().QueryRow(ctx, "SELECT count() FROM "+table).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	var daily uint64
	if err := db.Conn().QueryRow(ctx, "SELECT sum(messages) FROM device_message_daily").Scan(&daily); err != nil {
		t.Fatal(err)
	}
	var quarter uint64
	if err := db.Conn().QueryRow(ctx, "SELECT sum(messages) FROM device_message_quarter").Scan(&quarter); err != nil {
		t.Fatal(err)
	}
	if count("device_message") != 2 || count("device_property") != 2 || daily != 2 || quarter != 2 {
		t.Fatalf("after dropping %d partitions: messages %d, props %d, daily %d, quarter-hourly %d; want 2 each",
			n, count("device_message"), count("device_property"), daily, quarter)
	}
	if n < 8 {
		t.Fatalf("dropped %d partitions, want at least 8 (2 months x 4 tables)", n)
	}
	if n, err := db.DropPartitionsBefore(ctx, sh(t, "2024-02-10 00:00:00")); err != nil || n != 0 {
		t.Fatalf("second drop: %d, %v", n, err)
	}
}

// dayCount is db's message count of day y-m-d in its platform zone.
func dayCount(t *testing.T, ctx context.Context, db *DB, y int, m time.Month, d int) uint64 {
	t.Helper()
	tm := time.Date(y, m, d, 12, 0, 0, 0, db.Location())
	got, err := db.MessageCounts(ctx, CountQuery{Interval: Day, From: tm, To: tm})
	if err != nil {
		t.Fatal(err)
	}
	return got[0].Count
}

// Reopening with another platform zone rebuilds the per-day view and
// recounts the days.
func TestDailyViewZoneRebuild(t *testing.T) {
	ctx := ctxT(t)
	utc := openDB(t, "zone", time.UTC)
	// 2024-02-29 16:30 UTC is Mar 1 in Shanghai.
	ms := []Message{
		{Time: time.Date(2024, 2, 29, 16, 30, 0, 0, time.UTC), ProductID: "p", DeviceID: "d", Direction: "up"},
		{Time: time.Date(2024, 2, 29, 15, 30, 0, 0, time.UTC), ProductID: "p", DeviceID: "d", Direction: "up"},
	}
	if err := utc.Insert(ctx, ms, nil); err != nil {
		t.Fatal(err)
	}
	day := func(db *DB, y int, m time.Month, d int) uint64 { t.Helper(); return dayCount(t, ctx, db, y, m, d) }
	if a, b := day(utc, 2024, 2, 29), day(utc, 2024, 3, 1); a != 2 || b != 0 {
		t.Fatalf("UTC days: Feb 29 %d, Mar 1 %d; want 2, 0", a, b)
	}
	shdb, err := Open(ctx, testOptions("zone", shanghai))
	if err != nil {
		t.Fatal(err)
	}
	defer shdb.Close()
	if a, b := day(shdb, 2024, 2, 29), day(shdb, 2024, 3, 1); a != 1 || b != 1 {
		t.Fatalf("Shanghai days after rebuild: Feb 29 %d, Mar 1 %d; want 1, 1", a, b)
	}
	// New rows go through the rebuilt view with the new zone.
	if err := shdb.Insert(ctx, ms[:1], nil); err != nil {
		t.Fatal(err)
	}
	if b := day(shdb, 2024, 3, 1); b != 2 {
		t.Fatalf("Shanghai Mar 1 after insert: %d, want 2", b)
	}
	// Same zone again: no rebuild (a rebuild would drop this marker row).
	// INSERT ... SELECT: an Exec of INSERT ... VALUES hangs on 18.16.
	if err := shdb.Conn().Exec(ctx, "INSERT INTO device_message_daily (day, product_id, messages) SELECT toDate('2030-01-01'), 'marker', toUInt64(5)"); err != nil {
		t.Fatal(err)
	}
	again, err := Open(ctx, testOptions("zone", shanghai))
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if b := day(again, 2030, 1, 1); b != 5 {
		t.Fatalf("reopen with the same zone rebuilt the view (marker %d)", b)
	}
}

func TestWriterStoresThroughDB(t *testing.T) {
	db := shared(t)
	ctx := ctxT(t)
	w := NewWriter(db, WriterOptions{MaxRows: 300, FlushInterval: 50 * time.Millisecond})
	var acked int
	done := make(chan struct{}, 100)
	base := sh(t, "2024-03-15 10:00:00")
	for i := range 100 {
		m := []Message{{Time: base.Add(time.Duration(i) * time.Second), ProductID: "writer_p", DeviceID: "d", Direction: "up", MessageID: fmt.Sprint(i)}}
		p := []PropertyValue{{Time: m[0].Time, ProductID: "writer_p", DeviceID: "d", Property: "n", ValueType: "number", Num: float64(i)}}
		if err := w.Add(ctx, m, p, func() { done <- struct{}{} }); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	acked = len(done)
	if acked != 100 {
		t.Fatalf("%d of 100 done callbacks", acked)
	}
	got, err := db.MessageCounts(ctx, CountQuery{Interval: Day, From: base, To: base, ProductID: "writer_p"})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Count != 100 {
		t.Fatalf("stored %d messages, want 100", got[0].Count)
	}
	hist, err := db.PropertyHistory(ctx, "writer_p", "d", []string{"n"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 3 || hist[2].Num != 99 || hist[0].Num != 97 {
		t.Fatalf("history %+v", hist)
	}
}

func TestRetentionCutoff(t *testing.T) {
	f := func(now string, months int, want string) {
		t.Helper()
		n, err := time.Parse("2006-01-02 15:04", now)
		if err != nil {
			t.Fatal(err)
		}
		if got := RetentionCutoff(n, months).Format("2006-01-02 15:04"); got != want {
			t.Errorf("RetentionCutoff(%s, %d) = %s, want %s", now, months, got, want)
		}
	}
	f("2024-03-31 23:59", 1, "2024-03-01 00:00")
	f("2024-03-01 00:00", 2, "2024-02-01 00:00")
	f("2024-03-15 12:00", 3, "2024-01-01 00:00")
	f("2024-03-15 12:00", 4, "2023-12-01 00:00")
	f("2024-03-15 12:00", 12, "2023-04-01 00:00")
	f("2024-03-15 12:00", 27, "2022-01-01 00:00")
}

// RunRetention drops what is older than the retained months at once and
// keeps the rest.
func TestRunRetention(t *testing.T) {
	db := openDB(t, "retention_loop", time.UTC)
	ctx := ctxT(t)
	now := time.Now().UTC()
	old := RetentionCutoff(now, 2).Add(-time.Hour) // the last hour of the month just dropped
	keep := RetentionCutoff(now, 2).Add(time.Hour) // the first hour of the oldest month kept
	ms := []Message{
		{Time: old, ProductID: "p", DeviceID: "d", Direction: "up"},
		{Time: keep, ProductID: "p", DeviceID: "d", Direction: "up"},
		{Time: now, ProductID: "p", DeviceID: "d", Direction: "up"},
	}
	ps := []PropertyValue{{Time: old, ProductID: "p", DeviceID: "d", Property: "x", ValueType: "number", Num: 1}}
	if err := db.Insert(ctx, ms, ps); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); db.RunRetention(rctx, 2, time.Hour, slog.New(slog.DiscardHandler)) }()
	var msgs, props uint64
	testkit.Within(20*time.Second, func() bool {
		if err := db.Conn().QueryRow(ctx, "SELECT count() FROM device_message").Scan(&msgs); err != nil {
			t.Fatal(err)
		}
		if err := db.Conn().QueryRow(ctx, "SELECT count() FROM device_property").Scan(&props); err != nil {
			t.Fatal(err)
		}
		return msgs == 2 && props == 0
	})
	cancel()
	<-done
	if msgs != 2 || props != 0 {
		t.Fatalf("after retention of 2 months: %d messages, %d property values; want 2 and 0", msgs, props)
	}
}

// TestInsertInBlocks stores a batch larger than one INSERT block: every
// row arrives, in order across block boundaries, and each table gets one
// part, so the batch was one INSERT, stored all or nothing.
func TestInsertInBlocks(t *testing.T) {
	db := openDB(t, "blocks", time.UTC)
	ctx := ctxT(t)
	base := sh(t, "2024-05-01 00:00:00")
	const nm, np = 2*insertBlockRows + 1, 3*insertBlockRows + 5
	msgs := make([]Message, nm)
	for i := range msgs {
		msgs[i] = Message{Time: base.Add(time.Duration(i) * time.Millisecond), ProductID: "p", DeviceID: "d",
			Direction: "up", MessageID: fmt.Sprint(i), Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))}
	}
	props := make([]PropertyValue, np)
	for i := range props {
		props[i] = PropertyValue{Time: base.Add(time.Duration(i) * time.Millisecond), ProductID: "p", DeviceID: "d",
			Property: "n", ValueType: "number", Num: float64(i), Str: fmt.Sprint(i)}
	}
	if err := db.Insert(ctx, msgs, props); err != nil {
		t.Fatal(err)
	}
	check := func(what, q string, want uint64) {
		t.Helper()
		var got uint64
		if err := db.Conn().QueryRow(ctx, q).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("%s: %d, want %d", what, got, want)
		}
	}
	check("messages", "SELECT count() FROM device_message", nm)
	check("messages whose payload and ts match their id",
		"SELECT countIf(payload = concat('{\"i\":', message_id, '}') AND ts - toInt64(message_id) = "+fmt.Sprint(base.UnixMilli())+") FROM device_message", nm)
	check("property rows", "SELECT count() FROM device_property", np)
	check("property rows whose values and ts match",
		"SELECT countIf(toString(toUInt64(num_value)) = str_value AND ts - toInt64(str_value) = "+fmt.Sprint(base.UnixMilli())+") FROM device_property", np)
	check("device_message parts", "SELECT count() FROM system.parts WHERE database = currentDatabase() AND table = 'device_message' AND active", 1)
	check("device_property parts", "SELECT count() FROM system.parts WHERE database = currentDatabase() AND table = 'device_property' AND active", 1)
}

// Insert hands ClickHouse its blocks in key order: the server counts every
// block it did not have to sort, so the schema's ORDER BY and the orderer
// cannot drift apart unnoticed. The counters are server-wide; an attempt
// that saw other blocks written meanwhile is repeated.
func TestInsertInKeyOrder(t *testing.T) {
	db := openDB(t, "keyorder", time.UTC)
	ctx := ctxT(t)
	base := sh(t, "2024-05-01 00:00:00")
	rng := rand.New(rand.NewPCG(7, 7))
	var msgs []Message
	var props []PropertyValue
	for k := range 2000 {
		dev := fmt.Sprintf("dev-%d", rng.IntN(12)) // "dev-10" sorts before "dev-9"
		tm := base.Add(time.Duration(rng.IntN(3600_000)) * time.Millisecond)
		id := fmt.Sprint(k)
		msgs = append(msgs, Message{Time: tm, ProductID: "p", DeviceID: dev, Direction: "up", MessageID: id, Payload: []byte("{}")})
		for _, j := range rng.Perm(6)[:1+rng.IntN(6)] {
			props = append(props, PropertyValue{Time: tm, ProductID: "p", DeviceID: dev,
				Property: fmt.Sprintf("prop%d", j), ValueType: "number", Num: float64(k)})
		}
	}
	// The materialized views are dropped from the test's own database:
	// their blocks (GROUP BY results, in hash order) are ClickHouse's to
	// sort, and would hide the tables' own in the counts.
	var views []string
	rows, err := db.Conn().Query(ctx, "SELECT name FROM system.tables WHERE database = currentDatabase() AND engine = 'MaterializedView'")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		views = append(views, v)
	}
	rows.Close()
	if len(views) == 0 {
		t.Fatal("no materialized views found: the query reads the wrong database")
	}
	for _, v := range views {
		if err := db.Conn().Exec(ctx, "DROP TABLE `"+v+"`"); err != nil {
			t.Fatal(err)
		}
	}
	// The insert's own profile events, from system.query_log: one query
	// id for its statements (one per table), so that other tests' inserts into the
	// same server at the same time count nothing here.
	// ProfileEvents.Names/Values: arrays on 18.16, aliases of the
	// ProfileEvents map's keys and values on releases since 21.8.
	qid := fmt.Sprintf("keyorder-%d", time.Now().UnixNano())
	ictx := clickhouse.Context(ctx, clickhouse.WithQueryID(qid), clickhouse.WithSettings(clickhouse.Settings{"log_queries": 1}))
	if err := db.Insert(ictx, msgs, props); err != nil {
		t.Fatal(err)
	}
	var blocks, sorted, statements uint64
	deadline := time.Now().Add(30 * time.Second)
	for statements < 2 && time.Now().Before(deadline) {
		if err := db.Conn().Exec(ctx, "SYSTEM FLUSH LOGS"); err != nil {
			t.Fatal(err)
		}
		row := db.Conn().QueryRow(ctx, `SELECT count(),
			sum(arraySum(arrayMap((n, v) -> if(n = 'MergeTreeDataWriterBlocks', v, 0), ProfileEvents.Names, ProfileEvents.Values))),
			sum(arraySum(arrayMap((n, v) -> if(n = 'MergeTreeDataWriterBlocksAlreadySorted', v, 0), ProfileEvents.Names, ProfileEvents.Values)))
			FROM system.query_log WHERE query_id = ? AND type = 2`, qid)
		if err := row.Scan(&statements, &blocks, &sorted); err != nil {
			t.Fatal(err)
		}
		if statements < 2 {
			time.Sleep(200 * time.Millisecond)
		}
	}
	if statements != 2 {
		t.Fatalf("query_log holds %d finished statements of the insert, want 2 (device_message, device_property)", statements)
	}
	// One block each: device_message and device_property.
	const want = 2
	if blocks != want {
		t.Fatalf("%d blocks written by an insert into two tables, want %d", blocks, want)
	}
	if sorted != want {
		t.Fatalf("ClickHouse sorted %d of the %d blocks written", blocks-sorted, blocks)
	}
}

// A database created before version 2 loses device_property.message_id
// when opened, keeps its rows, and opens again as it is; instances opening
// it at once all succeed, whichever drops the column. Then one instance
// of this version converts it to the layout of version 6 (convert.go).
func TestSchemaUpgradeDropsPropertyMessageID(t *testing.T) {
	ctx := ctxT(t)
	name := fmt.Sprint("upgrade", rand.IntN(1e6)) // its own, under -count too
	v1 := testOptions(name, time.UTC)
	v1.SchemaVersion = 1
	db := openDBWith(t, v1)
	hasColumn := func() bool {
		t.Helper()
		var n uint64
		if err := db.Conn().QueryRow(ctx, "SELECT count() FROM system.columns WHERE database = currentDatabase()"+
			" AND table = 'device_property' AND name = 'message_id'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	// The table as version 1 left it, with a row.
	tm := time.Date(2024, 5, 1, 8, 0, 0, 250e6, time.UTC)
	for _, q := range []string{
		"INSERT INTO device_property (time, ts, product_id, device_id, property, value_type, num_value, str_value, message_id)" +
			" SELECT toDateTime(1714550400), toInt64(1714550400250), 'p', 'd', 'temp', 'number', 21.5, '', 'm1'",
	} {
		if err := db.Conn().Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	errs := make(chan error, 3)
	v5 := testOptions(name, time.UTC)
	v5.SchemaVersion = 5
	for range 3 {
		go func() {
			again, err := Open(ctx, v5)
			if err == nil {
				again.Close()
			}
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatalf("open a version 1 database: %v", err)
		}
	}
	if hasColumn() {
		t.Fatal("device_property.message_id still there after Open")
	}
	db = openDB(t, name, time.UTC) // version 6: converted
	got, err := db.PropertyHistory(ctx, "p", "d", []string{"temp"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Num != 21.5 || !got[0].Time.Equal(tm) {
		t.Fatalf("history after the upgrade: %+v", got)
	}
	if err := db.Insert(ctx, nil, []PropertyValue{{Time: tm.Add(time.Second), ProductID: "p", DeviceID: "d", Property: "temp", ValueType: "number", Num: 22}}); err != nil {
		t.Fatal(err)
	}
	reopened, err := Open(ctx, testOptions(name, time.UTC))
	if err != nil {
		t.Fatalf("open an upgraded database: %v", err)
	}
	reopened.Close()
}
