package tsdb

import (
	"context"
	"fmt"
	"time"

	"devicehub/schema"
)

// Aggregate functions of PropertyAggregates. first and last order a
// bucket's values by time, then by value: first is the earliest (the
// smallest of values stored at the same millisecond), last the latest (the
// largest of those).
const (
	AggAvg   = "avg"
	AggMin   = "min"
	AggMax   = "max"
	AggSum   = "sum"
	AggCount = "count"
	AggFirst = "first"
	AggLast  = "last"
)

// aggSQL is each aggregate over device_property's numeric values, as
// Float64.
var aggSQL = map[string]string{
	AggAvg:   "avg(num_value)",
	AggMin:   "min(num_value)",
	AggMax:   "max(num_value)",
	AggSum:   "sum(num_value)",
	AggCount: "toFloat64(count())",
	AggFirst: "argMin(num_value, (ts, num_value))",
	AggLast:  "argMax(num_value, (ts, num_value))",
}

// CheckAgg refuses an aggregate function other than avg, min, max, sum,
// count, first and last.
func CheckAgg(agg string) error {
	if _, ok := aggSQL[agg]; !ok {
		return fmt.Errorf("aggregate %q: want avg, min, max, sum, count, first or last: %w", agg, schema.ErrIllegalArgument)
	}
	return nil
}

// AggQuery selects one aggregate of numeric property values per bucket.
type AggQuery struct {
	Interval   string    // as CountQuery's
	From, To   time.Time // either order; buckets holding any moment in between
	ProductID  string    // required
	DeviceID   string    // "" for every device of the product
	Properties []string  // at least one; repeats are ignored
	Agg        string    // AggAvg, AggMin, ...
	Limit      int       // newest buckets kept per property; <= 0 means MaxBuckets
	// Range, if set, is the buckets resolved (NewRange):
	// Interval, From, To and Limit are then ignored.
	Range *Range
}

// AggSeries is the buckets of one property, newest first.
type AggSeries struct {
	Property string
	Buckets  []AggBucket
}

// AggBucket is the aggregate of the values stored in the bucket starting
// at Start.
type AggBucket struct {
	Start  time.Time // in the platform time zone
	Values uint64    // how many values the bucket holds; 0: empty
	Value  float64   // the aggregate; 0 when the bucket is empty
}

// PropertyAggregates returns, for each property of q in request order,
// the aggregate of its numeric values (value type "number") in every
// bucket between q.From and q.To, newest first, empty buckets present with
// Values 0. Product-wide ones (no DeviceID) of buckets made of whole UTC
// hours within the last daySeriesDays days are merged in memory from the
// kept hourly partials (propaggs.go), without a query of their own.
// Other buckets made of whole UTC hours (1h and longer in zones with
// whole-hour offsets) read the hourly rollup (rollup.go), the same answer
// from one row per device, property and hour; others read device_property
// through its primary key (product, device, property, time): with a
// device, only that device's values of the properties in the range, plus
// the ends of the granules holding them; without one, the same for each
// device of the product. Answers come from
// the result cache (cache.go) as MessageCounts'.
func (db *DB) PropertyAggregates(ctx context.Context, q AggQuery) ([]AggSeries, error) {
	if err := CheckAgg(q.Agg); err != nil {
		return nil, err
	}
	if q.ProductID == "" {
		return nil, fmt.Errorf("aggregates: no product: %w", schema.ErrIllegalArgument)
	}
	var props []string
	seen := map[string]bool{}
	for _, p := range q.Properties {
		if !seen[p] {
			seen[p] = true
			props = append(props, p)
		}
	}
	if len(props) == 0 {
		return nil, fmt.Errorf("aggregates: no property: %w", schema.ErrIllegalArgument)
	}
	r, err := resolved(q.Range, q.Interval, q.From, q.To, db.loc, q.Limit)
	if err != nil {
		return nil, err
	}
	// Product-wide, whole UTC hours: from the kept partials (propaggs.go).
	if out, ok, err := db.aggsFromMemory(ctx, r, q, props, time.Now()); ok {
		return out, err
	}
	parts := []any{"agg", r.interval, r.starts[0].Unix(), len(r.starts), q.ProductID, q.DeviceID, q.Agg}
	for _, p := range props {
		parts = append(parts, p)
	}
	v, err := db.cache.get(ctx, cacheKey(parts...), func(ctx context.Context) (any, int, error) {
		out, err := db.propertyAggregates(ctx, r, q, props)
		return out, len(out) * len(r.starts), err
	})
	if err != nil {
		return nil, err
	}
	shared := v.([]AggSeries)
	out := make([]AggSeries, len(shared))
	for i, s := range shared {
		out[i] = AggSeries{Property: s.Property, Buckets: append([]AggBucket(nil), s.Buckets...)}
	}
	return out, nil
}

// propertyAggregates runs one GROUP BY property, bucket over the range of
// r and fills in the empty buckets.
func (db *DB) propertyAggregates(ctx context.Context, r bucketRange, q AggQuery, props []string) ([]AggSeries, error) {
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	sql, args, rollup := db.aggregateSQL(r, q, props)
	if rollup {
		rollupQueries.Add(1)
	}
	rows, err := db.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("tsdb: property aggregates: %w", err)
	}
	defer rows.Close()
	type key struct {
		prop  string
		start int64
	}
	found := map[key]AggBucket{}
	for rows.Next() {
		var (
			prop string
			b    uint32
			v    float64
			n    uint64
		)
		if err := rows.Scan(&prop, &b, &v, &n); err != nil {
			return nil, fmt.Errorf("tsdb: property aggregates: %w", err)
		}
		found[key{prop, bucketStart(r.interval, b, db.loc).Unix()}] = AggBucket{Values: n, Value: v}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tsdb: property aggregates: %w", err)
	}
	out := make([]AggSeries, len(props))
	for i, p := range props {
		bs := make([]AggBucket, len(r.starts))
		for j, s := range r.starts {
			bs[j] = found[key{p, s.Unix()}]
			bs[j].Start = s
		}
		out[i] = AggSeries{Property: p, Buckets: bs}
	}
	return out, nil
}
