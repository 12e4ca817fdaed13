package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"devicehub/meta"
	"devicehub/schema"
	"devicehub/tsdb"
)

// Store is the time-series store the queries run on (*tsdb.DB): one
// method per kind of query, each holding its SQL. An export's history
// also needs PrepareExport (exportHistoryExporter).
type Store interface {
	MessageCounts(ctx context.Context, q tsdb.CountQuery) ([]tsdb.Bucket, error)
	PropertyAggregates(ctx context.Context, q tsdb.AggQuery) ([]tsdb.AggSeries, error)
	PropertyHistory(ctx context.Context, productID, deviceID string, properties []string, n int) ([]tsdb.PropertyValue, error)
	HistoryRange(ctx context.Context, q tsdb.HistoryQuery) ([]tsdb.PropertyValue, error)
	Location() *time.Location
}

// Scope looks up the objects a query names within the caller's products
// (ctx, meta.LimitProducts): an object outside them is meta.ErrNotFound,
// as if it did not exist. api's lookups, cached and shared with its
// commands, are one.
type Scope interface {
	// DeviceRef is a device's product and thing model in force.
	DeviceRef(ctx context.Context, id string) (meta.DeviceRef, error)
	// ProductModel is a product's thing model (JSON text).
	ProductModel(ctx context.Context, id string) (string, error)
	// ProductVisible is nil when ctx may reach product id.
	ProductVisible(ctx context.Context, id string) error
}

// AlarmCounter counts the alarms raised in each bucket of q, newest first,
// within ctx's products (the alarm store, in PostgreSQL).
type AlarmCounter interface {
	AlarmCounts(ctx context.Context, q AlarmCountQuery) ([]uint64, error)
}

// Options are the service's settings; the zero value is the default.
type Options struct {
	// Concurrency is how many dashboard requests run at once (0: 2 x
	// GOMAXPROCS); Wait is how long one more waits for a slot before it is
	// refused with a *BusyError (0: 2 s). Exports have their own slots
	// (maxExports) in the same gate.
	Concurrency int
	Wait        time.Duration
	// Clock is the "now" of date math and default ranges (nil: time.Now).
	Clock func() time.Time
}

// Deps are what the service calls.
type Deps struct {
	// Store answers the queries; nil: every request fails (a server error).
	Store Store
	// Scope looks up products and devices within the caller's products.
	Scope Scope
	// Alarms counts alarms (object "alarm"); AlarmSeverities and
	// AlarmStates are the values its severity and state filters take.
	Alarms          AlarmCounter
	AlarmSeverities []string
	AlarmStates     []string
	// JSONError names what encoding/json refused in a body as an input
	// error (api's errors.go jsonError: a *schema.ArgError naming the
	// field); nil: schema.Invalid of "body" with encoding/json's text.
	JSONError func(error) error
}

// Service answers endpoint 14 (Run) and exports (PlanExport).
type Service struct {
	opts Options
	deps Deps
	gate *gate
}

// New returns the service.
func New(opts Options, deps Deps) *Service {
	if deps.JSONError == nil {
		deps.JSONError = func(err error) error { return schema.Invalid("body", "%v", err) }
	}
	return &Service{opts: opts, deps: deps, gate: newGate(opts.Concurrency, opts.Wait)}
}

// dashboardTimeout bounds a request's lookups and queries (an export's
// rows have exportTimeout).
const dashboardTimeout = 10 * time.Second

// now is the clock of date math (Options.Clock).
func (s *Service) now() time.Time {
	if s.opts.Clock != nil {
		return s.opts.Clock()
	}
	return time.Now()
}

// Query is one item of the _multi body (and an export's body).
type Query struct {
	Dashboard   string          `json:"dashboard"`
	Object      string          `json:"object"`
	Measurement string          `json:"measurement"`
	Dimension   string          `json:"dimension"`
	Group       string          `json:"group"`
	Params      json.RawMessage `json:"params"`
}

// Answer is endpoint 14's result: every query's items in request order.
// It holds its request's slot of the gate until Release, called once it
// is written.
type Answer struct {
	results []*[]byte // each query's items, comma-separated
	release func()    // the slot's
}

// Append appends the result, the JSON array of the items, to b.
func (a *Answer) Append(b []byte) []byte {
	b = append(b, '[')
	first := true
	for _, items := range a.results {
		if len(*items) == 0 {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, *items...)
	}
	return append(b, ']')
}

