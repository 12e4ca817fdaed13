package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"devicehub/api"
	"devicehub/meta"
	"devicehub/tsdb"
)

// dashSwitch is the server's DashboardStore: the database of the size
// being measured.
type dashSwitch struct{ db atomic.Pointer[tsdb.DB] }

func (d *dashSwitch) MessageCounts(ctx context.Context, q tsdb.CountQuery) ([]tsdb.Bucket, error) {
	return d.db.Load().MessageCounts(ctx, q)
}

func (d *dashSwitch) PropertyHistory(ctx context.Context, productID, deviceID string, properties []string, n int) ([]tsdb.PropertyValue, error) {
	return d.db.Load().PropertyHistory(ctx, productID, deviceID, properties, n)
}

func (d *dashSwitch) PropertyAggregates(ctx context.Context, q tsdb.AggQuery) ([]tsdb.AggSeries, error) {
	return d.db.Load().PropertyAggregates(ctx, q)
}

func (d *dashSwitch) HistoryRange(ctx context.Context, q tsdb.HistoryQuery) ([]tsdb.PropertyValue, error) {
	return d.db.Load().HistoryRange(ctx, q)
}

func (d *dashSwitch) Location() *time.Location { return d.db.Load().Location() }

// dashAPI is the real API server (benchServer: a fresh metadata database,
// dropped by close, and a logged-in client) whose dashboard store can be
// switched between the generated sizes, with the history device created.
type dashAPI struct {
	*benchServer
	dash dashSwitch
	// limited is logged in as a user whose role (dashboard:read and the
	// reads of products and devices) is limited to the generator's 10
	// products, p0 to p9; limitedOne as one limited to p7.
	limited, limitedOne *apiClient
}

const (
	dashLimitedUser     = "bench-limited"
	dashLimitedPassword = "bench-limited-password"
)

// dashThingModel declares the 14 properties of the history product.
func dashThingModel() string {
	var ps []string
	for i, id := range dashPropNames {
		var vt string
		switch {
		case id == "mode":
			vt = `{"type":"enum","elements":[{"value":"1","text":"Eco"},{"value":"2","text":"Boost"}]}`
		case id == "online":
			vt = `{"type":"boolean","trueText":"Online","trueValue":true,"falseText":"Offline","falseValue":false}`
		case i%2 == 0:
			vt = `{"type":"float","scale":2,"unit":"percent"}`
		default:
			vt = `{"type":"double","scale":1,"unit":"meter"}`
		}
		ps = append(ps, fmt.Sprintf(`{"id":%q,"name":%q,"valueType":%s}`, id, strings.ToUpper(id[:1])+id[1:], vt))
	}
	return `{"properties":[` + strings.Join(ps, ",") + `]}`
}

