package tsdb

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestWarm: a fresh instance's Warm loads every closed month with rows
// of the window (message counts per product and for every product,
// property partials per product and property), so that the questions a
// dashboard asks first read no chunk, and answer what a DB without kept
// months answers; a second Warm loads nothing again; months past the
// window are not loaded.
func TestWarm(t *testing.T) {
	ctx := ctxT(t)
	opt := testOptions("warm", berlin)
	opt.ResultTTL = time.Hour // nothing expires during the test: loads are counted
	writer := openDBWith(t, opt)

	now := time.Now()
	var (
		msgs []Message
		vals []PropertyValue
	)
	// Every 20 hours over 130 days (five months of closed days, and
	// today), and one month past the window.
	for h := 0; h < 130*24; h += 20 {
		tm := now.Add(-time.Duration(h) * time.Hour)
		for _, p := range []string{"w1", "w2"} {
			msgs = append(msgs, Message{Time: tm, ProductID: p, DeviceID: "d", Direction: "up", MessageID: fmt.Sprint(len(msgs))})
			vals = append(vals, PropertyValue{Time: tm, ProductID: p, DeviceID: "d", Property: "t", ValueType: "number", Num: float64(h % 17)})
		}
	}
	old := now.AddDate(0, 0, -daySeriesDays-20)
	msgs = append(msgs, Message{Time: old, ProductID: "w1", DeviceID: "d", Direction: "up", MessageID: "old"})
	vals = append(vals, PropertyValue{Time: old, ProductID: "w1", DeviceID: "d", Property: "t", ValueType: "number", Num: 1})
	if err := writer.Insert(ctx, msgs, vals); err != nil {
		t.Fatal(err)
	}

	// What the window's totals say has rows: each keeper's months.
	months := func(k interface{ closedMonths() int }) int { return k.closedMonths() }
	db := openDBWith(t, opt) // a new instance: nothing kept
	st, err := db.Warm(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := months(db.days) + months(db.props)
	if st.Chunks != want || st.Chunks < 3*5 {
		t.Fatalf("warm loaded %d chunks (skipped %d), want %d (>= 15)", st.Chunks, st.Skipped, want)
	}
	counts, props := db.days.chunkReads.Load(), db.props.chunkReads.Load()

	opt.ResultTTL = 0 // no kept months: ClickHouse's answers
	plain := openDBWith(t, opt)
	for _, p := range []string{"w1", "w2", ""} {
		for _, q := range []CountQuery{
			{Interval: Day, From: now.AddDate(0, 0, -120), To: now, ProductID: p},
			{Interval: Hour, From: now.AddDate(0, 0, -7), To: now, ProductID: p},
			{Interval: Month, From: now.AddDate(0, -5, 0), To: now, ProductID: p},
		} {
			got, err := db.MessageCounts(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			exp, err := plain.MessageCounts(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, exp) {
				t.Fatalf("counts %q %s:\n got %v\nwant %v", p, q.Interval, got, exp)
			}
		}
		if p == "" {
			continue
		}
		for _, agg := range []string{AggMax, AggFirst, AggCount} {
			q := AggQuery{Interval: Hour, From: now.AddDate(0, 0, -60), To: now, Limit: 24 * 60, ProductID: p, Properties: []string{"t"}, Agg: agg}
			answers := propMemoryAnswers.Load()
			got, err := db.PropertyAggregates(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			if propMemoryAnswers.Load() == answers {
				t.Fatalf("aggregate %q %s: not from the kept partials", p, agg)
			}
			if exp := rawAggs(t, plain, q); !slices.EqualFunc(got, exp, func(a, b AggSeries) bool {
				return a.Property == b.Property && slices.Equal(a.Buckets, b.Buckets)
			}) {
				t.Fatalf("aggregate %q %s:\n got %v\nwant %v", p, agg, got, exp)
			}
		}
	}
	if c, pr := db.days.chunkReads.Load(), db.props.chunkReads.Load(); c != counts || pr != props {
		t.Fatalf("after Warm, the questions read %d count chunks and %d property chunks, want none", c-counts, pr-props)
	}
	again, err := db.Warm(ctx)
	if err != nil || again.Chunks != 0 || again.Skipped != st.Chunks {
		t.Fatalf("second Warm: %+v, %v; want nothing loaded, %d kept", again, err, st.Chunks)
	}
}

// closedMonths is how many closed months the kept totals count rows in.
func (k *keeper[V]) closedMonths() int {
	k.totals.mu.Lock()
	defer k.totals.mu.Unlock()
	n := 0
	if t := k.totals.cur; t != nil {
		for _, rows := range t.closed {
			if rows > 0 {
				n++
			}
		}
	}
	return n
}
