package bench

import (
	"context"
	"fmt"
	"math/bits"
	"strings"
	"sync"
	"time"

	"devicehub/tsdb"
)

// The generated fleet. Message i (0 <= i < N) belongs to device i mod
// 10000 (id "d<dev>"), of product dev mod 10 ("p<k>"), and is stamped
//
//	ts_i = start + floor(i * span / N)   (milliseconds)
//
// so messages are spread uniformly over the 365 days ending at the moment
// of generation, every device reporting at a steady rate. The same formula
// fills ClickHouse and PostgreSQL, and gives the expected count of any
// window without reading the data (genInfo.countBefore).
//
// Property rows: the first 100 devices (1% of the fleet) carry all 14
// properties in every message of theirs (14 rows per message). A history
// query reads one device through the primary key (product, device,
// property, time), so its cost is that of a fleet where every device does
// the same; generating 14 rows for all N messages would multiply the
// generation time by 15 for rows no query reads.
const (
	dashDevices     = 10000
	dashProducts    = 10
	dashPropDevices = 100
	dashProps       = 14
	dashHistory     = 10
	dashChunk       = 5_000_000
	// The history device and its product: device 7 is among the first 100.
	dashHistoryDevice  = "d7"
	dashHistoryProduct = "p7"
	dashHistoryDevNum  = 7
)

var dashSpanMs = int64(365 * 24 * time.Hour / time.Millisecond)

// dashPropNames are the 14 properties: 12 numbers, an enum (string) and a
// boolean, as declared in dashThingModel.
var dashPropNames = []string{
	"temperature", "humidity", "pressure", "voltage", "current", "power",
	"energy", "rssi", "battery", "co2", "pm25", "noise", "mode", "online",
}

// genInfo describes generated data; stored in bench_info.
type genInfo struct {
	rows     uint64
	startMs  int64
	spanMs   int64
	propRows uint64
}

// storedGenInfo reads what an earlier run recorded in table (bench_info
// and its kind) about the data it generated: ok false when there is no
// such table or it cannot be read (the data is generated again).
func storedGenInfo(ctx context.Context, db *tsdb.DB, table string) (g genInfo, genSec float64, ok bool, err error) {
	conn := db.Conn()
	var tables uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = ? AND name = ?", db.Database(), table).Scan(&tables); err != nil {
		return genInfo{}, 0, false, err
	}
	if tables == 0 {
		return genInfo{}, 0, false, nil
	}
	err = conn.QueryRow(ctx, "SELECT rows, start_ms, span_ms, gen_seconds FROM "+table+" LIMIT 1").Scan(&g.rows, &g.startMs, &g.spanMs, &genSec)
	return g, genSec, err == nil, nil
}

// countBefore returns how many messages have ts < x (ms).
func (g genInfo) countBefore(x int64) uint64 {
	if x <= g.startMs {
		return 0
	}
	d := uint64(x - g.startMs)
	if d >= uint64(g.spanMs) {
		return g.rows
	}
	// i*span/N < d  <=>  i < d*N/span: the count is ceil(d*N/span).
	hi, lo := bits.Mul64(d, g.rows)
	q, r := bits.Div64(hi, lo, uint64(g.spanMs))
	if r > 0 {
		q++
	}
	return min(q, g.rows)
}

// perDevice is the number of messages of the history device.
func (g genInfo) perDevice() int {
	if g.rows <= dashHistoryDevNum {
		return 0
	}
	return int((g.rows - dashHistoryDevNum + dashDevices - 1) / dashDevices)
}

