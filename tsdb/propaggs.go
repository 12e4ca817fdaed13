package tsdb

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Product-wide property aggregates at memory speed. A dashboard's users
// ask many different aggregate questions (avg, min, max, sum, count,
// first or last of a property over a product, 1h buckets over a week,
// each with its own end), and each costs ClickHouse 18.16 about 6 ms of
// its CPU, even from the hourly rollup. Here every such question whose
// buckets are whole UTC hours (1h and longer in zones with whole-hour
// offsets: rollupAligned) and whose range lies in the last daySeriesDays
// UTC days is answered in memory by merging hourly partial aggregates,
// kept by the same mechanism as the message counts (daycounts.go: a
// keeper of partials instead of counts), from two tables of migration
// 00005:
//
//   - device_property_product_hourly: per product, property and UTC hour
//     the partial aggregate (count, sum, min, max, and the first and last
//     values with their times) of the numeric values: the slots.
//   - device_property_daily: per product, property and UTC day the number
//     of numeric values: the day table of the three-read check.
//
// Closed months of closed UTC days are kept as chunks per product,
// property and month, checked against the daily value counts by three
// reads; the closed months' value counts and today's hours of every
// product and property are the totals, one query pair per half ResultTTL,
// patched by this DB's inserts; late values of closed days patch the kept
// chunks. The argument of daycounts.go holds word for word with values
// for messages, hours for quarter-hours and UTC days for the platform
// zone's: it needs only that rows are only added to both tables, each by
// its own view of every insert into device_property, and that a patch
// merges exactly what the tables' rows hold.
//
// Why merging partials is exact: count, min and max of a bucket are those
// of its hours; first and last order values by (ts, num_value), as
// aggSQL's argMin/argMax do, and each hour keeps the (ts, value) of its
// first and last, so the bucket's first is the least of its hours' firsts
// (a late value is merged the same way); avg is sum / count as avg
// computes it. Sums are added in another order than a query of
// device_property adds them (as rollup.go says of the rollup): with
// values exact in Float64 (integers, multiples of 0.25) and sums below
// 2^53 they are equal; otherwise they may differ in the last bits.
//
// Questions of one device, of minute buckets, in zones such as
// Asia/Kolkata (+05:30), or older than the window read ClickHouse as
// before (rollup.go, through the result cache).
//
// Memory: a chunk holds at most 744 hours of 68 bytes (50 KiB for a
// property with values in every hour of a month) and 31 days of 12; the
// chunks' Cache is bounded by maxDayChunks entries and maxPropChunkBytes
// (past them the least recently used are dropped and read again when
// asked for); the totals hold one count per product, property and month
// of the window and at most 24 hours per product and property.

// maxPropChunkBytes bounds the property chunks kept: 256 MiB, 5,000
// property-months with values in every hour.
const maxPropChunkBytes = 256 << 20

// hourSec is the length of a slot of device_property_product_hourly.
const hourSec = 3600

// Loads of the property totals from ClickHouse, and answers from memory
// (tests).
var propTotalsLoads, propMemoryAnswers atomic.Uint64

// partial is the aggregate of numeric values: how many, their sum, min
// and max, and the first and last by (ts, value) with their ts (epoch
// ms).
type partial struct {
	n             uint64
	sum, min, max float64
	tFirst, tLast int64
	vFirst, vLast float64
}

// valuePartial is the partial of one value stored at ms.
func valuePartial(ms int64, v float64) partial {
	return partial{n: 1, sum: v, min: v, max: v, tFirst: ms, vFirst: v, tLast: ms, vLast: v}
}

// mergePartials is the partial of a's and b's values.
func mergePartials(a, b partial) partial {
	switch {
	case a.n == 0:
		return b
	case b.n == 0:
		return a
	}
	out := a
	out.n += b.n
	out.sum += b.sum
	if b.min < out.min {
		out.min = b.min
	}
	if b.max > out.max {
		out.max = b.max
	}
	if b.tFirst < out.tFirst || b.tFirst == out.tFirst && b.vFirst < out.vFirst {
		out.tFirst, out.vFirst = b.tFirst, b.vFirst
	}
	if b.tLast > out.tLast || b.tLast == out.tLast && b.vLast > out.vLast {
		out.tLast, out.vLast = b.tLast, b.vLast
	}
	return out
}

// value is the aggregate agg of p's values; 0 when there are none.
func (p partial) value(agg string) float64 {
	if p.n == 0 {
		return 0
	}
	switch agg {
	case AggAvg:
		return p.sum / float64(p.n)
	case AggMin:
		return p.min
	case AggMax:
		return p.max
	case AggSum:
		return p.sum
	case AggCount:
		return float64(p.n)
	case AggFirst:
		return p.vFirst
	default: // AggLast
		return p.vLast
	}
}

