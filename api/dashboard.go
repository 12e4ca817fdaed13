package api

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
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
	dashboardTimeout = 10 * time.Second
)

// dashboardPlan is one checked query of endpoint 14 or of an export: the
// tsdb query it runs (one of counts, agg and history) and how its items
// are shaped. resolveDashboard looks up what it needs from the metadata
// (the product, or the device and its thing model); runDashboard (an
// export: writeExport) runs it.
type dashboardPlan struct {
	at, group string
	buckets   int        // of all its properties (bucketed queries)
	layout    javaLayout // of the buckets' timeString
	counts    *tsdb.CountQuery
	agg       *tsdb.AggQuery // its properties without repeats
	sent      []string       // agg's properties as sent (errors name their index)
	history   *tsdb.HistoryQuery
	alarms    *alarmCountPlan // alarm counts (alarms_dashboard.go)
	// Set by resolveDashboard: agg's thing model in force (the device's,
	// or the product's without a device), and history resolved.
	model    *schema.ThingModel
	resolved tsdb.History
}

// countItemPrefix is what every message-count item of group starts
// with, up to its value (appendCountItem).
func countItemPrefix(group string) []byte {
	b := append(make([]byte, 0, len(group)+32), `{"group":`...)
	b = appendJSONString(b, group)
	return append(b, `,"data":{"value":`...)
}

// appendCountItem appends a message-count bucket, the aggItem
// {group, data: {value, timeString, timestamp: i, time, timeZone}}, as the tests'
// appendItem (encoding/json) does (without reflection:
// TestAppendCountItem compares them), prefix being countItemPrefix(group)
// and its timeString start in layout; scratch holds the timeString while
// it is written.
func appendCountItem(b, scratch []byte, size *resultBytes, prefix []byte, value uint64, layout javaLayout, start time.Time, i int) ([]byte, []byte, error) {
	before := len(b)
	if before > 0 {
		b = append(b, ',')
	}
	item := len(b)
	b = append(b, prefix...)
	b = strconv.AppendUint(b, value, 10)
	return endBucketItem(b, scratch, size, before, item, layout, start, i)
}

// endBucketItem ends a bucket's item that starts at b[item:] (b[before:]
// with its comma) after its value: its timeString (start in layout,
// written through scratch) and timestamp i; the item is counted into
// size, and taken back out of b when the result's size is refused.
func endBucketItem(b, scratch []byte, size *resultBytes, before, item int, layout javaLayout, start time.Time, i int) ([]byte, []byte, error) {
	b = append(b, `,"timeString":`...)
	scratch = layout.appendFormat(scratch[:0], start)
	b = appendJSONBytes(b, scratch)
	b = append(b, `,"timestamp":`...)
	b = strconv.AppendInt(b, int64(i), 10)
	b = appendBucketTime(b, start)
	b = append(b, '}', '}')
	if err := size.add(len(b) - item + 1); err != nil {
		return b[:before], scratch, err
	}
	return b, scratch, nil
}

// appendBucketTime appends, beside the spec's fields of a bucket (whose
// timestamp is a position), the bucket's start as epoch milliseconds and
// the zone its timeString and boundaries follow: "time", "timeZone".
func appendBucketTime(b []byte, start time.Time) []byte {
	b = append(b, `,"time":`...)
	b = strconv.AppendInt(b, start.UnixMilli(), 10)
	return appendTimeZone(b, start.Location())
}

// appendTimeZone appends the member "timeZone": the zone's name (IANA,
// as DEVICEHUB_TIMEZONE names it; "Local" is the server's own).
func appendTimeZone(b []byte, loc *time.Location) []byte {
	b = append(b, `,"timeZone":`...)
	return appendJSONString(b, loc.String())
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
	From       json.RawMessage `json:"from"` // with to: a range to page through (planHistory)
	To         json.RawMessage `json:"to"`
}

