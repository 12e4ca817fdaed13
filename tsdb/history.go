package tsdb

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// HistoryQuery selects the stored values of one device's properties: the
// latest of each, or those of a time range, for paging back through them
// (Bounded).
type HistoryQuery struct {
	ProductID, DeviceID string
	Properties          []string  // none: every property
	From                time.Time // inclusive, to the millisecond; zero: no lower bound
	To                  time.Time // exclusive, to the millisecond; zero: no upper bound
	N                   int       // newest values per property (<= 0 means 1; an export's 0: every value)
	// Bounded is a query given a range (From or To, dashboard.go): it
	// runs as HistoryRange. Without, it reads the latest N values of each
	// property (PropertyHistory), From and To unused.
	Bounded bool
}

// HistoryRange returns the newest q.N values of each property in
// [q.From, q.To), grouped by property in request order (by name when none
// was named), oldest first within a property, ordered by time, then value.
// When values share the millisecond of a property's oldest value on the
// page, all of them are returned, even past q.N: so the next page, the same
// query with To set to that millisecond, neither repeats nor skips a value.
// Properties without values in the range are absent.
//
// Without From, it reads the last day before To (or now), then the last
// 30 days, then everything, until every named property has its N values,
// as PropertyHistory does; a bounded range is read at once.
func (db *DB) HistoryRange(ctx context.Context, q HistoryQuery) ([]PropertyValue, error) {
	if q.N <= 0 {
		q.N = 1
	}
	if !q.From.IsZero() && !q.To.IsZero() && !q.From.Before(q.To) {
		return nil, nil // an empty range
	}
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	anchor := q.To
	if anchor.IsZero() {
		anchor = time.Now()
	}
	var byProp map[string][]PropertyValue
	for i, w := range historyWindows {
		last := i == len(historyWindows)-1
		from := q.From
		if w > 0 {
			if len(q.Properties) == 0 {
				continue // any property may lie only in older data
			}
			if lo := anchor.Add(-w); from.IsZero() || lo.After(from) {
				from = lo
			} else {
				last = true // the window holds the whole range
			}
		}
		var err error
		if byProp, err = db.rangeValues(ctx, q, from, q.N+1); err != nil {
			return nil, err
		}
		// N values in the window suffice: a value older than the window
		// cannot share the millisecond of one in it.
		if last || complete(byProp, q.Properties, q.N) {
			break
		}
	}
	// Cut each property at N values, but keep every value of the oldest
	// millisecond kept: those past the N+1 read come from a second query.
	var ties []string
	tieMs := map[string]int64{}
	for p, vs := range byProp { // newest first
		if len(vs) <= q.N {
			continue
		}
		cut := vs[q.N-1].Time.UnixMilli()
		if vs[q.N].Time.UnixMilli() != cut {
			byProp[p] = vs[:q.N]
			continue
		}
		keep := vs[:0]
		for _, v := range vs {
			if v.Time.UnixMilli() != cut {
				keep = append(keep, v)
			}
		}
		byProp[p] = keep
		ties = append(ties, p)
		tieMs[p] = cut
	}
	if len(ties) > 0 {
		if err := db.tiedValues(ctx, q, ties, tieMs, byProp); err != nil {
			return nil, err
		}
	}
	var out []PropertyValue
	for _, p := range propertyOrder(q.Properties, byProp) {
		vs := byProp[p]
		sort.Slice(vs, func(i, j int) bool { return valueBefore(vs[i], vs[j]) })
		out = append(out, vs...)
	}
	return out, nil
}

// propertyOrder is the order of the properties in a history answer: as
// requested, each once, or by name when none was named.
func propertyOrder(requested []string, byProp map[string][]PropertyValue) []string {
	order := make([]string, 0, max(len(requested), len(byProp)))
	if len(requested) == 0 {
		for p := range byProp {
			order = append(order, p)
		}
		sort.Strings(order)
		return order
	}
	seen := make(map[string]bool, len(requested))
	for _, p := range requested {
		if !seen[p] {
			seen[p] = true
			order = append(order, p)
		}
	}
	return order
}

