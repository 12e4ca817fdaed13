package api

import (
	"context"
	"encoding/json"
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

// maxPropertyName bounds a property id in a query; thing-model ids are
// far shorter.
const maxPropertyName = 256

// checkPropertyNames refuses empty and overlong property ids.
func checkPropertyNames(at string, props []string) error {
	for i, p := range props {
		if p == "" || len(p) > maxPropertyName {
			return schema.Invalid(fmt.Sprintf("%s.params.properties[%d]", at, i), "must be a property id of 1 to %d bytes", maxPropertyName)
		}
	}
	return nil
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
	if p.Agg == "" {
		return p, bp, schema.Invalid(at+".params.agg", "is required: avg, min, max, sum, count, first or last")
	}
	if err := tsdb.CheckAgg(p.Agg); err != nil {
		return p, bp, fmt.Errorf("%s.params.agg: %w", at, err)
	}
	if len(p.Properties) == 0 {
		return p, bp, schema.Invalid(at+".params.properties", "is required: the numeric properties to aggregate")
	}
	if len(p.Properties) > maxAggProperties {
		return p, bp, schema.Invalid(at+".params.properties", "%d properties; at most %d properties per aggregate query",
			len(p.Properties), maxAggProperties)
	}
	return p, bp, checkPropertyNames(at, p.Properties)
}

// planPropertyAggregates checks a property aggregate query; its resolve
// checks the properties against the thing model of the device (or of the
// product, without deviceId).
func (s *Server) planPropertyAggregates(at string, q *dashboardQuery, now time.Time, loc *time.Location) (*dashboardPlan, error) {
	p, bp, err := propAggregateParams(at, q)
	if err != nil {
		return nil, err
	}
	props := dedupe(p.Properties)
	b, err := planBuckets(at, bp, now, loc)
	if err != nil {
		return nil, err
	}
	productID, group := q.Object, q.Group
	return &dashboardPlan{buckets: b.count * len(props), resolve: func(ctx context.Context) (int, dashboardRun, error) {
		if err := s.checkNumeric(ctx, at, productID, p.DeviceID, p.Properties); err != nil { // indexes as sent
			return 0, nil, err
		}
		return 0, func(ctx context.Context, size *resultBytes) ([]json.RawMessage, error) {
			series, err := s.deps.Dashboard.PropertyAggregates(ctx, tsdb.AggQuery{
				Interval: b.interval, From: b.from, To: b.to, ProductID: productID, DeviceID: p.DeviceID,
				Properties: props, Agg: p.Agg, Limit: b.limit,
			})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", at, err)
			}
			items := make([]json.RawMessage, 0, len(series)*b.count)
			for _, sr := range series {
				for i, bk := range sr.Buckets {
					if items, err = encodeItem(items, size, propAggItem{Group: group, Property: sr.Property, Data: propAggData{
						Value: aggValue(p.Agg, bk), TimeString: b.layout.format(bk.Start.In(loc)), Timestamp: i,
					}}); err != nil {
						return nil, err
					}
				}
			}
			return items, nil
		}, nil
	}}, nil
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
	return s.models.get(ctx, id, time.Now(), func(ctx context.Context, id string) (string, time.Time, error) {
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
	absent := func(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }
	if absent(p.From) && absent(p.To) {
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
	if !r.from.IsZero() && !r.to.IsZero() && r.from.After(r.to) {
		return nil, schema.Invalid(at+".params.from", "must not be after to (the range is from <= time < to)")
	}
	return &r, nil
}
