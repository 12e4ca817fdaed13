package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"devicehub/ingest"
	"devicehub/ingest/wire"
	"devicehub/tsdb"
)

// The mixed dashboard scenario: load as a dashboard's users make it.
// Every request is distinct (no two ask the same product, interval, range
// and function): message counts and property aggregates half and half,
// each of a random product among mixedProducts, a random interval (1h,
// 1d, 1w, 1M), a random number of buckets ending at a random instant of
// the data's span or now, and for property aggregates a random function,
// property and, one time in three, device. Ingest runs at the same time:
// reports of random devices, built and decoded as the ingest scenario
// builds them (reportPayload, wire.Decode), 1% of them stamped at a
// random past instant (late messages), stored through tsdb.Writer into
// the database being queried, through the serving DB (one instance that
// ingests and serves). A checker samples answers against a direct
// ClickHouse count while the load runs (see mixedChecker).
//
// Data, in <Prefix>_mixed_<n>: message i belongs to device "md<dev>",
// dev = i mod 1000, of product "mp<dev mod 100>", stamped start +
// floor(i * span / n) over the 90 days ending at generation; each
// message has property values p0 and p1 (numbers, multiples of 0.25).
const (
	mixedProducts = 100
	mixedDevices  = 1000
	mixedSpanDays = 90
	mixedProps    = 15 // p0 .. p14, as reportPayload names them
)

// MixedResult is the outcome of the mixed scenario.
type MixedResult struct {
	Messages        int64   `json:"messages"`
	PropertyRows    int64   `json:"propertyRows"`
	Products        int     `json:"products"`
	Reused          bool    `json:"reused"`
	GenerateSeconds float64 `json:"generateSeconds"`
	// IngestTarget is the reports/s the ingest generator aims at;
	// IngestRates what it stored during each run.
	IngestTarget int       `json:"ingestTarget"`
	IngestRates  []float64 `json:"ingestRates"`
	// IngestStored is every report stored while the scenario ran;
	// IngestFailures the insert attempts that failed (and were retried).
	IngestStored   int64  `json:"ingestStored"`
	IngestFailures int64  `json:"ingestFailures"`
	IngestError    string `json:"ingestError,omitempty"`
	// Checks is the number of sampled answers compared with a direct
	// ClickHouse count, Rechecked those that matched only when asked
	// again after the result cache's TTL (the documented 1 s), and
	// Failures those that did not match then either (the run fails).
	Checks    int `json:"checks"`
	Rechecked int `json:"rechecked"`
	Failures  int `json:"failures"`
	// IngestAlone is the CPU ingest takes with no request running, over
	// a few seconds before the runs (this process holds ingest, clients
	// and server; Machine is every process of the machine, other
	// sessions' included).
	IngestAlone *CPUBreakdown `json:"ingestAlone,omitempty"`
	// The bare Fiber handler and the runs, each under the same load.
	Ceiling *LoadResult `json:"ceiling,omitempty"`
	Runs    []DashLoad  `json:"runs"`
}

// mixedRequest is one distinct dashboard query.
type mixedRequest struct {
	body     []byte
	count    bool // message counts; else a property aggregate
	product  string
	device   string // property aggregates: "" for the product
	property string
	agg      string
	interval string
	from, to time.Time
	limit    int
}

// Kinds of requests of a mixed run (DashboardParams.MixedKinds).
const (
	// MixedAll: counts and property aggregates half and half (see the
	// top of this file).
	MixedAll = "mixed"
	// MixedCounts: message counts only, of 15m, 1h, 1d, 1w or 1M buckets.
	MixedCounts = "counts"
	// MixedAggs: property aggregates only, product-wide, 1h x168 (7 days),
	// of a random product, property, function and end.
	MixedAggs = "aggs"
)

// mixedGen makes distinct requests of one kind.
type mixedGen struct {
	mu        sync.Mutex
	r         *rand.Rand
	loc       *time.Location
	startMs   int64
	seen      map[string]bool
	kind      string // MixedAll ("" too), MixedCounts or MixedAggs
	checkAggs bool   // property aggregates use count, max or sum (checker)
}

