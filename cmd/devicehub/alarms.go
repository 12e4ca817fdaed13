package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"devicehub/api/live"
	"devicehub/ingest/alarm"
)

// alarmChannel carries alarm transitions from the evaluating instance to
// every instance's live hub (their subscribers may be anywhere).
const alarmChannel = "devicehub_alarms"

// startAlarmLive listens for alarm transitions and hands them to hub; the
// returned publish sends a committed batch's transitions (as the alarm
// runner's OnTransitions). Transitions sent while an instance's listener
// reconnects are not seen there: live events are a view, the records are
// the truth.
func startAlarmLive(ctx context.Context, dsn string, hub *live.Hub, log *slog.Logger) (publish func([]alarm.Transition), stop func(), err error) {
	bus, err := live.NewPGBus(dsn)
	if err != nil {
		return nil, nil, err
	}
	stopListen, err := bus.Listen(ctx, []string{alarmChannel}, func(_, payload string) {
		var e live.AlarmEvent
		if json.Unmarshal([]byte(payload), &e) == nil {
			hub.AlarmChanged(e)
		}
	}, func() {})
	if err != nil {
		bus.Close()
		return nil, nil, err
	}
	publish = func(trs []alarm.Transition) {
		var payloads []string
		for _, t := range trs {
			if t.Kind == alarm.KindRepeated {
				continue // a count, not a transition
			}
			b, _ := json.Marshal(live.AlarmEvent{DeviceID: t.DeviceID, ProductID: t.ProductID, RuleID: t.RuleID, RuleName: t.RuleName,
				Kind: t.Kind, Severity: t.Severity, Value: t.Value, Timestamp: t.At.UnixMilli()})
			if len(b) <= bus.MaxPayload() {
				payloads = append(payloads, string(b))
			}
		}
		if len(payloads) == 0 {
			return
		}
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := bus.Send(sctx, alarmChannel, payloads); err != nil {
			log.Warn("alarms: live announcement failed", "err", err)
		}
	}
	return publish, func() { stopListen(); bus.Close() }, nil
}
