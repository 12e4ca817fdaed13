package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"devicehub/tsdb"
)

// The property-aggregate scenario: PropRows numeric values in their own
// database, <Prefix>_props_<rows>. Value j (0 <= j < N) is property
// "m<k>", k = (j / 1000) mod 10, of device "ad<dev>", dev = j mod 1000, of
// product "ap<dev mod 10>"; it is the device's report number i = j / 10000
// of R = N / 10000, stamped
//
//	ts = start + floor(i * span / R)   (milliseconds)
//
// over the 30 days ending at generation: every device reports its 10
// properties at a steady rate (at 100M values, every 4.3 minutes). As
// for messages, the formula gives the expected count of any window
// (genInfo.countBefore with R rows).
const (
	propDevices   = 1000
	propProducts  = 10
	propProps     = 10
	propQueried   = 50 // devices of product ap0 the queries rotate over
	propSpanDays  = 30
	propDayBucket = 24 // buckets of the measured queries: 1h x24
)

// PropAggSize holds the figures of the property-aggregate scenario.
type PropAggSize struct {
	Rows            int64   `json:"rows"`
	Reused          bool    `json:"reused"`
	GenerateSeconds float64 `json:"generateSeconds"`
	OptimizeSeconds float64 `json:"optimizeSeconds"`
	// Sequential, through HTTP, without the result cache (what a query
	// costs): avg of one property, 1h x24 ending at the newest value, one
	// device (rotating over 50) and product-wide.
	Device  Latency `json:"device"`
	Product Latency `json:"product"`
	// Rows ClickHouse read for one query of each, and the values it
	// aggregated (checked against the generator).
	DeviceRowsRead  uint64 `json:"deviceRowsRead"`
	ProductRowsRead uint64 `json:"productRowsRead"`
	DeviceValues    uint64 `json:"deviceValues"`
	ProductValues   uint64 `json:"productValues"`
	// Concurrent runs (absent if Concurrency <= 1).
	Concurrent []DashLoad  `json:"concurrent,omitempty"`
	Ceiling    *LoadResult `json:"ceiling,omitempty"`
}

// propModel declares the 10 numeric properties.
func propModel() string {
	var ps []string
	for k := range propProps {
		ps = append(ps, fmt.Sprintf(`{"id":"m%d","name":"Metric %d","valueType":{"type":"double","scale":1}}`, k, k))
	}
	return `{"properties":[` + strings.Join(ps, ",") + `]}`
}

