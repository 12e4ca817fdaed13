package api

import (
	"context"
	"fmt"
	"slices"
	"time"

	"devicehub/ingest/alarm"
	"devicehub/schema"
)

// Endpoint 14's alarm counts: object "alarm", measurement "quantity",
// dimension "agg": the message-count parameters (time, format, limit,
// from, to, productId) plus deviceId, severity and state; the number of
// alarms raised in each bucket, newest first, from PostgreSQL.

type alarmCountParams struct {
	ProductID string `json:"productId"`
	DeviceID  string `json:"deviceId"`
	Severity  string `json:"severity"`
	State     string `json:"state"`
}

// alarmCountPlan is a checked alarm-count query.
type alarmCountPlan struct {
	q alarm.CountQuery
}

// alarmCountParamFields are an alarm-count query's params: the message
// counts' and the alarms' own.
var alarmCountParamFields = append(slices.Clone(countParamFields), "deviceId", "severity", "state")

func planAlarmCounts(at string, q *dashboardQuery, now time.Time, loc *time.Location) (*dashboardPlan, error) {
	if err := checkParamKeys(at, q.Params, alarmCountParamFields); err != nil {
		return nil, err
	}
	var p alarmCountParams
	if err := decodeParams(at, q.Params, &p); err != nil {
		return nil, err
	}
	var bp bucketParams
	if err := decodeParams(at, q.Params, &bp); err != nil {
		return nil, err
	}
	if p.Severity != "" && !slices.Contains(alarm.Severities(), p.Severity) {
		return nil, schema.Invalid(at+".params.severity", "must be one of critical, major, minor, warning, info")
	}
	if p.State != "" && p.State != alarm.StateActive && p.State != alarm.StateCleared {
		return nil, schema.Invalid(at+".params.state", "must be active or cleared")
	}
	b, err := planBuckets(at, bp, now, loc)
	if err != nil {
		return nil, err
	}
	return &dashboardPlan{at: at, group: q.Group, buckets: b.rng.Len(), layout: b.layout,
		alarms: &alarmCountPlan{q: alarm.CountQuery{Starts: b.rng.Starts(), End: b.rng.End(),
			ProductID: p.ProductID, DeviceID: p.DeviceID, Severity: p.Severity, State: p.State}}}, nil
}

// resolveAlarmCounts: a product or device outside the caller's is
// not_found before the query runs.
func (s *Server) resolveAlarmCounts(ctx context.Context, plan *dashboardPlan) error {
	q := &plan.alarms.q
	if q.ProductID != "" { // outside the caller's products, or none such: not_found
		if _, err := s.productModel(ctx, q.ProductID); err != nil {
			return err
		}
	}
	if q.DeviceID != "" {
		if _, err := s.deviceRef(ctx, q.DeviceID); err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) runAlarmCounts(ctx context.Context, plan *dashboardPlan, size *resultBytes, loc *time.Location, b []byte) ([]byte, error) {
	store, err := s.alarms()
	if err != nil {
		return b, err
	}
	counts, err := store.Counts(ctx, plan.alarms.q)
	if err != nil {
		return b, fmt.Errorf("%s: %w", plan.at, err)
	}
	var scratch [64]byte
	ts := scratch[:0]
	prefix := countItemPrefix(plan.group)
	for i, n := range counts {
		if b, ts, err = appendCountItem(b, ts, size, prefix, n, plan.layout, plan.alarms.q.Starts[i].In(loc), i); err != nil {
			return b, err
		}
	}
	return b, nil
}
