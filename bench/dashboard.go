package bench

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sort"
	"time"

	"devicehub/tsdb"
)

// DashboardParams configure RunDashboard.
type DashboardParams struct {
	// Sizes are the numbers of messages generated in ClickHouse, one
	// database devicehub_bench_<size> each (at least 10000). Default 1M.
	Sizes []int
	// PGSizes are the sizes also loaded into PostgreSQL for the baseline
	// (a subset of Sizes; others are ignored). Default none.
	PGSizes []int
	// Iterations is the number of timed requests per query kind, after
	// warm-up. Default 200.
	Iterations int
	// Concurrency > 1 adds closed-loop runs with that many clients (1d x30
	// without and with the result cache, 1M x12 with it, the property
	// aggregates likewise, each beside a bare Fiber handler under the same
	// load), Requests requests each.
	Concurrency int
	// Requests is the number of measured requests of each concurrent run
	// (a quarter of it for the runs ClickHouse answers every request of).
	// Default 20000.
	Requests int
	// PropRows is the size of the property-aggregate scenario: property
	// values generated in <Prefix>_props_<rows>, rounded down to a multiple
	// of 10000 (1000 devices x 10 properties). Default 1M; negative skips it.
	PropRows int
	// PGIterations is the number of timed PostgreSQL queries per kind.
	// Default 5.
	PGIterations int
	// KeepData leaves the generated ClickHouse databases and PostgreSQL
	// tables in place, so the next run with the same sizes reuses them;
	// without it they are dropped at the end.
	KeepData bool
	// GenWorkers is the number of concurrent INSERT ... SELECT statements
	// filling ClickHouse. Default 2.
	GenWorkers int
	// Prefix names the databases: <Prefix>_<size> in ClickHouse and
	// <Prefix> in PostgreSQL. Default "devicehub_bench".
	Prefix string
	// ClickHouseAddr defaults to $DEVICEHUB_CLICKHOUSE_ADDR or
	// 127.0.0.1:9000; PostgresDSN (server, no database) to
	// $DEVICEHUB_TEST_POSTGRES or postgres://postgres@127.0.0.1:5432.
	ClickHouseAddr string
	PostgresDSN    string
	// Logf, if set, receives progress lines.
	Logf func(format string, args ...any)

	// ClickHouseCluster spreads the generated tables over this cluster
	// (tsdb.Options.Cluster). Default "": one server.
	ClickHouseCluster string

	// MixedMessages sizes the mixed scenario (dashboard_mixed.go):
	// messages generated in <Prefix>_mixed_<n>, each with two property
	// values. Default 1M; negative skips it. It runs with Concurrency
	// clients (> 1), MixedRequests measured requests through the result
	// cache (MixedUncachedRequests for each uncached run), while ingest stores
	// MixedIngestRate reports/s (default 10000; negative: none).
	MixedMessages   int
	MixedRequests   int
	MixedIngestRate int
	// MixedUncachedRequests are the measured requests of each mixed run
	// without the result cache (default a quarter of MixedRequests).
	MixedUncachedRequests int
	// MixedKinds are the kinds of distinct requests measured, each in its
	// runs (MixedAll, MixedCounts, MixedAggs). Default MixedAll.
	MixedKinds []string
}

// DashboardResult is the outcome of RunDashboard.
type DashboardResult struct {
	ClickHouseVersion string          `json:"clickhouseVersion"`
	TimeZone          string          `json:"timeZone"`
	Iterations        int             `json:"iterations"`
	Concurrency       int             `json:"concurrency"`
	PGIterations      int             `json:"pgIterations"`
	Sizes             []DashboardSize `json:"sizes"`
	// Props is the property-aggregate scenario (absent if skipped).
	Props *PropAggSize `json:"props,omitempty"`
	// Mixed is the mixed scenario (absent if skipped).
	Mixed *MixedResult `json:"mixed,omitempty"`
}

