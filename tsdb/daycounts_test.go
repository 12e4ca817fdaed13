package tsdb

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestDaySeries: message counts of 15m, 1h, day and longer buckets
// answered from the totals and the closed chunks equal those read from
// ClickHouse for each question, across DST changes and month ends; every
// question shares one totals query and each product-month is read once;
// only a range older than the window (or of 1m or 5m buckets) is read as
// before; a local late insert shows at once and re-reads only its month;
// a day that closes moves into its chunk.
func TestDaySeries(t *testing.T) {
	ctx := ctxT(t)
	opt := testOptions("days", berlin)
	opt.ResultTTL = time.Hour // nothing expires (or is renewed) during the test: loads are counted
	db := openDBWith(t, opt)

	now := time.Now().In(berlin)
	var msgs []Message
	add := func(tm time.Time, product string) {
		msgs = append(msgs, Message{Time: tm, ProductID: product, DeviceID: "d", Direction: "up", MessageID: fmt.Sprint(len(msgs))})
	}
	// Every day of the last 430 days (past the window), a few messages
	// around local midnight, more for p1; DST days included.
	for d := 0; d < 430; d++ {
		day := time.Date(now.Year(), now.Month(), now.Day()-d, 0, 0, 0, 0, berlin)
		add(day.Add(-time.Second), "p1") // the day before's last second
		add(day, "p1")
		add(day.Add(90*time.Minute), "p2")
		add(day.Add(time.Duration(d%96)*15*time.Minute+7*time.Minute), "p2")
		if d%7 == 0 {
			add(day.Add(23*time.Hour+59*time.Minute), "p1")
		}
	}
	if err := db.Insert(ctx, msgs, nil); err != nil {
		t.Fatal(err)
	}
	type question struct {
		interval string
		from, to time.Time
		limit    int
		old      bool // 1m or 5m: read from ClickHouse
	}
	var qs []question
	for _, iv := range []string{FifteenMinutes, Hour, Day, Week, Month, Year} {
		qs = append(qs,
			question{iv, now.AddDate(0, 0, -30), now, 0, false},
			question{iv, now.AddDate(0, 0, -7), now, 0, false},
			question{iv, now.AddDate(0, -12, 0), now, 0, false},
			question{iv, now.AddDate(0, 0, -390), now.AddDate(0, 0, -200), 5, false},
			question{iv, now.AddDate(0, 0, -399), now.AddDate(0, 0, 3), 0, false},
			question{iv, now.AddDate(0, 0, -425), now, 0, false}, // older than the window
		)
	}
	// Sub-day ranges of the past, across the last DST changes (the last
	// Sundays of March and October).
	for _, iv := range []string{FifteenMinutes, Hour} {
		for _, mo := range []time.Month{time.March, time.October} {
			last := time.Date(now.Year(), mo+1, 0, 12, 0, 0, 0, berlin)
			for last.Weekday() != time.Sunday {
				last = last.AddDate(0, 0, -1)
			}
			if last.After(now) {
				last = last.AddDate(-1, 0, 0)
			}
			qs = append(qs, question{iv, last.AddDate(0, 0, -1), last.AddDate(0, 0, 1), 0, false})
		}
		qs = append(qs, question{iv, now.AddDate(0, 0, -2), now, 0, false},
			question{iv, now.AddDate(0, 0, -100), now.AddDate(0, 0, -99), 0, false})
	}
	qs = append(qs, question{Minute, now.AddDate(0, 0, -1), now, 0, true}, question{FiveMinutes, now.AddDate(0, 0, -2), now, 0, true})
	one := func(p string) productSet { return CountQuery{ProductID: p}.products() }
	check := func(products ...string) {
		t.Helper()
		for _, p := range products {
			for _, q := range qs {
				read := countQueries.Load()
				got, err := db.MessageCounts(ctx, CountQuery{Interval: q.interval, From: q.from, To: q.to, ProductID: p, Limit: q.limit})
				if err != nil {
					t.Fatal(err)
				}
				r, err := newBucketRange(q.interval, q.from, q.to, berlin, q.limit)
				if err != nil {
					t.Fatal(err)
				}
				want, err := db.messageCounts(ctx, r, one(p))
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("%q %s %s..%s limit %d:\n got %v\nwant %v", p, q.interval, q.from.Format(time.DateOnly), q.to.Format(time.DateOnly), q.limit, got, want)
				}
				// Read from ClickHouse: 1m and 5m, and ranges starting
				// before the window.
				old := q.old || dayNumber(r.lo, berlin) < dayNumber(now, berlin)-daySeriesDays
				if countQueries.Load() != read+1 && !old { // +1: want's
					t.Fatalf("%q %s %s..%s: read from ClickHouse", p, q.interval, q.from.Format(time.DateOnly), q.to.Format(time.DateOnly))
				}
			}
		}
	}
	loads := func() (uint64, uint64) { return dayTotalsLoads.Load(), db.days.chunkReads.Load() }
	t0, c0 := loads()
	check("p1", "p2", "", "none")
	t1, c1 := loads()
	// One totals query for every question; a chunk per month with
	// messages (the window spans 14 or 15 months) of p1, p2 and every
	// product, none of "none".
	if t1-t0 != 1 || c1-c0 < 3*14 || c1-c0 > 3*15 {
		t.Fatalf("%d totals and %d chunks read for %d questions", t1-t0, c1-c0, 4*len(qs))
	}
	check("p1", "p2", "", "none")
	if t2, c2 := loads(); t2 != t1 || c2 != c1 {
		t.Fatalf("asked again: %d totals and %d chunks read", t2-t1, c2-c1)
	}
	// Through this DB, a late row shows in the next answer: the totals and
	// the chunk of its month are patched, not read again.
	if err := db.Insert(ctx, []Message{{Time: now.AddDate(0, 0, -100), ProductID: "p2", DeviceID: "d", Direction: "up", MessageID: "late"}}, nil); err != nil {
		t.Fatal(err)
	}
	check("p2", "p1", "")
	if t3, c3 := loads(); t3-t1 != 0 || c3-c1 != 0 {
		t.Fatalf("after a late row: %d totals and %d chunks read, want none (both patched)", t3-t1, c3-c1)
	}
	// A set of products is the sum of its products' series, cut from
	// their kept chunks (no chunk read again, no query per product), equal
	// to ClickHouse's count of product_id IN the set.
	for _, set := range [][]string{{"p1", "p2"}, {"p2", "p1", "p1"}, {"p1", "none"}, {"none"}, {}} {
		for _, q := range qs {
			got, err := db.MessageCounts(ctx, CountQuery{Interval: q.interval, From: q.from, To: q.to, Products: set, Limit: q.limit})
			if err != nil {
				t.Fatal(err)
			}
			r, err := newBucketRange(q.interval, q.from, q.to, berlin, q.limit)
			if err != nil {
				t.Fatal(err)
			}
			sum := make([]Bucket, len(r.starts))
			for i, s := range r.starts {
				sum[i].Start = s
			}
			for _, p := range slices.Compact(slices.Sorted(slices.Values(set))) {
				one, err := db.MessageCounts(ctx, CountQuery{Interval: q.interval, From: q.from, To: q.to, ProductID: p, Limit: q.limit})
				if err != nil {
					t.Fatal(err)
				}
				for i := range sum {
					sum[i].Count += one[i].Count
				}
			}
			if !slices.Equal(got, sum) {
				t.Fatalf("%q %s %s..%s: got %v, sum of its products %v", set, q.interval, q.from.Format(time.DateOnly), q.to.Format(time.DateOnly), got, sum)
			}
			if len(set) == 0 {
				continue
			}
			want, err := db.messageCounts(ctx, r, CountQuery{Products: set}.products())
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%q %s: got %v, ClickHouse %v", set, q.interval, got, want)
			}
		}
	}
	if t4, c4 := loads(); t4-t1 != 0 || c4-c1 != 0 {
		t.Fatalf("sets of products: %d totals and %d chunks read, want none", t4-t1, c4-c1)
	}
	// A set's series is kept with the totals: a late row through this DB
	// shows in the set's next answer.
	if err := db.Insert(ctx, []Message{{Time: now.AddDate(0, 0, -50), ProductID: "p1", DeviceID: "d", Direction: "up", MessageID: "late2"}}, nil); err != nil {
		t.Fatal(err)
	}
	for _, q := range qs[:3] {
		got, err := db.MessageCounts(ctx, CountQuery{Interval: q.interval, From: q.from, To: q.to, Products: []string{"p2", "p1"}, Limit: q.limit})
		if err != nil {
			t.Fatal(err)
		}
		r, err := newBucketRange(q.interval, q.from, q.to, berlin, q.limit)
		if err != nil {
			t.Fatal(err)
		}
		want, err := db.messageCounts(ctx, r, CountQuery{Products: []string{"p1", "p2"}}.products())
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("after a late row, %s: got %v, ClickHouse %v", q.interval, got, want)
		}
	}
	// Today closes: tomorrow, today's messages are in a closed chunk, read
	// again since the month's total now counts them.
	tomorrow := now.AddDate(0, 0, 1)
	for _, ps := range []productSet{one("p1"), one(""), CountQuery{Products: []string{"p1", "p2"}}.products()} {
		p := ps.key()
		r, err := newBucketRange(Day, now.AddDate(0, 0, -3), tomorrow, berlin, 0)
		if err != nil {
			t.Fatal(err)
		}
		want, err := db.messageCounts(ctx, r, ps)
		if err != nil {
			t.Fatal(err)
		}
		for _, at := range []time.Time{now, tomorrow} {
			got, ok, err := db.countsFromDays(ctx, r, ps, at)
			if err != nil || !ok || !slices.Equal(got, want) {
				t.Fatalf("%q at %s: %v %v %v, want %v", p, at.Format(time.DateOnly), got, ok, err, want)
			}
		}
	}
}