func startDashAPI(ctx context.Context, p DashboardParams) (_ *dashAPI, err error) {
	a := &dashAPI{}
	a.benchServer, err = startBenchServer(ctx, p.PostgresDSN, p.Prefix+"_meta", max(64, p.Concurrency), func(_ *meta.Store, deps *api.Deps, bs *benchServer) error {
		deps.Dashboard = &a.dash
		// Requests wait for one of the dashboard slots (2 x GOMAXPROCS)
		// rather than being refused after the default 2 s: the runs that
		// ClickHouse answers every request of queue 64 clients on them,
		// and measure that queue in their latencies.
		bs.opts.DashboardWait = time.Minute
		return nil
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	var prod map[string]any
	if err = a.call(ctx, "POST", "/api/device/product", map[string]any{"id": dashHistoryProduct, "name": "Bench product",
		"classifiedId": "meter", "modelFrom": "custom", "accessId": "mqtt-direct", "deviceType": "device"}, &prod); err != nil {
		return nil, err
	}
	prod["metadata"] = dashThingModel()
	if err = a.call(ctx, "PATCH", "/api/device-product", prod, nil); err != nil {
		return nil, err
	}
	if err = a.call(ctx, "POST", "/api/device/instance", map[string]any{"id": dashHistoryDevice, "name": "Bench device", "productId": dashHistoryProduct}, nil); err != nil {
		return nil, err
	}
	// The generator's other products, and the limited user.
	var products []string
	for i := range dashProducts {
		id := fmt.Sprintf("p%d", i)
		products = append(products, id)
		if id == dashHistoryProduct {
			continue
		}
		if err = a.call(ctx, "POST", "/api/device/product", map[string]any{"id": id, "name": "Bench product " + id,
			"classifiedId": "meter", "modelFrom": "custom", "accessId": "mqtt-direct", "deviceType": "device"}, nil); err != nil {
			return nil, err
		}
	}
	if err = a.call(ctx, "POST", "/api/role", map[string]any{"id": "bench-limited", "name": "Bench limited", "products": products,
		"permissions": []meta.Permission{meta.PermDashboardRead, meta.PermProductRead, meta.PermDeviceRead}}, nil); err != nil {
		return nil, err
	}
	if err = a.call(ctx, "POST", "/api/role", map[string]any{"id": "bench-limited-one", "name": "Bench limited to one", "products": []string{dashHistoryProduct},
		"permissions": []meta.Permission{meta.PermDashboardRead, meta.PermProductRead, meta.PermDeviceRead}}, nil); err != nil {
		return nil, err
	}
	for _, u := range []struct {
		name, role string
		client     **apiClient
	}{{dashLimitedUser, "bench-limited", &a.limited}, {dashLimitedUser + "-one", "bench-limited-one", &a.limitedOne}} {
		if _, err = a.store.CreateUser(ctx, u.name, dashLimitedPassword, u.role); err != nil {
			return nil, err
		}
		*u.client = &apiClient{base: a.base, http: a.http}
		if err = (*u.client).login(ctx, u.name, dashLimitedPassword); err != nil {
			return nil, err
		}
	}
	return a, nil
}

func (a *dashAPI) setDashboard(db *tsdb.DB) { a.dash.db.Store(db) }

// check runs one _multi query and returns its item count and, for
// aggregates, the sum of the bucket values.
func (a *dashAPI) check(ctx context.Context, body []byte) (items int, total uint64, err error) {
	return a.checkAs(ctx, &a.apiClient, body)
}

// checkAs is check by client c.
func (a *dashAPI) checkAs(ctx context.Context, c *apiClient, body []byte) (items int, total uint64, err error) {
	var res []struct {
		Data struct {
			Value json.RawMessage `json:"value"`
		} `json:"data"`
	}
	if err := c.call(ctx, "POST", "/api/dashboard/_multi", json.RawMessage(body), &res); err != nil {
		return 0, 0, err
	}
	for _, r := range res {
		var v uint64
		if json.Unmarshal(r.Data.Value, &v) == nil {
			total += v
		}
	}
	return len(res), total, nil
}

// measure sends body n times with conc clients (n/conc each) and
// summarises the latencies.
func (a *dashAPI) measure(ctx context.Context, body []byte, n, conc int) (Latency, error) {
	return a.measureAs(ctx, &a.apiClient, body, n, conc)
}

// measureAs is measure by client cl.
func (a *dashAPI) measureAs(ctx context.Context, cl *apiClient, body []byte, n, conc int) (Latency, error) {
	conc = max(conc, 1)
	per := max(n/conc, 1)
	lat := make([][]time.Duration, conc)
	errs := make([]error, conc)
	var wg sync.WaitGroup
	start := time.Now()
	for c := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ds := make([]time.Duration, 0, per)
			for range per {
				t0 := time.Now()
				if err := cl.send(ctx, "POST", "/api/dashboard/_multi", body); err != nil {
					errs[c] = err
					return
				}
				ds = append(ds, time.Since(t0))
			}
			lat[c] = ds
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	var all []time.Duration
	for c := range conc {
		if errs[c] != nil {
			return Latency{}, errs[c]
		}
		all = append(all, lat[c]...)
	}
	return summarize(all, wall), nil
}

// dashRun is one concurrent run: a query served from db, the same body
// for every request unless bodies (sent in turn) are given.
type dashRun struct {
	query    dashQuery
	bodies   [][]byte
	db       *tsdb.DB
	cached   bool // db has the result cache
	requests int
	// before and after, if set, run around the run (warm-up included).
	before, after func()
	limited       bool // sent by a.limited (or, with one, a.limitedOne)
	one           bool
}

// DashLoad is the outcome of one concurrent run.
type DashLoad struct {
	Name   string       `json:"name"`
	Cached bool         `json:"cached"` // answered through the result cache
	Load   LoadResult   `json:"load"`
	CPU    CPUBreakdown `json:"cpu"`
	// Limited: sent by a user limited to the generator's products;
	// ScopeRPSRatio and ScopeP50Ratio compare it with the run before (the
	// same query by the administrator).
	Limited       bool    `json:"limited,omitempty"`
	ScopeRPSRatio float64 `json:"scopeRpsRatio,omitempty"`
	ScopeP50Ratio float64 `json:"scopeP50Ratio,omitempty"`
}

// concurrentRuns measures the bare Fiber handler, then each run, closed
// loop with p.Concurrency clients, with the CPU of this process (the
// clients and the API server), ClickHouse and the metadata database's
// PostgreSQL backends over each run's measured requests.
func (a *dashAPI) concurrentRuns(ctx context.Context, p DashboardParams, label string, runs []dashRun) (*LoadResult, []DashLoad, error) {
	warm := 2 * p.Concurrency
	ceiling, err := FiberCeiling(ctx, CeilingParams{Concurrency: p.Concurrency, Requests: p.Requests, Warmup: warm,
		Method: "POST", Body: runs[0].query.body})
	if err != nil {
		return nil, nil, fmt.Errorf("fiber ceiling: %w", err)
	}
	p.Logf("%s: bare Fiber with %d clients: %s", label, p.Concurrency, ceiling)
	pgBackends, closePG := a.db.backends()
	defer closePG()
	procs := []namedProc{{Name: "bench clients + API server (this process)", PID: 0}}
	procs = append(procs, clickhouseProcs(ctx, p.ClickHouseAddr, p.ClickHouseCluster)...)
	procs = append(procs, namedProc{Name: "postgres (backends of the metadata db)", Members: pgBackends})
	var out []DashLoad
	for _, r := range runs {
		name := r.query.name
		if !r.cached {
			name += " (no result cache)"
		}
		client := &a.apiClient
		if r.limited {
			name += ", user limited to the 10 products"
			client = a.limited
			if r.one {
				name = r.query.name + ", user limited to 1 product"
				client = a.limitedOne
			}
		}
		bodies := r.bodies
		if len(bodies) == 0 {
			bodies = [][]byte{r.query.body}
		}
		a.setDashboard(r.db)
		if r.before != nil {
			r.before()
		}
		var seq atomic.Int64 // bodies in turn over warm-up and measured requests
		var span *cpuSpan
		var end cpuSnapshot
		l, err := runLoad(ctx, loadSpec{Name: name, Concurrency: p.Concurrency, Requests: max(r.requests, 1), Warmup: warm,
			Do: func(ctx context.Context, i int) error {
				return client.send(ctx, "POST", "/api/dashboard/_multi", bodies[(seq.Add(1)-1)%int64(len(bodies))])
			},
			Measured: func() func() {
				span = startCPUSpan(name, procs)
				return func() { end = span.snapshot() }
			}})
		if r.after != nil {
			r.after()
		}
		d := DashLoad{Name: name, Cached: r.cached, Load: l, Limited: r.limited}
		for k := len(out) - 1; r.limited && k >= 0; k-- { // the administrator's run before
			if !out[k].Limited {
				base := out[k].Load
				d.ScopeRPSRatio, d.ScopeP50Ratio = Ratio(l.SustainedRPS, base.SustainedRPS), Ratio(l.Latency.P50Ms, base.Latency.P50Ms)
				break
			}
		}
		if span != nil {
			d.CPU = span.breakdown(end, l.Requests)
			d.CPU.Unit = "req"
		}
		out = append(out, d)
		if err != nil {
			return &ceiling, out, fmt.Errorf("%s x%d: %w", name, p.Concurrency, err)
		}
		if l.Errors > 0 {
			return &ceiling, out, fmt.Errorf("%s x%d: %d of %d requests failed, first: %s", name, p.Concurrency, l.Errors, l.Errors+l.Requests, l.FirstError)
		}
		p.Logf("%s: %s with %d clients: %s", label, name, p.Concurrency, l)
		p.Logf("%s", d.CPU)
	}
	return &ceiling, out, nil
}

// measureBodies sends n requests, one client, the bodies in turn, and
// summarises the latencies.
func (a *dashAPI) measureBodies(ctx context.Context, bodies [][]byte, n int) (Latency, error) {
	ds := make([]time.Duration, 0, n)
	start := time.Now()
	for i := range n {
		t0 := time.Now()
		if err := a.send(ctx, "POST", "/api/dashboard/_multi", bodies[i%len(bodies)]); err != nil {
			return Latency{}, err
		}
		ds = append(ds, time.Since(t0))
	}
	return summarize(ds, time.Since(start)), nil
}
