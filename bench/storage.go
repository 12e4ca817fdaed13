package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	"devicehub/tsdb"
)

// The storage scenario: what a stored value costs on disk, per table and
// per column, on data shaped like a real fleet's, with the insert and
// query throughput of the same run beside it.
//
// The fleet: devices d = 0..D-1 of 5 products, each reporting every
// storageIntervals[d % 5] seconds (10 s .. 5 min) from its own phase, a
// few hundred ms of jitter on each report, over the span (14 days at the
// default size). Every report is one message (its JSON payload kept raw in
// device_message) carrying the 10 properties of storageProps: slowly
// changing floats with a few decimals, two monotonically growing
// counters, an integer, an enum, a boolean, a text status and a JSON
// value. Everything is computed server-side (INSERT ... SELECT from
// numbers(), as the dashboard scenario generates) into the tables
// devicehub stores into, through a database created by tsdb.Open, so the
// materialized views (rollups, counts) run as they do on ingest.

// storageIntervals are the report intervals, seconds.
var storageIntervals = []int{10, 15, 30, 60, 300}

// storageProp is one generated property: its ClickHouse expressions over
// d (device number), j (report number), t (epoch seconds, Float64) and h
// (a per-report hash, UInt64).
type storageProp struct {
	name, kind string // kind: float, counter, int, enum, bool, string, json
	valueType  string
	num, str   string // expressions of num_value and str_value
	payload    string // the value as JSON text in the message
}

var storageProps = func() []storageProp {
	p := []storageProp{
		{name: "temperature", kind: "float", valueType: "number",
			num: "round(21 + 6 * sin(t * 2 * pi() / 86400 + d) + toInt64(h % 11) / 100 - 0.05, 2)"},
		{name: "humidity", kind: "float", valueType: "number",
			num: "round(55 + 15 * sin(t / 50000 + d * 0.7) + toInt64(intDiv(h, 16) % 5) / 10 - 0.2, 1)"},
		{name: "voltage", kind: "float", valueType: "number",
			num: "round(3.6 + 0.4 * cos(t / 300000 + d) + toInt64(intDiv(h, 256) % 3) / 1000, 3)"},
		{name: "energy", kind: "counter", valueType: "number",
			num: "round(d * 10 + (t - 1.7e9) * 0.00042 + toInt64(intDiv(h, 4096) % 7) / 1000, 3)"},
		{name: "packets", kind: "counter", valueType: "number",
			num: "toFloat64(j * 3 + intDiv(h, 65536) % 3)"},
		{name: "rssi", kind: "int", valueType: "number",
			num: "toFloat64(-65 + round(8 * sin(t / 7200 + d)) + toInt64(intDiv(h, 1048576) % 3) - 1)"},
		{name: "mode", kind: "enum", valueType: "number",
			num: "toFloat64(intDiv(j, 2000 + (d % 7) * 100) % 3)"},
		{name: "relay", kind: "bool", valueType: "bool",
			num: "toFloat64(intDiv(j, 333 + d % 5) % 2)",
			str: "if(intDiv(j, 333 + d % 5) % 2 = 1, 'true', 'false')"},
		{name: "status", kind: "string", valueType: "string",
			str: "['idle', 'running', 'charging', 'fault'][intDiv(j, 500 + d % 11) % 4 + 1]"},
		{name: "config", kind: "json", valueType: "json",
			str: "concat('{\"fw\":\"2.', toString(intDiv(j, 20000)), '.1\",\"period\":', toString(iv), ',\"eco\":', if(intDiv(j, 1500) % 2 = 1, 'true', 'false'), '}')"},
	}
	for i := range p {
		switch {
		case p[i].num == "":
			p[i].num = "toFloat64(0)"
		case p[i].str == "":
			p[i].str = "''"
		}
		switch p[i].valueType {
		case "number":
			p[i].payload = "toString(" + p[i].num + ")"
		case "bool":
			p[i].payload = p[i].str
		case "string":
			p[i].payload = "concat('\"', " + p[i].str + ", '\"')"
		default:
			p[i].payload = p[i].str
		}
	}
	return p
}()

// StorageParams size the storage scenario.
type StorageParams struct {
	Values         int           // property values to generate (about: whole reports)
	Span           time.Duration // history length at most (shorter for small sizes)
	Queries        int           // timed queries of each kind
	InsertValues   int           // property values re-inserted through tsdb.InsertBatch
	Database       string        // the database to generate into (dropped first)
	ClickHouseAddr string
	Keep           bool // keep the database afterwards
	// Layouts copies a sample into the candidate layouts of
	// storageLayouts18 (slow: each is a copy and a merge).
	Layouts bool
	Logf    func(string, ...any)
}

// StorageColumn is one column's size.
type StorageColumn struct {
	Table, Column, Type      string
	Compressed, Uncompressed uint64
	BytesPerRow              float64 // compressed bytes per row of its table
}

