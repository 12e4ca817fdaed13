package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"devicehub/api"
	"devicehub/bench/testkit"
	"devicehub/meta/metatest"
	"devicehub/tsdb"
	"devicehub/tsdb/tsdbtest"
)

// BenchmarkDashboardCounts: one whole request of endpoint 14, a distinct
// message-count query of one product (a random interval of 15m, 1h, 1d,
// 1w or 1M, number of buckets and end, as the dashboard-mixed bench
// sends), over a real keep-alive connection with the administrator's
// token: Fiber, the token check, the body's checks and decoding, the
// product scope, the counts (tsdb, from memory) and the answer's
// encoding, with the client's side of the request in the same process
// (allocs/op counts both). Needs PostgreSQL and ClickHouse:
//
//	go test -run '^$' -bench DashboardCounts -benchmem ./api/
func BenchmarkDashboardCounts(b *testing.B) {
	db, base, admin, _ := benchServer(b, "bp")

	// 20,000 messages over the 90 days to now.
	now := time.Now()
	start := now.AddDate(0, 0, -90)
	var msgs []tsdb.Message
	for i := range 20000 {
		msgs = append(msgs, tsdb.Message{Time: start.Add(time.Duration(i) * 90 * 24 * time.Hour / 20000), ProductID: "bp",
			DeviceID: "bd", Direction: "up", MessageType: "REPORT_PROPERTY", MessageID: fmt.Sprint(i),
			Topic: "/bp/bd/properties/report", Payload: []byte("{}")})
	}
	if err := db.Insert(context.Background(), msgs, nil); err != nil {
		b.Fatal(err)
	}

	// Distinct bodies, sent in turn.
	r := rand.New(rand.NewPCG(1, 2))
	bodies := make([][]byte, 50000)
	for i := range bodies {
		interval, limit := tsdb.FifteenMinutes, 4+r.IntN(4*48-3)
		switch r.IntN(5) {
		case 0:
			interval, limit = tsdb.Hour, 24+r.IntN(24*6+1)
		case 1:
			interval, limit = tsdb.Day, 1+r.IntN(60)
		case 2:
			interval, limit = tsdb.Week, 1+r.IntN(26)
		case 3:
			interval, limit = tsdb.Month, 1+r.IntN(12)
		}
		to := start.Add(time.Duration(r.Int64N(int64(now.Sub(start)))))
		bodies[i] = fmt.Appendf(nil, `[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","group":"g",`+
			`"params":{"productId":"bp","time":%q,"limit":%d,"to":%d}}]`, interval, limit, to.UnixMilli())
	}
	runDashboardBench(b, base, admin.Token, bodies, []byte(`{"message":"success","result":[{"group":"g","data":{"value":`))
}