// valueBefore orders values by time, then value.
func valueBefore(a, b PropertyValue) bool {
	if ta, tb := a.Time.UnixMilli(), b.Time.UnixMilli(); ta != tb {
		return ta < tb
	}
	if a.Num != b.Num {
		return a.Num < b.Num
	}
	return a.Str < b.Str
}

// historyColumns are the columns a PropertyValue is scanned from.
const historyColumns = "SELECT ts, product_id, device_id, property, toString(value_type), num_value, str_value FROM device_property"

// rangeValues reads the newest n values of each property of q in
// [from, q.To), newest first per property.
func (db *DB) rangeValues(ctx context.Context, q HistoryQuery, from time.Time, n int) (map[string][]PropertyValue, error) {
	sql, args := db.historyWhere(q, from)
	sql += " ORDER BY ts DESC, num_value DESC, str_value DESC LIMIT " + strconv.Itoa(n) + " BY property"
	return db.scanValues(ctx, sql, args)
}

// tiedValues adds to byProp every value of property p stored at
// millisecond tieMs[p], for each p of props.
func (db *DB) tiedValues(ctx context.Context, q HistoryQuery, props []string, tieMs map[string]int64, byProp map[string][]PropertyValue) error {
	sel := q
	sel.Properties = props
	lo, hi := int64(1<<62), int64(0)
	var ms []string
	for _, p := range props {
		lo, hi = min(lo, tieMs[p]), max(hi, tieMs[p])
		ms = append(ms, strconv.FormatInt(tieMs[p], 10))
	}
	sel.From, sel.To = time.UnixMilli(lo), time.UnixMilli(hi+1)
	sql, args := db.historyWhere(sel, sel.From)
	sql += " AND ts IN (" + strings.Join(ms, ", ") + ")"
	tied, err := db.scanValues(ctx, sql, args)
	if err != nil {
		return err
	}
	for p, vs := range tied {
		for _, v := range vs {
			if v.Time.UnixMilli() == tieMs[p] {
				byProp[p] = append(byProp[p], v)
			}
		}
	}
	return nil
}

// historyWhere is the SELECT of q's device and properties in [from, q.To)
// (tsRange: the primary key skips the other granules).
func (db *DB) historyWhere(q HistoryQuery, from time.Time) (string, []any) {
	w, r := db.tsRange(from.UnixMilli(), q.To.UnixMilli(), !from.IsZero(), !q.To.IsZero())
	sql := historyColumns + " WHERE product_id = ? AND device_id = ?" + w
	args := append([]any{q.ProductID, q.DeviceID}, r...)
	if len(q.Properties) > 0 {
		sql += " AND property IN (" + strings.TrimSuffix(strings.Repeat("?, ", len(q.Properties)), ", ") + ")"
		for _, p := range q.Properties {
			args = append(args, p)
		}
	}
	return sql, args
}

// scanValues runs a property-value query (ts, product, device,
// property, value type, number, text) and groups its rows by property in
// the order ClickHouse returns them: latest values and range history both.
func (db *DB) scanValues(ctx context.Context, sql string, args []any) (map[string][]PropertyValue, error) {
	rows, err := db.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("tsdb: property history: %w", err)
	}
	defer rows.Close()
	byProp := map[string][]PropertyValue{}
	for rows.Next() {
		var (
			v  PropertyValue
			ts int64
		)
		if err := rows.Scan(&ts, &v.ProductID, &v.DeviceID, &v.Property, &v.ValueType, &v.Num, &v.Str); err != nil {
			return nil, fmt.Errorf("tsdb: property history: %w", err)
		}
		v.Time = time.UnixMilli(ts).In(db.loc)
		byProp[v.Property] = append(byProp[v.Property], v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tsdb: property history: %w", err)
	}
	return byProp, nil
}