// StorageTable is one table's size (data, not marks or the primary index).
type StorageTable struct {
	Table                    string
	Rows                     uint64
	Compressed, Uncompressed uint64
	BytesPerRow              float64
	Columns                  []StorageColumn
}

// StorageKind is the bytes a value of one kind costs in device_property:
// its share of the columns that differ per kind (num_value, str_value)
// measured on a table of only that property, plus the other columns' per
// row cost of the whole table.
type StorageKind struct {
	Kind        string
	Property    string
	BytesPerRow float64
}

// StorageLayout is device_property's values (a sample of whole devices)
// copied into a candidate layout and merged: what that layout would store
// them in, beside the same sample in today's layout.
type StorageLayout struct {
	Name, Note  string
	Rows        uint64
	BytesPerRow float64
	Columns     []StorageColumn
}

// StorageResult is what the scenario measured.
type StorageResult struct {
	Database        string
	Server          string
	Devices         int
	SpanSeconds     int64
	Values          uint64 // property values stored
	Messages        uint64
	GenerateSeconds float64
	GenRowsPerSec   float64 // property + message rows per second, INSERT ... SELECT
	OptimizeSeconds float64
	InsertValues    int
	InsertPerSec    float64 // property values per second through tsdb.InsertBatch (10,000-value batches)
	Tables          []StorageTable
	PropertyBytes   float64 // device_property compressed bytes per value
	MessageBytes    float64 // device_message compressed bytes per message
	AllBytes        float64 // every table's compressed bytes per property value
	Kinds           []StorageKind
	Layouts         []StorageLayout
	Queries         int
	HistoryPerSec   float64 // latest 100 values of 3 properties of a random device
	AggPerSec       float64 // avg 1h x24 of a random device and day from device_property (no rollup)
	AggRollupPerSec float64 // the same questions through the dashboard's path (the hourly rollup)
	// Before is the same fleet measured in the layout before schema 00006
	// (tsdb.Options.SchemaVersion 5), generated, merged and queried in
	// the same run before tsdb.Open converted it; the fields above are
	// measured after the conversion.
	Before *StorageResult `json:",omitempty"`
	// Convert is what the conversion by tsdb.Open cost.
	ConvertMonths  int
	ConvertRows    uint64
	ConvertSeconds float64
}

// storageFleet sizes the fleet for about n values: at least 20 devices,
// the span shortened below span when that would be more than n.
func storageFleet(n int, span time.Duration) (devices int, spanSec int64, msgs []int) {
	rate := 0.0 // reports per second of 5 devices, one of each interval
	for _, iv := range storageIntervals {
		rate += 1 / float64(iv)
	}
	props := float64(len(storageProps))
	spanSec = int64(span / time.Second)
	perDev := props * float64(spanSec) * rate / float64(len(storageIntervals))
	devices = max(20, int(math.Ceil(float64(n)/perDev)))
	if f := float64(devices) * perDev; f > float64(n) {
		spanSec = max(3600, int64(float64(spanSec)*float64(n)/f))
	}
	msgs = make([]int, devices)
	for d := range msgs {
		msgs[d] = int(spanSec / int64(storageIntervals[d%len(storageIntervals)]))
	}
	return devices, spanSec, msgs
}

// storageReports is the subquery of reports of devices [a, b): d, iv, j,
// ts (ms), t (s), h and the product and device ids.
func storageReports(startSec int64, spanSec int64, a, b int) string {
	ivs := make([]string, len(storageIntervals))
	for i, iv := range storageIntervals {
		ivs[i] = fmt.Sprint(iv)
	}
	return fmt.Sprintf(`SELECT d, iv, j, ts, ts / 1000 AS t, cityHash64(d, j) AS h,
    concat('p', toString(d %% 5)) AS product_id, concat('sensor-', toString(100000 + d)) AS device_id
  FROM (SELECT d, iv, j, toInt64((%[1]d + (d * 7919) %% iv + j * iv) * 1000 + cityHash64(j, d) %% 400) AS ts
    FROM (SELECT number + %[3]d AS d, [%[5]s][d %% %[6]d + 1] AS iv FROM numbers(%[4]d))
    ARRAY JOIN range(toUInt32(intDiv(%[2]d, iv))) AS j)`,
		startSec, spanSec, a, b-a, strings.Join(ivs, ", "), len(storageIntervals))
}

func storagePropertiesSQL(startSec, spanSec int64, a, b int, old bool) string {
	var names, types, nums, strs []string
	for _, p := range storageProps {
		names = append(names, "'"+p.name+"'")
		types = append(types, "'"+p.valueType+"'")
		nums = append(nums, p.num)
		strs = append(strs, p.str)
	}
	cols := "ts, product_id, device_id, property, value_type, num_value, str_value"
	sel := cols
	if old {
		cols, sel = "time, "+cols, "toDateTime(intDiv(ts, 1000)), "+sel
	}
	return fmt.Sprintf(`INSERT INTO device_property (`+cols+`)
SELECT `+sel+`
FROM (SELECT ts, product_id, device_id, [%s] AS names, [%s] AS types, [%s] AS nums, [%s] AS strs
  FROM (%s))
ARRAY JOIN names AS property, types AS value_type, nums AS num_value, strs AS str_value`,
		strings.Join(names, ", "), strings.Join(types, ", "), strings.Join(nums, ", "), strings.Join(strs, ", "),
		storageReports(startSec, spanSec, a, b))
}