// runDashboardBench sends bodies in turn to endpoint 14 from 16 x
// GOMAXPROCS clients over keep-alive connections, each answer checked
// to start with ok; before the timer, 1,000 of them warm the tsdb's
// kept series up.
func runDashboardBench(b *testing.B, base, token string, bodies [][]byte, ok []byte) {
	hc := &fasthttp.HostClient{Addr: strings.TrimPrefix(base, "http://"), MaxConns: 64}
	defer hc.CloseIdleConnections()
	for i := range 1000 {
		res := testkit.API{Base: base, Token: token}.Send(b, "POST", "/api/dashboard/_multi", json.RawMessage(bodies[len(bodies)-1-i]))
		if res.HTTPStatus != 200 {
			b.Fatalf("warm-up: HTTP %d: %.300s", res.HTTPStatus, res.Raw)
		}
	}
	var seq atomic.Int64
	b.SetParallelism(16) // 16 x GOMAXPROCS clients
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, res := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(res)
		req.SetRequestURI(base + "/api/dashboard/_multi")
		req.Header.SetMethod("POST")
		req.Header.SetContentType("application/json")
		req.Header.Set("X-Access-Token", token)
		for pb.Next() {
			req.SetBodyRaw(bodies[(seq.Add(1)-1)%int64(len(bodies))])
			if err := hc.Do(req, res); err != nil {
				b.Error(err)
				return
			}
			if res.StatusCode() != 200 || !bytes.HasPrefix(res.Body(), ok) {
				b.Errorf("HTTP %d: %.300s", res.StatusCode(), res.Body())
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

// BenchmarkDashboardAggregates: one whole request of endpoint 14, a
// distinct product-wide property aggregate query (one of two numeric
// properties, one of the seven aggregates, 1h x 168 buckets ending at a
// random instant of the last 60 days, as the dashboard-mixed bench's
// aggs kind sends), as BenchmarkDashboardCounts measures it: the
// aggregates come from the tsdb's kept hourly partials (memory), so the
// figure is mostly the API's own work. Needs PostgreSQL and ClickHouse:
//
//	go test -run '^$' -bench DashboardAggregates -benchmem ./api/
func BenchmarkDashboardAggregates(b *testing.B) {
	db, base, admin, product := benchServer(b, "ap")
	product["metadata"] = `{"properties":[{"id":"p0","name":"P0","valueType":{"type":"long"}},` +
		`{"id":"p1","name":"P1","valueType":{"type":"float","scale":2}}]}`
	admin.Call(b, "PATCH", "/api/device-product", product, nil)

	// 40,000 values of p0 (whole numbers) and p1 over the 60 days to now.
	now := time.Now()
	start := now.AddDate(0, 0, -60)
	r := rand.New(rand.NewPCG(1, 2))
	var ps []tsdb.PropertyValue
	for i := range 20000 {
		at := start.Add(time.Duration(i) * 60 * 24 * time.Hour / 20000)
		ps = append(ps,
			tsdb.PropertyValue{Time: at, ProductID: "ap", DeviceID: fmt.Sprint("ad", i%2), Property: "p0", ValueType: "number", Num: float64(r.IntN(1000))},
			tsdb.PropertyValue{Time: at, ProductID: "ap", DeviceID: fmt.Sprint("ad", i%2), Property: "p1", ValueType: "number", Num: r.NormFloat64() * 50})
	}
	if err := db.Insert(context.Background(), nil, ps); err != nil {
		b.Fatal(err)
	}

	aggs := []string{tsdb.AggAvg, tsdb.AggMin, tsdb.AggMax, tsdb.AggSum, tsdb.AggCount, tsdb.AggFirst, tsdb.AggLast}
	bodies := make([][]byte, 50000)
	for i := range bodies {
		to := start.Add(time.Duration(r.Int64N(int64(now.Sub(start)))))
		from, err := tsdb.RangeStart(tsdb.Hour, to, 24*7, shanghai)
		if err != nil {
			b.Fatal(err)
		}
		bodies[i] = fmt.Appendf(nil, `[{"dashboard":"device","object":"ap","measurement":"properties","dimension":"agg","group":"g",`+
			`"params":{"properties":["p%d"],"agg":%q,"time":"1h","limit":168,"from":%d,"to":%d}}]`,
			r.IntN(2), aggs[r.IntN(len(aggs))], from.UnixMilli(), to.UnixMilli())
	}
	runDashboardBench(b, base, admin.Token, bodies, []byte(`{"message":"success","result":[{"group":"g","property":"p`))
}

// BenchmarkDashboardHistory: one whole request of endpoint 14, a history
// query of one device's latest 100 values of one property (a float with a
// scale, or a string, in turn, both in the device's thing model), as
// BenchmarkDashboardCounts measures it: the values are read from
// ClickHouse on every request, then shaped with their definitions and
// encoded. Needs PostgreSQL and ClickHouse:
//
//	go test -run '^$' -bench DashboardHistory -benchmem ./api/
func BenchmarkDashboardHistory(b *testing.B) {
	db, base, admin, product := benchServer(b, "hp")
	product["metadata"] = `{"properties":[{"id":"p0","name":"P0","valueType":{"type":"float","scale":2}},` +
		`{"id":"p1","name":"P1","valueType":{"type":"string"}}]}`
	admin.Call(b, "PATCH", "/api/device-product", product, nil)
	admin.Call(b, "POST", "/api/device/instance", map[string]any{"id": "hd", "name": "hd", "productId": "hp"}, nil)

	// 20,000 values of each property over the 10 days to now.
	now := time.Now()
	start := now.AddDate(0, 0, -10)
	r := rand.New(rand.NewPCG(1, 2))
	var ps []tsdb.PropertyValue
	for i := range 20000 {
		at := start.Add(time.Duration(i) * 10 * 24 * time.Hour / 20000)
		ps = append(ps,
			tsdb.PropertyValue{Time: at, ProductID: "hp", DeviceID: "hd", Property: "p0", ValueType: "number", Num: r.NormFloat64() * 50},
			tsdb.PropertyValue{Time: at, ProductID: "hp", DeviceID: "hd", Property: "p1", ValueType: "string", Str: fmt.Sprint("state <", r.IntN(1000), "> & more")})
	}
	if err := db.Insert(context.Background(), nil, ps); err != nil {
		b.Fatal(err)
	}

	bodies := make([][]byte, 1000)
	for i := range bodies {
		bodies[i] = fmt.Appendf(nil, `[{"dashboard":"device","object":"hp","measurement":"properties","dimension":"history","group":"g",`+
			`"params":{"deviceId":"hd","history":100,"properties":["p%d"]}}]`, i%2)
	}
	runDashboardBench(b, base, admin.Token, bodies, []byte(`{"message":"success","result":[{"group":"g","data":{"value":{"id":`))
}

// benchServer serves the API of a new metadata store and tsdb over a real
// listener, logs in as the administrator and creates product id; the
// product's body is returned for changes.
func benchServer(b *testing.B, id string) (*tsdb.DB, string, testkit.API, map[string]any) {
	store := metatest.NewStore(b)
	db := tsdbtest.NewDB(b, shanghai)
	reg := prometheus.NewRegistry()
	srv := api.New(api.DefaultOptions(), api.Deps{
		Auth: store, Products: store, Roles: store, Devices: store, Audit: store, Models: store, Dashboard: db,
		Registry: reg, Gatherer: reg,
	})
	base := testkit.Serve(b, srv.App().Listener, srv.Shutdown)
	admin := testkit.Login(b, base, "admin", "admin123")
	product := map[string]any{"id": id, "name": "Bench product",
		"classifiedId": "meter", "modelFrom": "custom", "accessId": "mqtt-direct", "deviceType": "device"}
	admin.Call(b, "POST", "/api/device/product", product, nil)
	return db, base, admin, product
}
