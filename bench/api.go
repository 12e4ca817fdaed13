package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"devicehub/meta"
)

// APIParams configure RunAPI. Zero fields take the defaults noted.
type APIParams struct {
	Devices     int `json:"devices"`     // seeded devices over 10 products, default 100000
	Products    int `json:"products"`    // seeded products (10 of them hold the devices), default 1000
	Concurrency int `json:"concurrency"` // clients in flight, default 16
	Requests    int `json:"requests"`    // measured requests per query, default 2000
	// CachedRequests are the measured requests per query with the page
	// cache warm, and of the bare-Fiber ceiling, default 50000 (a run of
	// a few seconds: ten times as fast as without).
	CachedRequests int  `json:"cachedRequests"`
	Warmup         int  `json:"warmup"` // per query, default 100
	SkipCeiling    bool `json:"skipCeiling"`
	// The devicehub child's broker (its presence client connects even
	// without the ingest role); default $DEVICEHUB_MQTT_URL or
	// tcp://127.0.0.1:1884.
	BrokerURL string `json:"brokerUrl"`
	// Progress, if set, receives a live status line.
	Progress io.Writer `json:"-"`
	ChildParams
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
	if p.CachedRequests <= 0 {
		p.CachedRequests = 50_000
	}
	if p.BrokerURL == "" {
		p.BrokerURL = envDefault("DEVICEHUB_MQTT_URL", "tcp://127.0.0.1:1884")
	}
	p.childDefaults()
	return p
}

// APIResult is what RunAPI measured.
type APIResult struct {
	Params  APIParams        `json:"params"`
	Queries []APIQueryResult `json:"queries"`
	// Ceiling: the bare Fiber handler with the same load and a body of the
	// same size.
	Ceiling *LoadResult `json:"ceiling,omitempty"`
	// The server is the devicehub binary, a child process per page cache
	// mode with these roles (each query names its PID); PeakRSS is its
	// peak VmRSS over the queries (warm-ups included), BenchRSS this
	// process's (the load clients) meanwhile.
	ServerRoles string `json:"serverRoles"`
	PeakRSS     int64  `json:"serverPeakRssBytes"`
	BenchRSS    int64  `json:"benchPeakRssBytes"`
}

// APIQueryResult is one kind of list query, in one mode of the page cache.
type APIQueryResult struct {
	Name      string     `json:"name"`      // the kind and the mode
	PageCache string     `json:"pageCache"` // off, or warm: every page of the kind read once before
	ServerPID int        `json:"serverPid"` // the devicehub child that answered
	Path      string     `json:"path"`
	Example   string     `json:"example"` // body of request 0
	Load      LoadResult `json:"load"`
	P50Ratio  float64    `json:"p50Ratio,omitempty"` // to the ceiling's p50
	P99Ratio  float64    `json:"p99Ratio,omitempty"`
	RPSRatio  float64    `json:"rpsRatio,omitempty"`
	// CPU of each process over the measured requests (not the warm-up).
	CPU CPUBreakdown `json:"cpu"`
	// Limited: sent by a user limited to the products holding the
	// devices; ScopeP50Ratio and ScopeRPSRatio compare it with the same
	// query by the administrator, in the same mode (the product scope's
	// cost: above 1.05 and below 0.95 respectively is more than 5%).
	Limited       bool    `json:"limited,omitempty"`
	ScopeP50Ratio float64 `json:"scopeP50Ratio,omitempty"`
	ScopeRPSRatio float64 `json:"scopeRpsRatio,omitempty"`
}