func (g *mixedGen) next() mixedRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	for {
		q := g.make()
		k := fmt.Sprint(q.count, q.product, q.device, q.property, q.agg, q.interval, q.limit)
		starts, err := tsdb.Buckets(q.interval, q.from, q.to, g.loc, q.limit)
		if err != nil {
			continue
		}
		k += fmt.Sprint(starts[0].Unix())
		if g.seen[k] {
			continue
		}
		g.seen[k] = true
		return q
	}
}

func (g *mixedGen) make() mixedRequest {
	r := g.r
	product := r.IntN(mixedProducts)
	q := mixedRequest{product: fmt.Sprint("mp", product), count: r.IntN(2) == 0}
	switch g.kind {
	case MixedCounts:
		q.count = true
	case MixedAggs:
		q.count = false
	}
	now := time.Now()
	q.to = now
	if r.IntN(2) == 0 { // a random instant of the span; else now
		q.to = time.UnixMilli(g.startMs + r.Int64N(now.UnixMilli()-g.startMs))
	}
	n := 4
	if g.kind == MixedCounts {
		n = 5
	}
	switch r.IntN(n) {
	case 0:
		q.interval, q.limit = tsdb.Hour, 24+r.IntN(24*6+1) // 1 to 7 days of hours
	case 1:
		q.interval, q.limit = tsdb.Day, 1+r.IntN(60)
	case 2:
		q.interval, q.limit = tsdb.Week, 1+r.IntN(26)
	case 3:
		q.interval, q.limit = tsdb.Month, 1+r.IntN(12)
	default:
		q.interval, q.limit = tsdb.FifteenMinutes, 4+r.IntN(4*48-3) // 1 to 48 hours of quarter-hours
	}
	if g.kind == MixedAggs {
		q.interval, q.limit = tsdb.Hour, 24*7
	}
	q.from, _ = tsdb.RangeStart(q.interval, q.to, q.limit, g.loc)
	if q.count {
		q.body = fmt.Appendf(nil, `[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","group":"g",`+
			`"params":{"productId":%q,"time":%q,"limit":%d,"from":%d,"to":%d}}]`,
			q.product, q.interval, q.limit, q.from.UnixMilli(), q.to.UnixMilli())
		return q
	}
	q.property = fmt.Sprint("p", r.IntN(2))
	q.agg = []string{tsdb.AggAvg, tsdb.AggMin, tsdb.AggMax, tsdb.AggSum, tsdb.AggCount, tsdb.AggFirst, tsdb.AggLast}[r.IntN(7)]
	if g.checkAggs {
		// Aggregates that only grow as rows are added (mixedChecker):
		// sums of p0, whose values are whole numbers (exact in any order).
		q.agg = []string{tsdb.AggCount, tsdb.AggMax, tsdb.AggSum}[r.IntN(3)]
		if q.agg == tsdb.AggSum {
			q.property = "p0"
		}
	}
	dev := ""
	if g.kind != MixedAggs && r.IntN(3) == 0 {
		// One of the product's two registered devices.
		q.device = fmt.Sprint("md", product+mixedProducts*r.IntN(2))
		dev = fmt.Sprintf(`"deviceId":%q,`, q.device)
	}
	q.body = fmt.Appendf(nil, `[{"dashboard":"device","object":%q,"measurement":"properties","dimension":"agg","group":"g",`+
		`"params":{%s"properties":[%q],"agg":%q,"time":%q,"limit":%d,"from":%d,"to":%d}}]`,
		q.product, dev, q.property, q.agg, q.interval, q.limit, q.from.UnixMilli(), q.to.UnixMilli())
	return q
}

// RunDashboardMixed runs the mixed scenario alone (its own API server).
func RunDashboardMixed(ctx context.Context, p DashboardParams) (MixedResult, error) {
	p = p.withDefaults()
	api, err := startDashAPI(ctx, p)
	if err != nil {
		return MixedResult{}, err
	}
	defer api.close()
	return runMixed(ctx, p, api)
}

