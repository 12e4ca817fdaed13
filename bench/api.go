package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
)

// APIParams configure RunAPI. Zero fields take the defaults noted.
type APIParams struct {
	Devices     int    `json:"devices"`     // seeded devices over 10 products, default 100000
	Products    int    `json:"products"`    // seeded products (10 of them hold the devices), default 1000
	Concurrency int    `json:"concurrency"` // clients in flight, default 16
	Requests    int    `json:"requests"`    // measured requests per query, default 2000
	Warmup      int    `json:"warmup"`      // per query, default 100
	SkipCeiling bool   `json:"skipCeiling"`
	PostgresDSN string `json:"postgresDsn"` // server, no database; default as RunCommands
	// Progress, if set, receives a live status line; Logf setup steps.
	Progress io.Writer                        `json:"-"`
	Logf     func(format string, args ...any) `json:"-"`
}

func (p APIParams) withDefaults() APIParams {
	if p.Devices <= 0 {
		p.Devices = 100_000
	}
	if p.Products < 10 {
		p.Products = 1000
	}
	if p.Concurrency <= 0 {
		p.Concurrency = 16
	}
	if p.Requests <= 0 {
		p.Requests = 2000
	}
	if p.Warmup <= 0 {
		p.Warmup = 100
	}
	p.PostgresDSN = pgServerDSN(p.PostgresDSN)
	if p.Logf == nil {
		p.Logf = func(string, ...any) {}
	}
	return p
}

// APIResult is what RunAPI measured.
type APIResult struct {
	Params  APIParams        `json:"params"`
	Queries []APIQueryResult `json:"queries"`
	// Ceiling: the bare Fiber handler with the same load and a body of the
	// same size.
	Ceiling *LoadResult `json:"ceiling,omitempty"`
	// PeakRSS is the peak VmRSS of this process during the queries: the
	// API server (in process) and its load clients together.
	PeakRSS int64 `json:"peakRssBytes"`
}

// APIQueryResult is one kind of list query.
type APIQueryResult struct {
	Name     string     `json:"name"`
	Path     string     `json:"path"`
	Example  string     `json:"example"` // body of request 0
	Load     LoadResult `json:"load"`
	P50Ratio float64    `json:"p50Ratio,omitempty"` // to the ceiling's p50
	P99Ratio float64    `json:"p99Ratio,omitempty"`
	RPSRatio float64    `json:"rpsRatio,omitempty"`
}

func (r APIResult) String() string {
	s := fmt.Sprintf("api: %d devices, %d products, %d concurrent", r.Params.Devices, r.Params.Products, r.Params.Concurrency)
	for _, q := range r.Queries {
		s += fmt.Sprintf("\n  %-22s %s", q.Name, q.Load)
		if r.Ceiling != nil {
			s += fmt.Sprintf(" [p50 x%.1f, rps %.2f of ceiling]", q.P50Ratio, q.RPSRatio)
		}
	}
	if r.Ceiling != nil {
		s += fmt.Sprintf("\n  %-22s %s", "bare fiber ceiling", r.Ceiling)
	}
	s += fmt.Sprintf("\n  peak RSS %d MiB (API server and load clients, one process)", r.PeakRSS>>20)
	return s
}

var apiRooms = []string{"Kitchen", "Garage", "Attic", "Office", "Lab", "Basement", "Roof", "Hall"}

type apiQuery struct {
	name, path string
	body       func(i int) string
	check      func(total int, items int) bool
}

// apiQueries are the list queries of the scenario: like and eq terms on
// the columns a UI filters by, one page of 25 with its total.
func apiQueries(p APIParams) []apiQuery {
	page := func(terms string) string {
		return `{"pageIndex":0,"pageSize":25,"terms":[` + terms + `]}`
	}
	like := func(col, v string) string { return fmt.Sprintf(`{"column":%q,"termType":"like","value":%q}`, col, v) }
	eq := func(col string, v any) string {
		js, _ := json.Marshal(v)
		return fmt.Sprintf(`{"column":%q,"termType":"eq","value":%s,"type":"and"}`, col, js)
	}
	any1 := func(total, items int) bool { return total >= 1 && items >= 1 }
	return []apiQuery{
		{"devices like name", "/api/device-instance/_query", func(i int) string {
			return page(like("name", fmt.Sprintf("%%meter %d%%", 100+i%900)))
		}, any1},
		{"devices eq product+like", "/api/device-instance/_query", func(i int) string {
			return page(eq("productId", fmt.Sprintf("product-%d", i%10)) + "," + like("name", "%"+apiRooms[i%len(apiRooms)]+"%"))
		}, any1},
		{"products like name", "/api/device-product/_query", func(i int) string {
			return page(like("name", fmt.Sprintf("%%Product %d%%", 1+i%9)))
		}, any1},
		{"products eq state+like", "/api/device-product/_query", func(i int) string {
			return page(eq("state", 1) + "," + like("name", fmt.Sprintf("%%Product %d%%", 1+i%9)))
		}, any1},
	}
}

