package bench

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRunDashboardSmall checks the generator against the API on 20000
// messages: the buckets of 1d x30 and 1M x12 add up to the messages the
// generator put in those windows, per-day counts add up to every message,
// the history has 14 properties x min(10, messages of the device), and
// PostgreSQL gives the same totals. Correctness only, not timing.
// Serial: its runs measure this process's CPU (ingest alone, each load).
// Its bound is a hang's, not a speed's: on a slow 2-core machine, beside
// the other packages' tests, it took over 2 minutes (59 s alone).
func TestRunDashboardSmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	const n = 20000
	res, err := RunDashboard(ctx, DashboardParams{
		Sizes: []int{n}, PGSizes: []int{n}, Iterations: 4, Concurrency: 2, Requests: 40, PGIterations: 1, PropRows: 300000,
		MixedMessages: 20000, MixedRequests: 40, MixedIngestRate: 500, MixedKinds: []string{MixedAll, MixedCounts, MixedAggs},
		Prefix: "devicehub_benchtest_" + randHex(4), Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sizes) != 1 {
		t.Fatalf("%d sizes", len(res.Sizes))
	}
	// The mixed scenario: answers checked under ingest, none wrong (the
	// run fails otherwise), something stored meanwhile; the runs of each
	// kind (3 mixed, 2 counts, 3 aggregates), and ingest's own CPU.
	if m := res.Mixed; m == nil || m.Checks == 0 || m.Failures != 0 || len(m.Runs) != 8 || len(m.IngestRates) != 8 || m.IngestStored == 0 ||
		m.IngestAlone == nil || m.IngestAlone.Messages == 0 {
		t.Fatalf("mixed: %+v", m)
	}
	s := res.Sizes[0]
	if s.Rows != n || s.Reused {
		t.Fatalf("rows %d reused %v", s.Rows, s.Reused)
	}
	// 20000 messages over 365 days: about 55 a day.
	if s.Day30Total != s.Day30Want || s.Day30Want < 30*50 || s.Day30Want > 30*60 {
		t.Errorf("1d x30: API %d, generator %d", s.Day30Total, s.Day30Want)
	}
	// The 12 months start 11 months before the end (AddDate): 334 days
	// at least (on the 30th of November, December's 30th), 365 at most.
	if s.Month12Total != s.Month12Want || s.Month12Want < n*333/365 || s.Month12Want > n {
		t.Errorf("1M x12: API %d, generator %d", s.Month12Total, s.Month12Want)
	}
	if s.HistoryItems != 14*2 || s.HistoryWant != 14*2 {
		t.Errorf("history: %d items, want %d (14 properties x 2 messages)", s.HistoryItems, s.HistoryWant)
	}
	if s.PropertyRows != 14*100*2 {
		t.Errorf("property rows %d", s.PropertyRows)
	}
	if s.PG == nil || s.PG.Day30Total != s.Day30Want || s.PG.Month12Total != s.Month12Want {
		t.Errorf("postgres: %+v, want %d, %d", s.PG, s.Day30Want, s.Month12Want)
	}
	if s.Day30.N != 4 || s.History.N != 4 {
		t.Errorf("latency samples: %+v %+v", s.Day30, s.History)
	}
	// The limited user's message counts (checked equal to the
	// administrator's), timed beside them.
	if s.Day30Limited.N != 4 || s.Month12Limited.N != 4 || s.Day30Scope <= 0 || s.Month12Scope <= 0 {
		t.Errorf("limited user: %+v %+v, ratios %v %v", s.Day30Limited, s.Month12Limited, s.Day30Scope, s.Month12Scope)
	}
	// Concurrent runs: 1d x30 without and with the result cache, then by
	// the users limited to 10 products and to 1, 1M x12 and by both,
	// beside the bare Fiber handler.
	if s.Ceiling == nil || s.Ceiling.Requests != 40 || len(s.Concurrent) != 7 || s.Concurrent[0].Cached || !s.Concurrent[1].Cached ||
		s.Concurrent[1].Load.Requests != 40 || s.Concurrent[0].Load.Requests != 10 || s.Concurrent[1].Load.Errors != 0 ||
		!s.Concurrent[2].Limited || s.Concurrent[2].ScopeRPSRatio <= 0 || !s.Concurrent[3].Limited || s.Concurrent[3].ScopeRPSRatio <= 0 ||
		s.Concurrent[4].Limited || !s.Concurrent[6].Limited {
		t.Errorf("concurrent runs: ceiling %+v, runs %+v", s.Ceiling, s.Concurrent)
	}
	// Property aggregates: 300000 values are 30 reports, one a day, of 1000
	// devices x 10 properties; the answers were checked against the
	// generator.
	pa := res.Props
	if pa == nil || pa.Rows != 300000 || pa.DeviceValues == 0 || pa.Device.N != 4 || pa.Product.N != 4 || len(pa.Concurrent) != 3 || pa.Ceiling == nil {
		t.Fatalf("property aggregates: %+v", pa)
	}
	if pa.DeviceRowsRead == 0 || pa.DeviceRowsRead > 20000 || pa.ProductValues != 100*pa.DeviceValues {
		t.Errorf("property aggregates read %d rows for %d values of one device; %d values product-wide",
			pa.DeviceRowsRead, pa.DeviceValues, pa.ProductValues)
	}
	if _, err := json.Marshal(res); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkDashboard measures the dashboard queries through HTTP at 1M
// messages, or at the sizes in $DEVICEHUB_BENCH_ROWS (comma-separated, e.g.
// 1000000,10000000,100000000). $DEVICEHUB_BENCH_PG_ROWS lists the sizes also
// loaded into PostgreSQL (default: 1M when measured), $DEVICEHUB_BENCH_ITER
// the timed requests per query (default 200), $DEVICEHUB_BENCH_CONC the
// clients of the concurrent runs (default 4), $DEVICEHUB_BENCH_REQUESTS the
// requests of each (default 2000), $DEVICEHUB_BENCH_PROP_ROWS the property
// values of the property-aggregate scenario (default 1M). Generated data
// is kept for the next run unless $DEVICEHUB_BENCH_DROP=1;
// $DEVICEHUB_BENCH_OUT names a file for the result as JSON. Use -v to see
// every progress line.
//
//	go test -run '^$' -bench BenchmarkDashboard -benchtime 1x -v ./bench/
func BenchmarkDashboard(b *testing.B) {
	sizes := envInts(b, "DEVICEHUB_BENCH_ROWS", []int{1_000_000})
	pgDefault := []int{}
	if containsInt(sizes, 1_000_000) {
		pgDefault = []int{1_000_000}
	}
	p := DashboardParams{
		Sizes:       sizes,
		PGSizes:     envInts(b, "DEVICEHUB_BENCH_PG_ROWS", pgDefault),
		Iterations:  envInts(b, "DEVICEHUB_BENCH_ITER", []int{200})[0],
		Concurrency: envInts(b, "DEVICEHUB_BENCH_CONC", []int{4})[0],
		Requests:    envInts(b, "DEVICEHUB_BENCH_REQUESTS", []int{2000})[0],
		PropRows:    envInts(b, "DEVICEHUB_BENCH_PROP_ROWS", []int{1_000_000})[0],
		KeepData:    os.Getenv("DEVICEHUB_BENCH_DROP") != "1",
		Logf:        b.Logf,
	}
	var res DashboardResult
	for b.Loop() {
		var err error
		if res, err = RunDashboard(context.Background(), p); err != nil {
			b.Fatal(err)
		}
	}
	if pa := res.Props; pa != nil {
		sfx := "@" + strconv.Itoa(int(pa.Rows))
		b.ReportMetric(pa.Device.P50, "prop_device_p50_ms"+sfx)
		b.ReportMetric(pa.Device.P99, "prop_device_p99_ms"+sfx)
		b.ReportMetric(pa.Product.P50, "prop_product_p50_ms"+sfx)
		b.ReportMetric(pa.Product.P99, "prop_product_p99_ms"+sfx)
	}
	for _, s := range res.Sizes {
		sfx := "@" + strconv.Itoa(int(s.Rows))
		b.ReportMetric(s.Day30.P50, "day30_p50_ms"+sfx)
		b.ReportMetric(s.Day30.P99, "day30_p99_ms"+sfx)
		b.ReportMetric(s.Month12.P50, "month12_p50_ms"+sfx)
		b.ReportMetric(s.Month12.P99, "month12_p99_ms"+sfx)
		b.ReportMetric(s.History.P50, "history_p50_ms"+sfx)
		b.ReportMetric(s.History.P99, "history_p99_ms"+sfx)
		if s.PG != nil {
			b.ReportMetric(s.PG.Day30.P50, "pg_day30_p50_ms"+sfx)
			b.ReportMetric(s.PG.Month12.P50, "pg_month12_p50_ms"+sfx)
			b.ReportMetric(s.PG.RatioDay30, "pg/ch_day30"+sfx)
			b.ReportMetric(s.PG.RatioMonth12, "pg/ch_month12"+sfx)
		}
	}
	js, _ := json.MarshalIndent(res, "", "  ")
	if out := os.Getenv("DEVICEHUB_BENCH_OUT"); out != "" {
		if err := os.WriteFile(out, js, 0o644); err != nil {
			b.Error(err)
		}
	}
	b.Logf("result:\n%s", js)
}

func envInts(b *testing.B, name string, def []int) []int {
	v := strings.TrimSpace(os.Getenv(name))
	if v == "" {
		return def
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		out = append(out, n)
	}
	return out
}