func runPropAggregates(ctx context.Context, p DashboardParams, api *dashAPI, loc *time.Location, s *PropAggSize) error {
	n := p.PropRows / (propDevices * propProps) * (propDevices * propProps)
	if n == 0 {
		return fmt.Errorf("%d property rows: want at least %d", p.PropRows, propDevices*propProps)
	}
	s.Rows = int64(n)
	opt := genOptions(p, fmt.Sprintf("%s_props_%d", p.Prefix, n), loc)
	gen, err := tsdb.Open(ctx, opt)
	if err != nil {
		return err
	}
	defer closeGenDB(p, gen)
	info, err := generateProps(ctx, p, gen, n, s)
	if err != nil {
		return err
	}

	// The product and the devices queried, in the metadata database.
	var prod map[string]any
	if err := api.call(ctx, "POST", "/api/device/product", map[string]any{"id": "ap0", "name": "Bench metrics",
		"classifiedId": "meter", "modelFrom": "custom", "accessId": "mqtt-direct", "deviceType": "device"}, &prod); err != nil {
		return err
	}
	prod["metadata"] = propModel()
	if err := api.call(ctx, "PATCH", "/api/device-product", prod, nil); err != nil {
		return err
	}
	for d := range propQueried {
		id := fmt.Sprint("ad", d*propProducts)
		if err := api.call(ctx, "POST", "/api/device/instance", map[string]any{"id": id, "name": id, "productId": "ap0"}, nil); err != nil {
			return err
		}
	}

	opt.QueryTimeout, opt.ResultTTL = 0, -1
	uncached, err := tsdb.Open(ctx, opt)
	if err != nil {
		return err
	}
	defer uncached.Close()
	opt.ResultTTL = 0
	db, err := tsdb.Open(ctx, opt)
	if err != nil {
		return err
	}
	defer db.Close()

	// The 24 hours ending with the newest values (report R-1 of every
	// device): the window of every query.
	to := time.UnixMilli(info.startMs + int64(info.rows-1)*info.spanMs/int64(info.rows)).In(loc)
	starts, err := tsdb.Buckets(tsdb.Hour, to, to.Add(-time.Duration(propDayBucket-1)*time.Hour), loc, propDayBucket)
	if err != nil {
		return err
	}
	lo, hi := starts[len(starts)-1], starts[0].Add(time.Hour) // Shanghai: hours are 60 minutes
	perSeries := info.countBefore(hi.UnixMilli()) - info.countBefore(lo.UnixMilli())
	body := func(device string) []byte {
		dev := ""
		if device != "" {
			dev = fmt.Sprintf(`"deviceId":%q,`, device)
		}
		return fmt.Appendf(nil, `[{"dashboard":"device","object":"ap0","measurement":"properties","dimension":"agg","group":"g",`+
			`"params":{%s"properties":["m3"],"agg":"avg","time":"1h","limit":%d,"to":%d,"format":"yyyy-MM-dd HH:mm"}}]`,
			dev, propDayBucket, to.UnixMilli())
	}
	var deviceBodies [][]byte
	for d := range propQueried {
		deviceBodies = append(deviceBodies, body(fmt.Sprint("ad", d*propProducts)))
	}
	product := body("")

	// Check the answers against the generator: counts of the same window.
	count := func(device string) (uint64, uint64, error) {
		var rows uint64
		pctx := clickhouse.Context(ctx, clickhouse.WithProgress(func(pr *clickhouse.Progress) { rows += pr.Rows }))
		series, err := uncached.PropertyAggregates(pctx, tsdb.AggQuery{Interval: tsdb.Hour, From: lo, To: to, ProductID: "ap0",
			DeviceID: device, Properties: []string{"m3"}, Agg: tsdb.AggCount, Limit: propDayBucket})
		if err != nil {
			return 0, 0, err
		}
		var v uint64
		for _, b := range series[0].Buckets {
			v += b.Values
		}
		return v, rows, nil
	}
	if s.DeviceValues, s.DeviceRowsRead, err = count("ad10"); err != nil {
		return err
	}
	if s.ProductValues, s.ProductRowsRead, err = count(""); err != nil {
		return err
	}
	devicesOfProduct := uint64(propDevices / propProducts)
	if s.DeviceValues != perSeries || s.ProductValues != perSeries*devicesOfProduct {
		return fmt.Errorf("1h x24 counts: device %d (want %d), product %d (want %d)", s.DeviceValues, perSeries, s.ProductValues, perSeries*devicesOfProduct)
	}
	p.Logf("props %d: 1h x24 of one device: %d values, %d rows read; product-wide: %d values, %d rows read",
		n, s.DeviceValues, s.DeviceRowsRead, s.ProductValues, s.ProductRowsRead)

	api.setDashboard(uncached)
	for _, b := range append(deviceBodies[:3:3], product) {
		var items []json.RawMessage
		if err := api.call(ctx, "POST", "/api/dashboard/_multi", json.RawMessage(b), &items); err != nil {
			return err
		}
		if len(items) != propDayBucket {
			return fmt.Errorf("1h x24: %d items", len(items))
		}
	}
	if s.Device, err = api.measureBodies(ctx, deviceBodies, p.Iterations); err != nil {
		return err
	}
	if s.Product, err = api.measureBodies(ctx, [][]byte{product}, p.Iterations); err != nil {
		return err
	}
	p.Logf("props %d: avg 1h x24 one device p50 %.2fms p99 %.2fms; product-wide p50 %.2fms p99 %.2fms",
		n, s.Device.P50, s.Device.P99, s.Product.P50, s.Product.P99)
	if p.Concurrency > 1 {
		q := func(name string, b []byte) dashQuery { return dashQuery{name: name, body: b} }
		runs := []dashRun{
			{query: q("props avg 1h x24, 50 devices", deviceBodies[0]), bodies: deviceBodies, db: uncached, requests: p.Requests / 4},
			{query: q("props avg 1h x24, 50 devices", deviceBodies[0]), bodies: deviceBodies, db: db, cached: true, requests: p.Requests},
			{query: q("props avg 1h x24, product-wide", product), db: db, cached: true, requests: p.Requests},
		}
		if s.Ceiling, s.Concurrent, err = api.concurrentRuns(ctx, p, fmt.Sprintf("props %d", n), runs); err != nil {
			return err
		}
	}
	return nil
}