// Release gives the answer's buffers and slot back; it is not to be used
// after.
func (a *Answer) Release() {
	for _, r := range a.results {
		if r != nil {
			putItemBuffer(r)
		}
	}
	a.results = nil
	if a.release != nil {
		a.release()
		a.release = nil
	}
}

// Run answers endpoint 14's body (POST /api/dashboard/_multi), checked
// JSON text: it decodes the queries (decode.go), plans each (plan.go),
// checks it against the request's limits (limits.go) and resolves it
// against the caller's scope and the thing model, all before any runs;
// then takes a slot of the gate (or is refused with a *BusyError) and
// runs the queries concurrently, each its one tsdb method, writing their
// items (encode.go). Bad input is a *schema.ArgError naming the query
// ([i]) and field, an object outside the caller's products
// meta.ErrNotFound.
func (s *Service) Run(ctx context.Context, body []byte) (*Answer, error) {
	qs, err := s.decodeQueries(body)
	if err != nil {
		return nil, err
	}
	if len(qs) == 0 {
		return nil, schema.Invalid("body", "must be a non-empty array of queries")
	}
	if len(qs) > maxDashboardQueries {
		return nil, schema.Invalid("body", "at most %d queries", maxDashboardQueries)
	}
	if s.deps.Store == nil {
		return nil, errors.New("dashboard: no time-series store")
	}
	ctx, cancel := context.WithTimeout(ctx, dashboardTimeout)
	defer cancel()
	now, loc := s.now(), s.deps.Store.Location()
	plans := make([]*queryPlan, len(qs))
	var limits budget
	for i := range qs {
		at := queryAt(i)
		p, err := s.planQuery(at, &qs[i], now, loc, false)
		if err != nil {
			return nil, err
		}
		if err := limits.addBuckets(at, p.buckets); err != nil {
			return nil, err
		}
		if err := s.resolve(ctx, p); err != nil {
			return nil, err
		}
		if p.history != nil {
			if err := checkHistoryModel(at, p.resolved); err != nil {
				return nil, err
			}
			if err := limits.addHistory(at, p.resolved.Properties, p.resolved.Query.N); err != nil {
				return nil, err
			}
		}
		plans[i] = p
	}
	if err := s.gate.admit(ctx, &s.gate.queries); err != nil {
		return nil, err
	}
	var size resultBytes
	a := &Answer{results: make([]*[]byte, len(plans)), release: func() { s.gate.release(&s.gate.queries) }}
	if len(plans) == 1 { // no goroutine for one query
		a.results[0] = getItemBuffer()
		var err error
		if *a.results[0], err = s.run(ctx, plans[0], &size, loc, *a.results[0]); err != nil {
			a.Release()
			return nil, err
		}
		return a, nil
	}
	g, gctx := errgroup.WithContext(ctx)
	for i, p := range plans {
		a.results[i] = getItemBuffer()
		g.Go(func() error {
			var err error
			*a.results[i], err = s.run(gctx, p, &size, loc, *a.results[i])
			return err
		})
	}
	if err := g.Wait(); err != nil {
		a.Release()
		return nil, err
	}
	return a, nil
}

// itemBuffers hold the items of a query of endpoint 14 until the answer
// is written.
var itemBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

func getItemBuffer() *[]byte {
	b := itemBuffers.Get().(*[]byte)
	*b = (*b)[:0]
	return b
}

func putItemBuffer(b *[]byte) {
	if cap(*b) <= 1<<20 {
		itemBuffers.Put(b)
	}
}

// queryAt names the query at index i of a body in errors: [i].
func queryAt(i int) string {
	if i < len(queryAts) {
		return queryAts[i]
	}
	return fmt.Sprintf("[%d]", i)
}

var queryAts = func() []string {
	at := make([]string, maxDashboardQueries)
	for i := range at {
		at[i] = fmt.Sprintf("[%d]", i)
	}
	return at
}()

// decodeQueries reads the body of endpoint 14 as encoding/json does,
// without reflection when decodeQueriesFast can; the queries' params
// alias the body.
func (s *Service) decodeQueries(body []byte) ([]Query, error) {
	if json.Valid(body) {
		if qs, ok := decodeQueriesFast(body); ok {
			return qs, nil
		}
	}
	var qs []Query
	if err := json.Unmarshal(body, &qs); err != nil {
		return nil, s.deps.JSONError(err)
	}
	return qs, nil
}

