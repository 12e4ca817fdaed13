package tsdb

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"devicehub/meta/cache"
)

// Message counts of day and longer buckets at memory speed. A dashboard's
// users ask many different message-count questions (1d x7, 1d x30, 1w x12,
// 1M x12, each with its own from/to, per product, and a thousand
// dashboards each on its own product), and a ClickHouse query costs about
// 1.5 ms of its CPU on 18.16 whatever it reads. Here every such question
// whose range lies in the last daySeriesDays days is cut, in memory, from
// two things kept in meta/cache Caches:
//
//   - Closed days (before today in the platform zone), per product and
//     month: the per-day counts of that month's closed days (a dayChunk),
//     read once from device_message_daily and kept (cache.Forever, within
//     the bounds below) for as long as a check says they are still exact.
//   - The check and the open days, for every product at once (dayTotals):
//     one query grouping device_message_daily by product and month for the
//     closed days, and by product and day for today and later. It is kept
//     under the result cache's rules: served while younger than ResultTTL
//     from the start of its query, and dropped by every insert or drop
//     through this DB (Invalidate).
//
// A closed chunk is served only when its total equals the month's total in
// a dayTotals that may be served; otherwise it is read again (Delete, then
// a new load). Why this is exact under the result cache's rule (a row
// stored through this DB shows in the next answer, one stored through
// another instance in every answer more than ResultTTL later):
//
//   - The totals: their query started after every row stored through this
//     DB before the question (an insert drops them) and less than
//     ResultTTL before the question, so it counts every row that rule
//     requires; the open days are read from it directly.
//   - A chunk whose total equals its month's total counts exactly the same
//     rows: rows are only added (late ones included), so of the two
//     queries, the later one saw every row the earlier one saw, and equal
//     counts of a set and its superset make them the same set. A chunk
//     read again after a mismatch is newer than the totals, so it counts
//     all their rows too (and maybe more: also exact). A month whose
//     partition is dropped (retention) has a smaller total, so its chunk
//     is read again; a drop through this DB drops the totals at once. (A
//     drop by another instance followed by exactly as many late rows of
//     that month as it removed, before the check, would go unseen: the
//     retention drops months older than the window by default.)
//   - The day a chunk was read up to: a chunk holds the days before the
//     day it was read; once that day closes, the month's closed total
//     counts it, and the chunk is read again unless that day has no
//     messages (then it is exact as it is).
//
// Late messages stored through this DB do not make their months be read
// again: InsertBatch counts the batch's messages of closed days per
// product and day before it sends them, and once device_message has taken
// them adds those counts to each kept chunk whose query was sent before
// the insert started (it cannot have seen them; patches are serialized),
// and drops a chunk read since (it may have) or of a day it does not
// cover. A load that started before the insert and ends after the patch
// keeps a chunk without them; the totals, read after the insert, tell,
// and it is read again. After a failed insert (some rows may be stored)
// the chunks of its closed days are dropped; the retry patches what it
// stores, duplicates included, as device_message holds them.
//
// So with ingest running, ClickHouse answers one totals query per insert
// (per flush of each writer) and per ResultTTL, shared by every question
// of every product, plus a chunk for each month that a late row stored by
// another instance changed; questions themselves cost none.
//
// Memory: dayTotals holds one entry per product and month of the window
// (14) plus one per open day, about 40 bytes each; a dayChunk at most 31
// days of 12 bytes. The chunks' Cache is bounded by maxDayChunks entries
// and maxDayChunkBytes; the totals are one value (of the current window).

// daySeriesDays is how many days before today the chunks cover: a year of
// days, weeks or months, and the current year.
const daySeriesDays = 400

// Bounds of the closed chunks kept: 100,000 product-months (7,000
// products over the 14 months of the window) and 32 MiB.
const (
	maxDayChunks     = 100000
	maxDayChunkBytes = 32 << 20
)

// Loads from ClickHouse (tests).
var (
	dayTotalsLoads atomic.Uint64
	dayChunkLoads  atomic.Uint64
)

// dayCounts keeps the totals and the closed chunks.
type dayCounts struct {
	totals  *cache.Cache[totalsKey, *dayTotals]
	chunks  *cache.Cache[chunkKey, *dayChunk]
	patchMu sync.Mutex // one patch of the chunks at a time
}

// totalsKey is the window of a dayTotals: days from (inclusive); closed
// before cut (today).
type totalsKey struct{ from, cut uint32 }