func (r APIResult) String() string {
	s := fmt.Sprintf("api: %d devices, %d products, %d concurrent", r.Params.Devices, r.Params.Products, r.Params.Concurrency)
	for _, q := range r.Queries {
		s += fmt.Sprintf("\n  %-22s %s", q.Name, q.Load)
		if r.Ceiling != nil {
			s += fmt.Sprintf(" [p50 x%.1f, rps %.2f of ceiling]", q.P50Ratio, q.RPSRatio)
		}
		if q.Limited {
			s += fmt.Sprintf(" [scope: p50 x%.3f, rps x%.3f of the administrator's]", q.ScopeP50Ratio, q.ScopeRPSRatio)
		}
	}
	if r.Ceiling != nil {
		s += fmt.Sprintf("\n  %-22s %s", "bare fiber ceiling", r.Ceiling)
	}
	s += fmt.Sprintf("\n  peak RSS: devicehub server process %d MiB (roles %s), bench process (load clients) %d MiB",
		r.PeakRSS>>20, r.ServerRoles, r.BenchRSS>>20)
	for _, q := range r.Queries {
		s += "\n  " + q.CPU.String()
	}
	return s
}

var apiRooms = []string{"Kitchen", "Garage", "Attic", "Office", "Lab", "Basement", "Roof", "Hall"}

type apiQuery struct {
	name, path string
	body       func(i int) string // repeats every distinct requests
	distinct   int
	check      func(total int, items int) bool
	// limited: sent by apiLimitedUser, whose role is limited to the 10
	// products that hold the devices (the same answers as the
	// administrator's: the cost of the product scope alone).
	limited bool
}

// apiLimitedUser holds a role granting device:read and product:read on
// the products holding the seeded devices only (seedAPI).
const (
	apiLimitedUser     = "bench-limited"
	apiLimitedPassword = "bench-limited-password"
)

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
	likeName := func(i int) string { return page(like("name", fmt.Sprintf("%%meter %d%%", 100+i%900))) }
	eqProduct := func(i int) string {
		return page(eq("productId", fmt.Sprintf("product-%d", i%10)) + "," + like("name", "%"+apiRooms[i%len(apiRooms)]+"%"))
	}
	return []apiQuery{
		{name: "devices like name", path: "/api/device-instance/_query", body: likeName, distinct: 900, check: any1},
		{name: "devices like name, limited user", path: "/api/device-instance/_query", body: likeName, distinct: 900, check: any1, limited: true},
		{name: "devices eq product+like", path: "/api/device-instance/_query", body: eqProduct, distinct: 40, check: any1},
		{name: "devices eq product+like, limited user", path: "/api/device-instance/_query", body: eqProduct, distinct: 40, check: any1, limited: true},
		{name: "products like name", path: "/api/device-product/_query", body: func(i int) string {
			return page(like("name", fmt.Sprintf("%%Product %d%%", 1+i%9)))
		}, distinct: 9, check: any1},
		{name: "products eq state+like", path: "/api/device-product/_query", body: func(i int) string {
			return page(eq("state", 1) + "," + like("name", fmt.Sprintf("%%Product %d%%", 1+i%9)))
		}, distinct: 9, check: any1},
	}
}

