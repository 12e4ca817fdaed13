package tsdb

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestResultCache: an answer is served while less than the TTL has passed
// since its query started and nothing was inserted since; identical
// queries in flight share one load; failures are shared but not kept; the
// cache stays bounded. Time is synctest's.
func TestResultCache(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		c := newResultCache(time.Second)
		var loads atomic.Int32
		load := func(v string) func(context.Context) (any, int, error) {
			return func(context.Context) (any, int, error) { loads.Add(1); return v, 1, nil }
		}
		f := func(key string, v, want string, wantLoads int32) {
			t.Helper()
			got, err := c.get(ctx, key, load(v))
			if err != nil || got != want || loads.Load() != wantLoads {
				t.Fatalf("%s: %v, %v after %d loads; want %s after %d", key, got, err, loads.Load(), want, wantLoads)
			}
		}
		f("a", "a1", "a1", 1)
		time.Sleep(999 * time.Millisecond)
		f("a", "a2", "a1", 1) // within the TTL
		f("b", "b1", "b1", 2) // another query
		time.Sleep(time.Millisecond)
		f("a", "a3", "a3", 3) // the TTL has passed since a1's query started
		c.invalidate()        // an insert through the DB
		f("a", "a4", "a4", 4)
		f("b", "b2", "b2", 5) // b1's query started 1 ms ago

		// Concurrent identical queries share one load.
		release := make(chan struct{})
		started := make(chan struct{})
		var wg sync.WaitGroup
		results := make([]any, 8)
		slow := func(context.Context) (any, int, error) {
			loads.Add(1)
			close(started)
			<-release
			return "slow", 1, nil
		}
		before := loads.Load()
		wg.Add(1)
		go func() { defer wg.Done(); results[0], _ = c.get(ctx, "s", slow) }()
		<-started
		for i := 1; i < len(results); i++ {
			wg.Add(1)
			go func() { defer wg.Done(); results[i], _ = c.get(ctx, "s", load("other")) }()
		}
		synctest.Wait()
		close(release)
		wg.Wait()
		for i, r := range results {
			if r != "slow" {
				t.Fatalf("caller %d got %v", i, r)
			}
		}
		if n := loads.Load() - before; n != 1 {
			t.Fatalf("%d loads for 8 identical queries", n)
		}

		// A waiter gives up at its own deadline.
		block := make(chan struct{})
		go func() {
			_, _ = c.get(ctx, "w", func(context.Context) (any, int, error) { <-block; return "w", 1, nil })
		}()
		synctest.Wait()
		wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		if _, err := c.get(wctx, "w", load("x")); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("waiter past its deadline: %v", err)
		}
		cancel()
		close(block)

		// Failures reach the callers sharing them and are not kept; a panic
		// fails the query, and the next one loads again.
		boom := errors.New("boom")
		if _, err := c.get(ctx, "e", func(context.Context) (any, int, error) { return nil, 0, boom }); !errors.Is(err, boom) {
			t.Fatalf("failed load: %v", err)
		}
		f("e", "e1", "e1", loads.Load()+1)
		func() {
			defer func() { _ = recover() }()
			_, _ = c.get(ctx, "p", func(context.Context) (any, int, error) { panic("load") })
		}()
		f("p", "p1", "p1", loads.Load()+1)

		// Bounded: old entries are swept when the bounds are reached.
		time.Sleep(5 * time.Second)
		for i := range maxCacheEntries + 10 {
			if _, err := c.get(ctx, fmt.Sprint("k", i), load("v")); err != nil {
				t.Fatal(err)
			}
		}
		if n := c.c.Len(); n > maxCacheEntries {
			t.Fatalf("%d entries", n)
		}
		time.Sleep(5 * time.Second)
		big := func(context.Context) (any, int, error) { return "big", maxCacheValues, nil }
		if _, err := c.get(ctx, "big", big); err != nil {
			t.Fatal(err)
		}
		if c.c.Bytes() > 2*maxCacheValues*bucketBytes || c.c.Len() > maxCacheEntries {
			t.Fatalf("bytes %d, entries %d", c.c.Bytes(), c.c.Len())
		}

		// TTL <= 0: no cache.
		off := newResultCache(-1)
		before = loads.Load()
		for range 3 {
			if _, err := off.get(ctx, "a", load("x")); err != nil {
				t.Fatal(err)
			}
		}
		if loads.Load()-before != 3 {
			t.Fatal("a disabled cache kept an answer")
		}
	})
}

