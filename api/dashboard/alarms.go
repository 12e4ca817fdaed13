package dashboard

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"devicehub/schema"
	"devicehub/tsdb"
)

// Endpoint 14's alarm counts: object "alarm", measurement "quantity",
// dimension "agg": the message-count parameters (time, format, limit,
// from, to, productId) plus deviceId, severity and state; the number of
// alarms raised in each bucket, newest first, from the alarm store
// (Deps.Alarms, in PostgreSQL).

// AlarmCountQuery is a checked alarm-count query: its buckets (Range:
// their starts, newest first, and the end of the newest, as the message
// counts' plan computed them) and its filters ("": any).
type AlarmCountQuery struct {
	Range     tsdb.Range
	ProductID string
	DeviceID  string
	Severity  string
	State     string
}

type alarmCountParams struct {
	ProductID string `json:"productId"`
	DeviceID  string `json:"deviceId"`
	Severity  string `json:"severity"`
	State     string `json:"state"`
}

// alarmCountParamFields are an alarm-count query's params: the message
// counts' and the alarms' own.
var alarmCountParamFields = append(slices.Clone(countParamFields), "deviceId", "severity", "state")

func (s *Service) planAlarmCounts(at string, q *Query, now time.Time, loc *time.Location) (*queryPlan, error) {
	if err := checkParamKeys(at, q.Params, alarmCountParamFields); err != nil {
		return nil, err
	}
	var p alarmCountParams
	if err := s.decodeParams(at, q.Params, &p); err != nil {
		return nil, err
	}
	var bp bucketParams
	if err := s.decodeParams(at, q.Params, &bp); err != nil {
		return nil, err
	}
	if p.Severity != "" && !slices.Contains(s.deps.AlarmSeverities, p.Severity) {
		return nil, schema.Invalid(at+".params.severity", "must be one of %s", strings.Join(s.deps.AlarmSeverities, ", "))
	}
	if p.State != "" && !slices.Contains(s.deps.AlarmStates, p.State) {
		return nil, schema.Invalid(at+".params.state", "must be %s", strings.Join(s.deps.AlarmStates, " or "))
	}
	b, err := planBuckets(at, bp, now, loc)
	if err != nil {
		return nil, err
	}
	return &queryPlan{at: at, group: q.Group, buckets: b.rng.Len(), layout: b.layout,
		alarms: &AlarmCountQuery{Range: b.rng,
			ProductID: p.ProductID, DeviceID: p.DeviceID, Severity: p.Severity, State: p.State}}, nil
}

// resolveAlarmCounts: a product or device outside the caller's is
// not_found before the query runs.
func (s *Service) resolveAlarmCounts(ctx context.Context, p *queryPlan) error {
	q := p.alarms
	if q.ProductID != "" { // outside the caller's products, or none such: not_found
		if _, err := s.deps.Scope.ProductModel(ctx, q.ProductID); err != nil {
			return err
		}
	}
	if q.DeviceID != "" {
		if _, err := s.deps.Scope.DeviceRef(ctx, q.DeviceID); err != nil {
			return err
		}
	}
	return nil
}

func (s *Service) runAlarmCounts(ctx context.Context, p *queryPlan, size *resultBytes, loc *time.Location, b []byte) ([]byte, error) {
	if s.deps.Alarms == nil {
		return b, fmt.Errorf("%s: dashboard: no alarm store", p.at)
	}
	counts, err := s.deps.Alarms.AlarmCounts(ctx, *p.alarms)
	if err != nil {
		return b, fmt.Errorf("%s: %w", p.at, err)
	}
	var scratch [64]byte
	ts := scratch[:0]
	prefix := countItemPrefix(p.group)
	starts := p.alarms.Range.Starts()
	for i, n := range counts {
		if b, ts, err = appendCountItem(b, ts, size, prefix, n, p.layout, starts[i].In(loc), i); err != nil {
			return b, err
		}
	}
	return b, nil
}