// chunkKey is a product's ("" for every product) month, as yyyymm.
type chunkKey struct {
	product string
	month   uint32
}

// dayTotals is the message count of each product ("" included: every
// product) per month of closed days and per open day.
type dayTotals struct {
	closed map[chunkKey]uint64
	open   map[string]*dayChunk // product -> its open days, ascending
	// sets are the series of sets of products summed from these totals
	// (setDays): productSet key -> *dayChunk; setCount counts them.
	sets     sync.Map
	setCount atomic.Int64
}

// dayChunk is the message count of each closed day of a month with
// messages, days ascending, and their sum: of the days before cut, as
// read by a query sent at loaded.
type dayChunk struct {
	days   []uint32
	counts []uint64
	total  uint64
	cut    uint32
	loaded time.Time
}

// plus returns c with n more messages on each day of add.
func (c *dayChunk) plus(add map[uint32]uint64) *dayChunk {
	out := &dayChunk{cut: c.cut, loaded: c.loaded, total: c.total}
	merged := map[uint32]uint64{}
	for i, d := range c.days {
		merged[d] = c.counts[i]
	}
	for d, n := range add {
		merged[d] += n
		out.total += n
	}
	for d := range merged {
		out.days = append(out.days, d)
	}
	sort.Slice(out.days, func(i, j int) bool { return out.days[i] < out.days[j] })
	for _, d := range out.days {
		out.counts = append(out.counts, merged[d])
	}
	return out
}

// lateMessages counts the messages of b stamped before the start of
// now's day, per product (and "") and month, per day.
func (db *DB) lateMessages(b *Batch, now time.Time) map[chunkKey]map[uint32]uint64 {
	y, m, d := now.In(db.loc).Date()
	open := localTime(y, m, d, 0, 0, 0, 0, db.loc).UnixMilli()
	var late map[chunkKey]map[uint32]uint64
	for i := range b.msgs {
		r := &b.msgs[i]
		if r.ms >= open {
			continue
		}
		if late == nil {
			late = map[chunkKey]map[uint32]uint64{}
		}
		day := dayNumber(time.UnixMilli(r.ms), db.loc)
		for _, p := range []string{b.str(r.product), ""} {
			k := chunkKey{p, dayMonth(day)}
			if late[k] == nil {
				k.product = strings.Clone(k.product) // the arena is reused
				late[k] = map[uint32]uint64{}
			}
			late[k][day]++
		}
	}
	return late
}

// stored patches the kept chunks with late, the late messages of an
// insert that started at start; stored false (the insert failed, some
// rows may be stored) drops their chunks instead.
func (d *dayCounts) stored(late map[chunkKey]map[uint32]uint64, start time.Time, stored bool) {
	if len(late) == 0 {
		return
	}
	d.patchMu.Lock()
	defer d.patchMu.Unlock()
	for k, add := range late {
		c, ok := d.chunks.Peek(k)
		if !ok {
			continue // read when asked for
		}
		patch := stored && c.loaded.Before(start)
		for day := range add {
			patch = patch && day < c.cut
		}
		if patch {
			d.chunks.Put(k, c.plus(add))
		} else {
			d.chunks.Delete(k)
		}
	}
}

func newDayCounts(ttl time.Duration) *dayCounts {
	to := cache.DefaultOptions[totalsKey, *dayTotals]()
	to.TTL = ttl
	to.MaxEntries = 2  // the current window, and the last one around midnight
	to.LoadTimeout = 0 // the query's own (Options.QueryTimeout)
	co := cache.DefaultOptions[chunkKey, *dayChunk]()
	co.TTL = cache.Forever
	co.MaxEntries = maxDayChunks
	co.MaxBytes = maxDayChunkBytes
	co.Size = func(k chunkKey, c *dayChunk) int { return 64 + len(k.product) + 12*len(c.days) }
	co.LoadTimeout = 0
	return &dayCounts{totals: cache.New(to), chunks: cache.New(co)}
}

// invalidate drops the totals: rows were stored or dropped through the
// DB. The chunks stay; the next totals tell which are still exact.
func (d *dayCounts) invalidate() { d.totals.Invalidate() }

// dayNumber is the ClickHouse Date (days since 1970-01-01) of t's date
// in loc.
func dayNumber(t time.Time, loc *time.Location) uint32 {
	y, m, d := t.In(loc).Date()
	return uint32(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() / 86400)
}

