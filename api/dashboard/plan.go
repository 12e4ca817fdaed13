package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"devicehub/meta"
	"devicehub/meta/cache"
	"devicehub/schema"
	"devicehub/tsdb"
)

// Planning: each query of endpoint 14 (or an export's one) is checked,
// its parameters decoded and its buckets computed once (tsdb.NewRange),
// giving a queryPlan that holds its one tsdb query. This file is the
// request's policy: the parameters' names, defaults and bounds, and the
// errors naming them ([i].params.time); tsdb takes typed arguments only.

// queryPlan is one checked query of endpoint 14 or of an export: the
// tsdb query it runs (one of counts, agg and history; or alarm counts)
// and how its items are shaped. Service.resolve looks up what it needs
// within the caller's products (the product, or the device and its thing
// model); Service.run (an export: Export.write) runs it.
type queryPlan struct {
	at, group string
	buckets   int        // of all its properties (bucketed queries)
	layout    javaLayout // of the buckets' timeString
	counts    *tsdb.CountQuery
	agg       *tsdb.AggQuery // its properties without repeats
	sent      []string       // agg's properties as sent (errors name their index)
	history   *tsdb.HistoryQuery
	alarms    *AlarmCountQuery // alarm counts (alarms.go)
	// Set by Service.resolve: agg's thing model in force (the device's,
	// or the product's without a device), and history resolved.
	model    *schema.ThingModel
	resolved history
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
func (q *Query) kind(at string) (queryKind, error) {
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

// planQuery validates one query of endpoint 14, or an export's (export: a
// history query's own defaults and bounds, planHistory), and returns its
// plan. Date math is relative to now, in the platform zone loc.
func (s *Service) planQuery(at string, q *Query, now time.Time, loc *time.Location, export bool) (*queryPlan, error) {
	k, err := q.kind(at)
	if err != nil {
		return nil, err
	}
	switch k {
	case kindMessageCounts:
		return s.planMessageCounts(at, q, now, loc)
	case kindHistory:
		return s.planHistory(at, q, now, loc, export)
	case kindAlarmCounts:
		if export {
			return nil, schema.Invalid(at+".object", "alarm counts are answered by endpoint 14, not exported")
		}
		return s.planAlarmCounts(at, q, now, loc)
	default:
		return s.planPropertyAggregates(at, q, now, loc)
	}
}

// decodeParams decodes a query's params into v; what encoding/json
// refuses is named under at.params (Deps.JSONError names the field).
func (s *Service) decodeParams(at string, raw json.RawMessage, v any) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		var ae *schema.ArgError
		if errors.As(s.deps.JSONError(err), &ae) {
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
func decodeQueryParams[P any](s *Service, at string, raw json.RawMessage, fields []string, fast func([]byte, *P, *bucketParams, *int) bool) (P, bucketParams, error) {
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
	if err := s.decodeParams(at, raw, &p); err != nil {
		return p, bp, err
	}
	err := s.decodeParams(at, raw, &bp)
	return p, bp, err
}

// planMessageCounts checks a message-count query and resolves its
// buckets.
func (s *Service) planMessageCounts(at string, q *Query, now time.Time, loc *time.Location) (*queryPlan, error) {
	p, bp, err := decodeQueryParams(s, at, q.Params, countParamFields, decodeCountParamsFast)
	if err != nil {
		return nil, err
	}
	b, err := planBuckets(at, bp, now, loc)
	if err != nil {
		return nil, err
	}
	return &queryPlan{at: at, group: q.Group, buckets: b.rng.Len(), layout: b.layout,
		counts: &tsdb.CountQuery{Range: &b.rng, ProductID: p.ProductID}}, nil
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

// defaultBuckets is how many buckets a bucketed query without from and
// without limit returns.
const defaultBuckets = 30

// planBuckets checks the bucket parameters: time (default 1d), format
// (default yyyy-MM-dd), limit (1 to tsdb.MaxBuckets), and from/to, epoch
// ms or date math relative to now in the platform zone loc; and computes
// the buckets once (tsdb.NewRange): those holding a moment between from
// and to, at most limit; without from, the limit's worth (defaultBuckets
// without one) ending with the one holding to. A range outside what
// ClickHouse's DateTime holds is refused here, before any query runs.
func planBuckets(at string, p bucketParams, now time.Time, loc *time.Location) (bucketPlan, error) {
	var b bucketPlan
	interval := p.Time
	if interval == "" {
		interval = tsdb.Day
	} else if err := tsdb.CheckInterval(interval); err != nil {
		return b, argError(at+".params.time", err)
	}
	var err error
	if p.Format == "" {
		b.layout = defaultLayout
	} else if b.layout, err = parseJavaPattern(p.Format); err != nil {
		return b, schema.Invalid(at+".params.format", "%v", err)
	}
	limit := 0
	if p.Limit != nil {
		if limit = *p.Limit; limit < 1 || limit > tsdb.MaxBuckets {
			return b, schema.Invalid(at+".params.limit", "must be from 1 to %d", tsdb.MaxBuckets)
		}
	}
	to, err := parseTimeParam(at+".params.to", p.To, now, loc, now)
	if err != nil {
		return b, err
	}
	var from time.Time
	if !absentParam(p.From) {
		if from, err = parseTimeParam(at+".params.from", p.From, now, loc, time.Time{}); err != nil {
			return b, err
		}
	} else {
		n := limit
		if n == 0 {
			n = defaultBuckets
		}
		if from, err = tsdb.RangeStart(interval, to, n, loc); err != nil {
			return b, argError(at+".params", err)
		}
	}
	if b.rng, err = tsdb.NewRange(interval, from, to, loc, limit); err != nil {
		return b, argError(at+".params", err)
	}
	return b, nil
}

// argError is err, a tsdb error wrapping schema.ErrIllegalArgument, as a
// *schema.ArgError of field (the sentinel's own text dropped).
func argError(field string, err error) error {
	return &schema.ArgError{Field: field, Msg: strings.TrimSuffix(err.Error(), ": "+schema.ErrIllegalArgument.Error())}
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
func (s *Service) planHistory(at string, q *Query, now time.Time, loc *time.Location, export bool) (*queryPlan, error) {
	var p historyParams
	if err := checkParamKeys(at, q.Params, historyParamFields); err != nil {
		return nil, err
	}
	if err := s.decodeParams(at, q.Params, &p); err != nil {
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
	if err := atField(at, checkHistoryProperties(p.Properties)); err != nil {
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
		if err := checkHistoryRange(h); err != nil {
			return nil, atField(at, err)
		}
	}
	return &queryPlan{at: at, group: q.Group, history: &h}, nil
}

// checkHistoryModel refuses a history query of endpoint 14 that names no
// property when the device's thing model has more than
// maxHistoryProperties (an export reads them all).
func checkHistoryModel(at string, h history) error {
	if len(h.Query.Properties) == 0 && h.Properties > maxHistoryProperties {
		return schema.Invalid(at+".params.properties", "none named: all %d properties of the device's thing model; at most %d properties per history query: name them",
			h.Properties, maxHistoryProperties)
	}
	return nil
}

// Bounds of a query's properties.
const (
	maxPropertyName      = 256 // bytes of a property id; thing-model ids are far shorter
	maxAggProperties     = 100 // properties of one property aggregate query
	maxHistoryProperties = 100 // properties of one history query, named or all of the model
)

// checkPropertyNames refuses empty and overlong property ids.
func checkPropertyNames(props []string) error {
	for i, p := range props {
		if p == "" || len(p) > maxPropertyName {
			return schema.Invalid(fmt.Sprintf("params.properties[%d]", i), "must be a property id of 1 to %d bytes", maxPropertyName)
		}
	}
	return nil
}

// propAggParams are a property aggregate query's own parameters, beside
// its bucketParams (both decoded from the same params object).
type propAggParams struct {
	DeviceID   string   `json:"deviceId"` // "": every device of the product
	Properties []string `json:"properties"`
	Agg        string   `json:"agg"`
}

// planPropertyAggregates checks a property aggregate query (measurement
// "properties", dimension "agg") and resolves its buckets; Service.resolve
// checks the properties against the thing model of the device (or of the
// product, without deviceId).
func (s *Service) planPropertyAggregates(at string, q *Query, now time.Time, loc *time.Location) (*queryPlan, error) {
	p, bp, err := decodeQueryParams(s, at, q.Params, propAggParamFields, decodePropAggParamsFast)
	if err != nil {
		return nil, err
	}
	if err := atField(at, checkAgg(p.Agg, p.Properties)); err != nil {
		return nil, err
	}
	b, err := planBuckets(at, bp, now, loc)
	if err != nil {
		return nil, err
	}
	props := dedupe(p.Properties)
	return &queryPlan{at: at, group: q.Group, buckets: b.rng.Len() * len(props), layout: b.layout, sent: p.Properties,
		agg: &tsdb.AggQuery{Range: &b.rng, ProductID: q.Object, DeviceID: p.DeviceID, Properties: props, Agg: p.Agg}}, nil
}

// checkAgg checks a property aggregate query's aggregate and properties
// (its buckets are checked by planBuckets).
func checkAgg(agg string, props []string) error {
	if agg == "" {
		return schema.Invalid("params.agg", "is required: avg, min, max, sum, count, first or last")
	}
	if err := tsdb.CheckAgg(agg); err != nil {
		return argError("params.agg", err)
	}
	if len(props) == 0 {
		return schema.Invalid("params.properties", "is required: the numeric properties to aggregate")
	}
	if len(props) > maxAggProperties {
		return schema.Invalid("params.properties", "%d properties; at most %d properties per aggregate query",
			len(props), maxAggProperties)
	}
	return checkPropertyNames(props)
}

// dedupe returns ss without repeats, in first-seen order.
func dedupe(ss []string) []string {
	seen := make(map[string]bool, len(ss))
	out := make([]string, 0, len(ss))
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// aggModel is the thing model a property aggregate query is checked
// against, looked up within the caller's products (Service.aggModel):
// its device's when the query names one, else its product's.
type aggModel struct {
	ProductID string // the product of the device; without a device, the query's own
	Metadata  string // the thing model in force, JSON
}

// resolveAgg checks q against m: a device must belong to q.ProductID
// (else a *schema.ArgError of field "object"), and each property as sent
// must be a numeric property of the model (field "params.properties[i]";
// sent is q.Properties before repeats were dropped, so that errors name
// the index the client sent; nil: q.Properties). It returns the model,
// which names and formats the answer's values. A thing model that does
// not parse (a stored one does) counts as empty.
func resolveAgg(q *tsdb.AggQuery, m aggModel, sent []string) (*schema.ThingModel, error) {
	of := fmt.Sprintf("product %q", q.ProductID)
	if q.DeviceID != "" {
		if m.ProductID != q.ProductID {
			return nil, schema.Invalid("object", "device %q belongs to product %q, not %q", q.DeviceID, m.ProductID, q.ProductID)
		}
		of = fmt.Sprintf("device %q", q.DeviceID)
	}
	model := parsedModel(m.Metadata)
	if sent == nil {
		sent = q.Properties
	}
	for i, id := range sent {
		field := fmt.Sprintf("params.properties[%d]", i)
		def, ok := model.Property(id)
		if !ok {
			return nil, schema.Invalid(field, "property %q is not in the thing model of %s", id, of)
		}
		if !def.ValueType.IsNumeric() {
			return nil, schema.Invalid(field, "property %q is of type %s; aggregates need int, long, float or double", id, def.ValueType.Type)
		}
	}
	return model, nil
}

// checkHistoryProperties checks the properties a history query names.
func checkHistoryProperties(props []string) error {
	if len(props) > maxHistoryProperties {
		return schema.Invalid("params.properties", "%d properties; at most %d properties per history query",
			len(props), maxHistoryProperties)
	}
	return checkPropertyNames(props)
}

// checkHistoryRange checks q's properties (checkHistoryProperties) and
// range: From not after To.
func checkHistoryRange(q tsdb.HistoryQuery) error {
	if err := checkHistoryProperties(q.Properties); err != nil {
		return err
	}
	if !q.From.IsZero() && !q.To.IsZero() && q.From.After(q.To) {
		return schema.Invalid("params.from", "must not be after to (the range is from <= time < to)")
	}
	return nil
}

// history is a resolved history query: the query, the thing model of its
// device (which names, types and formats its values) and how many
// properties it reads.
type history struct {
	Query tsdb.HistoryQuery
	Model *schema.ThingModel
	// Properties is how many properties it reads: those named, or every
	// one of the thing model when none is named.
	Properties int
}

// resolveHistory checks q against its device, dev (looked up within the
// caller's products): the device must belong to q.ProductID (else a
// *schema.ArgError of field "object"). A thing model that does not parse
// (a stored one does) counts as empty.
func resolveHistory(q tsdb.HistoryQuery, dev meta.DeviceRef) (history, error) {
	if dev.ProductID != q.ProductID {
		return history{}, schema.Invalid("object", "device %q belongs to product %q, not %q", q.DeviceID, dev.ProductID, q.ProductID)
	}
	model := parsedModel(dev.Metadata)
	h := history{Query: q, Model: model, Properties: len(q.Properties)}
	if h.Properties == 0 {
		h.Properties = len(model.Properties)
	}
	return h, nil
}

// historyReader reads stored values; *tsdb.DB is one.
type historyReader interface {
	PropertyHistory(ctx context.Context, productID, deviceID string, properties []string, n int) ([]tsdb.PropertyValue, error)
	HistoryRange(ctx context.Context, q tsdb.HistoryQuery) ([]tsdb.PropertyValue, error)
}

// run reads h's values from r: those of its range (HistoryRange) when it
// is Bounded, else the latest of each property (PropertyHistory).
func (h history) run(ctx context.Context, r historyReader) ([]tsdb.PropertyValue, error) {
	q := h.Query
	if q.Bounded {
		return r.HistoryRange(ctx, q)
	}
	return r.PropertyHistory(ctx, q.ProductID, q.DeviceID, q.Properties, q.N)
}

// exportQuery is h as an export (tsdb.DB.PrepareExport): every value of
// its range (all of the device's history when it has none), or with N > 0
// the newest N of each property.
func (h history) exportQuery() tsdb.ExportQuery {
	q := h.Query
	return tsdb.ExportQuery{ProductID: q.ProductID, DeviceID: q.DeviceID, Properties: q.Properties, From: q.From, To: q.To, Newest: q.N}
}

// parsedModels keeps the thing models parsed by parsedModel, by their
// text: a dashboard's aggregate and history questions name a few models
// again and again, and parsing one took about a seventh of a distinct
// aggregate question's CPU. A text's model never changes (Forever); at
// most 1,024 models and 16 MiB of their text, the least recently used
// dropped past them.
var parsedModels = func() *cache.Cache[string, *schema.ThingModel] {
	o := cache.DefaultOptions[string, *schema.ThingModel]()
	o.TTL = cache.Forever
	o.MaxEntries = 1024
	o.MaxBytes = 16 << 20
	o.Size = func(k string, _ *schema.ThingModel) int { return 2 * len(k) }
	o.LoadTimeout = 0
	return cache.New(o)
}()

// parsedModel is the thing model of the escaped-string form s, shared
// (callers only read it); one that does not parse (a stored one does)
// counts as empty.
func parsedModel(s string) *schema.ThingModel {
	m, err := parsedModels.Get(context.Background(), s, func(context.Context, string) (*schema.ThingModel, error) {
		m, err := schema.ParseThingModelString(s)
		if err != nil {
			m = schema.EmptyThingModel()
		}
		return m, nil
	})
	if err != nil {
		return schema.EmptyThingModel()
	}
	return m
}