// generateClickHouse fills db with n messages and their property rows,
// unless bench_info says it already holds exactly that (then it checks the
// counts and reuses them).
func generateClickHouse(ctx context.Context, p DashboardParams, db *tsdb.DB, n int, s *DashboardSize) (genInfo, error) {
	conn := db.Conn()
	var tables uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = ? AND name = 'bench_info'", db.Database()).Scan(&tables); err != nil {
		return genInfo{}, err
	}
	if tables > 0 {
		var g genInfo
		var genSec float64
		err := conn.QueryRow(ctx, "SELECT rows, start_ms, span_ms, prop_rows, gen_seconds FROM bench_info LIMIT 1").
			Scan(&g.rows, &g.startMs, &g.spanMs, &g.propRows, &genSec)
		if err == nil && g.rows == uint64(n) {
			var msgs, daily, props uint64
			err = conn.QueryRow(ctx, "SELECT (SELECT count() FROM device_message), (SELECT sum(messages) FROM device_message_daily), (SELECT count() FROM device_property)").
				Scan(&msgs, &daily, &props)
			if err == nil && msgs == g.rows && daily == g.rows && props == g.propRows {
				p.Logf("size %d: reusing %s (%d messages, %d property rows)", n, db.Database(), msgs, props)
				s.Reused, s.PropertyRows = true, int64(props)
				if genSec > 0 {
					s.GenerateSeconds, s.MessagesPerSec = genSec, float64(n)/genSec
				}
				return g, nil
			}
		}
		p.Logf("size %d: %s is incomplete or of another size; regenerating", n, db.Database())
	}
	for _, st := range []string{
		"DROP TABLE IF EXISTS bench_info",
		"TRUNCATE TABLE " + storageTable(db, "device_message"),
		"TRUNCATE TABLE " + storageTable(db, "device_property"),
		"TRUNCATE TABLE " + storageTable(db, "device_message_daily"),
		"TRUNCATE TABLE " + storageTable(db, "device_property_hourly"),
		"TRUNCATE TABLE " + storageTable(db, "device_message_quarter"),
	} {
		if err := conn.Exec(ctx, st); err != nil {
			return genInfo{}, fmt.Errorf("%s: %w", st, err)
		}
	}

	now := time.Now().Truncate(time.Second)
	g := genInfo{rows: uint64(n), startMs: now.UnixMilli() - dashSpanMs, spanMs: dashSpanMs}
	perDev := (n + dashDevices - 1) / dashDevices
	propSeq := dashProps * dashPropDevices * perDev // before dropping i >= n

	start := time.Now()
	var stmts []string
	for off := 0; off < n; off += dashChunk {
		stmts = append(stmts, messagesSQL(g, off, min(dashChunk, n-off)))
	}
	for off := 0; off < propSeq; off += dashChunk {
		stmts = append(stmts, propertiesSQL(g, off, min(dashChunk, propSeq-off)))
	}
	if err := execParallel(ctx, db, stmts, p.GenWorkers, func(done, total int) {
		p.Logf("size %d: generated %d/%d chunks in %s", n, done, total, time.Since(start).Round(time.Millisecond))
	}); err != nil {
		return genInfo{}, err
	}
	genTime := time.Since(start)

	// The per-day table and the property table merged, as they are once a
	// live system has run for a while (device_message, read by neither
	// query, is left to background merges).
	start = time.Now()
	for _, st := range []string{"OPTIMIZE TABLE " + storageTable(db, "device_message_daily") + " FINAL",
		"OPTIMIZE TABLE " + storageTable(db, "device_property") + " FINAL"} {
		// On a cluster 18.16 merges on each shard's leader replica and
		// fails the statement on the others, which forward it there.
		if err := conn.Exec(ctx, st); err != nil && db.Cluster() == "" {
			return genInfo{}, fmt.Errorf("%s: %w", st, err)
		}
	}
	s.OptimizeSeconds = time.Since(start).Seconds()

	var msgs, daily uint64
	if err := conn.QueryRow(ctx, "SELECT (SELECT count() FROM device_message), (SELECT sum(messages) FROM device_message_daily), (SELECT count() FROM device_property)").
		Scan(&msgs, &daily, &g.propRows); err != nil {
		return genInfo{}, err
	}
	if msgs != g.rows || daily != g.rows {
		return genInfo{}, fmt.Errorf("generated %d messages, per-day counts sum to %d; want %d", msgs, daily, n)
	}
	if want := uint64(dashProps) * propMessages(n); g.propRows != want {
		return genInfo{}, fmt.Errorf("generated %d property rows, want %d", g.propRows, want)
	}
	s.GenerateSeconds = genTime.Seconds()
	s.MessagesPerSec = float64(n) / genTime.Seconds()
	s.PropertyRows = int64(g.propRows)
	p.Logf("size %d: %d messages + %d property rows in %s (%.0f messages/s), optimize %.1fs",
		n, msgs, g.propRows, genTime.Round(time.Millisecond), s.MessagesPerSec, s.OptimizeSeconds)

	// Written last: its presence marks a complete data set.
	for _, st := range []string{
		"CREATE TABLE bench_info (rows UInt64, start_ms Int64, span_ms Int64, prop_rows UInt64, gen_seconds Float64) ENGINE = TinyLog",
		fmt.Sprintf("INSERT INTO bench_info SELECT toUInt64(%d), toInt64(%d), toInt64(%d), toUInt64(%d), toFloat64(%f)",
			g.rows, g.startMs, g.spanMs, g.propRows, genTime.Seconds()),
	} {
		if err := conn.Exec(ctx, st); err != nil {
			return genInfo{}, fmt.Errorf("%s: %w", st, err)
		}
	}
	return g, nil
}

