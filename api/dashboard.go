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
	PropertyHistory(ctx context.Context, productID, deviceID string, properties []string, n int) ([]tsdb.PropertyValue, error)
	Location() *time.Location
}

// DeviceModels resolves a device's product and the thing model in force.
type DeviceModels interface {
	GetDeviceRef(ctx context.Context, id string) (meta.DeviceRef, error)
}

const (
	maxDashboardQueries = 32
	maxHistory          = 1000
	dashboardTimeout    = 10 * time.Second
)

// dashboardQuery is one item of the _multi body.
type dashboardQuery struct {
	Dashboard   string          `json:"dashboard"`
	Object      string          `json:"object"`
	Measurement string          `json:"measurement"`
	Dimension   string          `json:"dimension"`
	Group       string          `json:"group"`
	Params      json.RawMessage `json:"params"`
}

type aggParams struct {
	Time      string          `json:"time"`
	Format    string          `json:"format"`
	Limit     *int            `json:"limit"`
	From      json.RawMessage `json:"from"`
	To        json.RawMessage `json:"to"`
	ProductID string          `json:"productId"`
}

type historyParams struct {
	DeviceID   string   `json:"deviceId"`
	History    *int     `json:"history"`
	Properties []string `json:"properties"`
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
func (s *Server) dashboardMulti(c *fiber.Ctx) error {
	var qs []dashboardQuery
	if err := decodeJSON(c, &qs); err != nil {
		return err
	}
	if len(qs) == 0 {
		return meta.Invalid("body", "must be a non-empty array of queries")
	}
	if len(qs) > maxDashboardQueries {
		return meta.Invalid("body", "at most %d queries", maxDashboardQueries)
	}
	now := time.Now()
	runs := make([]func(context.Context) ([]any, error), len(qs))
	for i := range qs {
		run, err := s.planDashboard(fmt.Sprintf("[%d]", i), &qs[i], now)
		if err != nil {
			return err
		}
		runs[i] = run
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), dashboardTimeout)
	defer cancel()
	results := make([][]any, len(qs))
	g, gctx := errgroup.WithContext(ctx)
	for i, run := range runs {
		g.Go(func() error {
			items, err := run(gctx)
			results[i] = items
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	out := []any{}
	for _, items := range results {
		out = append(out, items...)
	}
	return ok(c, out)
}

// planDashboard validates one query and returns the function that runs it.
func (s *Server) planDashboard(at string, q *dashboardQuery, now time.Time) (func(context.Context) ([]any, error), error) {
	for _, f := range []struct{ name, v string }{
		{"dashboard", q.Dashboard}, {"object", q.Object}, {"measurement", q.Measurement}, {"dimension", q.Dimension},
	} {
		if f.v == "" {
			return nil, meta.Invalid(at+"."+f.name, "is required")
		}
	}
	if q.Dashboard != "device" {
		return nil, meta.Invalid(at+".dashboard", "unknown dashboard %q (supported: device)", q.Dashboard)
	}
	switch {
	case q.Object == "message" && q.Measurement == "quantity" && q.Dimension == "agg":
		return s.planMessageCounts(at, q, now)
	case q.Measurement == "properties" && q.Dimension == "history":
		return s.planHistory(at, q)
	}
	return nil, meta.Invalid(at, "unknown query %s/%s/%s (supported: object message with quantity/agg; measurement properties with history)",
		q.Object, q.Measurement, q.Dimension)
}

func decodeParams(at string, raw json.RawMessage, v any) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		var ae *meta.ArgError
		if errors.As(jsonError(err), &ae) {
			return meta.Invalid(at+".params."+ae.Field, "%s", ae.Msg)
		}
		return meta.Invalid(at+".params", "malformed")
	}
	return nil
}

func (s *Server) planMessageCounts(at string, q *dashboardQuery, now time.Time) (func(context.Context) ([]any, error), error) {
	var p aggParams
	if err := decodeParams(at, q.Params, &p); err != nil {
		return nil, err
	}
	if p.Time == "" {
		p.Time = "1d"
	}
	step, ok := bucketSteps[p.Time]
	if !ok {
		return nil, meta.Invalid(at+".params.time", "must be one of 1h, 1d, 1w, 1M, 1y (got %q)", p.Time)
	}
	if p.Format == "" {
		p.Format = "yyyy-MM-dd"
	}
	layout, err := parseJavaPattern(p.Format)
	if err != nil {
		return nil, meta.Invalid(at+".params.format", "%v", err)
	}
	limit := 0
	if p.Limit != nil {
		if *p.Limit < 1 || *p.Limit > tsdb.MaxBuckets {
			return nil, meta.Invalid(at+".params.limit", "must be from 1 to %d", tsdb.MaxBuckets)
		}
		limit = *p.Limit
	}
	to, err := parseTimeParam(at+".params.to", p.To, now, now)
	if err != nil {
		return nil, err
	}
	// Without from, the range is the limit's worth of buckets (30 by default).
	n := limit
	if n == 0 {
		n = 30
	}
	from, err := parseTimeParam(at+".params.from", p.From, now, step(to, -(n-1)))
	if err != nil {
		return nil, err
	}
	group := q.Group
	return func(ctx context.Context) ([]any, error) {
		buckets, err := s.deps.Dashboard.MessageCounts(ctx, tsdb.CountQuery{
			Interval: p.Time, From: from, To: to, ProductID: p.ProductID, Limit: limit,
		})
		if err != nil {
			return nil, err
		}
		loc := s.deps.Dashboard.Location()
		items := make([]any, len(buckets))
		for i, b := range buckets {
			items[i] = aggItem{Group: group, Data: aggData{
				Value: b.Count, TimeString: layout.format(b.Start.In(loc)), Timestamp: i,
			}}
		}
		return items, nil
	}, nil
}

// bucketSteps moves a time by n buckets (for the default range).
var bucketSteps = map[string]func(time.Time, int) time.Time{
	"1h": func(t time.Time, n int) time.Time { return t.Add(time.Duration(n) * time.Hour) },
	"1d": func(t time.Time, n int) time.Time { return t.AddDate(0, 0, n) },
	"1w": func(t time.Time, n int) time.Time { return t.AddDate(0, 0, 7*n) },
	"1M": func(t time.Time, n int) time.Time { return t.AddDate(0, n, 0) },
	"1y": func(t time.Time, n int) time.Time { return t.AddDate(n, 0, 0) },
}

func (s *Server) planHistory(at string, q *dashboardQuery) (func(context.Context) ([]any, error), error) {
	var p historyParams
	if err := decodeParams(at, q.Params, &p); err != nil {
		return nil, err
	}
	if p.DeviceID == "" {
		return nil, meta.Invalid(at+".params.deviceId", "is required")
	}
	n := 1
	if p.History != nil {
		if *p.History < 1 || *p.History > maxHistory {
			return nil, meta.Invalid(at+".params.history", "must be from 1 to %d", maxHistory)
		}
		n = *p.History
	}
	if len(p.Properties) > 256 {
		return nil, meta.Invalid(at+".params.properties", "at most 256 properties")
	}
	productID, group := q.Object, q.Group
	return func(ctx context.Context) ([]any, error) {
		dev, err := s.deps.Models.GetDeviceRef(ctx, p.DeviceID)
		if err != nil {
			return nil, err
		}
		if dev.ProductID != productID {
			return nil, meta.Invalid(at+".object", "device %q belongs to product %q, not %q", p.DeviceID, dev.ProductID, productID)
		}
		model, err := schema.ParseThingModelString(dev.Metadata)
		if err != nil {
			model = schema.EmptyThingModel() // a stored model is valid; stay robust regardless
		}
		values, err := s.deps.Dashboard.PropertyHistory(ctx, productID, p.DeviceID, p.Properties, n)
		if err != nil {
			return nil, err
		}
		loc := s.deps.Dashboard.Location()
		items := make([]any, 0, len(values))
		for _, v := range values {
			items = append(items, historyItem{Group: group, Data: historyEntry(v, model, loc)})
		}
		return items, nil
	}, nil
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
