package api

import (
	"context"
	"math"
	"strconv"
	"time"

	"devicehub/tsdb"
)

// Property aggregates (measurement "properties", dimension "agg") of
// endpoint 14 and of exports. Bucket edges, the platform time zone and date math are
// tsdb's (buckets.go, datemath.go); here the parameters are checked, the
// properties are checked against the thing model, and items are shaped.

// propAggParams are a property aggregate query's own parameters, beside
// its bucketParams (both decoded from the same params object).
type propAggParams struct {
	DeviceID   string   `json:"deviceId"` // "": every device of the product
	Properties []string `json:"properties"`
	Agg        string   `json:"agg"`
}

// planPropertyAggregates checks a property aggregate query and resolves
// its buckets; its resolve (resolveDashboard) checks the properties
// against the thing model of the device (or of the product, without
// deviceId).
func planPropertyAggregates(at string, q *dashboardQuery, now time.Time, loc *time.Location) (*dashboardPlan, error) {
	p, bp, err := decodeQueryParams(at, q.Params, propAggParamFields, decodePropAggParamsFast)
	if err != nil {
		return nil, err
	}
	if err := atField(at, tsdb.AggQuery{Agg: p.Agg, Properties: p.Properties}.Check()); err != nil {
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
	switch aggValueKind(agg, b) {
	case aggCount:
		return b.Values
	case aggNull:
		return nil
	}
	return b.Value
}

// What aggValue makes of a bucket: b.Values, nil or b.Value.
const (
	aggCount = iota
	aggNull
	aggNumber
)

func aggValueKind(agg string, b tsdb.AggBucket) int {
	switch {
	case agg == tsdb.AggCount:
		return aggCount
	case b.Values == 0 && agg != tsdb.AggSum:
		return aggNull
	case math.IsInf(b.Value, 0) || math.IsNaN(b.Value):
		return aggNull
	}
	return aggNumber
}

// appendAggValue appends aggValue(agg, bk) as encoding/json writes it.
func appendAggValue(b []byte, agg string, bk tsdb.AggBucket) []byte {
	switch aggValueKind(agg, bk) {
	case aggCount:
		return strconv.AppendUint(b, bk.Values, 10)
	case aggNull:
		return append(b, "null"...)
	}
	return appendJSONFloat(b, bk.Value)
}

// propAggItemPrefix is what every item of property of a property
// aggregate query of group starts with, up to its value
// (appendPropAggItem).
func propAggItemPrefix(group, property string) []byte {
	b := append(make([]byte, 0, len(group)+len(property)+48), `{"group":`...)
	b = appendJSONString(b, group)
	b = append(b, `,"property":`...)
	b = appendJSONString(b, property)
	return append(b, `,"data":{"value":`...)
}

// appendPropAggItem appends a property's bucket, the propAggItem
// {group, property, data: {value: aggValue(agg, bk), timeString,
// timestamp: i}}, as the tests' appendItem (encoding/json) does (without
// reflection: TestAppendPropAggItem compares them), prefix being
// propAggItemPrefix(group, property) and its timeString start (bk's, in
// the platform zone) in layout; scratch holds the timeString while it is
// written.
func appendPropAggItem(b, scratch []byte, size *resultBytes, prefix []byte, agg string, bk tsdb.AggBucket, layout javaLayout, start time.Time, i int) ([]byte, []byte, error) {
	before := len(b)
	if before > 0 {
		b = append(b, ',')
	}
	item := len(b)
	b = append(b, prefix...)
	b = appendAggValue(b, agg, bk)
	return endBucketItem(b, scratch, size, before, item, layout, start, i)
}

// aggModel looks up the thing model a property aggregate query is
// checked against (tsdb.AggQuery.Resolve): its device's, within the
// caller's products, or without a device its product's.
func (s *Server) aggModel(ctx context.Context, q *tsdb.AggQuery) (tsdb.AggModel, error) {
	if q.DeviceID != "" {
		dev, err := s.deviceRef(ctx, q.DeviceID)
		if err != nil {
			return tsdb.AggModel{}, err
		}
		return tsdb.AggModel{ProductID: dev.ProductID, Metadata: dev.Metadata}, nil
	}
	metadata, err := s.productModel(ctx, q.ProductID)
	if err != nil {
		return tsdb.AggModel{}, err
	}
	return tsdb.AggModel{ProductID: q.ProductID, Metadata: metadata}, nil
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