// TestDayChunkViewOrder: a closed month whose device_message_quarter and
// device_message_daily disagree, as while an insert has written one of its
// two views and not yet the other (either order, simulated by adding rows
// to one table only), is never answered from the quarter-hours: each
// answer equals ClickHouse's (the daily table for days, device_message
// for quarter-hours) and the fallback is counted; once both tables agree
// the month's chunk is kept and answers again.
func TestDayChunkViewOrder(t *testing.T) {
	ctx := ctxT(t)
	opt := testOptions("days_order", berlin)
	opt.ResultTTL = time.Hour // expiry is simulated (expire)
	db := openDBWith(t, opt)

	now := time.Now().In(berlin)
	day := time.Date(now.Year(), now.Month(), now.Day()-45, 0, 0, 0, 0, berlin)
	var msgs []Message
	for i := range 8 {
		for _, p := range []string{"pq", "pd"} {
			msgs = append(msgs, Message{Time: day.Add(time.Duration(i) * 97 * time.Minute), ProductID: p, DeviceID: "d", Direction: "up", MessageID: fmt.Sprint(p, i)})
		}
	}
	if err := db.Insert(ctx, msgs, nil); err != nil {
		t.Fatal(err)
	}
	// The rows of the simulated insert: 3 messages at 10:20 local.
	slot := day.Add(10*time.Hour + 20*time.Minute)
	quarterRows := func(p string) string {
		return fmt.Sprintf("INSERT INTO device_message_quarter (slot, product_id, messages) SELECT toDateTime(%d), '%s', toUInt64(3)", slot.Unix()-slot.Unix()%quarterSec, p)
	}
	dailyRows := func(p string) string {
		return fmt.Sprintf("INSERT INTO device_message_daily (day, product_id, messages) SELECT toDate('%s'), '%s', toUInt64(3)", day.Format(time.DateOnly), p)
	}
	// expire stands for the TTL passing: the totals (and chunks) are read
	// again, cached answers are not served.
	expire := func() {
		db.days.dropped()
		db.invalidate()
	}
	// check asks p's ("" every product's) 1h buckets of the day and 1d
	// buckets around it: each must equal ClickHouse's, the 1h ones with
	// extra messages more in slot's hour (rows in device_message_quarter
	// but not device_message: the simulated insert wrote no raw rows).
	check := func(p string, extra uint64) {
		t.Helper()
		one := CountQuery{ProductID: p}.products()
		for _, q := range []CountQuery{
			{Interval: Hour, From: day, To: day.AddDate(0, 0, 1), ProductID: p},
			{Interval: Day, From: day.AddDate(0, 0, -3), To: day.AddDate(0, 0, 4), ProductID: p},
		} {
			got, err := db.MessageCounts(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			r, err := newBucketRange(q.Interval, q.From, q.To, berlin, 0)
			if err != nil {
				t.Fatal(err)
			}
			want, err := db.messageCounts(ctx, r, one)
			if err != nil {
				t.Fatal(err)
			}
			if q.Interval == Hour {
				for i, b := range want {
					if !b.Start.After(slot) && slot.Sub(b.Start) < time.Hour {
						want[i].Count += extra
					}
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%q %s:\n got %v\nwant %v", p, q.Interval, got, want)
			}
		}
	}
	month := chunkKey{month: dayMonth(dayNumber(day, berlin))}
	var all uint64 // the simulated rows in both tables, of every product
	for _, c := range []struct {
		product       string
		first, second string // the simulated insert's views, in order
	}{
		{"pq", quarterRows("pq"), dailyRows("pq")},
		{"pd", dailyRows("pd"), quarterRows("pd")},
	} {
		p := c.product
		month.product = p
		// Both tables agree: answered from the kept chunk.
		expire()
		fallbacks := db.MessageCountFallbacks()
		check(p, 0)
		check("", all)
		if _, ok := db.days.chunks.Peek(month); !ok || db.MessageCountFallbacks() != fallbacks {
			t.Fatalf("%s: chunk kept %v, %d fallbacks", p, ok, db.MessageCountFallbacks()-fallbacks)
		}
		// The first view written, not the second: read from ClickHouse.
		if err := db.conn.Exec(ctx, c.first); err != nil {
			t.Fatal(err)
		}
		expire()
		check(p, 0)
		check("", 0) // read from ClickHouse too: device_message has no simulated rows
		if _, ok := db.days.chunks.Peek(month); ok || db.MessageCountFallbacks() == fallbacks {
			t.Fatalf("%s, tables disagreeing: chunk kept %v, %d fallbacks", p, ok, db.MessageCountFallbacks()-fallbacks)
		}
		// Both written: the chunk holds them, is kept and answers.
		if err := db.conn.Exec(ctx, c.second); err != nil {
			t.Fatal(err)
		}
		expire()
		fallbacks = db.MessageCountFallbacks()
		check(p, 3)
		loads := db.days.chunkReads.Load()
		check(p, 3)
		kept, ok := db.days.chunks.Peek(month)
		if !ok || db.days.chunkReads.Load() != loads || db.MessageCountFallbacks() != fallbacks {
			t.Fatalf("%s, tables agreeing: chunk kept %v, %d reads, %d fallbacks", p, ok, db.days.chunkReads.Load()-loads, db.MessageCountFallbacks()-fallbacks)
		}
		if n := kept.days.vals; len(n) != 1 || n[0] != 8+3 {
			t.Fatalf("%s: kept chunk's days %v, want [11]", p, n)
		}
		all += 3
		check("", all)
	}
}

// BenchmarkDistinctCounts asks 64 different questions of one product in
// turn, as a dashboard's users do (15m x96, 1h x24..x168, 1d, 1w, 1M and
// 1y buckets): from the product's kept quarter-hours and days, and
// (ResultTTL -1) from ClickHouse each time.
func BenchmarkDistinctCounts(b *testing.B) {
	ctx := ctxT(b)
	now := time.Now().In(shanghai)
	var msgs []Message
	for d := range 400 {
		for h := range 24 {
			msgs = append(msgs, Message{Time: now.AddDate(0, 0, -d).Add(-time.Duration(h) * time.Hour), ProductID: "bench_days", DeviceID: "d", Direction: "up", MessageID: fmt.Sprint(d, "_", h)})
		}
	}
	for _, c := range []struct {
		name string
		ttl  time.Duration
	}{{"series", time.Second}, {"clickhouse", -1}} {
		b.Run(c.name, func(b *testing.B) {
			opt := testOptions("bench_days_"+c.name, shanghai)
			opt.ResultTTL = c.ttl
			db := openDBWith(b, opt)
			if err := db.Insert(ctx, msgs, nil); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				k := i % 64
				q := CountQuery{Interval: []string{Day, Week, Month, Year}[k%4], From: now.AddDate(0, 0, -(k+1)*5), To: now, ProductID: "bench_days"}
				switch k % 8 {
				case 1:
					q = CountQuery{Interval: FifteenMinutes, From: now.AddDate(0, 0, -k), Limit: 96, ProductID: "bench_days"}
					q.To = q.From.AddDate(0, 0, 1)
				case 3, 5:
					q = CountQuery{Interval: Hour, From: now.AddDate(0, 0, -k), Limit: 24 * (1 + k%7), ProductID: "bench_days"}
					q.To = q.From.AddDate(0, 0, 1+k%7)
				}
				if _, err := db.MessageCounts(ctx, q); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// holderRig drives a totals holder in the holder tests: its loads count
// themselves and block until released, then return totals of closed.
type holderRig struct {
	t       testing.TB
	ctx     context.Context
	key     totalsKey
	h       *totalsHolder[uint64]
	closed  map[chunkKey]uint64
	loads   atomic.Int64
	release chan struct{}
}

func newHolderRig(t testing.TB, ctx context.Context, key totalsKey, h *totalsHolder[uint64], closed map[chunkKey]uint64) *holderRig {
	if closed == nil {
		closed = map[chunkKey]uint64{}
	}
	return &holderRig{t: t, ctx: ctx, key: key, h: h, closed: closed, release: make(chan struct{})}
}

func (r *holderRig) load(context.Context, totalsKey) (*dayTotals, error) {
	r.loads.Add(1)
	<-r.release
	return &dayTotals{closed: maps.Clone(r.closed), open: map[string]*dayChunk{}}, nil
}

// get asks the holder for the rig's key in a goroutine of its own; the
// channel gives its totals.
func (r *holderRig) get() chan *dayTotals {
	out := make(chan *dayTotals, 1)
	go func() {
		got, err := r.h.get(r.ctx, r.key, time.Now(), r.load)
		if err != nil {
			r.t.Error(err)
		}
		out <- got
	}()
	return out
}

// TestTotalsHolder: the rules of daytotals.go, with a load the test
// releases: a load is installed only if no insert was under way when it
// started and none began or ended meanwhile (its callers get it either
// way); a question after an insert ended does not share a load started
// before; an insert patches kept totals older than its start and drops
// newer ones; kept totals past half the TTL are served while one load
// renews them.
func TestTotalsHolder(t *testing.T) {
	ctx := ctxT(t)
	key := totalsKey{from: 20000, cut: 20400}
	rig := newHolderRig(t, ctx, key, &totalsHolder[uint64]{ttl: time.Hour, cells: countCells(time.UTC)}, map[chunkKey]uint64{{"p", 202510}: 5})
	h, loads, release, get := rig.h, &rig.loads, rig.release, rig.get
	waitLoads := func(n int64) {
		t.Helper()
		for loads.Load() < n {
			time.Sleep(time.Millisecond)
		}
	}
	kept := func() *dayTotals {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.cur
	}

	// Under an insert: given, not kept.
	h.begin()
	a := get()
	waitLoads(1)
	release <- struct{}{}
	if got := <-a; got == nil || got.closed[chunkKey{"p", 202510}] != 5 || kept() != nil {
		t.Fatalf("a load under an insert: got %v, kept %v", got, kept())
	}
	h.stored(nil, time.Now(), true)

	// An insert ending during a load: the first caller gets it (not
	// kept), one arriving after the insert ended starts its own (kept:
	// clean, nothing ended since), and it is then served without loading.
	a = get()
	waitLoads(2)
	h.begin()
	h.stored(nil, time.Now(), true)
	b := get()
	waitLoads(3)
	release <- struct{}{}
	release <- struct{}{}
	ga, gb := <-a, <-b
	cur := kept()
	if ga == nil || gb == nil || ga == gb || cur != gb || cur.key != key {
		t.Fatalf("loads overlapping an insert: kept %p, got %p and %p", cur, ga, gb)
	}
	if got := <-get(); got != cur || loads.Load() != 3 {
		t.Fatalf("kept totals not served (%d loads)", loads.Load())
	}

	// An insert that started after the load: patched in (a closed month,
	// and an open day and quarter-hour).
	openQ := uint32(dayStart(key.cut, time.UTC).Unix()/quarterSec) + 3
	closedQ := uint32(dayStart(key.cut-20, time.UTC).Unix() / quarterSec)
	h.begin()
	h.stored(map[string]map[uint32]uint64{"p": {openQ: 2, closedQ: 1}}, time.Now(), true)
	p := kept()
	month := dayMonth(key.cut - 20)
	if p == nil || p == cur || p.closed[chunkKey{"p", month}] != cur.closed[chunkKey{"p", month}]+1 ||
		!slices.Equal(p.open["p"].slots.keys, []uint32{openQ}) || !slices.Equal(p.open["p"].days.vals, []uint64{2}) {
		t.Fatalf("patched totals: %+v", p)
	}
	// One that started before the load's query: dropped.
	h.begin()
	h.stored(nil, p.started.Add(-time.Millisecond), true)
	if kept() != nil {
		t.Fatal("totals kept after an insert that started before their query")
	}
	// One that began while a load ran and ends after it: the load may hold
	// some of its rows, so it is not kept (its caller gets it).
	a = get()
	waitLoads(4)
	h.begin()
	release <- struct{}{}
	if got := <-a; got == nil || kept() != nil {
		t.Fatalf("a load during which an insert began: got %v, kept %v", got, kept())
	}
	h.stored(nil, time.Now(), true)

	// Past half the TTL: served, and renewed in the background.
	h.ttl = 2 * time.Second
	a = get()
	waitLoads(5)
	release <- struct{}{}
	first := <-a
	time.Sleep(time.Until(first.started.Add(h.ttl / 2)))
	if got := <-get(); got != first {
		t.Fatal("totals past half the TTL not served")
	}
	waitLoads(6)
	release <- struct{}{}
	for kept() == first {
		time.Sleep(time.Millisecond)
	}
	if k := kept(); k == nil || !k.started.After(first.started) {
		t.Fatalf("not renewed: %+v", k)
	}
}

// TestSeriesPlus: adding counts merges keys in order, sums repeats and
// leaves the original as it was.
func TestSeriesPlus(t *testing.T) {
	s := series[uint64]{keys: []uint32{2, 5, 9}, vals: []uint64{1, 2, 3}}
	got := s.plus(map[uint32]uint64{1: 7, 5: 1, 10: 4, 6: 2}, addCounts)
	if !slices.Equal(got.keys, []uint32{1, 2, 5, 6, 9, 10}) || !slices.Equal(got.vals, []uint64{7, 1, 3, 2, 3, 4}) {
		t.Fatalf("got %v", got)
	}
	if !slices.Equal(s.vals, []uint64{1, 2, 3}) {
		t.Fatalf("the original changed: %v", s)
	}
	if e := (series[uint64]{}).plus(map[uint32]uint64{3: 1}, addCounts); !slices.Equal(e.keys, []uint32{3}) || !slices.Equal(e.vals, []uint64{1}) {
		t.Fatalf("from empty: %v", e)
	}
}

// TestTotalsHolderExclusive: an exclusive holder's load waits until no
// insert is under way, holds new inserts back until it has returned, and
// is installed although inserts kept arriving; a question shares a load
// still waiting.
func TestTotalsHolderExclusive(t *testing.T) {
	ctx := ctxT(t)
	key := totalsKey{from: 20000, cut: 20400}
	rig := newHolderRig(t, ctx, key, &totalsHolder[uint64]{ttl: time.Hour, cells: countCells(time.UTC), exclusive: true, hold: time.Hour}, nil)
	h, loads, release, get := rig.h, &rig.loads, rig.release, rig.get
	h.begin() // an insert under way
	a := get()
	time.Sleep(20 * time.Millisecond)
	b := get() // shares the waiting load
	began := make(chan struct{})
	go func() { h.begin(); close(began) }() // held back
	time.Sleep(20 * time.Millisecond)
	if loads.Load() != 0 {
		t.Fatal("load started while an insert was under way")
	}
	select {
	case <-began:
		t.Fatal("an insert began while an exclusive load waited")
	default:
	}
	h.stored(nil, time.Now(), true)
	for deadline := time.Now().Add(5 * time.Second); loads.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the load did not start once no insert was under way")
		}
	}
	select {
	case <-began:
		t.Fatal("an insert began during an exclusive load")
	case <-time.After(20 * time.Millisecond):
	}
	release <- struct{}{}
	ga, gb := <-a, <-b
	<-began
	h.mu.Lock()
	cur := h.cur
	h.mu.Unlock()
	if ga == nil || ga != gb || cur != ga || loads.Load() != 1 {
		t.Fatalf("kept %p, got %p and %p, %d loads", cur, ga, gb, loads.Load())
	}
	h.stored(nil, time.Now(), true)
}

// TestTotalsHolderHoldBound: an exclusive load's query holds inserts
// back at most hold (the wait for the inserts under way before it is not
// bounded: the Writer's next insert waits for them anyway); a load during
// which an insert began is given to its callers but not kept.
func TestTotalsHolderHoldBound(t *testing.T) {
	key := totalsKey{from: 20000, cut: 20400}
	const hold = 100 * time.Millisecond
	for _, waiting := range []bool{false, true} {
		t.Run(fmt.Sprint("waiting=", waiting), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rig := newHolderRig(t, context.Background(), key, &totalsHolder[uint64]{ttl: time.Hour, cells: countCells(time.UTC), exclusive: true, hold: hold}, nil)
				h, loads, release := rig.h, &rig.loads, rig.release
				if waiting {
					h.begin() // an insert under way, longer than the hold
				}
				got := rig.get()
				synctest.Wait()
				began := make(chan time.Time, 1)
				go func() { h.begin(); began <- time.Now() }()
				synctest.Wait()
				if waiting {
					time.Sleep(10 * hold)
					synctest.Wait()
					if len(began) != 0 || loads.Load() != 0 {
						t.Fatalf("while an insert was under way: %d inserts began, %d loads started", len(began), loads.Load())
					}
					h.stored(nil, time.Now(), true)
					synctest.Wait()
				}
				start := time.Now() // the query started
				if len(began) != 0 || loads.Load() != 1 {
					t.Fatalf("%d inserts began at once during an exclusive load, %d loads started", len(began), loads.Load())
				}
				if at := <-began; at.Sub(start) != hold {
					t.Fatalf("the insert was held %v, want %v", at.Sub(start), hold)
				}
				close(release)
				if tt := <-got; tt == nil {
					t.Fatal("the caller got no totals")
				}
				h.mu.Lock()
				cur := h.cur
				h.mu.Unlock()
				if cur != nil {
					t.Fatal("kept totals loaded while an insert began")
				}
			})
		})
	}
}