// propCells are the property partials: per UTC hour, UTC days.
var propCells = &cells[partial]{slotSec: hourSec, loc: time.UTC, merge: mergePartials,
	count: func(p partial) uint64 { return p.n }, size: 64}

// propKey is the product of a keeper's chunkKey for a product's property:
// the product's length first, so that no two pairs share a key.
func propKey(product, property string) string {
	return strconv.Itoa(len(product)) + ":" + product + property
}

// splitPropKey returns the product and property of a propKey.
func splitPropKey(k string) (product, property string) {
	i := strings.IndexByte(k, ':')
	n, _ := strconv.Atoi(k[:i])
	return k[i+1 : i+1+n], k[i+1+n:]
}

// newPropAggs keeps the property partials, read from
// device_property_daily and device_property_product_hourly.
func (db *DB) newPropAggs() *keeper[partial] {
	k := newKeeper(propCells, db.opt.ResultTTL, maxDayChunks, maxPropChunkBytes, true)
	k.loadTotals = db.loadPropTotals
	k.readDays = func(ctx context.Context, key chunkKey, first, end uint32) (series[uint64], error) {
		product, property := splitPropKey(key.product)
		return db.readSumMap(ctx, "SELECT (sumMap([toUInt32(day)], [n]) AS s).1 AS b, s.2 AS c FROM device_property_daily"+
			" WHERE product_id = ? AND property = ? AND day >= toDate(?) AND day < toDate(?)",
			[]any{product, property, time.Unix(int64(first)*86400, 0).UTC().Format(time.DateOnly), time.Unix(int64(end)*86400, 0).UTC().Format(time.DateOnly)}, 1)
	}
	k.readSlots = func(ctx context.Context, key chunkKey, first, end uint32) (series[partial], error) {
		product, property := splitPropKey(key.product)
		s, err := db.readPartials(ctx, " WHERE product_id = ? AND property = ? AND hour >= toDateTime(?) AND hour < toDateTime(?) GROUP BY hour ORDER BY hour",
			product, property, int64(first)*86400, int64(end)*86400)
		if err != nil {
			return series[partial]{}, err
		}
		var out series[partial]
		for _, r := range s {
			out.keys, out.vals = append(out.keys, r.hour), append(out.vals, r.p)
		}
		return out, nil
	}
	return k
}

// hourRow is one row of readPartials.
type hourRow struct {
	product, property string
	hour              uint32 // epoch second / hourSec
	p                 partial
}

// readPartials reads device_property_product_hourly's partials per
// product, property and hour, with where (conditions and grouping) and
// its args.
func (db *DB) readPartials(ctx context.Context, where string, args ...any) ([]hourRow, error) {
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	rows, err := db.conn.Query(ctx, "SELECT any(product_id), any(property), toUInt32(hour), countMerge(n), sumMerge(v_sum), minMerge(v_min), maxMerge(v_max),"+
		" minMerge(t_first), argMinMerge(v_first), maxMerge(t_last), argMaxMerge(v_last) FROM device_property_product_hourly"+where, args...)
	if err != nil {
		return nil, fmt.Errorf("tsdb: property partials: %w", err)
	}
	defer rows.Close()
	var out []hourRow
	for rows.Next() {
		var r hourRow
		p := &r.p
		if err := rows.Scan(&r.product, &r.property, &r.hour, &p.n, &p.sum, &p.min, &p.max, &p.tFirst, &p.vFirst, &p.tLast, &p.vLast); err != nil {
			return nil, fmt.Errorf("tsdb: property partials: %w", err)
		}
		r.hour /= hourSec
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tsdb: property partials: %w", err)
	}
	return out, nil
}