// dayMonth is the yyyymm of a Date, as toYYYYMM.
func dayMonth(day uint32) uint32 {
	y, m, _ := time.Unix(int64(day)*86400, 0).UTC().Date()
	return uint32(y*100 + int(m))
}

// countsFromDays answers the message counts of r (day or longer buckets)
// from the totals and the closed chunks, when r lies in the window and
// the result cache is on; ok false otherwise (the caller reads ClickHouse
// as before). A set of products is the sum of its products' per-day
// counts over the window (setDays), kept with the totals.
func (db *DB) countsFromDays(ctx context.Context, r bucketRange, ps productSet, now time.Time) (out []Bucket, ok bool, err error) {
	if db.opt.ResultTTL <= 0 {
		return nil, false, nil
	}
	cut := dayNumber(now, db.loc)
	from := cut - daySeriesDays
	lo, hi := dayNumber(r.lo, db.loc), dayNumber(r.hi, db.loc) // hi exclusive
	if lo < from {
		return nil, false, nil
	}
	tk := totalsKey{from, cut}
	t, err := db.days.totals.Get(ctx, tk, func(ctx context.Context, k totalsKey) (*dayTotals, error) {
		return db.loadDayTotals(ctx, k)
	})
	if err != nil {
		return nil, true, err
	}
	var days []uint32
	var counts []uint64
	switch {
	case ps.all:
		days, counts, err = db.productDays(ctx, t, "", lo, hi, cut)
	case len(ps.ids) == 1:
		days, counts, err = db.productDays(ctx, t, ps.ids[0], lo, hi, cut)
	default:
		var c *dayChunk
		c, err = db.setDays(ctx, t, ps, from, cut)
		if c != nil {
			days, counts = c.days, c.counts
		}
	}
	if err != nil {
		return nil, true, err
	}
	out = make([]Bucket, len(r.starts))
	// Buckets oldest first, each [its first day, the next bucket's).
	i := sort.Search(len(days), func(i int) bool { return days[i] >= lo })
	for k := len(r.starts) - 1; k >= 0; k-- {
		end := r.hi
		if k > 0 {
			end = r.starts[k-1]
		}
		last := dayNumber(end, db.loc) // exclusive
		var n uint64
		for ; i < len(days) && days[i] < last; i++ {
			n += counts[i]
		}
		out[k] = Bucket{Start: r.starts[k], Count: n}
	}
	return out, true, nil
}

// productDays returns product p's ("" every product's) per-day counts of
// the months holding days lo to hi (exclusive), oldest first: its closed
// months' chunks as of cut, checked against the totals t, then its open
// days.
func (db *DB) productDays(ctx context.Context, t *dayTotals, p string, lo, hi, cut uint32) ([]uint32, []uint64, error) {
	var days []uint32
	var counts []uint64
	for m := dayMonth(lo); lo < min(hi, cut); {
		key := chunkKey{p, m}
		if want := t.closed[key]; want > 0 {
			c, err := db.dayChunk(ctx, key, cut, want)
			if err != nil {
				return nil, nil, err
			}
			days, counts = append(days, c.days...), append(counts, c.counts...)
		}
		// The first day of the next month.
		y, mo := int(m/100), time.Month(m%100)
		next := uint32(time.Date(y, mo+1, 1, 0, 0, 0, 0, time.UTC).Unix() / 86400)
		lo, m = next, dayMonth(next)
	}
	if o := t.open[p]; o != nil {
		days, counts = append(days, o.days...), append(counts, o.counts...)
	}
	return days, counts, nil
}

// maxSetSeries bounds the sets of products whose series a dayTotals
// keeps; past it, a set's series is summed for each question.
const maxSetSeries = 1000

// setDays returns the per-day counts, summed over the products of ps, of
// the whole window (days from to cut, and the open days), oldest first.
// It is kept with the totals t it was checked against, for as long as t
// is served: each product's part is exact for t (see the top), so their
// sum is; the next totals start a new series. Building it reads no
// ClickHouse query per product once their chunks are kept.
func (db *DB) setDays(ctx context.Context, t *dayTotals, ps productSet, from, cut uint32) (*dayChunk, error) {
	key := ps.key()
	if c, ok := t.sets.Load(key); ok {
		return c.(*dayChunk), nil
	}
	sum := map[uint32]uint64{}
	for _, p := range ps.ids {
		days, counts, err := db.productDays(ctx, t, p, from, cut+1, cut)
		if err != nil {
			return nil, err
		}
		for i, d := range days {
			sum[d] += counts[i]
		}
	}
	c := (&dayChunk{}).plus(sum)
	if t.setCount.Add(1) <= maxSetSeries {
		if kept, loaded := t.sets.LoadOrStore(key, c); loaded {
			return kept.(*dayChunk), nil
		}
	}
	return c, nil
}