// DashboardSize holds the figures of one data size.
type DashboardSize struct {
	Rows         int64 `json:"rows"`
	PropertyRows int64 `json:"propertyRows"`
	// PropertyDevices devices carry all 14 properties in every message;
	// HistoryDepth values per property exist for the history device.
	PropertyDevices int  `json:"propertyDevices"`
	Reused          bool `json:"reused"`
	// GenerateSeconds is the time of the INSERT ... SELECT statements (when
	// Reused, as recorded by the run that generated the data).
	GenerateSeconds float64 `json:"generateSeconds"`
	MessagesPerSec  float64 `json:"messagesPerSec,omitempty"`
	OptimizeSeconds float64 `json:"optimizeSeconds"`
	// Through HTTP, sequential.
	Day30   Latency `json:"day30"`
	Month12 Latency `json:"month12"`
	History Latency `json:"history"`
	// The same message counts of every product by a user whose role is
	// limited to the 10 products holding the messages (the same answer:
	// the cost of the product scope alone, one series per product summed);
	// *Scope are its p50 over the administrator's (above 1.05: more than
	// 5%). The concurrent runs add a user limited to one product.
	Day30Limited   Latency `json:"day30Limited"`
	Month12Limited Latency `json:"month12Limited"`
	Day30Scope     float64 `json:"day30ScopeRatio"`
	Month12Scope   float64 `json:"month12ScopeRatio"`
	// Through HTTP with Concurrency clients (absent if Concurrency <= 1),
	// beside the bare Fiber handler under the same load.
	Concurrent []DashLoad  `json:"concurrent,omitempty"`
	Ceiling    *LoadResult `json:"ceiling,omitempty"`
	// Checks: totals of the buckets answered and the generator's count of
	// messages in the same window; items of the history answer.
	Day30Total, Day30Want     uint64 `json:"-"`
	Month12Total, Month12Want uint64 `json:"-"`
	HistoryItems              int    `json:"historyItems"`
	HistoryWant               int    `json:"historyWant"`
	// PostgreSQL baseline, when this size is in PGSizes.
	PG *PGBaseline `json:"pg,omitempty"`
}

// Latency summarises timed requests, in milliseconds.
type Latency struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50Ms"`
	P99  float64 `json:"p99Ms"`
	Max  float64 `json:"maxMs"`
	Mean float64 `json:"meanMs"`
	RPS  float64 `json:"rps"` // completed requests per second of the run
}

// PGBaseline is the same aggregate computed by PostgreSQL from a plain
// message table.
type PGBaseline struct {
	Reused       bool    `json:"reused"`
	LoadSeconds  float64 `json:"loadSeconds"`
	Day30        Latency `json:"day30"`
	Month12      Latency `json:"month12"`
	Day30Total   uint64  `json:"day30Total"`
	Month12Total uint64  `json:"month12Total"`
	// RatioDay30/RatioMonth12 are PG p50 / ClickHouse-through-HTTP p50.
	RatioDay30   float64 `json:"ratioDay30"`
	RatioMonth12 float64 `json:"ratioMonth12"`
}

func (p DashboardParams) withDefaults() DashboardParams {
	if len(p.Sizes) == 0 {
		p.Sizes = []int{1_000_000}
	}
	if p.Iterations <= 0 {
		p.Iterations = 200
	}
	if p.PGIterations <= 0 {
		p.PGIterations = 5
	}
	if p.Requests <= 0 {
		p.Requests = 20000
	}
	if p.PropRows == 0 {
		p.PropRows = 1_000_000
	}
	if p.MixedMessages == 0 {
		p.MixedMessages = 1_000_000
	}
	if p.MixedRequests <= 0 {
		p.MixedRequests = p.Requests
	}
	if p.MixedIngestRate == 0 {
		p.MixedIngestRate = 10000
	}
	if p.MixedUncachedRequests <= 0 {
		p.MixedUncachedRequests = max(p.MixedRequests/4, 1)
	}
	if len(p.MixedKinds) == 0 {
		p.MixedKinds = []string{MixedAll}
	}
	if p.GenWorkers <= 0 {
		p.GenWorkers = 2
	}
	if p.Prefix == "" {
		p.Prefix = "devicehub_bench"
	}
	if p.ClickHouseAddr == "" {
		p.ClickHouseAddr = os.Getenv("DEVICEHUB_CLICKHOUSE_ADDR")
	}
	if p.ClickHouseAddr == "" {
		p.ClickHouseAddr = "127.0.0.1:9000"
	}
	if p.PostgresDSN == "" {
		p.PostgresDSN = os.Getenv("DEVICEHUB_TEST_POSTGRES")
	}
	if p.PostgresDSN == "" {
		p.PostgresDSN = "postgres://postgres@127.0.0.1:5432"
	}
	if p.Logf == nil {
		p.Logf = func(string, ...any) {}
	}
	return p
}

