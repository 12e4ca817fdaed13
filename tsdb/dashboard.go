package tsdb

import (
	"context"
	"fmt"
	"strings"
	"time"

	"devicehub/meta/cache"
	"devicehub/schema"
)

// The queries of a dashboard (api's endpoint 14 and its exports), one
// type per kind: CountQuery (message counts), AggQuery (property
// aggregates) and HistoryQuery (property history). Each is checked
// (Check: bad input is a *schema.ArgError naming the field under
// "params", which api prefixes with the query's position), resolved (a
// bucketed query's BucketParams.Resolve computes its buckets once, handed
// back as a Range that the query then runs on; a history query's Resolve
// takes its device, looked up by the caller, and gives a History) and run
// (DB.MessageCounts, DB.PropertyAggregates, History.Run: DB.HistoryRange
// or DB.PropertyHistory, each holding its SQL; an export streams a
// History's values with DB.PrepareExport, History.ExportQuery).

// DefaultBuckets is how many buckets a bucketed query without From and
// without Limit returns.
const DefaultBuckets = 30

// BucketParams are the bucket parameters of a bucketed query as asked.
type BucketParams struct {
	Interval string     // "" is Day
	Limit    *int       // nil: none (MaxBuckets, or DefaultBuckets without From)
	From     *time.Time // nil: the Limit's worth of buckets ending with To's
	To       time.Time
}

// argError is err, an ErrIllegalArgument, as a *schema.ArgError of field
// (the sentinel's own text dropped).
func argError(field string, err error) error {
	return &schema.ArgError{Field: field, Msg: strings.TrimSuffix(err.Error(), ": "+schema.ErrIllegalArgument.Error())}
}

// CheckInterval checks p's interval ("" is Day).
func (p BucketParams) CheckInterval() error {
	if p.Interval == "" {
		return nil
	}
	if err := CheckInterval(p.Interval); err != nil {
		return argError("params.time", err)
	}
	return nil
}

// CheckLimit checks p's limit: 1 to MaxBuckets.
func (p BucketParams) CheckLimit() error {
	if p.Limit != nil && (*p.Limit < 1 || *p.Limit > MaxBuckets) {
		return schema.Invalid("params.limit", "must be from 1 to %d", MaxBuckets)
	}
	return nil
}

// Check checks p's interval and limit.
func (p BucketParams) Check() error {
	if err := p.CheckInterval(); err != nil {
		return err
	}
	return p.CheckLimit()
}

// Range is a resolved bucket range: the buckets of an interval that a
// query returns, newest first, computed once.
type Range struct{ r bucketRange }

// Interval is the range's interval.
func (r Range) Interval() string { return r.r.interval }

// Starts are the starts of the range's buckets, newest first (shared: not
// to be modified).
func (r Range) Starts() []time.Time { return r.r.starts }

// Len is how many buckets the range holds.
func (r Range) Len() int { return len(r.r.starts) }

// Resolve checks p and computes its buckets in loc: those holding a moment
// between From and To, at most Limit (MaxBuckets without one); without
// From, the Limit's worth (DefaultBuckets without one) ending with the one
// holding To. A range outside what ClickHouse's DateTime holds is refused
// here, before any query runs.
func (p BucketParams) Resolve(loc *time.Location) (Range, error) {
	if err := p.Check(); err != nil {
		return Range{}, err
	}
	interval := p.Interval
	if interval == "" {
		interval = Day
	}
	limit := 0
	if p.Limit != nil {
		limit = *p.Limit
	}
	var from time.Time
	if p.From != nil {
		from = *p.From
	} else {
		n := limit
		if n == 0 {
			n = DefaultBuckets
		}
		var err error
		if from, err = RangeStart(interval, p.To, n, loc); err != nil {
			return Range{}, argError("params", err)
		}
	}
	r, err := newBucketRange(interval, from, p.To, loc, limit)
	if err != nil {
		return Range{}, argError("params", err)
	}
	return Range{r: r}, nil
}

// resolved is the range of a query given either resolved (r non-nil) or
// by its interval, ends and limit.
func resolved(r *Range, interval string, from, to time.Time, loc *time.Location, limit int) (bucketRange, error) {
	if r != nil {
		if len(r.r.starts) == 0 {
			return bucketRange{}, fmt.Errorf("tsdb: an unresolved Range: %w", schema.ErrIllegalArgument)
		}
		return r.r, nil
	}
	return newBucketRange(interval, from, to, loc, limit)
}

// Bounds of a query's properties.
const (
	MaxPropertyName      = 256 // bytes of a property id; thing-model ids are far shorter
	MaxAggProperties     = 100 // properties of one property aggregate query
	MaxHistoryProperties = 100 // properties of one history query
)

// checkPropertyNames refuses empty and overlong property ids.
func checkPropertyNames(props []string) error {
	for i, p := range props {
		if p == "" || len(p) > MaxPropertyName {
			return schema.Invalid(fmt.Sprintf("params.properties[%d]", i), "must be a property id of 1 to %d bytes", MaxPropertyName)
		}
	}
	return nil
}

