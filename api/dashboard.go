package api

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"
	"golang.org/x/sync/errgroup"

	"devicehub/meta"
	"devicehub/schema"
	"devicehub/tsdb"
)

// DashboardStore answers dashboard queries from ClickHouse.
type DashboardStore interface {
	MessageCounts(ctx context.Context, q tsdb.CountQuery) ([]tsdb.Bucket, error)
	PropertyAggregates(ctx context.Context, q tsdb.AggQuery) ([]tsdb.AggSeries, error)
	PropertyHistory(ctx context.Context, productID, deviceID string, properties []string, n int) ([]tsdb.PropertyValue, error)
	HistoryRange(ctx context.Context, q tsdb.HistoryQuery) ([]tsdb.PropertyValue, error)
	Location() *time.Location
}

// DeviceModels resolves a device's product and the thing model in force.
type DeviceModels interface {
	GetDeviceRef(ctx context.Context, id string) (meta.DeviceRef, error)
}

const (
	defaultBuckets   = 30 // of a message-count query with neither from nor limit
	dashboardTimeout = 10 * time.Second
)

// dashboardRun runs one planned query and returns its items, each encoded
// as it is made and counted against the response's size.
type dashboardRun func(context.Context, *resultBytes) ([]json.RawMessage, error)

// dashboardPlan is one checked query. A message-count query is ready to
// run and knows its buckets. A property query first resolves its device
// or product (resolve), which checks the properties against the thing
// model and, for history, tells how many properties "all" is.
type dashboardPlan struct {
	run     dashboardRun
	buckets int                                              // of all its properties
	history int                                              // values per property
	resolve func(context.Context) (int, dashboardRun, error) // properties read, and the run
}

// encodeItem encodes one item and counts it into size.
func encodeItem(items []json.RawMessage, size *resultBytes, item any) ([]json.RawMessage, error) {
	b, err := json.Marshal(item)
	if err != nil {
		return items, err
	}
	if err := size.add(len(b) + 1); err != nil {
		return items, err
	}
	return append(items, b), nil
}

// dashboardQuery is one item of the _multi body.
type dashboardQuery struct {
	Dashboard   string          `json:"dashboard"`
	Object      string          `json:"object"`
	Measurement string          `json:"measurement"`
	Dimension   string          `json:"dimension"`
	Group       string          `json:"group"`
	Params      json.RawMessage `json:"params"`
}

// bucketParams are the parameters of every bucketed query (message
// counts, property aggregates).
type bucketParams struct {
	Time   string          `json:"time"`
	Format string          `json:"format"`
	Limit  *int            `json:"limit"`
	From   json.RawMessage `json:"from"`
	To     json.RawMessage `json:"to"`
}

// aggParams are a message-count query's own parameters, beside its
// bucketParams (both decoded from the same params object).
type aggParams struct {
	ProductID string `json:"productId"`
}

type historyParams struct {
	DeviceID   string          `json:"deviceId"`
	History    *int            `json:"history"`
	Properties []string        `json:"properties"`
	From       json.RawMessage `json:"from"` // with to: a range to page through (dashboard_agg.go)
	To         json.RawMessage `json:"to"`
}

// aggItem and historyItem are the spec's result items.
type aggItem struct {
	Group string  `json:"group"`
	Data  aggData `json:"data"`
}

type aggData struct {
	Value      uint64 `json:"value"`
	TimeString string `json:"timeString"`
	Timestamp  int    `json:"timestamp"` // position 0, 1, 2...
}

type historyItem struct {
	Group string      `json:"group"`
	Data  historyData `json:"data"`
}

type historyData struct {
	Value      historyValue `json:"value"`
	TimeString string       `json:"timeString"`
	Timestamp  int64        `json:"timestamp"`
}

type historyValue struct {
	ID           string `json:"id"`
	Property     string `json:"property"`
	PropertyName string `json:"propertyName"`
	Type         string `json:"type"`
	Value        any    `json:"value"`
	FormatValue  string `json:"formatValue"`
	CreateTime   int64  `json:"createTime"`
	Timestamp    int64  `json:"timestamp"`
}