// dashZone is the platform time zone of the benchmark: day buckets end at
// Shanghai midnight, in ClickHouse's view and in PostgreSQL's query.
const dashZone = "Asia/Shanghai"

// RunDashboard generates each size, serves the dashboard API over HTTP on
// 127.0.0.1 and measures the message-count aggregates (1d x30, 1M x12) and
// a 10-deep history of 14 properties, plus the PostgreSQL baseline for the
// sizes in PGSizes.
func RunDashboard(ctx context.Context, p DashboardParams) (DashboardResult, error) {
	p = p.withDefaults()
	loc, err := time.LoadLocation(dashZone)
	if err != nil {
		return DashboardResult{}, err
	}
	for _, n := range p.Sizes {
		if n < dashDevices {
			return DashboardResult{}, fmt.Errorf("bench: size %d below %d (one message per device)", n, dashDevices)
		}
	}
	res := DashboardResult{TimeZone: dashZone, Iterations: p.Iterations, Concurrency: p.Concurrency, PGIterations: p.PGIterations}

	api, err := startDashAPI(ctx, p)
	if err != nil {
		return res, err
	}
	defer api.close()

	var pg *sql.DB
	if len(p.PGSizes) > 0 {
		if pg, err = openPGBench(ctx, p); err != nil {
			return res, err
		}
		defer pg.Close()
	}
	for _, n := range p.Sizes {
		s, err := runDashSize(ctx, p, api, pg, n, loc, &res)
		res.Sizes = append(res.Sizes, s)
		if err != nil {
			return res, fmt.Errorf("bench: size %d: %w", n, err)
		}
	}
	if p.PropRows > 0 {
		res.Props = &PropAggSize{}
		if err := runPropAggregates(ctx, p, api, loc, res.Props); err != nil {
			return res, fmt.Errorf("bench: property aggregates: %w", err)
		}
	}
	if p.MixedMessages > 0 && p.Concurrency > 1 {
		m, err := runMixed(ctx, p, api)
		res.Mixed = &m
		if err != nil {
			return res, fmt.Errorf("bench: mixed: %w", err)
		}
	}
	return res, nil
}

// genOptions are the options of ClickHouse database db of a scenario's
// data while it is generated (statements may run 15 minutes); the
// scenario then serves from it with QueryTimeout 0 (the default).
func genOptions(p DashboardParams, db string, loc *time.Location) tsdb.Options {
	opt := tsdb.DefaultOptions()
	opt.Addr, opt.Cluster = p.ClickHouseAddr, p.ClickHouseCluster
	opt.Database, opt.TimeZone = db, loc
	opt.QueryTimeout = 15 * time.Minute
	return opt
}

// closeGenDB closes gen, dropping its database unless the run keeps its
// data (-dash-keep).
func closeGenDB(p DashboardParams, gen *tsdb.DB) {
	if !p.KeepData {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = gen.DropDatabase(ctx)
	}
	gen.Close()
}

