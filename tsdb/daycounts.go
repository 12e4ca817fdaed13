package tsdb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"devicehub/meta/cache"
)

// Message counts of 15m, 1h, day and longer buckets at memory speed. A
// dashboard's users ask many different message-count questions (1h x24,
// 1h x168, 1d x7, 1d x30, 1w x12, 1M x12, each with its own from/to, per
// product, and a thousand dashboards each on its own product), and a
// ClickHouse query costs about 1.5 ms of its CPU on 18.16 whatever it
// reads. Here every such question whose range lies in the last
// daySeriesDays days is cut, in memory, from two things kept in meta/cache
// Caches:
//
//   - Closed days (before today in the platform zone), per product and
//     month: the message count of each UTC quarter-hour of that month's
//     closed days with messages, and their sums per day (a dayChunk), read
//     once from device_message_quarter (migration 00004), checked against
//     device_message_daily, and kept (cache.Forever, within the bounds
//     below) for as long as a check says they are still exact. Every zone
//     offset is a multiple of 15 minutes, so a local 15m or 1h bucket, day
//     or month is a union of quarter-hours.
//   - The check and the open days, for every product at once (dayTotals):
//     one query grouping device_message_daily by product and month for the
//     closed days and by product and day for today and later, and
//     device_message_quarter by product and quarter-hour from today's
//     start. It is kept under the result cache's rules (daytotals.go):
//     served while younger than ResultTTL from the start of its query;
//     every insert through this DB adds its messages to it (or drops it),
//     and it is read again in the background after half the TTL.
//
// A closed chunk is served only when its total equals the month's total in
// a dayTotals that may be served; otherwise it is read again (Delete, then
// a new load). Why this is exact under the result cache's rule (a row
// stored through this DB shows in the next answer, one stored through
// another instance in every answer more than ResultTTL later), whatever
// the order in which an insert writes its views:
//
//   - The tables. Rows are only added to device_message,
//     device_message_daily and device_message_quarter (late ones too;
//     dropped partitions below), and a query reads the parts committed
//     when it takes them. An insert writes device_message, then its views
//     one after the other (parallel_view_processing off, the default), in
//     an order nothing here knows (by the views' names on 18.16 and in
//     Ordinary databases, by the tables' UUIDs in Atomic ones, the default
//     since 20.10) but the same for every insert on a server. So at any
//     moment the messages of one of the two tables are a subset of the
//     other's: the daily table's of the quarter table's if the quarter
//     view is written first, else the other way round.
//   - A chunk is read by three queries, one after the other: the per-day
//     counts of the month's closed days from device_message_daily (D1),
//     the quarter-hours from device_message_quarter (Q), the per-day
//     counts again (D3); it is kept only if Q's sums per day equal D1's
//     and D3's. If the quarter view is written first, D1 is a subset of
//     what the quarter table held when Q was read, so of Q; if the daily
//     view is, Q is a subset of what the daily table held when Q was read,
//     so of D3. Either way equal counts make equal sets, and D1 is a
//     subset of D3 of the same count: Q holds exactly the messages the
//     daily table held from D1's read to D3's, and its day sums are that
//     table's counts. When they differ (an insert between its two views,
//     or rows that reached one table only) the chunk is read again, at
//     most maxChunkReads times; then the question is read from ClickHouse
//     as one outside the window is, and MessageCountFallbacks counts it.
//     No answer comes from a chunk that failed the check.
//   - The totals: their query started less than ResultTTL before the
//     question, and they count every row stored through this DB before
//     the question (daytotals.go), so every row that rule requires. The
//     open days (device_message_daily) and quarter-hours
//     (device_message_quarter) are served from them directly, each from
//     one table: each counts every insert that had ended when the query
//     started, whatever the order of its views, and a 15m or 1h answer
//     uses only the quarter-hours, a day or longer one only the days.
//   - A kept chunk against the totals: each holds every insert through
//     this DB that ended (read, or patched once it ended, both views
//     written; below), and of the other rows what device_message_daily
//     held at one moment (the chunk by the check above, the totals'
//     closed months by their query). So the one of the earlier moment
//     counts a subset of what the other counts, and equal counts make them
//     the same set: a chunk read before the totals and equal to them is
//     exact. A chunk read after them (again, after a mismatch) counts
//     every message they count, so every one the rule requires, and is
//     served. A month whose partition is dropped (retention) has a
//     smaller total, so its chunk is read again; a drop through this DB
//     drops every chunk. (A drop by another instance followed by exactly
//     as many late rows of that month as it removed, before the check,
//     would go unseen: the retention drops months older than the window
//     by default.)
//   - The day a chunk was read up to: a chunk holds the days before the
//     day it was read; once that day closes, the month's closed total
//     counts it, and the chunk is read again unless that day has no
//     messages (then it is exact as it is).
//
// Late messages stored through this DB do not make their months be read
// again: InsertBatch counts the batch's messages of closed days per
// product and quarter-hour before it sends them, and once device_message
// and both views have taken them (the insert returned) adds those counts
// to each kept chunk whose quarter-hours' query had returned before the
// insert started (it cannot hold them; patches are serialized), and drops
// a chunk read since (it may hold some), one of a day it does not cover,
// and any load of the month under way (it is not kept: it may have read
// before the rows were committed). After a failed insert (some rows may
// be stored) the chunks of its closed days are dropped; the retry patches
// what it stores, duplicates included, as device_message holds them.
//
// So with ingest running, ClickHouse answers about two totals queries per
// ResultTTL, shared by every question of every product, plus a chunk
// (three queries) for each month that a late row stored by another
// instance changed;
// questions themselves cost none, and wait for none of these. 1m and 5m
// buckets, and ranges older than the window, read ClickHouse (through the
// result cache).
//
// Memory: dayTotals holds one entry per product and month of the window
// (14), one per open day and one per quarter-hour of today with messages
// (at most 96), about 40 bytes each; a dayChunk at most 31 days and 2,976
// quarter-hours of 12 bytes (36 KiB for a product with messages in every
// quarter-hour). The chunks' Cache is bounded by maxDayChunks entries and
// maxDayChunkBytes; past them the least recently used chunks are dropped
// (and read again when asked for). The totals are one value (of the
// current window).