func storageMessagesSQL(startSec, spanSec int64, a, b int) string {
	parts := []string{}
	for i, p := range storageProps {
		sep := ","
		if i == 0 {
			sep = "{"
		}
		parts = append(parts, "'"+sep+`"`+p.name+`":'`, p.payload)
	}
	parts = append(parts, "'}'")
	return fmt.Sprintf(`INSERT INTO device_message (time, ts, product_id, device_id, direction, message_type, message_id, topic, payload)
SELECT toDateTime(intDiv(ts, 1000)), ts, product_id, device_id, 'up', 'REPORT_PROPERTY',
  toString(ts * 1000 + d %% 1000), concat('/', product_id, '/', device_id, '/properties/report'),
  concat(%s)
FROM (%s)`, strings.Join(parts, ", "), storageReports(startSec, spanSec, a, b))
}

// RunStorage generates the fleet into p.Database and measures it.
func RunStorage(ctx context.Context, p StorageParams) (StorageResult, error) {
	logf := p.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if p.Values <= 0 {
		return StorageResult{}, errors.New("storage: no values to generate")
	}
	if p.Span <= 0 {
		p.Span = 14 * 24 * time.Hour
	}
	opt := tsdb.DefaultOptions()
	opt.Addr, opt.Database, opt.TimeZone, opt.QueryTimeout = p.ClickHouseAddr, p.Database, time.UTC, 30*time.Minute
	before := StorageResult{Database: p.Database, Server: p.ClickHouseAddr}
	if err := dropTSDB(ctx, opt); err != nil {
		return before, err
	}
	// The fleet is generated in the layout before schema 00006, measured,
	// converted by tsdb.Open as an upgrade would, and measured again.
	old := opt
	old.SchemaVersion = 5
	db, err := tsdb.Open(ctx, old)
	if err != nil {
		return before, err
	}
	defer db.Close()
	if !p.Keep {
		defer db.DropDatabase(context.WithoutCancel(ctx))
	}
	conn := db.Conn()
	var version string
	if err := conn.QueryRow(ctx, "SELECT version()").Scan(&version); err == nil {
		before.Server += " (ClickHouse " + version + ")"
	}

	devices, spanSec, msgs := storageFleet(p.Values, p.Span)
	before.Devices, before.SpanSeconds = devices, spanSec
	startSec := time.Now().Truncate(24*time.Hour).Unix() - spanSec
	var stmts []string
	for a := 0; a < devices; {
		b, vals := a, 0
		for b < devices && (b == a || vals+msgs[b]*len(storageProps) <= 5_000_000) {
			vals += msgs[b] * len(storageProps)
			b++
		}
		stmts = append(stmts, storagePropertiesSQL(startSec, spanSec, a, b, true), storageMessagesSQL(startSec, spanSec, a, b))
		a = b
	}
	logf("storage: %d devices over %s, %d statements into %s", devices, time.Duration(spanSec)*time.Second, len(stmts), p.Database)
	start := time.Now()
	if err := execParallel(ctx, db, stmts, 1, func(done, total int) {
		if done%10 == 0 || done == total {
			logf("storage: %d/%d statements in %s", done, total, time.Since(start).Round(time.Second))
		}
	}); err != nil {
		return before, err
	}
	before.GenerateSeconds = time.Since(start).Seconds()
	var want uint64
	for _, m := range msgs {
		want += uint64(m)
	}
	if err := conn.QueryRow(ctx, "SELECT (SELECT count() FROM device_property), (SELECT count() FROM device_message)").Scan(&before.Values, &before.Messages); err != nil {
		return before, err
	}
	if before.Messages != want || before.Values != want*uint64(len(storageProps)) {
		return before, fmt.Errorf("storage: stored %d messages and %d values, want %d and %d", before.Messages, before.Values, want, want*uint64(len(storageProps)))
	}
	before.GenRowsPerSec = float64(before.Values+before.Messages) / before.GenerateSeconds
	logf("storage: %d values + %d messages in %.1fs (%.0f rows/s)", before.Values, before.Messages, before.GenerateSeconds, before.GenRowsPerSec)
	if err := storageMeasure(ctx, p, old, db, msgs, startSec, spanSec, &before, false); err != nil {
		return before, err
	}

	// The upgrade: tsdb.Open converts device_property (tsdb/convert.go).
	start = time.Now()
	conv, err := tsdb.Open(ctx, opt)
	if err != nil {
		return before, fmt.Errorf("storage: convert: %w", err)
	}
	defer conv.Close()
	r := before
	r.Before = &before
	r.Tables, r.Kinds, r.Layouts = nil, nil, nil
	r.ConvertSeconds = time.Since(start).Seconds()
	st := conv.LastConversion()
	r.ConvertMonths, r.ConvertRows = st.Months, st.Rows
	logf("storage: converted %d values (%d months) in %.1fs", st.Rows, st.Months, r.ConvertSeconds)
	if st.Rows != before.Values {
		return r, fmt.Errorf("storage: the conversion copied %d values of %d", st.Rows, before.Values)
	}
	if err := storageMeasure(ctx, p, opt, conv, msgs, startSec, spanSec, &r, p.Layouts); err != nil {
		return r, err
	}
	return r, nil
}