// TestLateRowsExact is issue #20's exactness rule: a message stored late
// for a past day changes that day's count in the next answer when it was
// stored through the same DB, and in every answer given more than
// ResultTTL after it was stored through another instance sharing the
// database; property aggregates alike.
func TestLateRowsExact(t *testing.T) {
	ctx := ctxT(t)
	a := openDB(t, "late", shanghai)
	opt := testOptions("late", shanghai)
	b, err := Open(ctx, opt) // the other instance
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	yesterday := time.Now().In(shanghai).AddDate(0, 0, -1)
	day := func(db *DB) uint64 {
		t.Helper()
		got, err := db.MessageCounts(ctx, CountQuery{Interval: Day, From: yesterday, To: time.Now(), ProductID: "late_p"})
		if err != nil {
			t.Fatal(err)
		}
		return got[len(got)-1].Count // oldest bucket: yesterday
	}
	// The hour (and quarter-hour) of the late rows, from the kept
	// quarter-hours as the days (daycounts.go).
	hour := func(db *DB, interval string) uint64 {
		t.Helper()
		got, err := db.MessageCounts(ctx, CountQuery{Interval: interval, From: yesterday, To: yesterday, ProductID: "late_p"})
		if err != nil {
			t.Fatal(err)
		}
		return got[0].Count
	}
	avg := func(db *DB) uint64 {
		t.Helper()
		got, err := db.PropertyAggregates(ctx, AggQuery{Interval: Hour, From: yesterday, To: time.Now(), ProductID: "late_p",
			DeviceID: "d", Properties: []string{"t"}, Agg: AggCount})
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, bk := range got[0].Buckets {
			n += bk.Values
		}
		return n
	}
	// The product-wide count and max of the values, from the kept hourly
	// partials (propaggs.go).
	wide := func(db *DB) [2]float64 {
		t.Helper()
		answers := propMemoryAnswers.Load()
		var out [2]float64
		for i, agg := range []string{AggCount, AggMax} {
			got, err := db.PropertyAggregates(ctx, AggQuery{Interval: Hour, From: yesterday.Add(-time.Hour), To: yesterday, ProductID: "late_p",
				Properties: []string{"t"}, Agg: agg})
			if err != nil {
				t.Fatal(err)
			}
			out[i] = got[0].Buckets[0].Value
		}
		if propMemoryAnswers.Load() != answers+2 {
			t.Fatal("product-wide aggregates not answered from the kept partials")
		}
		return out
	}
	late := func(db *DB, i int) time.Time {
		t.Helper()
		msg := Message{Time: yesterday, ProductID: "late_p", DeviceID: "d", Direction: "up", MessageID: fmt.Sprint("late", i)}
		val := PropertyValue{Time: yesterday, ProductID: "late_p", DeviceID: "d", Property: "t", ValueType: "number", Num: float64(i)}
		if err := db.Insert(ctx, []Message{msg}, []PropertyValue{val}); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	if day(a) != 0 || avg(a) != 0 || wide(a) != [2]float64{} || day(b) != 0 || hour(a, Hour) != 0 || hour(a, FifteenMinutes) != 0 {
		t.Fatal("not empty")
	}
	rollups := rollupQueries.Load()
	defer func() {
		if rollupQueries.Load() == rollups {
			t.Error("the hour buckets did not read the rollup")
		}
	}()
	// Through the same instance: at once.
	counts := func(db *DB) [3]uint64 { return [3]uint64{day(db), hour(db, Hour), hour(db, FifteenMinutes)} }
	queries := countQueries.Load()
	late(a, 1)
	if n, m, w := counts(a), avg(a), wide(a); n != [3]uint64{1, 1, 1} || m != 1 || w != [2]float64{1, 1} {
		t.Fatalf("same instance, next answer: %v messages (day, hour, quarter-hour), %d values, product-wide %v; want 1s, 1, [1 1]", n, m, w)
	}
	// Through another: a's answers are cached (a's query just ran), and
	// every answer more than the TTL after the insert counts the row.
	// Message counts and aggregates are kept apart: each turns from 1 to
	// 2 on its own, never back.
	stored := late(b, 2)
	seenN, seenM, seenW := [3]uint64{1, 1, 1}, uint64(1), [2]float64{1, 1}
	for {
		n, m, w := counts(a), avg(a), wide(a)
		if n == [3]uint64{2, 2, 2} && m == 2 && w == [2]float64{2, 2} {
			break
		}
		if w != seenW && w != [2]float64{2, 2} {
			t.Fatalf("other instance: product-wide count and max %v after %v; want [1 1] (cached) or [2 2]", w, seenW)
		}
		for i := range n {
			if n[i] < seenN[i] || n[i] > 2 {
				t.Fatalf("other instance: %v messages (day, hour, quarter-hour) after %v; want 1 (cached) or 2", n, seenN)
			}
		}
		if m < seenM || m > 2 {
			t.Fatalf("other instance: %d values after %d; want 1 (cached) or 2", m, seenM)
		}
		seenN, seenM, seenW = n, m, w
		if time.Since(stored) > opt.ResultTTL+100*time.Millisecond {
			t.Fatalf("another instance's late row not counted %v after it was stored", time.Since(stored))
		}
		time.Sleep(20 * time.Millisecond) // polling: the bound above is what is asserted
	}
	if n := counts(b); n != [3]uint64{2, 2, 2} {
		t.Fatalf("the storing instance counts %v of its own rows", n)
	}
	// The cache's clock is the wall clock here (two instances on one
	// ClickHouse): wait until a TTL has passed since the insert, then
	// assert that what a answers now (a fresh query) still counts the row.
	time.Sleep(time.Until(stored.Add(time.Second)))
	if n, m, w := counts(a), avg(a), wide(a); n != [3]uint64{2, 2, 2} || m != 2 || w != [2]float64{2, 2} {
		t.Fatalf("after the TTL: %v, %d, %v", n, m, w)
	}
	if q := countQueries.Load(); q != queries {
		t.Errorf("%d message counts read from ClickHouse, want none (all from the kept days and quarter-hours)", q-queries)
	}
}