func runMixed(ctx context.Context, p DashboardParams, api *dashAPI) (MixedResult, error) {
	res := MixedResult{Products: mixedProducts, IngestTarget: p.MixedIngestRate}
	n := p.MixedMessages
	loc, err := time.LoadLocation(dashZone)
	if err != nil {
		return res, err
	}
	opt := genOptions(p, fmt.Sprintf("%s_mixed_%d", p.Prefix, n), loc)
	gen, err := tsdb.Open(ctx, opt)
	if err != nil {
		return res, err
	}
	defer closeGenDB(p, gen)
	info, err := generateMixed(ctx, p, gen, n, &res)
	if err != nil {
		return res, err
	}

	// The products (thing model p0..p14, the odd ones reportPayload sends
	// as text declared as strings) and two devices of each.
	var model []string
	for k := range mixedProps {
		vt := `{"type":"double","scale":2}`
		if k%4 == 3 {
			vt = `{"type":"string"}`
		}
		model = append(model, fmt.Sprintf(`{"id":"p%d","name":"P%d","valueType":%s}`, k, k, vt))
	}
	for k := range mixedProducts {
		id := fmt.Sprint("mp", k)
		var prod map[string]any
		if err := api.call(ctx, "POST", "/api/device/product", map[string]any{"id": id, "name": "Mixed " + id,
			"classifiedId": "meter", "modelFrom": "custom", "accessId": "mqtt-direct", "deviceType": "device"}, &prod); err != nil {
			return res, err
		}
		prod["metadata"] = `{"properties":[` + strings.Join(model, ",") + `]}`
		if err := api.call(ctx, "PATCH", "/api/device-product", prod, nil); err != nil {
			return res, err
		}
		for d := range 2 {
			dev := fmt.Sprint("md", k+mixedProducts*d)
			if err := api.call(ctx, "POST", "/api/device/instance", map[string]any{"id": dev, "name": dev, "productId": id}, nil); err != nil {
				return res, err
			}
		}
	}

	opt.QueryTimeout = 0
	db, err := tsdb.Open(ctx, opt) // the serving instance: result cache, rollup
	if err != nil {
		return res, err
	}
	defer db.Close()
	// As cmd/devicehub does at start (tsdb/warm.go): the measured runs
	// are of an instance that has loaded its kept months, not of its
	// first seconds.
	st, err := db.Warm(ctx)
	if err != nil {
		return res, err
	}
	p.Logf("mixed %d: kept months warmed: %d loaded in %s", n, st.Chunks, st.Took.Round(time.Millisecond))
	opt.ResultTTL = -1
	uncached, err := tsdb.Open(ctx, opt)
	if err != nil {
		return res, err
	}
	defer uncached.Close()
	opt.NoRollup = true
	raw, err := tsdb.Open(ctx, opt)
	if err != nil {
		return res, err
	}
	defer raw.Close()

	seen := map[string]bool{} // distinct over every run
	warm := 2 * p.Concurrency
	var runs []dashRun
	for _, kind := range p.MixedKinds {
		g := &mixedGen{r: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7)), loc: loc, startMs: info.startMs, seen: seen, kind: kind}
		bodies := func(k int) [][]byte {
			out := make([][]byte, k+warm)
			for i := range out {
				out[i] = g.next().body
			}
			return out
		}
		mq := func(name string) dashQuery { return dashQuery{name: name} }
		var rs []dashRun
		switch kind {
		case MixedAll:
			rs = []dashRun{
				{query: mq("mixed distinct"), db: db, cached: true, requests: p.MixedRequests},
				{query: mq("mixed distinct, rollup"), db: uncached, requests: p.MixedUncachedRequests},
				{query: mq("mixed distinct, raw tables"), db: raw, requests: p.MixedUncachedRequests},
			}
		case MixedCounts:
			rs = []dashRun{
				{query: mq("counts distinct"), db: db, cached: true, requests: p.MixedRequests},
				{query: mq("counts distinct"), db: uncached, requests: p.MixedUncachedRequests},
			}
		case MixedAggs:
			rs = []dashRun{
				{query: mq("aggregates 1h x168 product-wide distinct"), db: db, cached: true, requests: p.MixedRequests},
				{query: mq("aggregates 1h x168 product-wide distinct, rollup"), db: uncached, requests: p.MixedUncachedRequests},
				{query: mq("aggregates 1h x168 product-wide distinct, raw tables"), db: raw, requests: p.MixedUncachedRequests},
			}
		default:
			return res, fmt.Errorf("mixed: kind %q: want %s, %s or %s", kind, MixedAll, MixedCounts, MixedAggs)
		}
		for i := range rs {
			rs[i].bodies = bodies(rs[i].requests)
			rs[i].query.body = rs[i].bodies[0]
		}
		runs = append(runs, rs...)
	}

	// Ingest and the checker for the whole of the runs (the checker asks
	// whichever database serves: the serving one until the runs switch).
	api.setDashboard(db)
	ictx, stop := context.WithCancel(ctx)
	ing := startMixedIngest(ictx, db, p.MixedIngestRate, info.startMs)
	label := fmt.Sprintf("mixed %d", n)
	if p.MixedIngestRate > 0 {
		// What ingest alone costs once it runs at its rate, before the
		// checker and the runs start.
		procs := append([]namedProc{{Name: "bench process (ingest alone)", PID: 0}}, clickhouseProcs(ctx, p.ClickHouseAddr, p.ClickHouseCluster)...)
		_ = sleepCtx(ictx, 2*time.Second)
		span, from := startCPUSpan("ingest alone", procs), ing.stored.Load()
		_ = sleepCtx(ictx, 5*time.Second) // a cancelled run ends in the runs below
		c := span.breakdown(span.snapshot(), ing.stored.Load()-from)
		c.Unit = "report"
		res.IngestAlone = &c
		p.Logf("%s: %s", label, c)
	}
	chk := &mixedChecker{ing: ing, api: api, db: gen, loc: loc}
	for _, kind := range p.MixedKinds { // requests of each kind in turn
		chk.gens = append(chk.gens, &mixedGen{r: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9)), loc: loc, startMs: info.startMs,
			seen: map[string]bool{}, kind: kind, checkAggs: true})
	}
	var cw sync.WaitGroup
	cw.Add(1)
	go func() { defer cw.Done(); chk.run(ictx) }()
	var mark ingestMark
	for i := range runs {
		runs[i].before = func() { mark = ing.mark() }
		runs[i].after = func() { res.IngestRates = append(res.IngestRates, ing.rate(mark)) }
	}
	res.Ceiling, res.Runs, err = api.concurrentRuns(ctx, p, label, runs)
	stop()
	cw.Wait()
	ierr := ing.wait()
	res.IngestStored, res.IngestFailures = ing.stored.Load(), ing.failed.Load()
	if e, ok := ing.first.Load().(string); ok {
		res.IngestError = e
	}
	res.Checks, res.Rechecked, res.Failures = chk.counts()
	p.Logf("%s: ingest %v reports/s (target %d) during the runs, %d failed inserts (%s); %d answers checked against ClickHouse, %d after the TTL, %d wrong",
		label, res.IngestRates, p.MixedIngestRate, res.IngestFailures, res.IngestError, res.Checks, res.Rechecked, res.Failures)
	if res.Failures > 0 {
		p.Logf("%s: first wrong answer: %s", label, chk.firstFailure())
	}
	if err != nil {
		return res, err
	}
	if ierr != nil {
		return res, fmt.Errorf("ingest: %w", ierr)
	}
	if res.Failures > 0 {
		return res, fmt.Errorf("%d of %d sampled answers differ from ClickHouse: first: %s", res.Failures, res.Checks, chk.firstFailure())
	}
	if res.Checks == 0 {
		return res, errors.New("no answer checked")
	}
	return res, nil
}