// storageMeasure merges every table and measures r's sizes, queries and
// inserts in db's layout (opt's: the bench's other connections open it
// with the same SchemaVersion).
func storageMeasure(ctx context.Context, p StorageParams, opt tsdb.Options, db *tsdb.DB, msgs []int, startSec, spanSec int64, r *StorageResult, layouts bool) error {
	logf := p.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	conn := db.Conn()
	// Merged, as a table is once background merges have run: sizes of a
	// table in a hundred unmerged parts say little.
	start := time.Now()
	for _, t := range storageTables {
		if err := conn.Exec(ctx, "OPTIMIZE TABLE "+t+" FINAL"); err != nil {
			return fmt.Errorf("optimize %s: %w", t, err)
		}
	}
	r.OptimizeSeconds = time.Since(start).Seconds()
	var err error
	if r.Tables, err = storageSizes(ctx, db); err != nil {
		return err
	}
	var all uint64
	for _, t := range r.Tables {
		all += t.Compressed
		switch t.Table {
		case "device_property":
			r.PropertyBytes = t.BytesPerRow
		case "device_message":
			r.MessageBytes = t.BytesPerRow
		}
	}
	r.AllBytes = float64(all) / float64(r.Values)
	if r.Kinds, err = storageKinds(ctx, db, r.Tables, r.Values); err != nil {
		return err
	}
	logf("storage: %.2f B a property value, %.2f B a message, %.2f B a value in all tables", r.PropertyBytes, r.MessageBytes, r.AllBytes)
	if layouts {
		if r.Layouts, err = storageLayouts(ctx, db, r.Values); err != nil {
			return err
		}
		for _, l := range r.Layouts {
			logf("storage: layout %s: %.2f B a value (%d values)", l.Name, l.BytesPerRow, l.Rows)
		}
	}
	if p.Queries > 0 {
		if err := storageQueries(ctx, p, opt, msgs, startSec, spanSec, r); err != nil {
			return err
		}
		logf("storage: %.1f history queries/s, %.1f 1h x24 aggregates/s from device_property, %.1f through the rollup (%d each, median of %d rounds)", r.HistoryPerSec, r.AggPerSec, r.AggRollupPerSec, r.Queries, storageRounds)
	}
	if p.InsertValues > 0 {
		if err := storageInsert(ctx, p, opt, db, r); err != nil {
			return err
		}
		logf("storage: %.0f values/s through tsdb.InsertBatch (%d values)", r.InsertPerSec, r.InsertValues)
	}
	return nil
}

// storageTables are the tables the scenario sizes: the two written on
// ingest and the rollups and counts their views keep.
var storageTables = []string{"device_property", "device_message", "device_property_hourly",
	"device_property_product_hourly", "device_property_daily", "device_message_daily", "device_message_quarter"}

func dropTSDB(ctx context.Context, opt tsdb.Options) error {
	db, err := tsdb.Open(ctx, opt)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.DropDatabase(ctx)
}

// storageSizes reads system.columns and system.parts.
func storageSizes(ctx context.Context, db *tsdb.DB) ([]StorageTable, error) {
	return storageSizesOf(ctx, db, storageTables)
}

func storageSizesOf(ctx context.Context, db *tsdb.DB, tables []string) ([]StorageTable, error) {
	var out []StorageTable
	for _, t := range tables {
		st := StorageTable{Table: t}
		if err := db.Conn().QueryRow(ctx, "SELECT sum(rows) FROM system.parts WHERE active AND database = ? AND table = ?", db.Database(), t).Scan(&st.Rows); err != nil {
			return nil, err
		}
		rows, err := db.Conn().Query(ctx, `SELECT name, type, data_compressed_bytes, data_uncompressed_bytes FROM system.columns
WHERE database = ? AND table = ? ORDER BY data_compressed_bytes DESC, name`, db.Database(), t)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			c := StorageColumn{Table: t}
			if err := rows.Scan(&c.Column, &c.Type, &c.Compressed, &c.Uncompressed); err != nil {
				rows.Close()
				return nil, err
			}
			if st.Rows > 0 {
				c.BytesPerRow = float64(c.Compressed) / float64(st.Rows)
			}
			st.Compressed += c.Compressed
			st.Uncompressed += c.Uncompressed
			st.Columns = append(st.Columns, c)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		if st.Rows > 0 {
			st.BytesPerRow = float64(st.Compressed) / float64(st.Rows)
		}
		out = append(out, st)
	}
	return out, nil
}

