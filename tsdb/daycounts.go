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

// The same mechanism keeps the property aggregates of propaggs.go: a
// keeper is generic over the cell it keeps per slot (a message count per
// quarter-hour here, a partial aggregate per hour there) and its own
// tables and zone (cells); the chunks, the totals, the three-read check
// and the patches above are the keeper's, whatever the cell.

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

// Loads of the message count totals from ClickHouse (tests).
var dayTotalsLoads atomic.Uint64

// cells describes what a keeper keeps: a V per slot (slotSec seconds,
// numbered by its start's epoch second / slotSec) and the number of rows
// (messages, values) a V holds; days are those of loc.
type cells[V any] struct {
	slotSec int64
	loc     *time.Location
	merge   func(a, b V) V // the cell of both cells' rows
	count   func(V) uint64
	size    int // bytes of a V
}

// slotDay is the Date of slot q's start in c's zone.
func (c *cells[V]) slotDay(q uint32) uint32 {
	return dayNumber(time.Unix(int64(q)*c.slotSec, 0), c.loc)
}

// keeper keeps the totals (daytotals.go) and the closed chunks of one
// kind of cell, with the queries reading them.
type keeper[V any] struct {
	cells   *cells[V]
	totals  *totalsHolder[V]
	chunks  *cache.Cache[chunkKey, *chunk[V]]
	patchMu sync.Mutex // one patch of the chunks at a time
	// unsettled counts the chunk loads given up (errChunkUnsettled).
	unsettled atomic.Uint64
	// chunkReads counts the reads of chunks from ClickHouse (tests).
	chunkReads atomic.Uint64

	// loadTotals reads the totals of a window; readDays the row count
	// per day, readSlots the cells, of key's days first to end
	// (exclusive).
	loadTotals func(ctx context.Context, k totalsKey) (*totals[V], error)
	readDays   func(ctx context.Context, key chunkKey, first, end uint32) (series[uint64], error)
	readSlots  func(ctx context.Context, key chunkKey, first, end uint32) (series[V], error)
}

// dayCounts keeps the message counts; dayChunk and dayTotals are its
// chunk and totals.
type (
	dayCounts = keeper[uint64]
	dayChunk  = chunk[uint64]
	dayTotals = totals[uint64]
)

// addCounts merges two message counts.
func addCounts(a, b uint64) uint64 { return a + b }

// countCells are the message counts: per UTC quarter-hour, days of loc.
func countCells(loc *time.Location) *cells[uint64] {
	return &cells[uint64]{slotSec: quarterSec, loc: loc, merge: addCounts, count: func(n uint64) uint64 { return n }, size: 8}
}

// totalsKey is the window of a dayTotals: days from (inclusive); closed
// before cut (today).
type totalsKey struct{ from, cut uint32 }

// chunkKey is a product's ("" for every product) month, as yyyymm.
type chunkKey struct {
	product string
	month   uint32
}

// totals is the row count of each product ("" included: every product)
// per month of closed days, and its open days and slots.
type totals[V any] struct {
	key     totalsKey
	started time.Time // when its query started
	closed  map[chunkKey]uint64
	open    map[string]*chunk[V] // product -> its open days and slots
	// sets are the series of days of sets of products summed from these
	// totals (setDays, message counts): productSet key -> *series;
	// setCount counts them.
	sets     sync.Map
	setCount atomic.Int64
}

// series is a value per key (a Date day number, or a slot), keys
// ascending, without empty ones.
type series[V any] struct {
	keys []uint32
	vals []V
}