// propMessages is the number of messages of the first 100 devices.
func propMessages(n int) uint64 {
	var c uint64
	for d := range dashPropDevices {
		if d < n {
			c += uint64((n - d + dashDevices - 1) / dashDevices)
		}
	}
	return c
}

// messagesSQL inserts messages off .. off+count-1 computed server-side.
func messagesSQL(g genInfo, off, count int) string {
	return fmt.Sprintf(`INSERT INTO device_message (time, ts, product_id, device_id, direction, message_type, message_id, topic, payload)
SELECT toDateTime(intDiv(ts, 1000)), ts,
  concat('p', toString(modulo(dev, %[4]d))), concat('d', toString(dev)),
  if(modulo(i, 20) = 0, 'down', 'up'), if(modulo(i, 20) = 0, 'WRITE_PROPERTY', 'REPORT_PROPERTY'),
  toString(i), concat('/p', toString(modulo(dev, %[4]d)), '/d', toString(dev), '/properties/report'),
  concat('{"temperature":', toString(modulo(i, 400) / 10), ',"humidity":', toString(modulo(i, 97)), '}')
FROM (SELECT i, modulo(i, %[5]d) AS dev, toInt64(%[1]d + intDiv(i * %[2]d, %[3]d)) AS ts
  FROM (SELECT number + %[6]d AS i FROM numbers(%[7]d)))`,
		g.startMs, g.spanMs, g.rows, dashProducts, dashDevices, off, count)
}

// propertiesSQL inserts property rows of sequence numbers off ..
// off+count-1: sequence k is property k mod 14 of device (k/14) mod 100,
// message number dev + 10000*(k/1400); messages beyond N are skipped.
func propertiesSQL(g genInfo, off, count int) string {
	names := make([]string, len(dashPropNames))
	for i, n := range dashPropNames {
		names[i] = "'" + n + "'"
	}
	return fmt.Sprintf(`INSERT INTO device_property (ts, product_id, device_id, property, value_type, num_value, str_value)
SELECT ts,
  concat('p', toString(modulo(dev, %[4]d))), concat('d', toString(dev)),
  [%[8]s][k + 1],
  if(k < 12, 'number', if(k = 12, 'string', 'bool')),
  if(k < 12, toFloat64(modulo(i * 7 + k, 1000)) / 10, if(k = 13, toFloat64(modulo(i, 2)), toFloat64(0))),
  if(k = 12, toString(1 + modulo(i, 2)), if(k = 13, if(modulo(i, 2) = 1, 'true', 'false'), ''))
FROM (SELECT k, dev, i, toInt64(%[1]d + intDiv(i * %[2]d, %[3]d)) AS ts
  FROM (SELECT modulo(seq, %[9]d) AS k, modulo(intDiv(seq, %[9]d), %[10]d) AS dev, dev + %[5]d * intDiv(seq, %[11]d) AS i
    FROM (SELECT number + %[6]d AS seq FROM numbers(%[7]d)))
  WHERE i < %[3]d)`,
		g.startMs, g.spanMs, g.rows, dashProducts, dashDevices, off, count,
		strings.Join(names, ", "), dashProps, dashPropDevices, dashProps*dashPropDevices)
}

// execParallel runs stmts on up to workers connections at once.
func execParallel(ctx context.Context, db *tsdb.DB, stmts []string, workers int, progress func(done, total int)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan string)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		firstEr error
		done    int
	)
	for range min(workers, len(stmts)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for st := range next {
				err := db.Conn().Exec(ctx, st)
				mu.Lock()
				if err != nil && firstEr == nil {
					firstEr = fmt.Errorf("generate: %w", err)
					cancel()
				}
				done++
				d := done
				mu.Unlock()
				if err == nil {
					progress(d, len(stmts))
				}
			}
		}()
	}
feed:
	for _, st := range stmts {
		select {
		case next <- st:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstEr != nil {
		return firstEr
	}
	return ctx.Err()
}