// RunAPI seeds products and devices in a fresh PostgreSQL database,
// starts the devicehub binary on it as a child process (role api, a
// ClickHouse database of its own), logs in and measures each list query
// with p.Concurrency keep-alive clients, with the peak RSS of the child
// and the CPU of each process; then the bare-Fiber ceiling, in this
// process. The databases are dropped at the end.
func RunAPI(ctx context.Context, p APIParams) (APIResult, error) {
	p = p.withDefaults()
	res := APIResult{Params: p, ServerRoles: childRoles("api", p.ServerArgs)}
	tmp, bin, db, cleanup, err := p.prepare(ctx, "api")
	if err != nil {
		return res, err
	}
	defer cleanup()
	p.Logf("api: seeding %d products and %d devices", p.Products, p.Devices)
	if err := seedAPI(ctx, p, db); err != nil {
		return res, err
	}

	var longest int
	for _, q := range apiQueries(p) {
		longest = max(longest, len(q.body(0)))
	}
	// Each query kind twice, each mode with a devicehub child of its own:
	// every page read from PostgreSQL, then every page kept (the warm-up
	// reads each distinct body once; nothing writes meanwhile).
	child := childAPIConfig{Binary: bin, LogDir: tmp, DB: db, ClickHouseAddr: p.ClickHouseAddr, BrokerURL: p.BrokerURL,
		Roles: "api", Conns: p.Concurrency, AdminPassword: "bench-" + randHex(8)}
	for _, mode := range []apiMode{
		{"off", "no page cache", append(slices.Clip(p.ServerArgs), "-page-cache-ttl=0")},
		{"warm", "page cache, warm", p.ServerArgs},
	} {
		queries, err := runAPIMode(ctx, p, child, mode, &res)
		scopeRatios(queries)
		res.Queries = append(res.Queries, queries...)
		if err != nil {
			return res, err
		}
	}
	if !p.SkipCeiling {
		p.Logf("api: bare Fiber ceiling")
		c, err := FiberCeiling(ctx, CeilingParams{Concurrency: p.Concurrency, Requests: p.CachedRequests, Warmup: p.Warmup,
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

// scopeRatios compares each limited user's query with the
// administrator's of the same kind (its name without ", limited user").
func scopeRatios(qs []APIQueryResult) {
	for i := range qs {
		q := &qs[i]
		if !q.Limited {
			continue
		}
		for _, b := range qs {
			if !b.Limited && strings.Replace(q.Name, ", limited user", "", 1) == b.Name {
				q.ScopeP50Ratio = Ratio(q.Load.Latency.P50Ms, b.Load.Latency.P50Ms)
				q.ScopeRPSRatio = Ratio(q.Load.SustainedRPS, b.Load.SustainedRPS)
			}
		}
	}
}

// apiMode is how RunAPI runs the queries: with the page cache off, or
// warm.
type apiMode struct {
	name, label string   // name: off or warm
	args        []string // the child's flags
}

// runAPIMode starts child with mode's flags and measures every query kind
// on it; the peaks of its RSS go into res.
func runAPIMode(ctx context.Context, p APIParams, child childAPIConfig, mode apiMode, res *APIResult) ([]APIQueryResult, error) {
	p.Logf("api: starting devicehub (roles %s, %s)", res.ServerRoles, mode.label)
	child.Args = mode.args
	srv, err := startChildAPI(ctx, child)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	backends, closeBackends := child.DB.backends()
	defer closeBackends()
	procs := childProcs("load clients", srv.pid(), backends, p.BrokerURL, p.ClickHouseAddr)

	// Sampled over the queries only (the ceiling has a server of its own);
	// the stops return the same peak if called again.
	stopRSS, stopBenchRSS := pidRSSSampler(srv.pid()), rssSampler()
	defer stopRSS()
	defer stopBenchRSS()
	limited := &apiClient{base: srv.base, http: srv.http}
	if err := limited.login(ctx, apiLimitedUser, apiLimitedPassword); err != nil {
		return nil, err
	}
	var out []APIQueryResult
	for _, q := range apiQueries(p) {
		client := &srv.apiClient
		if q.limited {
			client = limited
		}
		r := APIQueryResult{Name: q.name + " (" + mode.label + ")", Limited: q.limited, PageCache: mode.name, ServerPID: srv.pid(), Path: q.path, Example: q.body(0)}
		requests, warmup := p.Requests, p.Warmup
		if mode.name == "warm" {
			requests, warmup = p.CachedRequests, max(warmup, q.distinct)
		}
		// Every kind answers sensibly before it is timed.
		var pg struct {
			Total int               `json:"total"`
			Data  []json.RawMessage `json:"data"`
		}
		if err := client.call(ctx, "POST", q.path, json.RawMessage(r.Example), &pg); err != nil {
			return out, err
		}
		if !q.check(pg.Total, len(pg.Data)) {
			return out, fmt.Errorf("bench: %s: total %d, %d items for %s", q.name, pg.Total, len(pg.Data), r.Example)
		}
		do := func(ctx context.Context, i int) error {
			raw, err := client.do(ctx, "POST", q.path, []byte(q.body(i)))
			if err == nil && !bytes.Contains(raw, []byte(`"total":`)) {
				err = fmt.Errorf("bench: %s: no page: %.200s", q.name, raw)
			}
			return err
		}
		p.Logf("api: %s", r.Name)
		var span *cpuSpan
		var end cpuSnapshot
		r.Load, err = runLoad(ctx, loadSpec{Name: "api " + r.Name, Concurrency: p.Concurrency, Requests: requests,
			Warmup: warmup, Do: do, Progress: p.Progress, Measured: func() func() {
				span = startCPUSpan("api "+r.Name, procs)
				return func() { end = span.snapshot() }
			}})
		if span != nil {
			r.CPU = span.breakdown(end, r.Load.Requests)
			r.CPU.Unit = "req"
		}
		out = append(out, r)
		if err != nil {
			return out, err
		}
		if r.Load.Errors > 0 {
			return out, fmt.Errorf("bench: %s: %d errors, first: %s", r.Name, r.Load.Errors, r.Load.FirstError)
		}
	}
	rss, benchRSS := stopRSS(), stopBenchRSS()
	res.PeakRSS, res.BenchRSS = max(res.PeakRSS, rss), max(res.BenchRSS, benchRSS)
	return out, srv.stop()
}

// seedAPI migrates db (meta.Open) and fills it with p.Products products
// and p.Devices devices over the first 10 of them, straight in SQL.
func seedAPI(ctx context.Context, p APIParams, db *pgDatabase) error {
	mo := meta.DefaultOptions()
	mo.DSN, mo.MaxOpenConns = db.dsn(), 2
	store, err := meta.Open(ctx, mo)
	if err != nil {
		return err
	}
	defer store.Close()
	for _, s := range []string{
		fmt.Sprintf(`INSERT INTO products (id, name, device_type, state, classified_id, create_time)
			SELECT 'product-' || i, 'Product ' || i, (ARRAY['device','gateway'])[i %% 2 + 1], i %% 2, 'class-' || (i %% 3),
				now() - make_interval(secs => i)
			FROM generate_series(0, %d) AS i`, p.Products-1),
		seedDevicesSQL(p.Devices),
		`VACUUM ANALYZE devices`,
		`VACUUM ANALYZE products`,
	} {
		if _, err := store.DB().ExecContext(ctx, s); err != nil {
			return fmt.Errorf("bench: seed: %w", err)
		}
	}
	// The limited user (apiLimitedUser): its role reads the 10 products
	// holding the devices, and their devices, only.
	held := make([]string, 10)
	for i := range held {
		held[i] = fmt.Sprintf("product-%d", i)
	}
	name := "Bench limited"
	perms := []meta.Permission{meta.PermProductRead, meta.PermDeviceRead, meta.PermDashboardRead}
	if _, err := store.AddRole(ctx, meta.RoleInput{ID: "bench-limited", Name: &name, Permissions: &perms,
		Products: meta.ProductList{Set: true, IDs: held}}, "admin", ""); err != nil {
		return fmt.Errorf("bench: seed: %w", err)
	}
	if _, err := store.CreateUser(ctx, apiLimitedUser, apiLimitedPassword, "bench-limited"); err != nil {
		return fmt.Errorf("bench: seed: %w", err)
	}
	return nil
}

// seedDevicesSQL inserts n devices dev-0000001.. spread over product-0..9,
// a third in each state, with names a `like` term can pick out ("Kitchen",
// "meter 12").
func seedDevicesSQL(n int) string {
	return fmt.Sprintf(`INSERT INTO devices (id, name, product_id, state, secure_id, secure_key, creator_id, create_time)
		SELECT 'dev-' || lpad(i::text, 7, '0'),
			(ARRAY['Kitchen','Garage','Attic','Office','Lab','Basement','Roof','Hall'])[i %% 8 + 1] || ' meter ' || i,
			'product-' || (i %% 10),
			(ARRAY['notActive','offline','online'])[i %% 3 + 1],
			'dev-' || i, md5(i::text), 'admin',
			now() - make_interval(secs => i)
		FROM generate_series(1, %d) AS i`, n)
}