// storageKinds sizes one property of each kind: its rows copied into a
// table of device_property's layout (same engine, keys and columns), merged
// and sized (of the same sample of devices as the layouts). The copy is of that kind's values only, so its bytes per row
// are what a fleet of only that kind would pay.
func storageKinds(ctx context.Context, db *tsdb.DB, tables []StorageTable, values uint64) ([]StorageKind, error) {
	conn := db.Conn()
	every := storageSampleEvery(values)
	var names []string
	for _, t := range tables {
		if t.Table == "device_property" {
			for _, c := range t.Columns {
				names = append(names, c.Column)
			}
		}
	}
	cols := strings.Join(names, ", ")
	var out []StorageKind
	for _, p := range storageProps {
		if len(out) > 0 && out[len(out)-1].Kind == p.kind {
			continue // the first of each kind
		}
		if err := conn.Exec(ctx, "DROP TABLE IF EXISTS storage_kind"); err != nil {
			return nil, err
		}
		if err := conn.Exec(ctx, "CREATE TABLE storage_kind AS device_property"); err != nil {
			return nil, err
		}
		if err := conn.Exec(ctx, fmt.Sprintf("INSERT INTO storage_kind (%s) SELECT %s FROM device_property WHERE property = '%s' AND cityHash64(device_id) %% %d = 0",
			cols, cols, p.name, every)); err != nil {
			return nil, err
		}
		if err := conn.Exec(ctx, "OPTIMIZE TABLE storage_kind FINAL"); err != nil {
			return nil, err
		}
		var rows, bytes uint64
		if err := conn.QueryRow(ctx, "SELECT (SELECT sum(rows) FROM system.parts WHERE active AND database = currentDatabase() AND table = 'storage_kind'), "+
			"(SELECT sum(data_compressed_bytes) FROM system.columns WHERE database = currentDatabase() AND table = 'storage_kind')").Scan(&rows, &bytes); err != nil {
			return nil, err
		}
		k := StorageKind{Kind: p.kind, Property: p.name}
		if rows > 0 {
			k.BytesPerRow = float64(bytes) / float64(rows)
		}
		out = append(out, k)
	}
	return out, conn.Exec(ctx, "DROP TABLE IF EXISTS storage_kind")
}

// storageLayouts are the candidate layouts of device_property that
// ClickHouse 18.16 can hold: the columns, the ORDER BY and PARTITION BY,
// and the SELECT list over device_property that fills them.
var storageLayouts18 = []struct{ name, note, cols, key, part, sel string }{
	{"before 00006", "time DateTime and ts Int64 (ms), ORDER BY (product_id, device_id, property, time)",
		"time DateTime, ts Int64, product_id String, device_id String, property String, value_type Enum8('number' = 1, 'string' = 2, 'bool' = 3, 'json' = 4), num_value Float64, str_value String",
		"product_id, device_id, property, time", "toYYYYMM(time)",
		"toDateTime(intDiv(ts, 1000)), ts, product_id, device_id, property, value_type, num_value, str_value"},
	{"ts, property order", "ts Int64 alone, ORDER BY (product_id, device_id, property, ts)",
		"ts Int64, product_id String, device_id String, property String, value_type Enum8('number' = 1, 'string' = 2, 'bool' = 3, 'json' = 4), num_value Float64, str_value String",
		"product_id, device_id, property, ts", "toYYYYMM(toDateTime(intDiv(ts, 1000)))",
		"ts, product_id, device_id, property, value_type, num_value, str_value"},
	{"00006", "ts Int64 alone, ORDER BY (product_id, device_id, ts, property)",
		"ts Int64, product_id String, device_id String, property String, value_type Enum8('number' = 1, 'string' = 2, 'bool' = 3, 'json' = 4), num_value Float64, str_value String",
		"product_id, device_id, ts, property", "toYYYYMM(toDateTime(intDiv(ts, 1000)))",
		"ts, product_id, device_id, property, value_type, num_value, str_value"},
	{"sec+ms, report order", "sec UInt32 and ms UInt16, ORDER BY (product_id, device_id, sec, ms, property)",
		"sec UInt32, ms UInt16, product_id String, device_id String, property String, value_type Enum8('number' = 1, 'string' = 2, 'bool' = 3, 'json' = 4), num_value Float64, str_value String",
		"product_id, device_id, sec, ms, property", "toYYYYMM(toDateTime(sec))",
		"toUInt32(intDiv(ts, 1000)), toUInt16(ts % 1000), product_id, device_id, property, value_type, num_value, str_value"},
}