// mixedIngest stores reports at a steady rate until its context ends.
type mixedIngest struct {
	// Inserts started and ended, through the DB (trackedInserter).
	started, ended atomic.Int64
	stored         atomic.Int64
	failed         atomic.Int64 // insert attempts that failed (the writer retries them)
	first          atomic.Value // the first such error's text
	done           chan error
}

type ingestMark struct {
	n  int64
	at time.Time
}

func (m *mixedIngest) mark() ingestMark { return ingestMark{m.stored.Load(), time.Now()} }

// rate is the reports/s stored since from.
func (m *mixedIngest) rate(from ingestMark) float64 {
	now := m.mark()
	return float64(int64(float64(now.n-from.n) / now.at.Sub(from.at).Seconds()))
}

func (m *mixedIngest) wait() error { return <-m.done }

// trackedInserter counts the inserts under way, so the checker can count
// ClickHouse's rows when only acknowledged ones are visible.
type trackedInserter struct {
	db *tsdb.DB
	m  *mixedIngest
}

func (t trackedInserter) InsertBatch(ctx context.Context, b *tsdb.Batch) error {
	t.m.started.Add(1)
	defer t.m.ended.Add(1)
	return t.db.InsertBatch(ctx, b)
}

// quiet runs f at a moment no insert is under way from its start to its
// end (one that starts meanwhile makes it run f again), so that what f
// reads of ClickHouse is what acknowledged inserts stored: an insert's
// rows are visible in device_property before its materialized views have
// written theirs, and it is acknowledged after both.
func (m *mixedIngest) quiet(ctx context.Context, f func() error) error {
	for {
		s := m.started.Load()
		if m.ended.Load() == s {
			if err := f(); err != nil {
				return err
			}
			if m.started.Load() == s && m.ended.Load() == s {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// startMixedIngest builds, decodes and stores rate reports/s of random
// devices of the mixed products through db's writers, in 10 ms steps.
func startMixedIngest(ctx context.Context, db *tsdb.DB, rate int, startMs int64) *mixedIngest {
	m := &mixedIngest{done: make(chan error, 1)}
	if rate <= 0 {
		m.done <- nil
		return m
	}
	writers := make([]*tsdb.Writer, max(ingest.DefaultOptions().Writers, 1))
	wopt := tsdb.WriterOptions{OnFlush: func(_ int, _ time.Duration, err error) {
		if err != nil {
			m.failed.Add(1)
			m.first.CompareAndSwap(nil, err.Error())
		}
	}}
	for i := range writers {
		writers[i] = tsdb.NewWriter(trackedInserter{db, m}, wopt)
	}
	go func() {
		r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
		var buf []byte
		var rows wire.Rows
		var seq int64
		var err error
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		start := time.Now()
	loop:
		for {
			select {
			case <-ctx.Done():
				break loop
			case now := <-tick.C:
				due := int64(now.Sub(start).Seconds() * float64(rate))
				for ; seq < due && ctx.Err() == nil; seq++ {
					dev := r.IntN(mixedDevices)
					id := fmt.Sprint("md", dev)
					t, _ := wire.ParseTopic(fmt.Sprintf("/mp%d/%s/properties/report", dev%mixedProducts, id))
					buf = reportPayload(buf, id, dev, seq)
					rows.Msgs, rows.Props = rows.Msgs[:0], rows.Props[:0]
					if err = wire.Decode(&rows, t, buf, now, nil); err != nil {
						break loop
					}
					if r.IntN(100) == 0 { // late: a past instant of the span
						late := time.UnixMilli(startMs + r.Int64N(now.UnixMilli()-startMs))
						for i := range rows.Msgs {
							rows.Msgs[i].Time = late
						}
						for i := range rows.Props {
							rows.Props[i].Time = late
						}
					}
					// Add copies what it keeps (tsdb.Batch).
					if err = writers[seq%int64(len(writers))].Add(ctx, rows.Msgs, rows.Props, func() { m.stored.Add(1) }); err != nil {
						if ctx.Err() != nil {
							err = nil
						}
						break loop
					}
				}
			}
		}
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		errs := []error{err}
		for _, w := range writers {
			errs = append(errs, w.Close(cctx))
		}
		m.done <- errors.Join(errs...)
	}()
	return m
}

// mixedChecker compares sampled answers with a direct ClickHouse query:
// for a distinct request (message counts, or a property aggregate of
// count, max or sum of whole numbers), the count (max, sum) of the rows
// in its range taken before the request is sent while no insert is under
// way (every row it counts was acknowledged), the answer's total (largest
// bucket), and the same query taken after it arrives: before <= answer
// <= after, since rows are only added (values are not negative), and an
// answer counts every row stored through the serving instance before it
// was asked (cache.go). An answer that fails this is asked again after
// the result cache's TTL and must then pass.
type mixedChecker struct {
	ing  *mixedIngest
	api  *dashAPI
	db   *tsdb.DB
	loc  *time.Location
	gens []*mixedGen

	mu                        sync.Mutex
	checks, rechecked, failed int
	first                     string
}

func (c *mixedChecker) counts() (int, int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checks, c.rechecked, c.failed
}

func (c *mixedChecker) firstFailure() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.first
}

// checkPause is the checker's pause between two checks: each reads the
// raw tables twice (at 100M messages, up to a million rows a count), so
// that checks take a small share of the CPU the runs measure.
const checkPause = 200 * time.Millisecond

func (c *mixedChecker) run(ctx context.Context) {
	for i := 0; ctx.Err() == nil; i++ {
		q := c.gens[i%len(c.gens)].next()
		ok, detail, err := c.check(ctx, q)
		if ctx.Err() != nil {
			return
		}
		if err == nil && !ok {
			// Again after the TTL: 1 s.
			select {
			case <-ctx.Done():
				return
			case <-time.After(1100 * time.Millisecond):
			}
			ok, detail, err = c.check(ctx, q)
			if ctx.Err() != nil {
				return
			}
			c.mu.Lock()
			c.rechecked++
			c.mu.Unlock()
		}
		c.mu.Lock()
		c.checks++
		if err != nil || !ok {
			c.failed++
			if c.first == "" {
				c.first = fmt.Sprintf("%s: %s %v", q.body, detail, err)
			}
		}
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(checkPause):
		}
	}
}

// check runs q once: whether before <= answer <= after, and the three.
func (c *mixedChecker) check(ctx context.Context, q mixedRequest) (bool, string, error) {
	starts, err := tsdb.Buckets(q.interval, q.from, q.to, c.loc, q.limit)
	if err != nil {
		return false, "", err
	}
	lo, hi := starts[len(starts)-1], bucketAfter(q.interval, starts[0])
	sql := "SELECT toFloat64(count()) FROM device_message WHERE product_id = ? AND time >= toDateTime(?) AND time < toDateTime(?)"
	args := []any{q.product, lo.Unix(), hi.Unix()}
	if !q.count {
		f := map[string]string{tsdb.AggCount: "toFloat64(count())", tsdb.AggMax: "max(num_value)", tsdb.AggSum: "sum(num_value)"}[q.agg]
		if f == "" {
			return false, "", fmt.Errorf("checker: aggregate %q", q.agg)
		}
		sql = "SELECT " + f + " FROM device_property WHERE product_id = ? AND property = ? AND value_type = 'number' AND ts >= ? AND ts < ?"
		args = []any{q.product, q.property, lo.UnixMilli(), hi.UnixMilli()}
		if q.device != "" {
			sql += " AND device_id = ?"
			args = append(args, q.device)
		}
	}
	direct := func() (float64, error) {
		var n float64
		err := c.db.Conn().QueryRow(ctx, sql, args...).Scan(&n)
		return n, err
	}
	var before float64
	if err := c.ing.quiet(ctx, func() (err error) {
		before, err = direct()
		return err
	}); err != nil {
		return false, "", err
	}
	items, total, err := c.answer(ctx, q)
	if err != nil {
		return false, "", err
	}
	if items != len(starts) {
		return false, "", fmt.Errorf("%d items, want %d", items, len(starts))
	}
	after, err := direct()
	if err != nil {
		return false, "", err
	}
	return before <= total && total <= after, fmt.Sprintf("%s: ClickHouse %v before, answer %v, ClickHouse %v after", q.agg, before, total, after), nil
}

// answer asks q and returns its number of buckets and their total (max:
// the largest).
func (c *mixedChecker) answer(ctx context.Context, q mixedRequest) (items int, total float64, err error) {
	var res []struct {
		Data struct {
			Value json.RawMessage `json:"value"`
		} `json:"data"`
	}
	if err := c.api.apiClient.call(ctx, "POST", "/api/dashboard/_multi", json.RawMessage(q.body), &res); err != nil {
		return 0, 0, err
	}
	for _, r := range res {
		var v float64
		if err := json.Unmarshal(r.Data.Value, &v); err != nil {
			return 0, 0, fmt.Errorf("bucket value %s: %w", r.Data.Value, err)
		}
		if !q.count && q.agg == tsdb.AggMax {
			total = max(total, v)
		} else {
			total += v
		}
	}
	return len(res), total, nil
}

// generateMixed fills db with n messages and 2n property values (see the
// top of this file) unless bench_mixed_info says it holds them.
func generateMixed(ctx context.Context, p DashboardParams, db *tsdb.DB, n int, res *MixedResult) (genInfo, error) {
	conn := db.Conn()
	old, genSec, ok, err := storedGenInfo(ctx, db, "bench_mixed_info")
	if err != nil {
		return genInfo{}, err
	}
	if ok && old.rows == uint64(n) {
		p.Logf("mixed %d: reusing %s (with the rows earlier runs ingested)", n, db.Database())
		res.Reused, res.GenerateSeconds, res.Messages, res.PropertyRows = true, genSec, int64(n), 2*int64(n)
		return old, nil
	}
	for _, t := range []string{"device_message", "device_property", "device_message_daily", "device_property_hourly", "device_message_quarter",
		"device_property_product_hourly", "device_property_daily"} {
		if err := conn.Exec(ctx, "TRUNCATE TABLE "+storageTable(db, t)); err != nil {
			return genInfo{}, err
		}
	}
	if err := conn.Exec(ctx, "DROP TABLE IF EXISTS bench_mixed_info"); err != nil {
		return genInfo{}, err
	}
	span := int64(mixedSpanDays * 24 * time.Hour / time.Millisecond)
	g := genInfo{rows: uint64(n), startMs: time.Now().Truncate(time.Second).UnixMilli() - span, spanMs: span}
	var stmts []string
	for off := 0; off < n; off += dashChunk {
		c := min(dashChunk, n-off)
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO device_message (time, ts, product_id, device_id, direction, message_type, message_id, topic, payload)
SELECT toDateTime(intDiv(ts, 1000)), ts, concat('mp', toString(modulo(dev, %[4]d))), concat('md', toString(dev)), 'up', 'REPORT_PROPERTY',
  toString(i), concat('/mp', toString(modulo(dev, %[4]d)), '/md', toString(dev), '/properties/report'), '{}'
FROM (SELECT i, modulo(i, %[5]d) AS dev, toInt64(%[1]d + intDiv(i * %[2]d, %[3]d)) AS ts FROM (SELECT number + %[6]d AS i FROM numbers(%[7]d)))`,
			g.startMs, g.spanMs, n, mixedProducts, mixedDevices, off, c),
			fmt.Sprintf(`INSERT INTO device_property (ts, product_id, device_id, property, value_type, num_value, str_value)
SELECT ts, concat('mp', toString(modulo(dev, %[4]d))), concat('md', toString(dev)),
  concat('p', toString(k)), 'number', toFloat64(modulo(i * 7 + k * 13, 1000)) / 4, ''
FROM (SELECT i, k, modulo(i, %[5]d) AS dev, toInt64(%[1]d + intDiv(i * %[2]d, %[3]d)) AS ts
  FROM (SELECT intDiv(number, 2) + %[6]d AS i, modulo(number, 2) AS k FROM numbers(%[7]d)))`,
				g.startMs, g.spanMs, n, mixedProducts, mixedDevices, off, 2*c))
	}
	start := time.Now()
	if err := execParallel(ctx, db, stmts, p.GenWorkers, func(done, total int) {
		p.Logf("mixed %d: generated %d/%d chunks in %s", n, done, total, time.Since(start).Round(time.Millisecond))
	}); err != nil {
		return genInfo{}, err
	}
	genTime := time.Since(start)
	var msgs, props, rolled, quarters, hours, days uint64
	if err := conn.QueryRow(ctx, "SELECT (SELECT count() FROM device_message), (SELECT count() FROM device_property), (SELECT countMerge(n) FROM device_property_hourly),"+
		" (SELECT sum(messages) FROM device_message_quarter), (SELECT countMerge(n) FROM device_property_product_hourly), (SELECT sum(n) FROM device_property_daily)").
		Scan(&msgs, &props, &rolled, &quarters, &hours, &days); err != nil {
		return genInfo{}, err
	}
	if msgs != uint64(n) || props != 2*uint64(n) || rolled != props || quarters != msgs || hours != props || days != props {
		return genInfo{}, fmt.Errorf("generated %d messages (%d in quarter-hours), %d property values (%d, %d and %d rolled up); want %d, %d", msgs, quarters, props, rolled, hours, days, n, 2*n)
	}
	res.Messages, res.PropertyRows, res.GenerateSeconds = int64(n), int64(props), genTime.Seconds()
	p.Logf("mixed %d: %d messages + %d property values in %s", n, msgs, props, genTime.Round(time.Millisecond))
	for _, st := range []string{
		"CREATE TABLE bench_mixed_info (rows UInt64, start_ms Int64, span_ms Int64, gen_seconds Float64) ENGINE = TinyLog",
		fmt.Sprintf("INSERT INTO bench_mixed_info SELECT toUInt64(%d), toInt64(%d), toInt64(%d), toFloat64(%f)", g.rows, g.startMs, g.spanMs, genTime.Seconds()),
	} {
		if err := conn.Exec(ctx, st); err != nil {
			return genInfo{}, fmt.Errorf("%s: %w", st, err)
		}
	}
	return g, nil
}