func runDashSize(ctx context.Context, p DashboardParams, api *dashAPI, pg *sql.DB, n int, loc *time.Location, res *DashboardResult) (DashboardSize, error) {
	s := DashboardSize{Rows: int64(n), PropertyDevices: dashPropDevices}
	opt := genOptions(p, fmt.Sprintf("%s_%d", p.Prefix, n), loc)
	gen, err := tsdb.Open(ctx, opt)
	if err != nil {
		return s, err
	}
	res.ClickHouseVersion = gen.ServerVersion().String()
	dropped := false
	defer func() {
		if !p.KeepData && !dropped {
			dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_ = gen.DropDatabase(dctx)
		}
		gen.Close()
	}()
	info, err := generateClickHouse(ctx, p, gen, n, &s)
	if err != nil {
		return s, err
	}

	// Serve from a connection pool with the default (short) timeouts,
	// without the result cache first (what each query costs), then with it.
	opt.QueryTimeout = 0
	opt.ResultTTL = -1
	uncached, err := tsdb.Open(ctx, opt)
	if err != nil {
		return s, err
	}
	defer uncached.Close()
	opt.ResultTTL = 0 // the default
	db, err := tsdb.Open(ctx, opt)
	if err != nil {
		return s, err
	}
	defer db.Close()
	api.setDashboard(uncached)

	end := time.UnixMilli(info.startMs + info.spanMs).In(loc)
	queries := dashQueries(end)
	// The generator's count of messages in each window, from the formula.
	for i, q := range queries[:2] {
		buckets, err := tsdb.Buckets(q.interval, q.from, end, loc, q.limit)
		if err != nil {
			return s, err
		}
		lo := buckets[len(buckets)-1]
		hi := bucketAfter(q.interval, buckets[0])
		want := info.countBefore(hi.UnixMilli()) - info.countBefore(lo.UnixMilli())
		if i == 0 {
			s.Day30Want = want
		} else {
			s.Month12Want = want
		}
	}
	s.HistoryWant = dashProps * min(dashHistory, info.perDevice())

	// Warm up, and check the answers.
	for range 3 {
		for i := range queries {
			items, total, err := api.check(ctx, queries[i].body)
			if err != nil {
				return s, fmt.Errorf("%s: %w", queries[i].name, err)
			}
			switch i {
			case 0:
				s.Day30Total = total
				if items != 30 {
					return s, fmt.Errorf("1d x30: %d buckets", items)
				}
			case 1:
				s.Month12Total = total
				if items != 12 {
					return s, fmt.Errorf("1M x12: %d buckets", items)
				}
			case 2:
				s.HistoryItems = items
			}
		}
	}
	if s.Day30Total != s.Day30Want || s.Month12Total != s.Month12Want || s.HistoryItems != s.HistoryWant {
		return s, fmt.Errorf("answers differ from the generator: 1d x30 %d (want %d), 1M x12 %d (want %d), history %d items (want %d)",
			s.Day30Total, s.Day30Want, s.Month12Total, s.Month12Want, s.HistoryItems, s.HistoryWant)
	}

	// The limited user's answers are the administrator's.
	for i, want := range []uint64{s.Day30Want, s.Month12Want} {
		if _, total, err := api.checkAs(ctx, api.limited, queries[i].body); err != nil || total != want {
			return s, fmt.Errorf("%s by the limited user: %d messages, want %d: %v", queries[i].name, total, want, err)
		}
	}
	lat := []*Latency{&s.Day30, &s.Month12, &s.History}
	for i := range queries {
		l, err := api.measure(ctx, queries[i].body, p.Iterations, 1)
		if err != nil {
			return s, fmt.Errorf("%s: %w", queries[i].name, err)
		}
		*lat[i] = l
		p.Logf("size %d: %s p50 %.2fms p99 %.2fms max %.2fms", n, queries[i].name, l.P50, l.P99, l.Max)
	}
	for i, l := range []*Latency{&s.Day30Limited, &s.Month12Limited} {
		if *l, err = api.measureAs(ctx, api.limited, queries[i].body, p.Iterations, 1); err != nil {
			return s, fmt.Errorf("%s by the limited user: %w", queries[i].name, err)
		}
		p.Logf("size %d: %s by the limited user p50 %.2fms p99 %.2fms max %.2fms", n, queries[i].name, l.P50, l.P99, l.Max)
	}
	if s.Day30.P50 > 0 && s.Month12.P50 > 0 {
		s.Day30Scope, s.Month12Scope = s.Day30Limited.P50/s.Day30.P50, s.Month12Limited.P50/s.Month12.P50
	}
	if p.Concurrency > 1 {
		runs := []dashRun{
			{query: queries[0], db: uncached, requests: p.Requests / 4},
			{query: queries[0], db: db, cached: true, requests: p.Requests},
			{query: queries[0], db: db, cached: true, requests: p.Requests, limited: true},
			{query: queries[0], db: db, cached: true, requests: p.Requests, limited: true, one: true},
			{query: queries[1], db: db, cached: true, requests: p.Requests},
			{query: queries[1], db: db, cached: true, requests: p.Requests, limited: true},
			{query: queries[1], db: db, cached: true, requests: p.Requests, limited: true, one: true},
		}
		if s.Ceiling, s.Concurrent, err = api.concurrentRuns(ctx, p, fmt.Sprintf("size %d", n), runs); err != nil {
			return s, err
		}
	}
	api.setDashboard(db)

	if pg != nil && containsInt(p.PGSizes, n) {
		b, err := runPGBaseline(ctx, p, pg, info, n, queries, loc)
		if b != nil {
			if b.Day30.P50 > 0 && s.Day30.P50 > 0 {
				b.RatioDay30 = b.Day30.P50 / s.Day30.P50
				b.RatioMonth12 = b.Month12.P50 / s.Month12.P50
			}
			s.PG = b
		}
		if err != nil {
			return s, fmt.Errorf("postgres: %w", err)
		}
		if b.Day30Total != s.Day30Want || b.Month12Total != s.Month12Want {
			return s, fmt.Errorf("postgres answers 1d x30 %d, 1M x12 %d; want %d, %d", b.Day30Total, b.Month12Total, s.Day30Want, s.Month12Want)
		}
	}
	if !p.KeepData {
		if err := gen.DropDatabase(ctx); err != nil {
			return s, err
		}
		dropped = true
	}
	return s, nil
}