// daySeriesDays is how many days before today the chunks cover: a year of
// days, weeks or months, and the current year.
const daySeriesDays = 400

// Bounds of the closed chunks kept: 100,000 product-months (7,000
// products over the 14 months of the window) and 128 MiB (3,600
// product-months with messages in every quarter-hour).
const (
	maxDayChunks     = 100000
	maxDayChunkBytes = 128 << 20
)

// quarterSec is the length of a quarter-hour of device_message_quarter;
// a quarter-hour is numbered by its start's epoch second / quarterSec.
const quarterSec = 900

// Loads from ClickHouse (tests).
var (
	dayTotalsLoads atomic.Uint64
	dayChunkLoads  atomic.Uint64
)

// dayCounts keeps the totals (daytotals.go) and the closed chunks.
type dayCounts struct {
	totals  *totalsHolder
	chunks  *cache.Cache[chunkKey, *dayChunk]
	patchMu sync.Mutex // one patch of the chunks at a time
	// unsettled counts the chunk loads given up (errChunkUnsettled).
	unsettled atomic.Uint64
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
// product) per month of closed days, and per open day and quarter-hour.
type dayTotals struct {
	key     totalsKey
	started time.Time // when its query started
	closed  map[chunkKey]uint64
	open    map[string]*dayChunk // product -> its open days and quarter-hours
	// sets are the series of days of sets of products summed from these
	// totals (setDays): productSet key -> *series; setCount counts them.
	sets     sync.Map
	setCount atomic.Int64
}

// series is a count per key (a Date day number, or a quarter-hour), keys
// ascending, without zeros.
type series struct {
	keys   []uint32
	counts []uint64
}

// plus returns s with add's counts added: one merge of s with add's
// keys sorted (a late message patches a chunk of up to 2,976
// quarter-hours with a few).
func (s series) plus(add map[uint32]uint64) series {
	keys := make([]uint32, 0, len(add))
	for k := range add {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := series{keys: make([]uint32, 0, len(s.keys)+len(keys)), counts: make([]uint64, 0, len(s.keys)+len(keys))}
	i, j := 0, 0
	for i < len(s.keys) || j < len(keys) {
		switch {
		case j == len(keys) || i < len(s.keys) && s.keys[i] < keys[j]:
			out.keys, out.counts = append(out.keys, s.keys[i]), append(out.counts, s.counts[i])
			i++
		case i == len(s.keys) || keys[j] < s.keys[i]:
			out.keys, out.counts = append(out.keys, keys[j]), append(out.counts, add[keys[j]])
			j++
		default:
			out.keys, out.counts = append(out.keys, keys[j]), append(out.counts, s.counts[i]+add[keys[j]])
			i++
			j++
		}
	}
	return out
}

// dayChunk is the message count of each closed day and quarter-hour of a
// month with messages and their sum: of the days before cut, as read by
// a query sent at loaded. In dayTotals.open it holds the open days and
// quarter-hours.
type dayChunk struct {
	days     series
	quarters series
	total    uint64
	cut      uint32
	loaded   time.Time
}

// plus returns c with n more messages in each quarter-hour of add.
func (c *dayChunk) plus(add map[uint32]uint64, loc *time.Location) *dayChunk {
	out := &dayChunk{cut: c.cut, loaded: c.loaded, total: c.total, quarters: c.quarters.plus(add)}
	days := map[uint32]uint64{}
	for q, n := range add {
		days[quarterDay(q, loc)] += n
		out.total += n
	}
	out.days = c.days.plus(days)
	return out
}

// quarterDay is the Date of quarter-hour q's start in loc.
func quarterDay(q uint32, loc *time.Location) uint32 {
	return dayNumber(time.Unix(int64(q)*quarterSec, 0), loc)
}

// daysOf sums quarters per day in loc (quarters ascending).
func daysOf(quarters series, loc *time.Location) series {
	var out series
	var end int64 // the end of the last day appended, epoch seconds
	for i, q := range quarters.keys {
		if s := int64(q) * quarterSec; s >= end || len(out.keys) == 0 {
			t := time.Unix(s, 0).In(loc)
			d := dayNumber(t, loc)
			end = dayStart(d+1, loc).Unix()
			if len(out.keys) == 0 || out.keys[len(out.keys)-1] != d {
				out.keys = append(out.keys, d)
				out.counts = append(out.counts, 0)
			}
		}
		out.counts[len(out.counts)-1] += quarters.counts[i]
	}
	return out
}

// lateMessages picks from a batch's messages per product ("" included)
// and quarter-hour (Batch.batchQuarters) those stamped before the start of
// now's day, per product and month.
func (db *DB) lateMessages(all map[string]map[uint32]uint64, now time.Time) map[chunkKey]map[uint32]uint64 {
	open := dayStart(dayNumber(now, db.loc), db.loc).Unix()
	var late map[chunkKey]map[uint32]uint64
	for p, qs := range all {
		for q, n := range qs {
			if int64(q)*quarterSec >= open {
				continue
			}
			if late == nil {
				late = map[chunkKey]map[uint32]uint64{}
			}
			k := chunkKey{p, dayMonth(quarterDay(q, db.loc))}
			if late[k] == nil {
				late[k] = map[uint32]uint64{}
			}
			late[k][q] += n
		}
	}
	return late
}

// stored patches the kept chunks with late, the late messages of an
// insert that started at start; stored false (the insert failed, some
// rows may be stored) drops their chunks instead.
func (d *dayCounts) stored(late map[chunkKey]map[uint32]uint64, start time.Time, stored bool, loc *time.Location) {
	if len(late) == 0 {
		return
	}
	d.patchMu.Lock()
	defer d.patchMu.Unlock()
	for k, add := range late {
		c, ok := d.chunks.Peek(k)
		if !ok {
			// A load under way may have read before the insert's rows
			// were committed: it is not kept. Read when asked for.
			d.chunks.Delete(k)
			continue
		}
		patch := stored && c.loaded.Before(start)
		end := uint32(dayStart(c.cut, loc).Unix() / quarterSec)
		for q := range add {
			patch = patch && q < end
		}
		if patch {
			d.chunks.Put(k, c.plus(add, loc))
		} else {
			d.chunks.Delete(k)
		}
	}
}

func newDayCounts(ttl time.Duration) *dayCounts {
	co := cache.DefaultOptions[chunkKey, *dayChunk]()
	co.TTL = cache.Forever
	co.MaxEntries = maxDayChunks
	co.MaxBytes = maxDayChunkBytes
	co.Size = func(k chunkKey, c *dayChunk) int {
		return 96 + len(k.product) + 12*(len(c.days.keys)+len(c.quarters.keys))
	}
	co.LoadTimeout = 0
	return &dayCounts{totals: &totalsHolder{ttl: ttl}, chunks: cache.New(co)}
}

// dropped drops the totals and every chunk: partitions were dropped
// through the DB (a month's partitions of device_message_quarter are cut
// at the server's month, not the platform zone's).
func (d *dayCounts) dropped() {
	d.totals.drop()
	d.chunks.Invalidate()
}

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

// nextMonth is the first day of the month after day's.
func nextMonth(day uint32) uint32 {
	y, m, _ := time.Unix(int64(day)*86400, 0).UTC().Date()
	return uint32(time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC).Unix() / 86400)
}

// countsFromDays answers the message counts of r (15m, 1h, day or longer
// buckets) from the totals and the closed chunks, when r lies in the
// window and the result cache is on; ok false otherwise (the caller reads
// ClickHouse as before). A set of products is the sum of its products'
// counts: for days, their per-day counts over the window (setDays), kept
// with the totals; for quarter-hours, summed for the question.
func (db *DB) countsFromDays(ctx context.Context, r bucketRange, ps productSet, now time.Time) (out []Bucket, ok bool, err error) {
	if db.opt.ResultTTL <= 0 {
		return nil, false, nil
	}
	sub := subDay(r.interval)
	if sub && !quarterBuckets(r) {
		return nil, false, nil
	}
	cut := dayNumber(now, db.loc)
	from := cut - daySeriesDays
	lo, hi := dayNumber(r.lo, db.loc), dayNumber(r.hi.Add(-time.Nanosecond), db.loc)+1 // hi exclusive
	if lo < from {
		return nil, false, nil
	}
	tk := totalsKey{from, cut}
	t, err := db.days.totals.get(ctx, tk, time.Now(), db.loadDayTotals)
	if err != nil {
		return nil, true, err
	}
	defer func() {
		if errors.Is(err, errChunkUnsettled) {
			out, ok, err = nil, false, nil // read from ClickHouse
		}
	}()
	// key maps a bucket's end to the key of the series that it stops
	// before.
	key := func(t time.Time) uint32 { return dayNumber(t, db.loc) }
	if sub {
		key = func(t time.Time) uint32 { return uint32(t.Unix() / quarterSec) }
	}
	counts := make([]uint64, len(r.starts))
	add := func(s series) {
		// Buckets oldest first, each [its start, the next bucket's).
		i := sort.Search(len(s.keys), func(i int) bool { return s.keys[i] >= key(r.lo) })
		for k := len(r.starts) - 1; k >= 0; k-- {
			end := r.hi
			if k > 0 {
				end = r.starts[k-1]
			}
			last := key(end) // exclusive
			for ; i < len(s.keys) && s.keys[i] < last; i++ {
				counts[k] += s.counts[i]
			}
		}
	}
	switch {
	case ps.all || len(ps.ids) == 1:
		p := ""
		if !ps.all {
			p = ps.ids[0]
		}
		s, err := db.productSeries(ctx, t, p, lo, hi, cut, sub)
		if err != nil {
			return nil, true, err
		}
		add(s)
	case sub:
		for _, p := range ps.ids {
			s, err := db.productSeries(ctx, t, p, lo, hi, cut, sub)
			if err != nil {
				return nil, true, err
			}
			add(s)
		}
	default:
		s, err := db.setDays(ctx, t, ps, from, cut)
		if err != nil {
			return nil, true, err
		}
		add(s)
	}
	out = make([]Bucket, len(r.starts))
	for k, s := range r.starts {
		out[k] = Bucket{Start: s, Count: counts[k]}
	}
	return out, true, nil
}

// quarterBuckets reports whether every bucket of r (15m or 1h) starts and
// ends on a quarter-hour (in every zone whose offsets are multiples of 15
// minutes, as all are since 1979), and they are 15m or 1h buckets.
func quarterBuckets(r bucketRange) bool {
	if r.interval != Hour && r.interval != FifteenMinutes {
		return false
	}
	if r.hi.Unix()%quarterSec != 0 {
		return false
	}
	for _, s := range r.starts {
		if s.Unix()%quarterSec != 0 {
			return false
		}
	}
	return true
}

// productSeries returns product p's ("" every product's) per-day counts
// (sub: per quarter-hour) of the months holding days lo to hi
// (exclusive), oldest first: its closed months' chunks as of cut, checked
// against the totals t, then its open days (quarter-hours).
func (db *DB) productSeries(ctx context.Context, t *dayTotals, p string, lo, hi, cut uint32, sub bool) (series, error) {
	var out series
	for day := lo; day < min(hi, cut); day = nextMonth(day) {
		key := chunkKey{p, dayMonth(day)}
		if want := t.closed[key]; want > 0 {
			c, err := db.dayChunk(ctx, key, cut, want)
			if err != nil {
				return series{}, err
			}
			s := c.days
			if sub {
				s = c.quarters
			}
			out.keys, out.counts = append(out.keys, s.keys...), append(out.counts, s.counts...)
		}
	}
	if o := t.open[p]; o != nil && hi > cut {
		s := o.days
		if sub {
			s = o.quarters
		}
		out.keys, out.counts = append(out.keys, s.keys...), append(out.counts, s.counts...)
	}
	return out, nil
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
func (db *DB) setDays(ctx context.Context, t *dayTotals, ps productSet, from, cut uint32) (series, error) {
	key := ps.key()
	if s, ok := t.sets.Load(key); ok {
		return *s.(*series), nil
	}
	sum := map[uint32]uint64{}
	for _, p := range ps.ids {
		s, err := db.productSeries(ctx, t, p, from, cut+1, cut, false)
		if err != nil {
			return series{}, err
		}
		for i, d := range s.keys {
			sum[d] += s.counts[i]
		}
	}
	s := series{}.plus(sum)
	if t.setCount.Add(1) <= maxSetSeries {
		if kept, loaded := t.sets.LoadOrStore(key, &s); loaded {
			return *kept.(*series), nil
		}
	}
	return s, nil
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
// days and per open day and quarter-hour, in the window of k.
func (db *DB) loadDayTotals(ctx context.Context, k totalsKey) (*dayTotals, error) {
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	dayTotalsLoads.Add(1)
	// Whole months, as the chunks: from the first day of from's month.
	y, m, _ := time.Unix(int64(k.from)*86400, 0).UTC().Date()
	// Kinds of rows: 0 a closed month (x: yyyymm), 1 an open day (x: its
	// Date), 2 an open quarter-hour (x: its start, epoch seconds).
	rows, err := db.conn.Query(ctx, "SELECT product_id, toUInt8(if(toUInt32(day) >= ?, 1, 0)) AS k,"+
		" if(k = 1, toUInt32(day), toUInt32(toYYYYMM(day))) AS x, sum(messages) AS n"+
		" FROM device_message_daily WHERE day >= toDate(?) GROUP BY product_id, k, x"+
		" UNION ALL SELECT product_id, toUInt8(2) AS k, toUInt32(slot) AS x, sum(messages) AS n"+
		" FROM device_message_quarter WHERE slot >= toDateTime(?) GROUP BY product_id, x",
		k.cut, time.Date(y, m, 1, 0, 0, 0, 0, time.UTC).Format(time.DateOnly), dayStart(k.cut, db.loc).Unix())
	if err != nil {
		return nil, fmt.Errorf("tsdb: message count totals: %w", err)
	}
	defer rows.Close()
	t := &dayTotals{closed: map[chunkKey]uint64{}, open: map[string]*dayChunk{}}
	days, quarters := map[string]map[uint32]uint64{}, map[string]map[uint32]uint64{}
	addOpen := func(to map[string]map[uint32]uint64, p string, x uint32, n uint64) {
		if to[p] == nil {
			to[p] = map[uint32]uint64{}
		}
		to[p][x] += n
	}
	for rows.Next() {
		var (
			p    string
			kind uint8
			x    uint32
			n    uint64
		)
		if err := rows.Scan(&p, &kind, &x, &n); err != nil {
			return nil, fmt.Errorf("tsdb: message count totals: %w", err)
		}
		switch kind {
		case 0:
			t.closed[chunkKey{p, x}] += n
			t.closed[chunkKey{"", x}] += n
		case 1:
			addOpen(days, p, x, n)
			addOpen(days, "", x, n)
		default:
			addOpen(quarters, p, x/quarterSec, n)
			addOpen(quarters, "", x/quarterSec, n)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tsdb: message count totals: %w", err)
	}
	for p, d := range days {
		t.open[p] = &dayChunk{days: series{}.plus(d)}
	}
	for p, q := range quarters {
		if t.open[p] == nil {
			t.open[p] = &dayChunk{}
		}
		t.open[p].quarters = series{}.plus(q)
	}
	return t, nil
}

// maxChunkReads bounds the reads of a chunk whose two tables disagree
// (see the top); past it the question is read from ClickHouse. Read i+1
// waits i*chunkReadPause first (100 ms in all): the views of an insert
// under way are written within that as a rule.
const (
	maxChunkReads  = 5
	chunkReadPause = 10 * time.Millisecond
)

// errChunkUnsettled: device_message_quarter and device_message_daily
// disagreed on a month's closed days maxChunkReads times in a row.
var errChunkUnsettled = errors.New("tsdb: device_message_quarter and device_message_daily disagree")

// loadDayChunk reads the per-quarter-hour counts of the days of k's month
// before cut and sums them per day, checked against device_message_daily
// (see the top): errChunkUnsettled when no read of maxChunkReads agreed.
func (db *DB) loadDayChunk(ctx context.Context, k chunkKey, cut uint32) (*dayChunk, error) {
	for i := range maxChunkReads {
		if i > 0 {
			select {
			case <-time.After(time.Duration(i) * chunkReadPause):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		c, ok, err := db.readDayChunk(ctx, k, cut)
		if err != nil || ok {
			return c, err
		}
	}
	db.days.unsettled.Add(1)
	return nil, errChunkUnsettled
}

// MessageCountFallbacks returns how many times a month's message counts
// could not be kept in memory because device_message_quarter and
// device_message_daily disagreed on every read (the question was then
// read from ClickHouse): it should stay zero, a rise means rows that
// reached only one of the two tables.
func (db *DB) MessageCountFallbacks() uint64 { return db.days.unsettled.Load() }

// readDayChunk reads the chunk of k's month as of cut by three queries,
// one after the other: the closed days' counts from device_message_daily,
// the quarter-hours from device_message_quarter, the days again; ok
// reports whether the quarter-hours' per-day sums equal both reads of the
// days.
func (db *DB) readDayChunk(ctx context.Context, k chunkKey, cut uint32) (c *dayChunk, ok bool, err error) {
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	dayChunkLoads.Add(1)
	y, m := int(k.month/100), time.Month(k.month%100)
	first := uint32(time.Date(y, m, 1, 0, 0, 0, 0, time.UTC).Unix() / 86400)
	end := min(nextMonth(first), cut)
	product, pargs := "", []any(nil)
	if k.product != "" {
		product, pargs = " AND product_id = ?", []any{k.product}
	}
	readDays := func() (series, error) {
		var s series
		args := append([]any{time.Unix(int64(first)*86400, 0).UTC().Format(time.DateOnly), time.Unix(int64(end)*86400, 0).UTC().Format(time.DateOnly)}, pargs...)
		if err := db.conn.QueryRow(ctx, "SELECT (sumMap([toUInt32(day)], [messages]) AS s).1 AS b, s.2 AS n FROM device_message_daily"+
			" WHERE day >= toDate(?) AND day < toDate(?)"+product, args...).Scan(&s.keys, &s.counts); err != nil {
			return series{}, fmt.Errorf("tsdb: message counts per day: %w", err)
		}
		if len(s.keys) != len(s.counts) {
			return series{}, fmt.Errorf("tsdb: message counts per day: sumMap returned %d keys and %d sums", len(s.keys), len(s.counts))
		}
		return s, nil
	}
	before, err := readDays()
	if err != nil {
		return nil, false, err
	}
	c = &dayChunk{cut: cut}
	var starts []uint32
	args := append([]any{dayStart(first, db.loc).Unix(), dayStart(end, db.loc).Unix()}, pargs...)
	if err := db.conn.QueryRow(ctx, "SELECT (sumMap([toUInt32(slot)], [messages]) AS s).1 AS b, s.2 AS n FROM device_message_quarter"+
		" WHERE slot >= toDateTime(?) AND slot < toDateTime(?)"+product, args...).Scan(&starts, &c.quarters.counts); err != nil {
		return nil, false, fmt.Errorf("tsdb: message counts per quarter-hour: %w", err)
	}
	// Every row of an insert that starts from now on is committed after
	// the quarter-hours' query took its parts: a patch may add it.
	c.loaded = time.Now()
	if len(starts) != len(c.quarters.counts) {
		return nil, false, fmt.Errorf("tsdb: message counts per quarter-hour: sumMap returned %d keys and %d sums", len(starts), len(c.quarters.counts))
	}
	c.quarters.keys = starts // sumMap's keys come sorted
	for i, s := range starts {
		c.quarters.keys[i] = s / quarterSec
		c.total += c.quarters.counts[i]
	}
	c.days = daysOf(c.quarters, db.loc)
	after, err := readDays()
	if err != nil {
		return nil, false, err
	}
	return c, c.days.equal(before) && c.days.equal(after), nil
}

// equal reports whether s and o hold the same counts.
func (s series) equal(o series) bool {
	return slices.Equal(s.keys, o.keys) && slices.Equal(s.counts, o.counts)
}