// resolve looks up what a planned query needs within the caller's
// products: a product or device outside them, or that does not exist, is
// not_found before any query runs; a property aggregate query is checked
// against its device's or product's thing model (p.model); a history
// query against its device (p.resolved).
func (s *Service) resolve(ctx context.Context, p *queryPlan) error {
	switch {
	case p.alarms != nil:
		return s.resolveAlarmCounts(ctx, p)
	case p.counts != nil:
		if p.counts.ProductID != "" {
			// A product that does not exist is not_found, as in every
			// other dashboard query (not a row of zeros); the lookup is
			// the thing models' cache, shared with property aggregates.
			_, err := s.deps.Scope.ProductModel(ctx, p.counts.ProductID)
			return err
		}
		return nil
	case p.agg != nil:
		m, err := s.aggModel(ctx, p.agg)
		if err != nil {
			return err
		}
		p.model, err = resolveAgg(p.agg, m, p.sent)
		return atField(p.at, err)
	}
	dev, err := s.deps.Scope.DeviceRef(ctx, p.history.DeviceID)
	if err != nil {
		return err
	}
	p.resolved, err = resolveHistory(*p.history, dev)
	return atField(p.at, err)
}

// run runs a resolved query, its one tsdb method, and appends its items
// to b, comma-separated, each counted into size; times are shown in loc.
func (s *Service) run(ctx context.Context, p *queryPlan, size *resultBytes, loc *time.Location, b []byte) ([]byte, error) {
	switch {
	case p.alarms != nil:
		return s.runAlarmCounts(ctx, p, size, loc, b)
	case p.counts != nil:
		buckets, err := s.messageCounts(ctx, *p.counts)
		if err != nil {
			return b, fmt.Errorf("%s: %w", p.at, err)
		}
		var scratch [64]byte
		ts := scratch[:0]
		prefix := countItemPrefix(p.group)
		for i, bk := range buckets {
			if b, ts, err = appendCountItem(b, ts, size, prefix, bk.Count, p.layout, bk.Start.In(loc), i); err != nil {
				return b, err
			}
		}
		return b, nil
	case p.agg != nil:
		q := p.agg
		series, err := s.deps.Store.PropertyAggregates(ctx, *q)
		if err != nil {
			return b, fmt.Errorf("%s: %w", p.at, err)
		}
		var scratch [64]byte
		ts := scratch[:0]
		for _, sr := range series {
			prefix := propAggItemPrefix(p.group, sr.Property)
			for i, bk := range sr.Buckets {
				if b, ts, err = appendPropAggItem(b, ts, size, prefix, q.Agg, bk, p.layout, bk.Start.In(loc), i); err != nil {
					return b, err
				}
			}
		}
		return b, nil
	}
	values, err := p.resolved.run(ctx, s.deps.Store)
	if err != nil {
		return b, err
	}
	var scratch [64]byte
	ts := scratch[:0]
	prefix := historyItemPrefix(p.group)
	for i := range values {
		if b, ts, err = appendHistoryItem(b, ts, size, prefix, &values[i], p.resolved.Model, loc); err != nil {
			return b, err
		}
	}
	return b, nil
}

// messageCounts answers a message-count query (endpoint 14's and an
// export's) within ctx's products: a product outside is not_found; every
// product (q.ProductID "") is every product of the limit, one query of
// that set (tsdb sums their counts per bucket, cached per set); a caller
// limited to no product gets no buckets.
func (s *Service) messageCounts(ctx context.Context, q tsdb.CountQuery) ([]tsdb.Bucket, error) {
	all, products := meta.ProductsOf(ctx)
	if q.ProductID != "" {
		if err := s.deps.Scope.ProductVisible(ctx, q.ProductID); err != nil {
			return nil, err
		}
	} else if !all {
		if len(products) == 0 {
			return nil, nil
		}
		q.Products = products
	}
	return s.deps.Store.MessageCounts(ctx, q)
}

// aggModel looks up the thing model a property aggregate query is
// checked against (resolveAgg): its device's, within the caller's
// products, or without a device its product's.
func (s *Service) aggModel(ctx context.Context, q *tsdb.AggQuery) (aggModel, error) {
	if q.DeviceID != "" {
		dev, err := s.deps.Scope.DeviceRef(ctx, q.DeviceID)
		if err != nil {
			return aggModel{}, err
		}
		return aggModel{ProductID: dev.ProductID, Metadata: dev.Metadata}, nil
	}
	metadata, err := s.deps.Scope.ProductModel(ctx, q.ProductID)
	if err != nil {
		return aggModel{}, err
	}
	return aggModel{ProductID: q.ProductID, Metadata: metadata}, nil
}