// loadPropTotals reads every product's and property's value count per
// month of closed UTC days (device_property_daily) and partial per hour
// of the open days (device_property_product_hourly), in the window of k.
// Both queries start after the totals' start (totalsHolder), and each
// part is served from one table, as the message counts' totals are.
func (db *DB) loadPropTotals(ctx context.Context, k totalsKey) (*totals[partial], error) {
	propTotalsLoads.Add(1)
	t := &totals[partial]{closed: map[chunkKey]uint64{}, open: map[string]*chunk[partial]{}}
	err := func() error {
		ctx, cancel := db.ctx(ctx)
		defer cancel()
		rows, err := db.conn.Query(ctx, "SELECT product_id, property, toUInt32(toYYYYMM(day)) AS m, sum(n) FROM device_property_daily"+
			" WHERE day >= toDate(?) AND day < toDate(?) GROUP BY product_id, property, m",
			time.Unix(int64(monthStart(k.from))*86400, 0).UTC().Format(time.DateOnly), time.Unix(int64(k.cut)*86400, 0).UTC().Format(time.DateOnly))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				p, prop string
				m       uint32
				n       uint64
			)
			if err := rows.Scan(&p, &prop, &m, &n); err != nil {
				return err
			}
			t.closed[chunkKey{propKey(p, prop), m}] += n
		}
		return rows.Err()
	}()
	if err != nil {
		return nil, fmt.Errorf("tsdb: property totals: %w", err)
	}
	hours, err := db.readPartials(ctx, " WHERE hour >= toDateTime(?) GROUP BY product_id, property, hour ORDER BY hour", int64(k.cut)*86400)
	if err != nil {
		return nil, err
	}
	for _, r := range hours {
		key := propKey(r.product, r.property)
		o := t.open[key]
		if o == nil {
			o = &chunk[partial]{}
			t.open[key] = o
		}
		o.slots.keys, o.slots.vals = append(o.slots.keys, r.hour), append(o.slots.vals, r.p)
	}
	for _, o := range t.open {
		o.days = propCells.daysOf(o.slots)
	}
	return t, nil
}

// batchHours merges the numeric property values of b per product and
// property (propKey) and UTC hour.
func (b *Batch) batchHours() map[string]map[uint32]partial {
	out := map[string]map[uint32]partial{}
	keys := map[[2]span]string{}
	for i := range b.props {
		r := &b.props[i]
		if b.str(r.vt) != "number" {
			continue
		}
		sp := [2]span{r.product, r.prop}
		k, ok := keys[sp]
		if !ok {
			k = propKey(b.str(r.product), b.str(r.prop)) // a copy: the arena is reused
			keys[sp] = k
		}
		m := out[k]
		if m == nil {
			m = map[uint32]partial{}
			out[k] = m
		}
		h := uint32(floorSec(r.ms) / hourSec)
		m[h] = mergePartials(m[h], valuePartial(r.ms, r.num))
	}
	return out
}

// aggsFromMemory answers q's product-wide aggregates over r from the
// kept partials (see the top) when r's buckets are whole UTC hours within
// the window, the result cache is on and the rollup in use; ok false
// otherwise (the caller reads ClickHouse as before).
func (db *DB) aggsFromMemory(ctx context.Context, r bucketRange, q AggQuery, props []string, now time.Time) (out []AggSeries, ok bool, err error) {
	if db.opt.ResultTTL <= 0 || db.opt.NoRollup || q.DeviceID != "" || !rollupAligned(r) {
		return nil, false, nil
	}
	cut := dayNumber(now, time.UTC)
	from := cut - daySeriesDays
	lo, hi := dayNumber(r.lo, time.UTC), dayNumber(r.hi.Add(-time.Nanosecond), time.UTC)+1 // hi exclusive
	if lo < from {
		return nil, false, nil
	}
	t, err := db.props.totals.get(ctx, totalsKey{from, cut}, time.Now(), db.props.loadTotals)
	if err != nil {
		return nil, true, err
	}
	loH, hiH := uint32(r.lo.Unix()/hourSec), uint32(r.hi.Unix()/hourSec)
	acc := make([]partial, len(r.starts))
	out = make([]AggSeries, len(props))
	var buf [16]*chunk[partial]
	for i, prop := range props {
		chunks, err := db.props.chunksFor(ctx, t, propKey(q.ProductID, prop), lo, hi, cut, buf[:0])
		if errors.Is(err, errChunkUnsettled) {
			return nil, false, nil // read from ClickHouse
		}
		if err != nil {
			return nil, true, err
		}
		clear(acc)
		k := len(r.starts) - 1 // buckets oldest first, each [its start, the next bucket's)
		for _, c := range chunks {
			s := c.slots
			j := sort.Search(len(s.keys), func(j int) bool { return s.keys[j] >= loH })
			for ; j < len(s.keys) && s.keys[j] < hiH; j++ {
				sec := int64(s.keys[j]) * hourSec
				for k > 0 && sec >= r.starts[k-1].Unix() {
					k--
				}
				acc[k] = mergePartials(acc[k], s.vals[j])
			}
		}
		bs := make([]AggBucket, len(r.starts))
		for j, st := range r.starts {
			bs[j] = AggBucket{Start: st, Values: acc[j].n, Value: acc[j].value(q.Agg)}
		}
		out[i] = AggSeries{Property: prop, Buckets: bs}
	}
	propMemoryAnswers.Add(1)
	return out, true, nil
}

// PropertyAggregateFallbacks returns how many times a month's property
// partials could not be kept in memory because
// device_property_product_hourly and device_property_daily disagreed on
// every read (the question was then read from ClickHouse): it should stay
// zero.
func (db *DB) PropertyAggregateFallbacks() uint64 { return db.props.unsettled.Load() }