// dashQuery is one timed _multi request.
type dashQuery struct {
	name     string
	interval string
	from     time.Time
	limit    int
	body     []byte
}

// dashQueries are 1d x30 and 1M x12 ending at end, and the history of the
// 14 properties of the history device, 10 deep.
func dashQueries(end time.Time) []dashQuery {
	agg := func(name, interval, format string, limit int, from time.Time) dashQuery {
		body := fmt.Sprintf(`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","group":"g",`+
			`"params":{"time":%q,"format":%q,"limit":%d,"from":%d,"to":%d}}]`, interval, format, limit, from.UnixMilli(), end.UnixMilli())
		return dashQuery{name: name, interval: interval, from: from, limit: limit, body: []byte(body)}
	}
	props := ""
	for i, name := range dashPropNames {
		if i > 0 {
			props += ","
		}
		props += fmt.Sprintf("%q", name)
	}
	hist := fmt.Sprintf(`[{"dashboard":"device","object":%q,"measurement":"properties","dimension":"history","group":"h",`+
		`"params":{"deviceId":%q,"history":%d,"properties":[%s]}}]`, dashHistoryProduct, dashHistoryDevice, dashHistory, props)
	return []dashQuery{
		agg("1d x30", tsdb.Day, "yyyy-MM-dd", 30, end.AddDate(0, 0, -29)),
		agg("1M x12", tsdb.Month, "yyyy-MM", 12, end.AddDate(0, -11, 0)),
		{name: "history 14x10", body: []byte(hist)},
	}
}

// bucketAfter is the start of the bucket following the one starting at b
// (hours: in a zone without DST, as dashZone).
func bucketAfter(interval string, b time.Time) time.Time {
	switch interval {
	case tsdb.Hour:
		return b.Add(time.Hour)
	case tsdb.FifteenMinutes:
		return b.Add(15 * time.Minute)
	case tsdb.Week:
		return time.Date(b.Year(), b.Month(), b.Day()+7, 0, 0, 0, 0, b.Location())
	case tsdb.Day:
		return time.Date(b.Year(), b.Month(), b.Day()+1, 0, 0, 0, 0, b.Location())
	case tsdb.Month:
		return time.Date(b.Year(), b.Month()+1, 1, 0, 0, 0, 0, b.Location())
	}
	panic("bench: interval " + interval)
}

// summarize computes the percentiles (nearest rank) of ds.
func summarize(ds []time.Duration, wall time.Duration) Latency {
	if len(ds) == 0 {
		return Latency{}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	rank := func(q float64) time.Duration {
		k := int(q*float64(len(ds))+0.999999) - 1
		return ds[max(0, min(k, len(ds)-1))]
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	l := Latency{N: len(ds), P50: ms(rank(0.50)), P99: ms(rank(0.99)), Max: ms(ds[len(ds)-1]), Mean: ms(sum) / float64(len(ds))}
	if wall > 0 {
		l.RPS = float64(len(ds)) / wall.Seconds()
	}
	return l
}

func containsInt(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}