// dashboardMulti is endpoint 14: POST /api/dashboard/_multi. The queries
// run concurrently; the result lists every query's items in request order.
// Every query is checked against the limits (dashboard_limits.go) before
// any runs; then the request takes a slot of the dashboard gate, or is
// refused with 503 when none comes free in time.
func (s *Server) dashboardMulti(c *fiber.Ctx) error {
	qs, err := decodeQueries(c)
	if err != nil {
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
	now, loc := s.dashboardNow(), s.deps.Dashboard.Location()
	plans := make([]*dashboardPlan, len(qs))
	var budget dashboardBudget
	for i := range qs {
		at := queryAt(i)
		plan, err := s.planDashboard(at, &qs[i], now, loc)
		if err != nil {
			return err
		}
		if err := budget.addBuckets(at, plan.buckets); err != nil {
			return err
		}
		if err := s.resolveDashboard(ctx, plan); err != nil {
			return err
		}
		if plan.history != nil {
			if err := checkHistoryModel(at, plan.resolved); err != nil {
				return err
			}
			if err := budget.addHistory(at, plan.resolved.Properties, plan.resolved.Query.N); err != nil {
				return err
			}
		}
		plans[i] = plan
	}
	if !s.dash.acquire(ctx) {
		return tooBusy(c)
	}
	defer s.dash.release()
	var size resultBytes
	results := make([]*[]byte, len(plans)) // each query's items, comma-separated
	defer func() {
		for _, r := range results {
			if r != nil {
				putItemBuffer(r)
			}
		}
	}()
	if len(plans) == 1 { // no goroutine for one query
		results[0] = getItemBuffer()
		var err error
		if *results[0], err = s.runDashboard(ctx, plans[0], &size, loc, *results[0]); err != nil {
			return err
		}
	} else {
		g, gctx := errgroup.WithContext(ctx)
		for i, plan := range plans {
			results[i] = getItemBuffer()
			g.Go(func() error {
				var err error
				*results[i], err = s.runDashboard(gctx, plan, &size, loc, *results[i])
				return err
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
	}
	return okWith(c, func(b []byte) []byte {
		b = append(b, '[')
		first := true
		for _, items := range results {
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
	})
}

// dashboardNow is the clock of date math (Options.DashboardClock).
func (s *Server) dashboardNow() time.Time {
	if s.opts.DashboardClock != nil {
		return s.opts.DashboardClock()
	}
	return time.Now()
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

// decodeQueries reads the body of endpoint 14 as decodeJSON does, without
// reflection when decodeQueriesFast can; the queries' params alias the
// request's body.
func decodeQueries(c *fiber.Ctx) ([]dashboardQuery, error) {
	body, err := checkedBody(c)
	if err != nil {
		return nil, err
	}
	if json.Valid(body) {
		if qs, ok := decodeQueriesFast(body); ok {
			return qs, nil
		}
	}
	var qs []dashboardQuery
	if err := jsonError(json.Unmarshal(body, &qs)); err != nil {
		return nil, err
	}
	return qs, nil
}

// queryKind is what a dashboard query asks for.
type queryKind int

const (
	kindMessageCounts queryKind = iota
	kindHistory
	kindPropertyAggregates
	kindAlarmCounts
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
	case q.Object == "alarm" && q.Measurement == "quantity" && q.Dimension == "agg":
		return kindAlarmCounts, nil
	case q.Measurement == "properties" && q.Dimension == "history":
		return kindHistory, nil
	case q.Measurement == "properties" && q.Dimension == "agg":
		return kindPropertyAggregates, nil
	}
	return 0, schema.Invalid(at, "unknown query %s/%s/%s (supported: object message or alarm with quantity/agg; measurement properties with history or agg)",
		q.Object, q.Measurement, q.Dimension)
}

// planDashboard validates one query of endpoint 14 and returns its plan.
// Date math is relative to now, in the platform zone loc.
func (s *Server) planDashboard(at string, q *dashboardQuery, now time.Time, loc *time.Location) (*dashboardPlan, error) {
	return planQuery(at, q, now, loc, false)
}

// planQuery validates one query of endpoint 14, or an export's (export: a
// history query's own defaults and bounds, planHistory), and returns its
// plan.
func planQuery(at string, q *dashboardQuery, now time.Time, loc *time.Location, export bool) (*dashboardPlan, error) {
	k, err := q.kind(at)
	if err != nil {
		return nil, err
	}
	switch k {
	case kindMessageCounts:
		return planMessageCounts(at, q, now, loc)
	case kindHistory:
		return planHistory(at, q, now, loc, export)
	case kindAlarmCounts:
		if export {
			return nil, schema.Invalid(at+".object", "alarm counts are answered by endpoint 14, not exported")
		}
		return planAlarmCounts(at, q, now, loc)
	default:
		return planPropertyAggregates(at, q, now, loc)
	}
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

// checkParamKeys refuses (400 naming it) a key of the params object raw
// that is none of fields, as encoding/json matches them (case aside): a
// misspelt or foreign parameter ("tz", "deviceID2") is an error, not
// silently ignored.
func checkParamKeys(at string, raw json.RawMessage, fields []string) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var bad string
	walkJSON(raw, true, func(key, _ []byte) bool {
		var k string
		if json.Unmarshal(key, &k) != nil {
			k = string(key)
		}
		for _, f := range fields {
			if strings.EqualFold(k, f) {
				return true
			}
		}
		bad = k
		return false
	})
	if bad == "" {
		return nil
	}
	if len(bad) > 64 {
		bad = bad[:64]
	}
	return schema.Invalid(at+".params."+bad, "is not a parameter of this query (its parameters: %s)", strings.Join(fields, ", "))
}

// decodeQueryParams decodes a bucketed query's params, its own (P) and
// its bucketParams, without reflection when fast can (decodeCountParamsFast,
// decodePropAggParamsFast), else by encoding/json after checking that
// every key is one of fields (checkParamKeys): a failure is named as
// decoding P, then its bucketParams, names it.
func decodeQueryParams[P any](at string, raw json.RawMessage, fields []string, fast func([]byte, *P, *bucketParams, *int) bool) (P, bucketParams, error) {
	var p P
	var bp bucketParams
	var limit int
	if fast(raw, &p, &bp, &limit) {
		return p, bp, nil
	}
	p, bp = *new(P), bucketParams{}
	if err := checkParamKeys(at, raw, fields); err != nil {
		return p, bp, err
	}
	if err := decodeParams(at, raw, &p); err != nil {
		return p, bp, err
	}
	err := decodeParams(at, raw, &bp)
	return p, bp, err
}

// planMessageCounts checks a message-count query and resolves its
// buckets.
func planMessageCounts(at string, q *dashboardQuery, now time.Time, loc *time.Location) (*dashboardPlan, error) {
	p, bp, err := decodeQueryParams(at, q.Params, countParamFields, decodeCountParamsFast)
	if err != nil {
		return nil, err
	}
	b, err := planBuckets(at, bp, now, loc)
	if err != nil {
		return nil, err
	}
	return &dashboardPlan{at: at, group: q.Group, buckets: b.rng.Len(), layout: b.layout,
		counts: &tsdb.CountQuery{Range: &b.rng, ProductID: p.ProductID}}, nil
}

// resolveDashboard looks up what a planned query needs from the metadata:
// a product outside the caller's, or that does not exist, is not_found
// before any query runs; a
// property aggregate query's device or product model is looked up and
// handed to its Resolve (plan.model); a history query's device is looked
// up and handed to its Resolve (plan.resolved).
func (s *Server) resolveDashboard(ctx context.Context, plan *dashboardPlan) error {
	switch {
	case plan.alarms != nil:
		return s.resolveAlarmCounts(ctx, plan)
	case plan.counts != nil:
		if plan.counts.ProductID != "" {
			// A product that does not exist is not_found, as in every
			// other dashboard query (not a row of zeros); the lookup is
			// the thing models' cache, shared with property aggregates.
			_, err := s.productModel(ctx, plan.counts.ProductID)
			return err
		}
		return nil
	case plan.agg != nil:
		m, err := s.aggModel(ctx, plan.agg)
		if err != nil {
			return err
		}
		plan.model, err = plan.agg.Resolve(m, plan.sent)
		return atField(plan.at, err)
	}
	dev, err := s.deviceRef(ctx, plan.history.DeviceID)
	if err != nil {
		return err
	}
	plan.resolved, err = plan.history.Resolve(tsdb.HistoryDevice{ProductID: dev.ProductID, Metadata: dev.Metadata})
	return atField(plan.at, err)
}

// runDashboard runs a resolved query, its one tsdb method, and appends
// its items to b, comma-separated, each counted into size; times are
// shown in loc.
func (s *Server) runDashboard(ctx context.Context, plan *dashboardPlan, size *resultBytes, loc *time.Location, b []byte) ([]byte, error) {
	switch {
	case plan.alarms != nil:
		return s.runAlarmCounts(ctx, plan, size, loc, b)
	case plan.counts != nil:
		buckets, err := s.messageCounts(ctx, *plan.counts)
		if err != nil {
			return b, fmt.Errorf("%s: %w", plan.at, err)
		}
		var scratch [64]byte
		ts := scratch[:0]
		prefix := countItemPrefix(plan.group)
		for i, bk := range buckets {
			if b, ts, err = appendCountItem(b, ts, size, prefix, bk.Count, plan.layout, bk.Start.In(loc), i); err != nil {
				return b, err
			}
		}
		return b, nil
	case plan.agg != nil:
		q := plan.agg
		series, err := s.deps.Dashboard.PropertyAggregates(ctx, *q)
		if err != nil {
			return b, fmt.Errorf("%s: %w", plan.at, err)
		}
		var scratch [64]byte
		ts := scratch[:0]
		for _, sr := range series {
			prefix := propAggItemPrefix(plan.group, sr.Property)
			for i, bk := range sr.Buckets {
				if b, ts, err = appendPropAggItem(b, ts, size, prefix, q.Agg, bk, plan.layout, bk.Start.In(loc), i); err != nil {
					return b, err
				}
			}
		}
		return b, nil
	}
	values, err := plan.resolved.Run(ctx, s.deps.Dashboard)
	if err != nil {
		return b, err
	}
	var scratch [64]byte
	ts := scratch[:0]
	prefix := historyItemPrefix(plan.group)
	for i := range values {
		if b, ts, err = appendHistoryItem(b, ts, size, prefix, &values[i], plan.resolved.Model, loc); err != nil {
			return b, err
		}
	}
	return b, nil
}

// bucketPlan is the checked bucket parameters of a query: its buckets,
// resolved by tsdb, and the layout of their timeString.
type bucketPlan struct {
	layout javaLayout
	rng    tsdb.Range
}

// defaultLayout is the layout of the buckets' timeString without a
// format: yyyy-MM-dd.
var defaultLayout = func() javaLayout {
	l, err := parseJavaPattern("yyyy-MM-dd")
	if err != nil {
		panic(err)
	}
	return l
}()

// planBuckets checks the bucket parameters: time (default 1d), format
// (default yyyy-MM-dd), limit, and from/to, epoch ms or date math relative
// to now in the platform zone loc; tsdb resolves the buckets (without
// from, the limit's worth, 30 without a limit, ending with the one
// holding to).
func planBuckets(at string, p bucketParams, now time.Time, loc *time.Location) (bucketPlan, error) {
	var b bucketPlan
	bp := tsdb.BucketParams{Interval: p.Time, Limit: p.Limit}
	if err := bp.CheckInterval(); err != nil {
		return b, atField(at, err)
	}
	var err error
	if p.Format == "" {
		b.layout = defaultLayout
	} else if b.layout, err = parseJavaPattern(p.Format); err != nil {
		return b, schema.Invalid(at+".params.format", "%v", err)
	}
	if err := bp.CheckLimit(); err != nil {
		return b, atField(at, err)
	}
	if bp.To, err = parseTimeParam(at+".params.to", p.To, now, loc, now); err != nil {
		return b, err
	}
	if !absentParam(p.From) {
		from, err := parseTimeParam(at+".params.from", p.From, now, loc, time.Time{})
		if err != nil {
			return b, err
		}
		bp.From = &from
	}
	b.rng, err = bp.Resolve(loc)
	return b, atField(at, err)
}

// absentParam reports whether a parameter is absent (or null).
func absentParam(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

// atField puts the query's position at before the field of tsdb's
// *schema.ArgError err; other errors are returned as they are.
func atField(at string, err error) error {
	if err == nil {
		return nil
	}
	var ae *schema.ArgError
	if errors.As(err, &ae) {
		return &schema.ArgError{Field: at + "." + ae.Field, Msg: ae.Msg}
	}
	return err
}

// planHistory checks a history query (endpoint 14's, or an export's):
// deviceId, properties, and from/to, epoch ms or date math relative to
// now in the platform zone loc. With from or to it reads the values of
// that range (Bounded: paging back through them, tsdb.DB.HistoryRange);
// without, the latest values. history is the values per property:
// endpoint 14's from 1 to maxHistory (default 1); an export's at least 1,
// default 0: every value of the range.
func planHistory(at string, q *dashboardQuery, now time.Time, loc *time.Location, export bool) (*dashboardPlan, error) {
	var p historyParams
	if err := checkParamKeys(at, q.Params, historyParamFields); err != nil {
		return nil, err
	}
	if err := decodeParams(at, q.Params, &p); err != nil {
		return nil, err
	}
	if p.DeviceID == "" {
		return nil, schema.Invalid(at+".params.deviceId", "is required")
	}
	h := tsdb.HistoryQuery{ProductID: q.Object, DeviceID: p.DeviceID, Properties: p.Properties}
	switch {
	case export && p.History != nil:
		if *p.History < 1 {
			return nil, schema.Invalid(at+".params.history", "must be at least 1 (leave it out for every value of the range)")
		}
		h.N = *p.History
	case export: // N 0: every value
	case p.History != nil:
		if *p.History < 1 || *p.History > maxHistory {
			return nil, schema.Invalid(at+".params.history", "must be from 1 to %d", maxHistory)
		}
		h.N = *p.History
	default:
		h.N = 1
	}
	if err := atField(at, tsdb.CheckHistoryProperties(p.Properties)); err != nil {
		return nil, err
	}
	if !absentParam(p.From) || !absentParam(p.To) {
		h.Bounded = true
		var err error
		if h.From, err = parseTimeParam(at+".params.from", p.From, now, loc, time.Time{}); err != nil {
			return nil, err
		}
		if h.To, err = parseTimeParam(at+".params.to", p.To, now, loc, time.Time{}); err != nil {
			return nil, err
		}
		if err := h.Check(); err != nil {
			return nil, atField(at, err)
		}
	}
	return &dashboardPlan{at: at, group: q.Group, history: &h}, nil
}

// checkHistoryModel refuses a history query of endpoint 14 that names no
// property when the device's thing model has more than
// maxHistoryProperties (an export reads them all).
func checkHistoryModel(at string, h tsdb.History) error {
	if len(h.Query.Properties) == 0 && h.Properties > maxHistoryProperties {
		return schema.Invalid(at+".params.properties", "none named: all %d properties of the device's thing model; at most %d properties per history query: name them",
			h.Properties, maxHistoryProperties)
	}
	return nil
}

// historyItemPrefix is what every history item of group starts with, up
// to its value's id (appendHistoryItem).
func historyItemPrefix(group string) []byte {
	b := append(make([]byte, 0, len(group)+40), `{"group":`...)
	b = appendJSONString(b, group)
	return append(b, `,"data":{"value":{"id":`...)
}

// appendHistoryItem appends a stored value v, the historyItem {group,
// data: {value: {id, property, propertyName, type, value, formatValue,
// createTime, timestamp, outsideModel?}, timeString, timestamp, timeZone}}, after a comma if b
// holds items already, as encoding/json writes it (without reflection:
// TestAppendHistoryItem compares them). prefix is historyItemPrefix(group);
// the value is storedValue's, named, typed and formatted by its
// definition in model (without one: its own name and type, plainText);
// the timeString is its time in loc, written through scratch. The item
// is counted into size, and taken back out of b when the result's size
// is refused; a value encoding/json refuses to write (NaN, an infinity,
// a json value that is not JSON) is refused with encoding/json's error.
func appendHistoryItem(b, scratch []byte, size *resultBytes, prefix []byte, v *tsdb.PropertyValue, model *schema.ThingModel, loc *time.Location) ([]byte, []byte, error) {
	before := len(b)
	if before > 0 {
		b = append(b, ',')
	}
	item := len(b)
	value := storedValue(v)
	def, known := model.Property(v.Property)
	name, typ := v.Property, v.ValueType
	if known {
		name, typ = def.Name, def.ValueType.Type
	}
	b = append(b, prefix...)
	b = appendHistoryID(b, v)
	b = append(b, `,"property":`...)
	b = appendJSONString(b, v.Property)
	b = append(b, `,"propertyName":`...)
	b = appendJSONString(b, name)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, typ)
	b = append(b, `,"value":`...)
	switch x := value.(type) {
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return b[:before], scratch, refusedValue(value)
		}
		b = appendJSONFloat(b, x)
	case bool:
		b = strconv.AppendBool(b, x)
	case string:
		b = appendJSONString(b, x)
	case json.RawMessage:
		switch {
		case x == nil:
			b = append(b, "null"...)
		case !json.Valid(x):
			return b[:before], scratch, refusedValue(value)
		default:
			b = appendCompactJSON(b, x)
		}
	default:
		return b[:before], scratch, fmt.Errorf("history value of type %T", value)
	}
	b = append(b, `,"formatValue":`...)
	if known {
		b = appendJSONString(b, def.ValueType.FormatValue(value))
	} else {
		b = appendJSONString(b, plainText(value))
	}
	ms := v.Time.UnixMilli()
	b = append(b, `,"createTime":`...)
	b = strconv.AppendInt(b, ms, 10)
	b = append(b, `,"timestamp":`...)
	b = strconv.AppendInt(b, ms, 10)
	if reason := model.Outside(v.Property, value); reason != "" {
		b = appendOutsideModel(b, reason)
	}
	b = append(b, `},"timeString":`...)
	scratch = v.Time.In(loc).AppendFormat(scratch[:0], time.DateTime)
	b = appendJSONBytes(b, scratch)
	b = append(b, `,"timestamp":`...)
	b = strconv.AppendInt(b, ms, 10)
	b = appendTimeZone(b, loc)
	b = append(b, '}', '}')
	if err := size.add(len(b) - item + 1); err != nil {
		return b[:before], scratch, err
	}
	return b, scratch, nil
}

// outsideModelText are the labels of schema's outside-model reasons.
var outsideModelText = map[string]string{
	schema.OutsideUndeclared: "Not in the thing model",
	schema.OutsideNotInEnum:  "Not one of the enum's elements",
	schema.OutsideWrongType:  "Not of the property's type",
}

// appendOutsideModel appends the mark of a stored value outside the
// device's current thing model, `,"outsideModel":{"text","value"}` with
// value the reason (schema.ThingModel.Outside); a value that fits has no
// such field.
func appendOutsideModel(b []byte, reason string) []byte {
	b = append(b, `,"outsideModel":`...)
	return appendOutsideModelObject(b, reason)
}

// appendOutsideModelObject appends the mark's object, {"text","value"}
// (exports write it too).
func appendOutsideModelObject(b []byte, reason string) []byte {
	b = append(b, `{"text":`...)
	b = appendJSONString(b, outsideModelText[reason])
	b = append(b, `,"value":`...)
	b = appendJSONString(b, reason)
	return append(b, '}')
}

// refusedValue is encoding/json's error for a value it refuses to write.
func refusedValue(value any) error {
	if _, err := json.Marshal(value); err != nil {
		return err
	}
	return fmt.Errorf("history value %v: refused", value)
}

// appendHistoryID appends a stored value's id quoted: the md5 hex of
// "device-property-ms", what identifies its row. The same value has the
// same id in every response, and the id needs no column of its own
// (device_property stored each value's message id for it until schema
// version 2).
func appendHistoryID(b []byte, v *tsdb.PropertyValue) []byte {
	var buf [96]byte
	key := append(buf[:0], v.DeviceID...)
	key = append(key, '-')
	key = append(key, v.Property...)
	key = append(key, '-')
	key = strconv.AppendInt(key, v.Time.UnixMilli(), 10)
	sum := md5.Sum(key)
	b = append(b, '"')
	b = hex.AppendEncode(b, sum[:])
	return append(b, '"')
}
