package api

import (
	"context"
	"fmt"
	"math"
	"time"

	"devicehub/schema"
	"devicehub/tsdb"
)

// Property aggregates (measurement "properties", dimension "agg") and the
// range form of property history (dimension "history" with from/to) of
// endpoint 14. Bucket edges, the platform time zone and date math are
// tsdb's (buckets.go, datemath.go); here the parameters are checked, the
// properties are checked against the thing model, and items are shaped.

// propAggParams are a property aggregate query's own parameters, beside
// its bucketParams (both decoded from the same params object).
type propAggParams struct {
	DeviceID   string   `json:"deviceId"` // "": every device of the product
	Properties []string `json:"properties"`
	Agg        string   `json:"agg"`
}

// propAggItem is one bucket of one property.
type propAggItem struct {
	Group    string      `json:"group"`
	Property string      `json:"property"`
	Data     propAggData `json:"data"`
}

type propAggData struct {
	// Value is the aggregate: a number, or null for an empty bucket of
	// avg, min, max, first and last (count and sum of nothing are 0).
	Value      any    `json:"value"`
	TimeString string `json:"timeString"`
	Timestamp  int    `json:"timestamp"` // position 0, 1, 2... within the property
}

// propAggregateParams decodes and checks a property aggregate query's
// params (endpoint 14's and an export's alike).
func propAggregateParams(at string, q *dashboardQuery) (propAggParams, bucketParams, error) {
	var p propAggParams
	var bp bucketParams
	if err := decodeParams(at, q.Params, &p); err != nil {
		return p, bp, err
	}
	if err := decodeParams(at, q.Params, &bp); err != nil {
		return p, bp, err
	}
	return p, bp, atField(at, tsdb.AggQuery{Agg: p.Agg, Properties: p.Properties}.Check())
}

// planPropertyAggregates checks a property aggregate query; its resolve
// (resolveDashboard) checks the properties against the thing model of the
// device (or of the product, without deviceId).
func planPropertyAggregates(at string, q *dashboardQuery, now time.Time, loc *time.Location) (*dashboardPlan, error) {
	p, bp, err := propAggregateParams(at, q)
	if err != nil {
		return nil, err
	}
	b, err := planBuckets(at, bp, now, loc)
	if err != nil {
		return nil, err
	}
	props := dedupe(p.Properties)
	return &dashboardPlan{at: at, group: q.Group, buckets: b.rng.Len() * len(props), layout: b.layout, sent: p.Properties,
		agg: &tsdb.AggQuery{Range: &b.rng, ProductID: q.Object, DeviceID: p.DeviceID, Properties: props, Agg: p.Agg}}, nil
}

// aggValue is a bucket's value in an item: the count as an integer, the
// aggregate otherwise; null where there is none (an empty bucket of an
// aggregate other than count and sum) or JSON cannot write it (a sum past
// the Float64 range).
func aggValue(agg string, b tsdb.AggBucket) any {
	switch {
	case agg == tsdb.AggCount:
		return b.Values
	case b.Values == 0 && agg != tsdb.AggSum:
		return nil
	case math.IsInf(b.Value, 0) || math.IsNaN(b.Value):
		return nil
	}
	return b.Value
}

// numericTypes are the thing-model value types whose values are numbers.
var numericTypes = map[string]bool{schema.TypeInt: true, schema.TypeLong: true, schema.TypeFloat: true, schema.TypeDouble: true}

// checkNumeric refuses a property that the thing model in force (the
// device's, or the product's without a device) does not declare, or
// declares with a type other than int, long, float or double.
func (s *Server) checkNumeric(ctx context.Context, at, productID, deviceID string, props []string) error {
	var metadata, of string
	if deviceID != "" {
		dev, err := s.deviceRef(ctx, deviceID)
		if err != nil {
			return err
		}
		if dev.ProductID != productID {
			return schema.Invalid(at+".object", "device %q belongs to product %q, not %q", deviceID, dev.ProductID, productID)
		}
		metadata, of = dev.Metadata, fmt.Sprintf("device %q", deviceID)
	} else {
		var err error
		if metadata, err = s.productModel(ctx, productID); err != nil {
			return err
		}
		of = fmt.Sprintf("product %q", productID)
	}
	model, err := schema.ParseThingModelString(metadata)
	if err != nil {
		model = schema.EmptyThingModel() // a stored model is valid; stay robust regardless
	}
	for i, id := range props {
		field := fmt.Sprintf("%s.params.properties[%d]", at, i)
		def, ok := model.Property(id)
		if !ok {
			return schema.Invalid(field, "property %q is not in the thing model of %s", id, of)
		}
		if !numericTypes[def.ValueType.Type] {
			return schema.Invalid(field, "property %q is of type %s; aggregates need int, long, float or double", id, def.ValueType.Type)
		}
	}
	return nil
}

// productModel looks up a product's thing model through the server's
// short-lived cache (cleared by every product or device change through
// this instance, at most DeviceCacheTTL old), as deviceRef does devices.
func (s *Server) productModel(ctx context.Context, id string) (string, error) {
	if err := productVisible(ctx, id); err != nil { // the cache is shared by every caller
		return "", err
	}
	return s.models.get(ctx, id, func(ctx context.Context, id string) (string, time.Time, error) {
		p, err := s.deps.Products.GetProduct(ctx, id)
		return p.Metadata, time.Time{}, err
	})
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

// historyRange is the checked from/to of a history query: [from, to),
// either end zero for none.
type historyRange struct{ from, to time.Time }

// planHistoryRange checks the from/to of a history query: nil when
// neither is given (the latest values).
func planHistoryRange(at string, p historyParams, now time.Time, loc *time.Location) (*historyRange, error) {
	if absentParam(p.From) && absentParam(p.To) {
		return nil, nil
	}
	var r historyRange
	var err error
	if r.from, err = parseTimeParam(at+".params.from", p.From, now, loc, time.Time{}); err != nil {
		return nil, err
	}
	if r.to, err = parseTimeParam(at+".params.to", p.To, now, loc, time.Time{}); err != nil {
		return nil, err
	}
	if err := (tsdb.HistoryQuery{Properties: p.Properties, From: r.from, To: r.to}).Check(); err != nil {
		return nil, atField(at, err)
	}
	return &r, nil
}