// RunAPI seeds products and devices in a fresh PostgreSQL database,
// serves the API on 127.0.0.1 and measures each list query with
// p.Concurrency keep-alive clients, then the bare-Fiber ceiling.
func RunAPI(ctx context.Context, p APIParams) (APIResult, error) {
	p = p.withDefaults()
	res := APIResult{Params: p}
	srv, err := startBenchServer(ctx, p.PostgresDSN, "devicehub_bench_api", p.Concurrency, nil)
	if err != nil {
		return res, err
	}
	defer srv.close()
	p.Logf("api: seeding %d products and %d devices", p.Products, p.Devices)
	for _, s := range []string{
		fmt.Sprintf(`INSERT INTO products (id, name, device_type, state, classified_id, create_time)
			SELECT 'product-' || i, 'Product ' || i, (ARRAY['device','gateway'])[i %% 2 + 1], i %% 2, 'class-' || (i %% 3),
				now() - make_interval(secs => i)
			FROM generate_series(0, %d) AS i`, p.Products-1),
		fmt.Sprintf(`INSERT INTO devices (id, name, product_id, state, secure_id, secure_key, creator_id, create_time)
			SELECT 'dev-' || lpad(i::text, 7, '0'),
				(ARRAY['Kitchen','Garage','Attic','Office','Lab','Basement','Roof','Hall'])[i %% 8 + 1] || ' meter ' || i,
				'product-' || (i %% 10),
				(ARRAY['notActive','offline','online'])[i %% 3 + 1],
				'dev-' || i, md5(i::text), 'admin',
				now() - make_interval(secs => i)
			FROM generate_series(1, %d) AS i`, p.Devices),
		`VACUUM ANALYZE devices`,
		`VACUUM ANALYZE products`,
	} {
		if _, err := srv.store.DB().ExecContext(ctx, s); err != nil {
			return res, fmt.Errorf("bench: seed: %w", err)
		}
	}

	// The server and the load clients share this process, so the peak is
	// theirs together. Sampled over the queries only (the ceiling has a
	// server of its own); stopRSS returns the same peak if called again.
	stopRSS := rssSampler()
	defer stopRSS()
	var longest int
	for _, q := range apiQueries(p) {
		longest = max(longest, len(q.body(0)))
		r := APIQueryResult{Name: q.name, Path: q.path, Example: q.body(0)}
		// Every kind answers sensibly before it is timed.
		var pg struct {
			Total int               `json:"total"`
			Data  []json.RawMessage `json:"data"`
		}
		if err := srv.call(ctx, "POST", q.path, json.RawMessage(r.Example), &pg); err != nil {
			return res, err
		}
		if !q.check(pg.Total, len(pg.Data)) {
			return res, fmt.Errorf("bench: %s: total %d, %d items for %s", q.name, pg.Total, len(pg.Data), r.Example)
		}
		do := func(ctx context.Context, i int) error {
			raw, err := srv.do(ctx, "POST", q.path, bytes.NewBufferString(q.body(i)))
			if err == nil && !bytes.Contains(raw, []byte(`"total":`)) {
				err = fmt.Errorf("bench: %s: no page: %.200s", q.name, raw)
			}
			return err
		}
		p.Logf("api: %s", q.name)
		r.Load, err = runLoad(ctx, loadSpec{Name: "api " + q.name, Concurrency: p.Concurrency, Requests: p.Requests,
			Warmup: p.Warmup, Do: do, Progress: p.Progress})
		res.Queries = append(res.Queries, r)
		if err != nil {
			return res, err
		}
		if r.Load.Errors > 0 {
			return res, fmt.Errorf("bench: %s: %d errors, first: %s", q.name, r.Load.Errors, r.Load.FirstError)
		}
	}
	res.PeakRSS = stopRSS()
	if !p.SkipCeiling {
		p.Logf("api: bare Fiber ceiling")
		c, err := FiberCeiling(ctx, CeilingParams{Concurrency: p.Concurrency, Requests: p.Requests, Warmup: p.Warmup,
			Method: "POST", Body: bytes.Repeat([]byte{' '}, longest), Progress: p.Progress})
		if err != nil {
			return res, err
		}
		res.Ceiling = &c
		for i := range res.Queries {
			q := &res.Queries[i]
			q.P50Ratio = Ratio(q.Load.Latency.P50Ms, c.Latency.P50Ms)
			q.P99Ratio = Ratio(q.Load.Latency.P99Ms, c.Latency.P99Ms)
			q.RPSRatio = Ratio(q.Load.SustainedRPS, c.SustainedRPS)
		}
	}
	return res, nil
}