// dayChunk returns the closed days of key's month as of cut, checked
// against want, the month's total in the current totals: a kept chunk of
// another total is read again.
func (db *DB) dayChunk(ctx context.Context, key chunkKey, cut uint32, want uint64) (*dayChunk, error) {
	load := func(ctx context.Context, k chunkKey) (*dayChunk, error) { return db.loadDayChunk(ctx, k, cut) }
	c, err := db.days.chunks.Get(ctx, key, load)
	if err != nil || c.total == want {
		return c, err
	}
	// Stale (or newer than the totals: then exact too, see the top).
	db.days.chunks.Delete(key)
	return db.days.chunks.Get(ctx, key, load)
}

// loadDayTotals reads every product's message count per month of closed
// days and per open day, in the window of k.
func (db *DB) loadDayTotals(ctx context.Context, k totalsKey) (*dayTotals, error) {
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	dayTotalsLoads.Add(1)
	// Whole months, as the chunks: from the first day of from's month.
	y, m, _ := time.Unix(int64(k.from)*86400, 0).UTC().Date()
	rows, err := db.conn.Query(ctx, "SELECT product_id, toUInt32(toYYYYMM(day)) AS m, if(toUInt32(day) >= ?, toUInt32(day), toUInt32(0)) AS o,"+
		" sum(messages) AS n FROM device_message_daily WHERE day >= toDate(?) GROUP BY product_id, m, o",
		k.cut, time.Date(y, m, 1, 0, 0, 0, 0, time.UTC).Format(time.DateOnly))
	if err != nil {
		return nil, fmt.Errorf("tsdb: message count totals: %w", err)
	}
	defer rows.Close()
	t := &dayTotals{closed: map[chunkKey]uint64{}, open: map[string]*dayChunk{}}
	open := map[string]map[uint32]uint64{}
	addOpen := func(p string, day uint32, n uint64) {
		if open[p] == nil {
			open[p] = map[uint32]uint64{}
		}
		open[p][day] += n
	}
	for rows.Next() {
		var (
			p    string
			m, o uint32
			n    uint64
		)
		if err := rows.Scan(&p, &m, &o, &n); err != nil {
			return nil, fmt.Errorf("tsdb: message count totals: %w", err)
		}
		if o == 0 {
			t.closed[chunkKey{p, m}] += n
			t.closed[chunkKey{"", m}] += n
		} else {
			addOpen(p, o, n)
			addOpen("", o, n)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tsdb: message count totals: %w", err)
	}
	for p, days := range open {
		t.open[p] = (&dayChunk{}).plus(days)
	}
	return t, nil
}

// loadDayChunk reads the per-day counts of the days of k's month before
// cut.
func (db *DB) loadDayChunk(ctx context.Context, k chunkKey, cut uint32) (*dayChunk, error) {
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	dayChunkLoads.Add(1)
	y, m := int(k.month/100), time.Month(k.month%100)
	first := time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
	end := min(uint32(first.AddDate(0, 1, 0).Unix()/86400), cut)
	sql := "SELECT (sumMap([toUInt32(day)], [messages]) AS s).1 AS b, s.2 AS n FROM device_message_daily WHERE day >= toDate(?) AND day < toDate(?)"
	args := []any{first.Format(time.DateOnly), time.Unix(int64(end)*86400, 0).UTC().Format(time.DateOnly)}
	if k.product != "" {
		sql += " AND product_id = ?"
		args = append(args, k.product)
	}
	c := &dayChunk{cut: cut, loaded: time.Now()}
	if err := db.conn.QueryRow(ctx, sql, args...).Scan(&c.days, &c.counts); err != nil {
		return nil, fmt.Errorf("tsdb: message counts per day: %w", err)
	}
	if len(c.days) != len(c.counts) {
		return nil, fmt.Errorf("tsdb: message counts per day: sumMap returned %d keys and %d sums", len(c.days), len(c.counts))
	}
	for _, n := range c.counts {
		c.total += n
	}
	return c, nil // sumMap's keys come sorted
}