// plus returns s with add's values merged in: one merge of s with add's
// keys sorted (a late row patches a chunk of up to 2,976 slots with a
// few).
func (s series[V]) plus(add map[uint32]V, merge func(a, b V) V) series[V] {
	keys := make([]uint32, 0, len(add))
	for k := range add {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := series[V]{keys: make([]uint32, 0, len(s.keys)+len(keys)), vals: make([]V, 0, len(s.keys)+len(keys))}
	i, j := 0, 0
	for i < len(s.keys) || j < len(keys) {
		switch {
		case j == len(keys) || i < len(s.keys) && s.keys[i] < keys[j]:
			out.keys, out.vals = append(out.keys, s.keys[i]), append(out.vals, s.vals[i])
			i++
		case i == len(s.keys) || keys[j] < s.keys[i]:
			out.keys, out.vals = append(out.keys, keys[j]), append(out.vals, add[keys[j]])
			j++
		default:
			out.keys, out.vals = append(out.keys, keys[j]), append(out.vals, merge(s.vals[i], add[keys[j]]))
			i++
			j++
		}
	}
	return out
}

// chunk is the row count of each closed day and the cell of each slot of
// a month with rows, and their count: of the days before cut, as read by
// a query sent at loaded. In totals.open it holds the open days and
// slots.
type chunk[V any] struct {
	days   series[uint64]
	slots  series[V]
	total  uint64
	cut    uint32
	loaded time.Time
}

// plus returns ch with the cells of add merged in.
func (ch *chunk[V]) plus(add map[uint32]V, c *cells[V]) *chunk[V] {
	out := &chunk[V]{cut: ch.cut, loaded: ch.loaded, total: ch.total, slots: ch.slots.plus(add, c.merge)}
	days := map[uint32]uint64{}
	for q, v := range add {
		n := c.count(v)
		days[c.slotDay(q)] += n
		out.total += n
	}
	out.days = ch.days.plus(days, addCounts)
	return out
}

// daysOf sums the rows of slots per day (slots ascending).
func (c *cells[V]) daysOf(slots series[V]) series[uint64] {
	var out series[uint64]
	var end int64 // the end of the last day appended, epoch seconds
	for i, q := range slots.keys {
		if s := int64(q) * c.slotSec; s >= end || len(out.keys) == 0 {
			d := dayNumber(time.Unix(s, 0), c.loc)
			end = dayStart(d+1, c.loc).Unix()
			if len(out.keys) == 0 || out.keys[len(out.keys)-1] != d {
				out.keys = append(out.keys, d)
				out.vals = append(out.vals, 0)
			}
		}
		out.vals[len(out.vals)-1] += c.count(slots.vals[i])
	}
	return out
}

// late picks from a batch's cells per product and slot (all) those of
// slots before the start of now's day, per product and month.
func (k *keeper[V]) late(all map[string]map[uint32]V, now time.Time) map[chunkKey]map[uint32]V {
	c := k.cells
	open := dayStart(dayNumber(now, c.loc), c.loc).Unix()
	var late map[chunkKey]map[uint32]V
	for p, qs := range all {
		for q, v := range qs {
			if int64(q)*c.slotSec >= open {
				continue
			}
			if late == nil {
				late = map[chunkKey]map[uint32]V{}
			}
			ck := chunkKey{p, dayMonth(c.slotDay(q))}
			if late[ck] == nil {
				late[ck] = map[uint32]V{}
			}
			if old, ok := late[ck][q]; ok {
				v = c.merge(old, v)
			}
			late[ck][q] = v
		}
	}
	return late
}

// stored patches the kept chunks with late, the late cells of an insert
// that started at start; stored false (the insert failed, some rows may
// be stored) drops their chunks instead.
func (k *keeper[V]) stored(late map[chunkKey]map[uint32]V, start time.Time, stored bool) {
	if len(late) == 0 {
		return
	}
	c := k.cells
	k.patchMu.Lock()
	defer k.patchMu.Unlock()
	for ck, add := range late {
		ch, ok := k.chunks.Peek(ck)
		if !ok {
			// A load under way may have read before the insert's rows
			// were committed: it is not kept. Read when asked for.
			k.chunks.Delete(ck)
			continue
		}
		patch := stored && ch.loaded.Before(start)
		end := uint32(dayStart(ch.cut, c.loc).Unix() / c.slotSec)
		for q := range add {
			patch = patch && q < end
		}
		if patch {
			k.chunks.Put(ck, ch.plus(add, c))
		} else {
			k.chunks.Delete(ck)
		}
	}
}

// newKeeper keeps cells c in a Cache of at most maxEntries chunks and
// maxBytes; exclusive: its totals hold inserts back while they load
// (daytotals.go).
func newKeeper[V any](c *cells[V], ttl time.Duration, maxEntries, maxBytes int, exclusive bool) *keeper[V] {
	co := cache.DefaultOptions[chunkKey, *chunk[V]]()
	co.TTL = cache.Forever
	co.MaxEntries = maxEntries
	co.MaxBytes = maxBytes
	co.Size = func(k chunkKey, ch *chunk[V]) int {
		return 96 + len(k.product) + 12*len(ch.days.keys) + (4+c.size)*len(ch.slots.keys)
	}
	co.LoadTimeout = 0
	return &keeper[V]{cells: c, totals: &totalsHolder[V]{ttl: ttl, cells: c, exclusive: exclusive, hold: maxInsertHold}, chunks: cache.New(co)}
}

// dropped drops the totals and every chunk: partitions were dropped
// through the DB (a month's partitions of the slot tables are cut at the
// server's month, not the platform zone's).
func (k *keeper[V]) dropped() {
	k.totals.drop()
	k.chunks.Invalidate()
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

// monthStart is the first day of day's month.
func monthStart(day uint32) uint32 {
	y, m, _ := time.Unix(int64(day)*86400, 0).UTC().Date()
	return uint32(time.Date(y, m, 1, 0, 0, 0, 0, time.UTC).Unix() / 86400)
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
	t, err := db.days.totals.get(ctx, tk, time.Now(), db.days.loadTotals)
	if err != nil {
		return nil, true, err
	}
	defer func() {
		if errors.Is(err, errChunkUnsettled) {
			out, ok, err = nil, false, nil // read from ClickHouse
		}
	}()
	// key maps a bucket's end to the key of the series that it stops
	// before; ends[k] is bucket k's (buckets newest first, each [its
	// start, the next bucket's)).
	key := func(t time.Time) uint32 { return dayNumber(t, db.loc) }
	if sub {
		key = func(t time.Time) uint32 { return uint32(t.Unix() / quarterSec) }
	}
	ends := make([]uint32, len(r.starts))
	ends[0] = key(r.hi)
	for k := 1; k < len(ends); k++ {
		ends[k] = key(r.starts[k-1])
	}
	first := key(r.lo)
	counts := make([]uint64, len(r.starts))
	// sum adds a product's chunks (series oldest first, their keys
	// ascending) to the buckets, reading each only from the range's
	// first key to its last.
	var buf [16]*dayChunk
	sum := func(chunks []*dayChunk) {
		k := len(ends) - 1 // the oldest bucket
		for _, c := range chunks {
			s := c.days
			if sub {
				s = c.slots
			}
			i := 0
			if len(s.keys) > 0 && s.keys[0] < first {
				i = sort.Search(len(s.keys), func(i int) bool { return s.keys[i] >= first })
			}
			for ; i < len(s.keys); i++ {
				for s.keys[i] >= ends[k] {
					if k == 0 {
						return
					}
					k--
				}
				counts[k] += s.vals[i]
			}
		}
	}
	switch {
	case ps.all || len(ps.ids) == 1:
		p := ""
		if !ps.all {
			p = ps.ids[0]
		}
		chunks, err := db.days.chunksFor(ctx, t, p, lo, hi, cut, buf[:0])
		if err != nil {
			return nil, true, err
		}
		sum(chunks)
	case sub:
		for _, p := range ps.ids {
			chunks, err := db.days.chunksFor(ctx, t, p, lo, hi, cut, buf[:0])
			if err != nil {
				return nil, true, err
			}
			sum(chunks)
		}
	default:
		s, err := db.setDays(ctx, t, ps, from, cut)
		if err != nil {
			return nil, true, err
		}
		sum([]*dayChunk{{days: s}})
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

// chunksFor appends to dst product p's chunks of the months holding days
// lo to hi (exclusive), oldest first: its closed months' chunks as of
// cut, checked against the totals t (none for a month without rows), then
// its open days and slots when hi > cut.
func (k *keeper[V]) chunksFor(ctx context.Context, t *totals[V], p string, lo, hi, cut uint32, dst []*chunk[V]) ([]*chunk[V], error) {
	for day := lo; day < min(hi, cut); day = nextMonth(day) {
		key := chunkKey{p, dayMonth(day)}
		if want := t.closed[key]; want > 0 {
			c, err := k.chunk(ctx, key, cut, want)
			if err != nil {
				return nil, err
			}
			dst = append(dst, c)
		}
	}
	if o := t.open[p]; o != nil && hi > cut {
		dst = append(dst, o)
	}
	return dst, nil
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
func (db *DB) setDays(ctx context.Context, t *dayTotals, ps productSet, from, cut uint32) (series[uint64], error) {
	key := ps.key()
	if s, ok := t.sets.Load(key); ok {
		return *s.(*series[uint64]), nil
	}
	sum := map[uint32]uint64{}
	var buf [16]*dayChunk
	for _, p := range ps.ids {
		chunks, err := db.days.chunksFor(ctx, t, p, from, cut+1, cut, buf[:0])
		if err != nil {
			return series[uint64]{}, err
		}
		for _, c := range chunks {
			for i, d := range c.days.keys {
				sum[d] += c.days.vals[i]
			}
		}
	}
	s := series[uint64]{}.plus(sum, addCounts)
	if t.setCount.Add(1) <= maxSetSeries {
		if kept, loaded := t.sets.LoadOrStore(key, &s); loaded {
			return *kept.(*series[uint64]), nil
		}
	}
	return s, nil
}

// chunk returns the closed days of key's month as of cut, checked
// against want, the month's total in the current totals: a kept chunk of
// another total is read again.
func (k *keeper[V]) chunk(ctx context.Context, key chunkKey, cut uint32, want uint64) (*chunk[V], error) {
	load := func(ctx context.Context, ck chunkKey) (*chunk[V], error) { return k.loadChunk(ctx, ck, cut) }
	c, err := k.chunks.Get(ctx, key, load)
	if err != nil || c.total == want {
		return c, err
	}
	// Stale (or newer than the totals: then exact too, see the top).
	k.chunks.Delete(key)
	return k.chunks.Get(ctx, key, load)
}

// newDayCounts keeps the message counts of db's zone, read from
// device_message_daily and device_message_quarter.
func (db *DB) newDayCounts() *dayCounts {
	k := newKeeper(countCells(db.loc), db.opt.ResultTTL, maxDayChunks, maxDayChunkBytes, false)
	k.loadTotals = db.loadDayTotals
	dayArgs := func(first, end uint32) []any {
		return []any{time.Unix(int64(first)*86400, 0).UTC().Format(time.DateOnly), time.Unix(int64(end)*86400, 0).UTC().Format(time.DateOnly)}
	}
	k.readDays = func(ctx context.Context, key chunkKey, first, end uint32) (series[uint64], error) {
		product, pargs := productWhere(key.product)
		return db.readSumMap(ctx, "SELECT (sumMap([toUInt32(day)], [messages]) AS s).1 AS b, s.2 AS n FROM device_message_daily"+
			" WHERE day >= toDate(?) AND day < toDate(?)"+product, append(dayArgs(first, end), pargs...), 1)
	}
	k.readSlots = func(ctx context.Context, key chunkKey, first, end uint32) (series[uint64], error) {
		product, pargs := productWhere(key.product)
		return db.readSumMap(ctx, "SELECT (sumMap([toUInt32(slot)], [messages]) AS s).1 AS b, s.2 AS n FROM device_message_quarter"+
			" WHERE slot >= toDateTime(?) AND slot < toDateTime(?)"+product,
			append([]any{dayStart(first, db.loc).Unix(), dayStart(end, db.loc).Unix()}, pargs...), quarterSec)
	}
	return k
}

// productWhere is the condition on product p ("" every product).
func productWhere(p string) (string, []any) {
	if p == "" {
		return "", nil
	}
	return " AND product_id = ?", []any{p}
}

// readSumMap reads a series from a query of one row: a sumMap's keys
// (divided by div) and sums.
func (db *DB) readSumMap(ctx context.Context, sql string, args []any, div uint32) (series[uint64], error) {
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	var s series[uint64]
	if err := db.conn.QueryRow(ctx, sql, args...).Scan(&s.keys, &s.vals); err != nil {
		return series[uint64]{}, fmt.Errorf("tsdb: message counts: %w", err)
	}
	if len(s.keys) != len(s.vals) {
		return series[uint64]{}, fmt.Errorf("tsdb: message counts: sumMap returned %d keys and %d sums", len(s.keys), len(s.vals))
	}
	for i := range s.keys { // sumMap's keys come sorted
		s.keys[i] /= div
	}
	return s, nil
}

// loadDayTotals reads every product's message count per month of closed
// days and per open day and quarter-hour, in the window of k.
func (db *DB) loadDayTotals(ctx context.Context, k totalsKey) (*dayTotals, error) {
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	dayTotalsLoads.Add(1)
	// Whole months, as the chunks: from the first day of from's month.
	// Kinds of rows: 0 a closed month (x: yyyymm), 1 an open day (x: its
	// Date), 2 an open quarter-hour (x: its start, epoch seconds).
	rows, err := db.conn.Query(ctx, "SELECT product_id, toUInt8(if(toUInt32(day) >= ?, 1, 0)) AS k,"+
		" if(k = 1, toUInt32(day), toUInt32(toYYYYMM(day))) AS x, sum(messages) AS n"+
		" FROM device_message_daily WHERE day >= toDate(?) GROUP BY product_id, k, x"+
		" UNION ALL SELECT product_id, toUInt8(2) AS k, toUInt32(slot) AS x, sum(messages) AS n"+
		" FROM device_message_quarter WHERE slot >= toDateTime(?) GROUP BY product_id, x",
		k.cut, time.Unix(int64(monthStart(k.from))*86400, 0).UTC().Format(time.DateOnly), dayStart(k.cut, db.loc).Unix())
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
		t.open[p] = &dayChunk{days: series[uint64]{}.plus(d, addCounts)}
	}
	for p, q := range quarters {
		if t.open[p] == nil {
			t.open[p] = &dayChunk{}
		}
		t.open[p].slots = series[uint64]{}.plus(q, addCounts)
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

// errChunkUnsettled: a month's slot table and day table disagreed on its
// closed days maxChunkReads times in a row.
var errChunkUnsettled = errors.New("tsdb: the slot and day tables of a month disagree")

// loadChunk reads the slots of the days of k's month before cut and sums
// them per day, checked against the day table (see the top):
// errChunkUnsettled when no read of maxChunkReads agreed.
func (k *keeper[V]) loadChunk(ctx context.Context, ck chunkKey, cut uint32) (*chunk[V], error) {
	for i := range maxChunkReads {
		if i > 0 {
			select {
			case <-time.After(time.Duration(i) * chunkReadPause):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		c, ok, err := k.readChunk(ctx, ck, cut)
		if err != nil || ok {
			return c, err
		}
	}
	k.unsettled.Add(1)
	return nil, errChunkUnsettled
}

// MessageCountFallbacks returns how many times a month's message counts
// could not be kept in memory because device_message_quarter and
// device_message_daily disagreed on every read (the question was then
// read from ClickHouse): it should stay zero, a rise means rows that
// reached only one of the two tables.
func (db *DB) MessageCountFallbacks() uint64 { return db.days.unsettled.Load() }

// readChunk reads the chunk of ck's month as of cut by three queries,
// one after the other: the closed days' row counts from the day table,
// the slots, the days again; ok reports whether the slots' per-day sums
// equal both reads of the days.
func (k *keeper[V]) readChunk(ctx context.Context, ck chunkKey, cut uint32) (c *chunk[V], ok bool, err error) {
	k.chunkReads.Add(1)
	first := uint32(time.Date(int(ck.month/100), time.Month(ck.month%100), 1, 0, 0, 0, 0, time.UTC).Unix() / 86400)
	end := min(nextMonth(first), cut)
	before, err := k.readDays(ctx, ck, first, end)
	if err != nil {
		return nil, false, err
	}
	slots, err := k.readSlots(ctx, ck, first, end)
	if err != nil {
		return nil, false, err
	}
	// Every row of an insert that starts from now on is committed after
	// the slots' query took its parts: a patch may add it.
	c = &chunk[V]{cut: cut, loaded: time.Now(), slots: slots}
	for _, v := range slots.vals {
		c.total += k.cells.count(v)
	}
	c.days = k.cells.daysOf(slots)
	after, err := k.readDays(ctx, ck, first, end)
	if err != nil {
		return nil, false, err
	}
	return c, countsEqual(c.days, before) && countsEqual(c.days, after), nil
}

// countsEqual reports whether s and o hold the same counts.
func countsEqual(s, o series[uint64]) bool {
	return slices.Equal(s.keys, o.keys) && slices.Equal(s.vals, o.vals)
}