// generateProps fills db with n property values (see the top of this
// file) unless bench_props_info says it already holds them.
func generateProps(ctx context.Context, p DashboardParams, db *tsdb.DB, n int, s *PropAggSize) (genInfo, error) {
	conn := db.Conn()
	reports := uint64(n / (propDevices * propProps))
	old, genSec, ok, err := storedGenInfo(ctx, db, "bench_props_info")
	if err != nil {
		return genInfo{}, err
	}
	if ok {
		var stored uint64
		err := conn.QueryRow(ctx, "SELECT count() FROM device_property").Scan(&stored)
		if err == nil && old.rows == reports && stored == uint64(n) {
			p.Logf("props %d: reusing %s", n, db.Database())
			s.Reused, s.GenerateSeconds = true, genSec
			return old, nil
		}
		p.Logf("props %d: %s is incomplete or of another size; regenerating", n, db.Database())
	}
	for _, st := range []string{"DROP TABLE IF EXISTS bench_props_info", "TRUNCATE TABLE " + storageTable(db, "device_property"),
		"TRUNCATE TABLE " + storageTable(db, "device_property_hourly")} {
		if err := conn.Exec(ctx, st); err != nil {
			return genInfo{}, fmt.Errorf("%s: %w", st, err)
		}
	}
	span := int64(propSpanDays * 24 * time.Hour / time.Millisecond)
	g := genInfo{rows: reports, startMs: time.Now().Truncate(time.Second).UnixMilli() - span, spanMs: span}
	var stmts []string
	for off := 0; off < n; off += dashChunk {
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO device_property (ts, product_id, device_id, property, value_type, num_value, str_value)
SELECT ts, concat('ap', toString(modulo(dev, %[4]d))), concat('ad', toString(dev)),
  concat('m', toString(k)), 'number', toFloat64(modulo(i * 7 + k * 13 + dev, 1000)) / 10, ''
FROM (SELECT dev, k, i, toInt64(%[1]d + intDiv(i * %[2]d, %[3]d)) AS ts
  FROM (SELECT modulo(j, %[5]d) AS dev, modulo(intDiv(j, %[5]d), %[6]d) AS k, intDiv(j, %[7]d) AS i
    FROM (SELECT number + %[8]d AS j FROM numbers(%[9]d))))`,
			g.startMs, g.spanMs, reports, propProducts, propDevices, propProps, propDevices*propProps, off, min(dashChunk, n-off)))
	}
	start := time.Now()
	if err := execParallel(ctx, db, stmts, p.GenWorkers, func(done, total int) {
		p.Logf("props %d: generated %d/%d chunks in %s", n, done, total, time.Since(start).Round(time.Millisecond))
	}); err != nil {
		return genInfo{}, err
	}
	genTime := time.Since(start)
	start = time.Now()
	// Merged, as a live table is once merges caught up (on a cluster,
	// shards other than the leader's refuse it: see generateClickHouse).
	if err := conn.Exec(ctx, "OPTIMIZE TABLE "+storageTable(db, "device_property")+" FINAL"); err != nil && db.Cluster() == "" {
		return genInfo{}, err
	}
	s.OptimizeSeconds = time.Since(start).Seconds()
	var stored uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM device_property").Scan(&stored); err != nil {
		return genInfo{}, err
	}
	if stored != uint64(n) {
		return genInfo{}, fmt.Errorf("generated %d property values, want %d", stored, n)
	}
	s.GenerateSeconds = genTime.Seconds()
	p.Logf("props %d: generated in %s, optimize %.1fs", n, genTime.Round(time.Millisecond), s.OptimizeSeconds)
	for _, st := range []string{
		"CREATE TABLE bench_props_info (rows UInt64, start_ms Int64, span_ms Int64, gen_seconds Float64) ENGINE = TinyLog",
		fmt.Sprintf("INSERT INTO bench_props_info SELECT toUInt64(%d), toInt64(%d), toInt64(%d), toFloat64(%f)",
			g.rows, g.startMs, g.spanMs, genTime.Seconds()),
	} {
		if err := conn.Exec(ctx, st); err != nil {
			return genInfo{}, fmt.Errorf("%s: %w", st, err)
		}
	}
	return g, nil
}