// dashboardMulti is endpoint 14: POST /api/dashboard/_multi. The queries
// run concurrently; the result lists every query's items in request order.
// Every query is checked against the limits (dashboard_limits.go) before
// any runs; then the request takes a slot of the dashboard gate, or is
// refused with 503 when none comes free in time.
func (s *Server) dashboardMulti(c *fiber.Ctx) error {
	var qs []dashboardQuery
	if err := decodeJSON(c, &qs); err != nil {
		return err
	}
	if len(qs) == 0 {
		return schema.Invalid("body", "must be a non-empty array of queries")
	}
	if len(qs) > maxDashboardQueries {
		return schema.Invalid("body", "at most %d queries", maxDashboardQueries)
	}
	if s.deps.Dashboard == nil {
		return errors.New("api: dashboard: no time-series store")
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), dashboardTimeout)
	defer cancel()
	now, loc := time.Now(), s.deps.Dashboard.Location()
	runs := make([]dashboardRun, len(qs))
	var budget dashboardBudget
	for i := range qs {
		at := fmt.Sprintf("[%d]", i)
		plan, err := s.planDashboard(at, &qs[i], now, loc)
		if err != nil {
			return err
		}
		if err := budget.addBuckets(at, plan.buckets); err != nil {
			return err
		}
		if plan.resolve == nil {
			runs[i] = plan.run
			continue
		}
		props, run, err := plan.resolve(ctx)
		if err != nil {
			return err
		}
		if err := budget.addHistory(at, props, plan.history); err != nil {
			return err
		}
		runs[i] = run
	}
	if !s.dash.acquire(ctx) {
		return tooBusy(c)
	}
	defer s.dash.release()
	var size resultBytes
	results := make([][]json.RawMessage, len(qs))
	g, gctx := errgroup.WithContext(ctx)
	for i, run := range runs {
		g.Go(func() error {
			items, err := run(gctx, &size)
			results[i] = items
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	n := 0
	for _, items := range results {
		n += len(items)
	}
	out := make([]json.RawMessage, 0, n)
	for _, items := range results {
		out = append(out, items...)
	}
	return ok(c, out)
}

// queryKind is what a dashboard query asks for.
type queryKind int

const (
	kindMessageCounts queryKind = iota
	kindHistory
	kindPropertyAggregates
)

// kind checks the fields that name a query (endpoint 14's and an
// export's alike) and says which query it is.
func (q *dashboardQuery) kind(at string) (queryKind, error) {
	for _, f := range []struct{ name, v string }{
		{"dashboard", q.Dashboard}, {"object", q.Object}, {"measurement", q.Measurement}, {"dimension", q.Dimension},
	} {
		if f.v == "" {
			return 0, schema.Invalid(at+"."+f.name, "is required")
		}
	}
	if q.Dashboard != "device" {
		return 0, schema.Invalid(at+".dashboard", "unknown dashboard %q (supported: device)", q.Dashboard)
	}
	switch {
	case q.Object == "message" && q.Measurement == "quantity" && q.Dimension == "agg":
		return kindMessageCounts, nil
	case q.Measurement == "properties" && q.Dimension == "history":
		return kindHistory, nil
	case q.Measurement == "properties" && q.Dimension == "agg":
		return kindPropertyAggregates, nil
	}
	return 0, schema.Invalid(at, "unknown query %s/%s/%s (supported: object message with quantity/agg; measurement properties with history or agg)",
		q.Object, q.Measurement, q.Dimension)
}

// planDashboard validates one query and returns its plan. Date math is
// relative to now, in the platform zone loc.
func (s *Server) planDashboard(at string, q *dashboardQuery, now time.Time, loc *time.Location) (*dashboardPlan, error) {
	k, err := q.kind(at)
	if err != nil {
		return nil, err
	}
	switch k {
	case kindMessageCounts:
		return s.planMessageCounts(at, q, now, loc)
	case kindHistory:
		return s.planHistory(at, q, now, loc)
	default:
		return s.planPropertyAggregates(at, q, now, loc)
	}
}

// checkHistoryProperties checks the properties a history query names
// (endpoint 14's and an export's alike).
func checkHistoryProperties(at string, props []string) error {
	if len(props) > maxHistoryProperties {
		return schema.Invalid(at+".params.properties", "%d properties; at most %d properties per history query",
			len(props), maxHistoryProperties)
	}
	return checkPropertyNames(at, props)
}

func decodeParams(at string, raw json.RawMessage, v any) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		var ae *schema.ArgError
		if errors.As(jsonError(err), &ae) {
			return schema.Invalid(at+".params."+ae.Field, "%s", ae.Msg)
		}
		return schema.Invalid(at+".params", "malformed")
	}
	return nil
}

// messageCountQuery decodes a message-count query's params and plans its
// buckets (endpoint 14's and an export's alike).
func messageCountQuery(at string, q *dashboardQuery, now time.Time, loc *time.Location) (aggParams, bucketPlan, error) {
	var p aggParams
	var bp bucketParams
	if err := decodeParams(at, q.Params, &p); err != nil {
		return p, bucketPlan{}, err
	}
	if err := decodeParams(at, q.Params, &bp); err != nil {
		return p, bucketPlan{}, err
	}
	b, err := planBuckets(at, bp, now, loc)
	return p, b, err
}

