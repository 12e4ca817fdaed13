package tsdb

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Export of stored property values (api's POST /api/dashboard/_export).
// An export may cover any number of values, so nothing here holds them:
// the values of one property are read in time windows of about
// exportWindowRows rows, each one ClickHouse query sorted by time, and
// handed one at a time to the caller, who writes them out. The driver
// holds at most a couple of blocks (65,536 rows each) of the window being
// read, so the memory an export costs does not grow with its size.
//
// Windows and not one query per property: ClickHouse 18.16 cannot read a
// table in key order for ORDER BY (optimize_read_in_order came with 19.x),
// so one sorted query of 10M values would sort them all in its memory
// first. The windows' edges come from a histogram of the property's
// timestamps (one GROUP BY over the ts column of its key range), read when
// the property is reached.

// ExportQuery selects the values of one device's properties to export.
type ExportQuery struct {
	ProductID, DeviceID string
	Properties          []string  // none: every property the device has values of
	From                time.Time // inclusive, to the millisecond; zero: no lower bound
	To                  time.Time // exclusive, to the millisecond; zero: no upper bound
	// Newest, when > 0, keeps only the newest Newest values of each
	// property in the range, and every other value stored at the same
	// millisecond as the oldest of them (as HistoryRange pages do).
	Newest int
}

// exportWindowRows is about how many values one window query sorts and
// sends. Small enough that a slow client reading a window stays well
// within the query timeout (QueryTimeout, 30 s: 64k rows at 10k rows/s is
// under 7 s), large enough that the per-query cost (about 2 ms on 18.16)
// stays a few percent.
const exportWindowRows = 1 << 16

// Export is a prepared export: which properties have values in the range
// and how many, known before any value is sent.
type Export struct {
	db         *DB
	q          ExportQuery
	props      []exportProp
	windowRows uint64 // exportWindowRows; smaller in tests
}

// exportProp is one property's part of an export: its values with
// from <= ts <= to.
type exportProp struct {
	name     string
	rows     uint64
	from, to int64 // epoch ms
}

// PrepareExport finds the properties of q with values in its range (in
// request order, by name when none was named) and their counts: one
// query, plus one per property when q.Newest is set. Errors here come
// before anything is sent.
func (db *DB) PrepareExport(ctx context.Context, q ExportQuery) (*Export, error) {
	e := &Export{db: db, q: q, windowRows: exportWindowRows}
	if !q.From.IsZero() && !q.To.IsZero() && !q.From.Before(q.To) {
		return e, nil // an empty range
	}
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	where, args := db.exportWhere(q, q.From.UnixMilli(), q.To.UnixMilli(), !q.From.IsZero(), !q.To.IsZero())
	if len(q.Properties) > 0 {
		where += " AND property IN (" + strings.TrimSuffix(strings.Repeat("?, ", len(q.Properties)), ", ") + ")"
		for _, p := range q.Properties {
			args = append(args, p)
		}
	}
	rows, err := db.conn.Query(ctx, "SELECT property, count(), min(ts), max(ts) FROM device_property WHERE "+where+" GROUP BY property", args...)
	if err != nil {
		return nil, fmt.Errorf("tsdb: export: %w", err)
	}
	found := map[string]exportProp{}
	for rows.Next() {
		var p exportProp
		if err := rows.Scan(&p.name, &p.rows, &p.from, &p.to); err != nil {
			rows.Close()
			return nil, fmt.Errorf("tsdb: export: %w", err)
		}
		found[p.name] = p
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tsdb: export: %w", err)
	}
	order := q.Properties
	if len(order) == 0 {
		for p := range found {
			order = append(order, p)
		}
		sort.Strings(order)
	}
	seen := map[string]bool{}
	for _, name := range order {
		p, ok := found[name]
		if !ok || seen[name] {
			continue
		}
		seen[name] = true
		if q.Newest > 0 && p.rows > uint64(q.Newest) {
			// The millisecond of the Newest-th newest value: the range
			// starts there, its ties included.
			w, a := db.exportWhere(q, p.from, p.to+1, true, true)
			var cut int64
			if err := db.conn.QueryRow(ctx, "SELECT ts FROM device_property WHERE "+w+" AND property = ? ORDER BY ts DESC LIMIT 1 OFFSET ?",
				append(a, name, q.Newest-1)...).Scan(&cut); err != nil {
				return nil, fmt.Errorf("tsdb: export: newest values of %s: %w", name, err)
			}
			p.from, p.rows = cut, uint64(q.Newest)
		}
		e.props = append(e.props, p)
	}
	return e, nil
}

// Properties returns the properties the export holds values of, in the
// order Each sends them.
func (e *Export) Properties() []string {
	out := make([]string, len(e.props))
	for i, p := range e.props {
		out[i] = p.name
	}
	return out
}

// Rows is how many values the export holds, as counted by PrepareExport
// (with Newest, values tied with the oldest kept one may add a few).
func (e *Export) Rows() uint64 {
	var n uint64
	for _, p := range e.props {
		n += p.rows
	}
	return n
}

// Each hands fn every value of the export: property by property (in the
// order of Properties), oldest first within one, ordered by time, then
// value. v is reused for the next value: fn must copy what it keeps. An
// error of fn stops the export and is returned.
func (e *Export) Each(ctx context.Context, fn func(v *PropertyValue) error) error {
	for _, p := range e.props {
		windows, err := e.windows(ctx, p)
		if err != nil {
			return err
		}
		for _, w := range windows {
			if err := e.window(ctx, p.name, w[0], w[1], fn); err != nil {
				return err
			}
		}
	}
	return nil
}

// windows splits [p.from, p.to] into ranges [lo, hi) of about
// exportWindowRows values each, from a histogram of the property's
// timestamps with about four buckets per window. A single millisecond
// with more values than that is one window however large.
func (e *Export) windows(ctx context.Context, p exportProp) ([][2]int64, error) {
	if p.rows <= e.windowRows {
		return [][2]int64{{p.from, p.to + 1}}, nil
	}
	groups := int64(4*p.rows/e.windowRows + 1)
	width := max(1, (p.to-p.from+1+groups-1)/groups)
	ctx, cancel := e.db.ctx(ctx)
	defer cancel()
	w, args := e.db.exportWhere(e.q, p.from, p.to+1, true, true)
	rows, err := e.db.conn.Query(ctx, "SELECT intDiv(ts - ?, ?) AS g, count() FROM device_property WHERE "+w+
		" AND property = ? GROUP BY g ORDER BY g", append([]any{p.from, width}, append(args, p.name)...)...)
	if err != nil {
		return nil, fmt.Errorf("tsdb: export: windows of %s: %w", p.name, err)
	}
	defer rows.Close()
	var out [][2]int64
	lo, n := p.from, uint64(0)
	for rows.Next() {
		var (
			g int64
			c uint64
		)
		if err := rows.Scan(&g, &c); err != nil {
			return nil, fmt.Errorf("tsdb: export: windows of %s: %w", p.name, err)
		}
		start := p.from + g*width
		if n > 0 && n+c > e.windowRows {
			out = append(out, [2]int64{lo, start})
			lo, n = start, 0
		}
		n += c
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tsdb: export: windows of %s: %w", p.name, err)
	}
	return append(out, [2]int64{lo, p.to + 1}), nil
}

// window reads the values of property with lo <= ts < hi, in order, into
// fn.
func (e *Export) window(ctx context.Context, property string, lo, hi int64, fn func(*PropertyValue) error) error {
	ctx, cancel := e.db.ctx(ctx)
	defer cancel()
	w, args := e.db.exportWhere(e.q, lo, hi, true, true)
	rows, err := e.db.conn.Query(ctx, "SELECT ts, toString(value_type), num_value, str_value FROM device_property WHERE "+w+
		" AND property = ? ORDER BY ts, num_value, str_value", append(args, property)...)
	if err != nil {
		return fmt.Errorf("tsdb: export of %s: %w", property, err)
	}
	defer rows.Close()
	v := PropertyValue{ProductID: e.q.ProductID, DeviceID: e.q.DeviceID, Property: property}
	var ts int64
	for rows.Next() {
		if err := rows.Scan(&ts, &v.ValueType, &v.Num, &v.Str); err != nil {
			return fmt.Errorf("tsdb: export of %s: %w", property, err)
		}
		v.Time = time.UnixMilli(ts).In(e.db.loc)
		if err := fn(&v); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("tsdb: export of %s: %w", property, err)
	}
	return nil
}

// exportWhere is the condition on q's device and lo <= ts < hi (each end
// only when set; epoch ms): the primary key's (product_id, device_id, ts)
// (tsRange).
func (db *DB) exportWhere(q ExportQuery, lo, hi int64, hasLo, hasHi bool) (string, []any) {
	w, r := db.tsRange(lo, hi, hasLo, hasHi)
	return "product_id = ? AND device_id = ?" + w, append([]any{q.ProductID, q.DeviceID}, r...)
}

// tsRange is the condition " AND lo <= ts < hi" (each end only when set;
// epoch ms) and its arguments. ts leads device_property's key after the
// device since schema 00006, so the primary key skips the other granules;
// on the layout before it (Options.SchemaVersion) the DateTime time
// column was the key's, and bounds on it are added.
func (db *DB) tsRange(lo, hi int64, hasLo, hasHi bool) (string, []any) {
	var w string
	var args []any
	if hasLo {
		if db.oldLayout {
			w += " AND time >= toDateTime(?)"
			args = append(args, max(lo, 0)/1000)
		}
		w += " AND ts >= ?"
		args = append(args, lo)
	}
	if hasHi {
		if db.oldLayout {
			w += " AND time <= toDateTime(?)"
			args = append(args, max(hi-1, 0)/1000)
		}
		w += " AND ts < ?"
		args = append(args, hi)
	}
	return w, args
}
