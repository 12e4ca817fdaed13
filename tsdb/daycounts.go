package tsdb

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"
	"time"
)

// Message counts of day and longer buckets from one per-product series of
// days. A dashboard's users ask many different message-count questions
// (1d x7, 1d x30, 1w x12, 1M x12, each with its own from/to, per product),
// and the result cache (cache.go) keys answers by the question: each
// distinct one cost a ClickHouse query (about 1.5 ms of its CPU on 18.16)
// per ResultTTL. Here the answer to all of them is one series per
// product: the per-day counts of the last daySeriesDays days, read in one
// query, kept in the result cache under the same rules (served while
// younger than ResultTTL from the start of its query, retired at once by
// a local insert or drop), and cut into whatever buckets a question asks
// for in memory. So, per product, every day-or-longer question whose
// range lies in the window costs ClickHouse one query per ResultTTL
// whatever the number of distinct questions; older ranges are read as
// before.
//
// Why the whole window is read again rather than only the open day: a
// closed day still changes when a late row arrives (a device's clock, a
// backlog stored after an outage), and another instance's late row must
// show within ResultTTL here too (TestLateRowsExact). Nothing in
// ClickHouse tells which days changed more cheaply than reading them:
// the window is at most daySeriesDays rows per product of the per-day
// view, and a query's cost on 18.16 is its fixed part (parse, plan, open
// the parts), so re-reading the closed days costs about what checking
// them would.
//
// Memory: a series is two slices of at most daySeriesDays+2 entries (12
// bytes each, about 5 KB), counted as that many buckets against the result
// cache's bounds (maxCacheEntries, maxCacheValues).

// daySeriesDays is how many days before today a series holds: a year of
// days, weeks or months, and the current year, from one series.
const daySeriesDays = 400

// daySeriesLoads counts the series read from ClickHouse (tests).
var daySeriesLoads atomic.Uint64

// daySeries is one product's message count per day from day from on:
// days ascending, counts[i] of days[i]; days without messages are absent.
type daySeries struct {
	from   uint32
	days   []uint32
	counts []uint64
}

// dayNumber is the ClickHouse Date (days since 1970-01-01) of t's date
// in loc.
func dayNumber(t time.Time, loc *time.Location) uint32 {
	y, m, d := t.In(loc).Date()
	return uint32(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() / 86400)
}

// countsFromDays answers the message counts of r (day or longer buckets)
// from the product's series, when r lies in its window; ok false when it
// does not (the caller reads ClickHouse as before).
func (db *DB) countsFromDays(ctx context.Context, r bucketRange, productID string, now time.Time) (out []Bucket, ok bool, err error) {
	from := dayNumber(now, db.loc) - daySeriesDays
	if dayNumber(r.lo, db.loc) < from {
		return nil, false, nil
	}
	key := cacheKey("days", productID, int(from))
	v, err := db.cache.get(ctx, key, func(ctx context.Context) (any, int, error) {
		s, err := db.loadDaySeries(ctx, productID, from)
		return s, len(s.days), err
	})
	if err != nil {
		return nil, true, err
	}
	s := v.(*daySeries)
	out = make([]Bucket, len(r.starts))
	// Buckets oldest first, each [its first day, the next bucket's).
	i := sort.Search(len(s.days), func(i int) bool { return s.days[i] >= dayNumber(r.lo, db.loc) })
	for k := len(r.starts) - 1; k >= 0; k-- {
		end := r.hi
		if k > 0 {
			end = r.starts[k-1]
		}
		last := dayNumber(end, db.loc) // exclusive
		var n uint64
		for ; i < len(s.days) && s.days[i] < last; i++ {
			n += s.counts[i]
		}
		out[k] = Bucket{Start: r.starts[k], Count: n}
	}
	return out, true, nil
}

// loadDaySeries reads a product's ("": every product's) message count of
// each day from day from on.
func (db *DB) loadDaySeries(ctx context.Context, productID string, from uint32) (*daySeries, error) {
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	daySeriesLoads.Add(1)
	sql := "SELECT (sumMap([toUInt32(day)], [messages]) AS m).1 AS b, m.2 AS n FROM device_message_daily WHERE day >= toDate(?)"
	args := []any{time.Unix(int64(from)*86400, 0).UTC().Format(time.DateOnly)}
	if productID != "" {
		sql += " AND product_id = ?"
		args = append(args, productID)
	}
	s := &daySeries{from: from}
	if err := db.conn.QueryRow(ctx, sql, args...).Scan(&s.days, &s.counts); err != nil {
		return nil, fmt.Errorf("tsdb: message counts per day: %w", err)
	}
	if len(s.days) != len(s.counts) {
		return nil, fmt.Errorf("tsdb: message counts per day: sumMap returned %d keys and %d sums", len(s.days), len(s.counts))
	}
	return s, nil // sumMap's keys come sorted
}