func (s *Server) planMessageCounts(at string, q *dashboardQuery, now time.Time, loc *time.Location) (*dashboardPlan, error) {
	p, b, err := messageCountQuery(at, q, now, loc)
	if err != nil {
		return nil, err
	}
	group := q.Group
	run := func(ctx context.Context, size *resultBytes) ([]json.RawMessage, error) {
		buckets, err := s.messageCounts(ctx, tsdb.CountQuery{
			Interval: b.interval, From: b.from, To: b.to, ProductID: p.ProductID, Limit: b.limit,
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", at, err)
		}
		items := make([]json.RawMessage, 0, len(buckets))
		for i, bk := range buckets {
			if items, err = encodeItem(items, size, aggItem{Group: group, Data: aggData{
				Value: bk.Count, TimeString: b.layout.format(bk.Start.In(loc)), Timestamp: i,
			}}); err != nil {
				return nil, err
			}
		}
		return items, nil
	}
	// A product outside the caller's is not_found before any query runs.
	return &dashboardPlan{buckets: b.count, resolve: func(ctx context.Context) (int, dashboardRun, error) {
		if p.ProductID != "" {
			if err := productVisible(ctx, p.ProductID); err != nil {
				return 0, nil, err
			}
		}
		return 0, run, nil
	}}, nil
}

// bucketPlan is the checked bucket parameters of a query.
type bucketPlan struct {
	interval string
	layout   javaLayout
	limit    int // 0: none given
	from, to time.Time
	count    int // buckets the query returns (per property)
}

// planBuckets checks the bucket parameters: time (default 1d), format
// (default yyyy-MM-dd), limit, and from/to, epoch ms or date math relative
// to now in the platform zone loc; without from, the range is the limit's
// worth of buckets (30 without a limit) ending with the one holding to.
func planBuckets(at string, p bucketParams, now time.Time, loc *time.Location) (bucketPlan, error) {
	b := bucketPlan{interval: p.Time}
	if b.interval == "" {
		b.interval = tsdb.Day
	}
	if err := tsdb.CheckInterval(b.interval); err != nil {
		return b, fmt.Errorf("%s.params.time: %w", at, err)
	}
	format := p.Format
	if format == "" {
		format = "yyyy-MM-dd"
	}
	var err error
	if b.layout, err = parseJavaPattern(format); err != nil {
		return b, schema.Invalid(at+".params.format", "%v", err)
	}
	if p.Limit != nil {
		if *p.Limit < 1 || *p.Limit > maxQueryBuckets {
			return b, schema.Invalid(at+".params.limit", "must be from 1 to %d", maxQueryBuckets)
		}
		b.limit = *p.Limit
	}
	if b.to, err = parseTimeParam(at+".params.to", p.To, now, loc, now); err != nil {
		return b, err
	}
	n := b.limit
	if n == 0 {
		n = defaultBuckets
	}
	from, err := tsdb.RangeStart(b.interval, b.to, n, loc)
	if err != nil {
		return b, fmt.Errorf("%s.params: %w", at, err)
	}
	if b.from, err = parseTimeParam(at+".params.from", p.From, now, loc, from); err != nil {
		return b, err
	}
	// The buckets this query returns: those of the range, at most limit
	// (maxQueryBuckets without one); a range outside what ClickHouse's
	// DateTime holds is refused here, before any query runs.
	bs, err := tsdb.Buckets(b.interval, b.from, b.to, loc, b.limit)
	if err != nil {
		return b, fmt.Errorf("%s.params: %w", at, err)
	}
	b.count = len(bs)
	return b, nil
}

// planHistory checks a history query. Its plan's resolve looks the device
// up, so that "all properties" counts as the thing model's properties.
// With from or to, it reads the values of that range (paging back through
// them, dashboard_agg.go); without, the latest values.
func (s *Server) planHistory(at string, q *dashboardQuery, now time.Time, loc *time.Location) (*dashboardPlan, error) {
	var p historyParams
	if err := decodeParams(at, q.Params, &p); err != nil {
		return nil, err
	}
	if p.DeviceID == "" {
		return nil, schema.Invalid(at+".params.deviceId", "is required")
	}
	n := 1
	if p.History != nil {
		if *p.History < 1 || *p.History > maxHistory {
			return nil, schema.Invalid(at+".params.history", "must be from 1 to %d", maxHistory)
		}
		n = *p.History
	}
	if err := checkHistoryProperties(at, p.Properties); err != nil {
		return nil, err
	}
	rng, err := planHistoryRange(at, p, now, loc)
	if err != nil {
		return nil, err
	}
	productID, group := q.Object, q.Group
	return &dashboardPlan{history: n, resolve: func(ctx context.Context) (int, dashboardRun, error) {
		return s.resolveHistory(ctx, at, p, n, rng, productID, group)
	}}, nil
}

// resolveHistory looks up the device of a history query and returns the
// number of properties it reads and the function that runs it.
func (s *Server) resolveHistory(ctx context.Context, at string, p historyParams, n int, rng *historyRange, productID, group string) (int, dashboardRun, error) {
	dev, err := s.deviceRef(ctx, p.DeviceID)
	if err != nil {
		return 0, nil, err
	}
	if dev.ProductID != productID {
		return 0, nil, schema.Invalid(at+".object", "device %q belongs to product %q, not %q", p.DeviceID, dev.ProductID, productID)
	}
	model, err := schema.ParseThingModelString(dev.Metadata)
	if err != nil {
		model = schema.EmptyThingModel() // a stored model is valid; stay robust regardless
	}
	props := len(p.Properties)
	if props == 0 {
		props = len(model.Properties)
		if props > maxHistoryProperties {
			return 0, nil, schema.Invalid(at+".params.properties", "none named: all %d properties of the device's thing model; at most %d properties per history query: name them",
				props, maxHistoryProperties)
		}
	}
	return props, func(ctx context.Context, size *resultBytes) ([]json.RawMessage, error) {
		var values []tsdb.PropertyValue
		var err error
		if rng == nil {
			values, err = s.deps.Dashboard.PropertyHistory(ctx, productID, p.DeviceID, p.Properties, n)
		} else {
			values, err = s.deps.Dashboard.HistoryRange(ctx, tsdb.HistoryQuery{ProductID: productID, DeviceID: p.DeviceID,
				Properties: p.Properties, From: rng.from, To: rng.to, N: n})
		}
		if err != nil {
			return nil, err
		}
		loc := s.deps.Dashboard.Location()
		items := make([]json.RawMessage, 0, len(values))
		for _, v := range values {
			if items, err = encodeItem(items, size, historyItem{Group: group, Data: historyEntry(v, model, loc)}); err != nil {
				return nil, err
			}
		}
		return items, nil
	}, nil
}

// deviceRef looks a device up through the server's short-lived cache of
// device references (the one commands use: cleared by every product or
// device change through this instance, at most DeviceCacheTTL old).
func (s *Server) deviceRef(ctx context.Context, id string) (meta.DeviceRef, error) {
	ref, err := s.refs.get(ctx, id, time.Now(), func(ctx context.Context, id string) (meta.DeviceRef, time.Time, error) {
		ref, err := s.deps.Models.GetDeviceRef(ctx, id)
		return ref, time.Time{}, err
	})
	if err != nil {
		return meta.DeviceRef{}, err
	}
	// The cache is shared by every caller: the caller's products are
	// checked on each use.
	return ref, deviceVisible(ctx, ref)
}

// historyID identifies a stored value by what identifies its row: the md5
// hex of "device-property-ms". The same value has the same id in every
// response, and the id needs no column of its own (device_property stored
// each value's message id for it until schema version 2).
func historyID(v tsdb.PropertyValue) string {
	sum := md5.Sum([]byte(v.DeviceID + "-" + v.Property + "-" + strconv.FormatInt(v.Time.UnixMilli(), 10)))
	return hex.EncodeToString(sum[:])
}

// historyEntry shapes one stored value with its thing-model definition.
func historyEntry(v tsdb.PropertyValue, model *schema.ThingModel, loc *time.Location) historyData {
	var value any
	switch v.ValueType {
	case "number":
		value = v.Num
	case "bool":
		value = v.Num != 0
	case "json":
		value = json.RawMessage(v.Str)
	default:
		value = v.Str
	}
	hv := historyValue{
		ID: historyID(v), Property: v.Property, PropertyName: v.Property,
		Type: v.ValueType, Value: value, CreateTime: v.Time.UnixMilli(), Timestamp: v.Time.UnixMilli(),
	}
	if def, ok := model.Property(v.Property); ok {
		hv.PropertyName = def.Name
		hv.Type = def.ValueType.Type
		hv.FormatValue = def.ValueType.FormatValue(value)
	} else {
		hv.FormatValue = fmt.Sprint(value)
	}
	return historyData{Value: hv, TimeString: v.Time.In(loc).Format(time.DateTime), Timestamp: v.Time.UnixMilli()}
}
