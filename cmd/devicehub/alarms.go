package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"strings"
	"time"

	"devicehub/api/live"
	"devicehub/ingest/alarm"
	"devicehub/ingest/shadow"
)

// The PostgreSQL channels that carry device events made on one instance
// (an alarm transition by the evaluating instance, a change of desired
// state by the instance that took the request) to every instance's live
// hub: their subscribers may be anywhere.
const (
	alarmChannel  = "devicehub_alarms"
	shadowChannel = "devicehub_shadows"
	// firmwareChannel carries devices' firmware job changes (ingest/firmware).
	firmwareChannel = "devicehub_firmware"
)

// eventRelay announces device events: to this instance's hub at once,
// and over PostgreSQL to the others. Announcing never blocks the caller:
// events wait in a bounded queue for one sender, which sends them in
// batches; when the queue is full an event is dropped and logged. Each
// payload begins with its instance's origin, so that the listener skips
// what its own instance sent (its hub had it already, without the round
// trips of a NOTIFY and its delivery: on a busy PostgreSQL they were most
// of an alarm's way to /api/live, bench alarms). Events sent while an
// instance's listener reconnects are not seen there either: live events
// are a view, the records and shadows are the truth.
type eventRelay struct {
	bus   *live.PGBus
	hub   *live.Hub
	log   *slog.Logger
	queue chan relayed
	self  string // `{"origin":"<this instance>",`: the start of every payload it sends
}

type relayed struct{ channel, payload string }

// startEventRelay listens for device events and hands them to hub; stop
// ends the sender and the listener.
func startEventRelay(ctx context.Context, dsn string, hub *live.Hub, log *slog.Logger) (r *eventRelay, stop func(), err error) {
	bus, err := live.NewPGBus(dsn)
	if err != nil {
		return nil, nil, err
	}
	var origin [8]byte
	if _, err := rand.Read(origin[:]); err != nil {
		bus.Close()
		return nil, nil, err
	}
	r = &eventRelay{bus: bus, hub: hub, log: log, queue: make(chan relayed, 10_000),
		self: `{"origin":"` + hex.EncodeToString(origin[:]) + `",`}
	stopListen, err := bus.Listen(ctx, []string{alarmChannel, shadowChannel, firmwareChannel}, func(channel, payload string) {
		if strings.HasPrefix(payload, r.self) {
			return // this instance's: its hub has it
		}
		r.deliver(channel, []byte(payload))
	}, func() {})
	if err != nil {
		bus.Close()
		return nil, nil, err
	}
	done := make(chan struct{})
	sctx, cancel := context.WithCancel(ctx)
	go func() { defer close(done); r.send(sctx) }()
	return r, func() { cancel(); <-done; stopListen(); bus.Close() }, nil
}

// deliver hands an event another instance announced on channel, as
// JSON, to the hub.
func (r *eventRelay) deliver(channel string, payload []byte) {
	switch channel {
	case alarmChannel:
		var e live.AlarmEvent
		if json.Unmarshal(payload, &e) == nil {
			r.hub.AlarmChanged(e)
		}
	case firmwareChannel:
		var e live.FirmwareEvent
		if json.Unmarshal(payload, &e) == nil {
			r.hub.FirmwareChanged(e)
		}
	case shadowChannel:
		var e live.ShadowEvent
		if json.Unmarshal(payload, &e) == nil {
			r.hub.ShadowChanged(e)
		}
	}
}

// announce hands an event to this instance's hub and queues it for every
// other instance; false when it was not queued (too large for a
// notification, or the queue full).
func (r *eventRelay) announce(channel string, e any) bool {
	b, err := json.Marshal(e)
	if err != nil || len(b) < 2 || b[0] != '{' {
		return false
	}
	switch ev := e.(type) { // this instance's hub: at once
	case live.AlarmEvent:
		r.hub.AlarmChanged(ev)
	case live.FirmwareEvent:
		r.hub.FirmwareChanged(ev)
	case live.ShadowEvent:
		r.hub.ShadowChanged(ev)
	}
	// The origin goes first (an instance of an earlier version decodes
	// the event and ignores the field).
	payload := r.self + string(b[1:])
	if len(b) == 2 { // {}
		payload = r.self[:len(r.self)-1] + "}"
	}
	if len(payload) > r.bus.MaxPayload() {
		return false
	}
	select {
	case r.queue <- relayed{channel, payload}:
		return true
	default:
		r.log.Warn("live: device event dropped, the relay's queue is full", "channel", channel)
		return false
	}
}

// send sends what is queued, up to 100 payloads of one channel a
// statement, until ctx ends.
func (r *eventRelay) send(ctx context.Context) {
	for {
		var first relayed
		select {
		case <-ctx.Done():
			return
		case first = <-r.queue:
		}
		batch := map[string][]string{first.channel: {first.payload}}
	more:
		for n := 1; n < 100; n++ {
			select {
			case e := <-r.queue:
				batch[e.channel] = append(batch[e.channel], e.payload)
			default:
				break more
			}
		}
		for channel, payloads := range batch {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if err := r.bus.Send(sctx, channel, payloads); err != nil && ctx.Err() == nil {
				r.log.Warn("live: device events not announced", "channel", channel, "events", len(payloads), "err", err)
			}
			cancel()
		}
	}
}

// alarmTransitions announces a committed batch of alarm transitions (the
// alarm runner's OnTransitions, and api's AlarmHandled: acks and clears
// by hand).
func (r *eventRelay) alarmTransitions(trs []alarm.Transition) {
	for _, t := range trs {
		if t.Kind == alarm.KindRepeated {
			continue // a count, not a transition
		}
		r.announce(alarmChannel, live.AlarmEvent{DeviceID: t.DeviceID, ProductID: t.ProductID, RuleID: t.RuleID, RuleName: t.RuleName,
			Kind: t.Kind, Severity: t.Severity, Value: t.Value, Timestamp: t.At.UnixMilli()})
	}
}

// shadowChanged announces a committed change of a device's desired state
// (the shadow service's Changed).
func (r *eventRelay) shadowChanged(productID string, v shadow.View) {
	r.announce(shadowChannel, live.ShadowEvent{DeviceID: v.DeviceID, ProductID: productID, Version: v.Version,
		Delta: v.Delta, Timestamp: time.Now().UnixMilli()})
}
