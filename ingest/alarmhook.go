package ingest

import (
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/ingest/wire"
)

// AlarmHook is handed the uplinks the alarm evaluator reads (ingest/alarm's
// Feed): reports, events, births and wills of the known, active devices
// of the products it wants, once decoded and before storage. It is set
// only where this ingester's session is the installation's one
// (NoShareGroup): the evaluator then reads what ingest reads instead of a
// second session of its own, which cost the broker a second delivery of
// every report. A message's acknowledgement waits for the hook's done as
// well as for its rows, so one whose evaluation is not committed is
// delivered again (ingest/alarm's doc says why that is exact).
//
// Take may wait while the hook holds as many messages as it may
// (backpressure: ingest's queues, then the broker, hold the rest); it
// returns false, done never to be called, when stop closes first.
//
// Marked is told of a marker the evaluator published (a payload with
// AlarmMarkerPrefix, on a topic ingest's data sessions take) once every
// message its session took before it was handed to Take or dropped: its
// acknowledgement is released in the session's order (backlog.go).
type AlarmHook interface {
	Wants(productID string) bool
	Take(m mqtt.Message, broker int, at time.Time, done func(), stop <-chan struct{}) bool
	Marked(payload string)
}

// AlarmMarkerPrefix begins the payload of the alarm evaluator's markers.
const AlarmMarkerPrefix = "alarms "

// alarmKind tells the messages the alarm evaluator reads.
func alarmKind(k wire.Kind) bool {
	return k == wire.KindReport || k == wire.KindEvent || k == wire.KindOnline || k == wire.KindOffline
}