// storageSampleEvery is the share of devices (1 in every n, by the hash
// of the id) whose values the kinds and layouts copy: about 10 million
// values at most.
func storageSampleEvery(values uint64) uint64 { return max(1, values/10_000_000) }

// storageLayouts copies a sample of whole devices (about 10 million
// values at most) into each candidate layout and sizes it.
func storageLayouts(ctx context.Context, db *tsdb.DB, values uint64) ([]StorageLayout, error) {
	conn := db.Conn()
	every := storageSampleEvery(values)
	var out []StorageLayout
	for _, l := range storageLayouts18 {
		steps := []string{
			"DROP TABLE IF EXISTS storage_layout",
			"CREATE TABLE storage_layout (" + l.cols + ") ENGINE = MergeTree() PARTITION BY " + l.part + " ORDER BY (" + l.key + ")",
			fmt.Sprintf("INSERT INTO storage_layout SELECT %s FROM device_property WHERE cityHash64(device_id) %% %d = 0", l.sel, every),
			"OPTIMIZE TABLE storage_layout FINAL",
		}
		for _, st := range steps {
			if err := conn.Exec(ctx, st); err != nil {
				return nil, fmt.Errorf("layout %s: %s: %w", l.name, firstLine(st), err)
			}
		}
		tables, err := storageSizesOf(ctx, db, []string{"storage_layout"})
		if err != nil {
			return nil, err
		}
		out = append(out, StorageLayout{Name: l.name, Note: l.note, Rows: tables[0].Rows, BytesPerRow: tables[0].BytesPerRow, Columns: tables[0].Columns})
	}
	return out, conn.Exec(ctx, "DROP TABLE IF EXISTS storage_layout")
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// storageQueries times p.Queries history reads, as many 1h x24
// aggregates straight from device_property, and as many through the
// dashboard's path (the hourly rollup, which answers an hour-aligned
// range), each of a device (and day) drawn from a fixed seed, so runs
// against different layouts or servers ask the same questions. Each kind
// runs storageRounds times, interleaved with the others, and its rate is
// the median: a machine whose load moves between phases moves every kind
// alike within a round.
func storageQueries(ctx context.Context, p StorageParams, opt tsdb.Options, msgs []int, startSec, spanSec int64, r *StorageResult) error {
	opt.NoRollup, opt.ResultTTL = true, -1
	raw, err := tsdb.Open(ctx, opt)
	if err != nil {
		return err
	}
	defer raw.Close()
	opt.NoRollup = false
	rolled, err := tsdb.Open(ctx, opt)
	if err != nil {
		return err
	}
	defer rolled.Close()
	days := max(1, spanSec/86400)
	history := func(rng *rand.Rand) error {
		d := rng.IntN(len(msgs))
		prod, id := fmt.Sprintf("p%d", d%5), fmt.Sprintf("sensor-%d", 100000+d)
		v, err := raw.PropertyHistory(ctx, prod, id, []string{"temperature", "energy", "status"}, 100)
		if err != nil {
			return err
		}
		if want := 3 * min(100, msgs[d]); len(v) != want {
			return fmt.Errorf("storage: history of %s: %d values, want %d", id, len(v), want)
		}
		return nil
	}
	aggregate := func(db *tsdb.DB) func(rng *rand.Rand) error {
		return func(rng *rand.Rand) error {
			d := rng.IntN(len(msgs))
			prod, id := fmt.Sprintf("p%d", d%5), fmt.Sprintf("sensor-%d", 100000+d)
			from := time.Unix(startSec+rng.Int64N(days)*86400, 0)
			s, err := db.PropertyAggregates(ctx, tsdb.AggQuery{Interval: "1h", From: from, To: from.Add(24*time.Hour - time.Second),
				ProductID: prod, DeviceID: id, Properties: []string{"temperature", "voltage"}, Agg: tsdb.AggAvg, Limit: 24})
			if err != nil {
				return err
			}
			if len(s) != 2 || len(s[0].Buckets) != 24 {
				return fmt.Errorf("storage: aggregate of %s: %d series", id, len(s))
			}
			return nil
		}
	}
	kinds := []struct {
		run  func(*rand.Rand) error
		seed uint64
		rate *float64
	}{{history, 46, &r.HistoryPerSec}, {aggregate(raw), 47, &r.AggPerSec}, {aggregate(rolled), 47, &r.AggRollupPerSec}}
	rates := make([][]float64, len(kinds))
	r.Queries = p.Queries
	for range storageRounds {
		for k, kind := range kinds {
			rng := rand.New(rand.NewPCG(kind.seed, 1))
			start := time.Now()
			for range p.Queries {
				if err := kind.run(rng); err != nil {
					return err
				}
			}
			rates[k] = append(rates[k], float64(p.Queries)/time.Since(start).Seconds())
		}
	}
	for k, kind := range kinds {
		slices.Sort(rates[k])
		*kind.rate = rates[k][len(rates[k])/2]
	}
	return nil
}

// storageRounds is how many times each kind of query is timed.
const storageRounds = 3

// storageInsert reads p.InsertValues stored values (whole reports) with
// their messages and stores them again, into a database of its own,
// through tsdb.InsertBatch in batches of 1,000 reports (10,000 values), as
// the ingest writer does.
func storageInsert(ctx context.Context, p StorageParams, opt tsdb.Options, src *tsdb.DB, r *StorageResult) error {
	opt.Database = p.Database + "_insert"
	if err := dropTSDB(ctx, opt); err != nil {
		return err
	}
	dst, err := tsdb.Open(ctx, opt)
	if err != nil {
		return err
	}
	defer dst.Close()
	defer dst.DropDatabase(context.WithoutCancel(ctx))
	reports := max(1, p.InsertValues/len(storageProps))
	rows, err := src.Conn().Query(ctx, `SELECT ts, product_id, device_id, message_id, topic, payload FROM device_message
ORDER BY ts, device_id LIMIT ?`, reports)
	if err != nil {
		return err
	}
	var msgs []tsdb.Message
	for rows.Next() {
		var m tsdb.Message
		var ts int64
		var payload string
		if err := rows.Scan(&ts, &m.ProductID, &m.DeviceID, &m.MessageID, &m.Topic, &payload); err != nil {
			rows.Close()
			return err
		}
		m.Time, m.Direction, m.MessageType, m.Payload = time.UnixMilli(ts), "up", "REPORT_PROPERTY", []byte(payload)
		msgs = append(msgs, m)
	}
	rows.Close()
	if len(msgs) == 0 {
		return errors.New("storage: no messages to insert again")
	}
	last := msgs[len(msgs)-1].Time.UnixMilli()
	prow, err := src.Conn().Query(ctx, `SELECT ts, product_id, device_id, property, toString(value_type), num_value, str_value FROM device_property
WHERE ts <= ? ORDER BY ts, device_id, property`, last)
	if err != nil {
		return err
	}
	byKey := map[string][]tsdb.PropertyValue{}
	for prow.Next() {
		var v tsdb.PropertyValue
		var ts int64
		if err := prow.Scan(&ts, &v.ProductID, &v.DeviceID, &v.Property, &v.ValueType, &v.Num, &v.Str); err != nil {
			prow.Close()
			return err
		}
		v.Time = time.UnixMilli(ts)
		k := fmt.Sprint(v.DeviceID, ts)
		byKey[k] = append(byKey[k], v)
	}
	prow.Close()
	const perBatch = 1000
	var batches [][2]int
	for a := 0; a < len(msgs); a += perBatch {
		batches = append(batches, [2]int{a, min(len(msgs), a+perBatch)})
	}
	values := 0
	start := time.Now()
	for _, bt := range batches {
		var props []tsdb.PropertyValue
		for _, m := range msgs[bt[0]:bt[1]] {
			props = append(props, byKey[fmt.Sprint(m.DeviceID, m.Time.UnixMilli())]...)
		}
		values += len(props)
		if err := dst.Insert(ctx, msgs[bt[0]:bt[1]], props); err != nil {
			return err
		}
	}
	r.InsertPerSec = float64(values) / time.Since(start).Seconds()
	r.InsertValues = values
	return nil
}

// Markdown renders the sizes as the table in BENCHMARKS.md: before and
// after the conversion side by side, then each layout's tables.
func (r StorageResult) Markdown() string {
	if r.Before == nil {
		return r.details()
	}
	var b strings.Builder
	o := r.Before
	change := func(before, after float64) string {
		if before == 0 {
			return ""
		}
		return fmt.Sprintf("%+.1f%%", 100*(after-before)/before)
	}
	fmt.Fprintf(&b, "%s: %d devices over %.1f days, %d property values, %d messages\n\n", r.Server, r.Devices,
		float64(r.SpanSeconds)/86400, r.Values, r.Messages)
	fmt.Fprintf(&b, "| figure | before (layout of 00001-00005) | after (00006) | change |\n|---|---:|---:|---:|\n")
	row := func(name, format string, before, after float64) {
		fmt.Fprintf(&b, "| %s | "+format+" | "+format+" | %s |\n", name, before, after, change(before, after))
	}
	row("device_property B/value", "%.2f", o.PropertyBytes, r.PropertyBytes)
	row("device_message B/message", "%.2f", o.MessageBytes, r.MessageBytes)
	row("all tables B/property value", "%.2f", o.AllBytes, r.AllBytes)
	row(fmt.Sprintf("tsdb.InsertBatch values/s (%d values, with their messages)", r.InsertValues), "%.0f", o.InsertPerSec, r.InsertPerSec)
	row(fmt.Sprintf("history (latest 100 of 3 properties, random device) queries/s (%d)", r.Queries), "%.1f", o.HistoryPerSec, r.HistoryPerSec)
	row(fmt.Sprintf("avg 1h x24 from device_property (random device and day) queries/s (%d)", r.Queries), "%.1f", o.AggPerSec, r.AggPerSec)
	row(fmt.Sprintf("the same through the hourly rollup (the dashboard's path) queries/s (%d)", r.Queries), "%.1f", o.AggRollupPerSec, r.AggRollupPerSec)
	row("OPTIMIZE FINAL of every table s", "%.1f", o.OptimizeSeconds, r.OptimizeSeconds)
	fmt.Fprintf(&b, "| generate (INSERT ... SELECT, views included, old layout) rows/s | %.0f | | |\n", o.GenRowsPerSec)
	fmt.Fprintf(&b, "| conversion by tsdb.Open: %d values, %d months, s (values/s) | | %.1f (%.0f) | |\n", r.ConvertRows, r.ConvertMonths,
		r.ConvertSeconds, float64(r.ConvertRows)/max(r.ConvertSeconds, 1e-9))
	fmt.Fprintf(&b, "\n### After (00006)\n\n%s\n### Before\n\n%s", r.details(), o.details())
	return b.String()
}

// details renders one layout's tables, kinds and figures.
func (r StorageResult) details() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d devices over %.1f days, %d property values, %d messages\n\n", r.Server, r.Devices,
		float64(r.SpanSeconds)/86400, r.Values, r.Messages)
	fmt.Fprintf(&b, "| table | column | type | compressed | uncompressed | ratio | B/row | B/property value |\n|---|---|---|---:|---:|---:|---:|---:|\n")
	for _, t := range r.Tables {
		fmt.Fprintf(&b, "| **%s** | (%d rows) | | **%s** | %s | %.1f | **%.2f** | **%.3f** |\n", t.Table, t.Rows, mib(t.Compressed), mib(t.Uncompressed),
			ratio(t.Uncompressed, t.Compressed), t.BytesPerRow, float64(t.Compressed)/float64(max(1, r.Values)))
		cols := append([]StorageColumn(nil), t.Columns...)
		sort.SliceStable(cols, func(i, j int) bool { return cols[i].Compressed > cols[j].Compressed })
		for _, c := range cols {
			fmt.Fprintf(&b, "| | %s | %s | %s | %s | %.1f | %.3f | %.3f |\n", c.Column, c.Type, mib(c.Compressed), mib(c.Uncompressed),
				ratio(c.Uncompressed, c.Compressed), c.BytesPerRow, float64(c.Compressed)/float64(max(1, r.Values)))
		}
	}
	fmt.Fprintf(&b, "\nBytes a property value, by kind (one property of the kind alone in device_property's layout):\n\n| kind | property | B/value |\n|---|---|---:|\n")
	for _, k := range r.Kinds {
		fmt.Fprintf(&b, "| %s | %s | %.2f |\n", k.Kind, k.Property, k.BytesPerRow)
	}
	if len(r.Layouts) > 0 {
		fmt.Fprintf(&b, "\ndevice_property's values (%d, whole devices) in candidate layouts, B/value per column:\n\n| layout | B/value | columns |\n|---|---:|---|\n", r.Layouts[0].Rows)
		for _, l := range r.Layouts {
			var cols []string
			for _, c := range l.Columns {
				if c.BytesPerRow >= 0.01 {
					cols = append(cols, fmt.Sprintf("%s %.2f", c.Column, c.BytesPerRow))
				}
			}
			fmt.Fprintf(&b, "| %s: %s | %.2f | %s |\n", l.Name, l.Note, l.BytesPerRow, strings.Join(cols, ", "))
		}
	}
	fmt.Fprintf(&b, "\n| figure | value |\n|---|---:|\n")
	fmt.Fprintf(&b, "| device_property B/value | %.2f |\n| device_message B/message | %.2f |\n| all tables B/property value | %.2f |\n", r.PropertyBytes, r.MessageBytes, r.AllBytes)
	fmt.Fprintf(&b, "| generate (INSERT ... SELECT, views included) rows/s | %.0f |\n| OPTIMIZE FINAL of every table s | %.1f |\n", r.GenRowsPerSec, r.OptimizeSeconds)
	fmt.Fprintf(&b, "| tsdb.InsertBatch values/s (%d values, with their messages) | %.0f |\n", r.InsertValues, r.InsertPerSec)
	fmt.Fprintf(&b, "| history (latest 100 of 3 properties, random device) queries/s (%d) | %.1f |\n", r.Queries, r.HistoryPerSec)
	fmt.Fprintf(&b, "| avg 1h x24 from device_property (random device and day) queries/s (%d) | %.1f |\n", r.Queries, r.AggPerSec)
	fmt.Fprintf(&b, "| the same through the hourly rollup (the dashboard's path) queries/s (%d) | %.1f |\n", r.Queries, r.AggRollupPerSec)
	return b.String()
}

func mib(n uint64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func ratio(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