// Check checks q's aggregate and properties (its buckets are checked by
// BucketParams.Resolve).
func (q AggQuery) Check() error {
	if q.Agg == "" {
		return schema.Invalid("params.agg", "is required: avg, min, max, sum, count, first or last")
	}
	if err := CheckAgg(q.Agg); err != nil {
		return argError("params.agg", err)
	}
	if len(q.Properties) == 0 {
		return schema.Invalid("params.properties", "is required: the numeric properties to aggregate")
	}
	if len(q.Properties) > MaxAggProperties {
		return schema.Invalid("params.properties", "%d properties; at most %d properties per aggregate query",
			len(q.Properties), MaxAggProperties)
	}
	return checkPropertyNames(q.Properties)
}

// AggModel is the thing model a property aggregate query is checked
// against, looked up by the caller (api: within the caller's products):
// its device's when the query names one, else its product's.
type AggModel struct {
	ProductID string // the product of the device; without a device, the query's own
	Metadata  string // the thing model in force, JSON
}

// Resolve checks q against m: a device must belong to q.ProductID (else a
// *schema.ArgError of field "object"), and each property as sent must be
// a numeric property of the model (field "params.properties[i]"; sent is
// q.Properties before repeats were dropped, so that errors name the index
// the client sent; nil: q.Properties). It returns the model, which names
// and formats the answer's values. A thing model that does not parse (a
// stored one does) counts as empty.
func (q AggQuery) Resolve(m AggModel, sent []string) (*schema.ThingModel, error) {
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

// CheckHistoryProperties checks the properties a history query names.
func CheckHistoryProperties(props []string) error {
	if len(props) > MaxHistoryProperties {
		return schema.Invalid("params.properties", "%d properties; at most %d properties per history query",
			len(props), MaxHistoryProperties)
	}
	return checkPropertyNames(props)
}

// Check checks q's properties (CheckHistoryProperties) and range: From
// not after To.
func (q HistoryQuery) Check() error {
	if err := CheckHistoryProperties(q.Properties); err != nil {
		return err
	}
	if !q.From.IsZero() && !q.To.IsZero() && q.From.After(q.To) {
		return schema.Invalid("params.from", "must not be after to (the range is from <= time < to)")
	}
	return nil
}

// HistoryDevice is what resolving a history query needs of its device,
// looked up by the caller (api: in the metadata store, within the
// caller's products).
type HistoryDevice struct {
	ProductID string // the product the device belongs to
	Metadata  string // the thing model in force, JSON
}

// History is a resolved history query: the query, the thing model of its
// device (which names, types and formats its values) and how many
// properties it reads.
type History struct {
	Query HistoryQuery
	Model *schema.ThingModel
	// Properties is how many properties it reads: those named, or every
	// one of the thing model when none is named.
	Properties int
}

// Resolve checks q against its device, dev: the device must belong to
// q.ProductID (else a *schema.ArgError of field "object"). A thing model
// that does not parse (a stored one does) counts as empty.
func (q HistoryQuery) Resolve(dev HistoryDevice) (History, error) {
	if dev.ProductID != q.ProductID {
		return History{}, schema.Invalid("object", "device %q belongs to product %q, not %q", q.DeviceID, dev.ProductID, q.ProductID)
	}
	model := parsedModel(dev.Metadata)
	h := History{Query: q, Model: model, Properties: len(q.Properties)}
	if h.Properties == 0 {
		h.Properties = len(model.Properties)
	}
	return h, nil
}

// HistoryReader reads stored values; *DB is one.
type HistoryReader interface {
	PropertyHistory(ctx context.Context, productID, deviceID string, properties []string, n int) ([]PropertyValue, error)
	HistoryRange(ctx context.Context, q HistoryQuery) ([]PropertyValue, error)
}

// Run reads h's values from r: those of its range (HistoryRange) when it
// is Bounded, else the latest of each property (PropertyHistory).
func (h History) Run(ctx context.Context, r HistoryReader) ([]PropertyValue, error) {
	q := h.Query
	if q.Bounded {
		return r.HistoryRange(ctx, q)
	}
	return r.PropertyHistory(ctx, q.ProductID, q.DeviceID, q.Properties, q.N)
}

// ExportQuery is h as an export (DB.PrepareExport): every value of its
// range (all of the device's history when it has none), or with N > 0
// the newest N of each property.
func (h History) ExportQuery() ExportQuery {
	q := h.Query
	return ExportQuery{ProductID: q.ProductID, DeviceID: q.DeviceID, Properties: q.Properties, From: q.From, To: q.To, Newest: q.N}
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

// End is the end of the range's newest bucket (exclusive): with Starts,
// what a store other than ClickHouse (alarm counts in PostgreSQL) buckets
// its rows between.
func (r Range) End() time.Time { return r.r.hi }
