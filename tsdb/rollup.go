package tsdb

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
)

// The hourly rollup of numeric property values (device_property_hourly,
// schema/clickhouse/00003_property_hourly.sql): per product, device,
// property and UTC hour, the aggregate states of count, sum, min, max,
// first and last, written by a materialized view as part of every INSERT
// into device_property. A product-wide aggregate over a year reads at most
// devices x properties x hours-with-values rows of it, however many values
// each hour holds.
//
// Why it answers exactly what device_property does:
//   - Same rows. The view runs inside each INSERT into device_property,
//     on the block being inserted, and the INSERT is acknowledged after
//     both are written; so the rollup holds a row's state exactly when a
//     query of device_property can see the row (a late row, a row stored
//     by another instance alike), and the result cache (cache.go) treats
//     both the same. device_property keeps every row it is sent,
//     duplicates of a message delivered twice included (MergeTree does
//     not deduplicate; in cluster mode a retried block is dropped by the
//     replicated table, and then not passed to the view either), and so
//     does the rollup: neither path deduplicates, so they agree. (Except
//     after a replica killed between an insert's raw part and its views:
//     cluster.go, "A replica killed in an insert".)
//   - Same functions. count, sum, min and max of a bucket are those of
//     its hours; avg is sum / count as avg computes it; first and last
//     are argMin/argMax over (ts, num_value), the raw query's ordering,
//     and the earliest of the hours' earliest is the bucket's earliest.
//     Sums are added in another order than a raw query adds them, as two
//     raw queries over differently merged parts also do: with values
//     exact in Float64 (integers, multiples of 0.25) the sums are equal;
//     otherwise they may differ in the last bits.
//   - Same buckets. Rollup hours are UTC hours; a bucket is a union of
//     them exactly when its start and end are whole hours in epoch
//     seconds, which rollupAligned checks for every bucket of the range:
//     true for 1h and longer buckets in every zone whose offsets are
//     whole hours, false for minute buckets and in zones such as
//     Asia/Kolkata (+05:30), which read device_property.

// rollupQueries counts the aggregate queries answered from the rollup
// (tests).
var rollupQueries atomic.Uint64

// rollupAggSQL is each aggregate over the rollup's states, as Float64.
var rollupAggSQL = map[string]string{
	AggAvg:   "sumMerge(v_sum) / countMerge(n)",
	AggMin:   "minMerge(v_min)",
	AggMax:   "maxMerge(v_max)",
	AggSum:   "sumMerge(v_sum)",
	AggCount: "toFloat64(countMerge(n))",
	AggFirst: "argMinMerge(v_first)",
	AggLast:  "argMaxMerge(v_last)",
}

// rollupAligned reports whether every bucket of r is a union of whole
// UTC hours (its start and end divisible by 3600 in epoch seconds).
func rollupAligned(r bucketRange) bool {
	if r.hi.Unix()%3600 != 0 {
		return false
	}
	for _, s := range r.starts {
		if s.Unix()%3600 != 0 {
			return false
		}
	}
	return true
}

// tsSeconds is device_property's time as a DateTime, for bucketSQL.
const tsSeconds = "toDateTime(intDiv(ts, 1000))"

// aggregateSQL returns the query of q's aggregate per property and bucket
// of r, from the rollup when it answers exactly (and Options.NoRollup is
// not set), from device_property otherwise. Its columns are property, the
// bucket (bucketSQL), the aggregate and the number of values.
func (db *DB) aggregateSQL(r bucketRange, q AggQuery, props []string) (string, []any, bool) {
	rollup := !db.opt.NoRollup && rollupAligned(r)
	var sql strings.Builder
	args := []any{q.ProductID}
	if rollup {
		sql.WriteString("SELECT property, " + bucketSQL(r.interval, "hour", db.tzName) + " AS b, " + rollupAggSQL[q.Agg] +
			" AS v, countMerge(n) AS c FROM device_property_hourly WHERE product_id = ?")
	} else {
		sql.WriteString("SELECT property, " + bucketSQL(r.interval, tsSeconds, db.tzName) + " AS b, " + aggSQL[q.Agg] +
			" AS v, count() AS c FROM device_property WHERE product_id = ?")
	}
	if q.DeviceID != "" {
		sql.WriteString(" AND device_id = ?")
		args = append(args, q.DeviceID)
	}
	sql.WriteString(" AND property IN (" + strings.TrimSuffix(strings.Repeat("?, ", len(props)), ", ") + ")")
	for _, p := range props {
		args = append(args, p)
	}
	// The range is whole seconds (bucket edges).
	if rollup {
		sql.WriteString(" AND hour >= toDateTime(?) AND hour < toDateTime(?) GROUP BY property, b")
		args = append(args, r.lo.Unix(), r.hi.Unix())
	} else {
		w, ra := db.tsRange(r.lo.UnixMilli(), r.hi.UnixMilli(), true, true)
		sql.WriteString(w + " AND value_type = 'number' GROUP BY property, b")
		args = append(args, ra...)
	}
	return sql.String(), args, rollup
}

// rollupCheck counts the rows of the rollup and of device_property's
// numeric values; equal when the rollup holds every value (tests, and
// the bench's check).
func (db *DB) rollupCheck(ctx context.Context) (rollup, raw uint64, err error) {
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	if err := db.conn.QueryRow(ctx, "SELECT countMerge(n) FROM device_property_hourly").Scan(&rollup); err != nil {
		return 0, 0, fmt.Errorf("tsdb: count rollup: %w", err)
	}
	if err := db.conn.QueryRow(ctx, "SELECT count() FROM device_property WHERE value_type = 'number'").Scan(&raw); err != nil {
		return 0, 0, fmt.Errorf("tsdb: count values: %w", err)
	}
	return rollup, raw, nil
}
