package live

import (
	"encoding/json"
	"strconv"
	"time"

	"devicehub/tsdb"
)

// Event names of the text/event-stream (REFERENCE.md "Live updates").
const (
	EventProperty = "property"
	EventState    = "state"
	EventSkipped  = "skipped"
)

// PropertyEvent is the data of a property event.
type PropertyEvent struct {
	DeviceID  string `json:"deviceId"`
	ProductID string `json:"productId"`
	Property  string `json:"property"`
	// Value is a number, a string, a boolean, or the JSON object or array
	// the device sent.
	Value     any   `json:"value"`
	Timestamp int64 `json:"timestamp"` // the value's time, epoch ms
	// Stored tells whether the value was in ClickHouse when its event
	// was made: false for values sent as ingest decodes them (Decoded),
	// before the batch holding them is inserted; true from Stored.
	Stored bool `json:"stored"`
}

// StateEvent is the data of a state event.
type StateEvent struct {
	DeviceID  string `json:"deviceId"`
	State     string `json:"state"`     // "online" or "offline"
	Timestamp int64  `json:"timestamp"` // when this instance saw the change, epoch ms
}

// SkippedEvent is the data of a skipped event.
type SkippedEvent struct {
	Count uint64 `json:"count"`
}

// propertyData is the JSON of a value's event; false for a value JSON
// cannot carry (a NaN, which no device's JSON can hold either).
func propertyData(v *tsdb.PropertyValue, stored bool) ([]byte, bool) {
	e := PropertyEvent{DeviceID: v.DeviceID, ProductID: v.ProductID, Property: v.Property, Timestamp: v.Time.UnixMilli(), Stored: stored}
	switch v.ValueType {
	case "number":
		e.Value = v.Num
	case "bool":
		e.Value = v.Str == "true" || (v.Str == "" && v.Num != 0)
	case "json":
		if json.Valid([]byte(v.Str)) {
			e.Value = json.RawMessage(v.Str)
		} else {
			e.Value = v.Str
		}
	default:
		e.Value = v.Str
	}
	b, err := json.Marshal(e)
	return b, err == nil
}

// stateData is the JSON of a state event.
func stateData(deviceID string, online bool, at time.Time) []byte {
	e := StateEvent{DeviceID: deviceID, State: "offline", Timestamp: at.UnixMilli()}
	if online {
		e.State = "online"
	}
	b, _ := json.Marshal(e) // strings and an integer: cannot fail
	return b
}

// frame is one server-sent event: "event: <name>\ndata: <data>\n\n".
// data is compact JSON, so it holds no line break.
func frame(name string, data []byte) []byte {
	b := make([]byte, 0, len("event: \ndata: \n\n")+len(name)+len(data))
	b = append(b, "event: "...)
	b = append(b, name...)
	b = append(b, "\ndata: "...)
	b = append(b, data...)
	return append(b, "\n\n"...)
}

// SkippedFrame is the event telling a subscriber that n events were
// dropped for it.
func SkippedFrame(n uint64) []byte {
	return frame(EventSkipped, append(strconv.AppendUint([]byte(`{"count":`), n, 10), '}'))
}

// EventAlarm is the event of an alarm transition (ingest/alarm): raised,
// escalated, deescalated or cleared by the evaluator, acknowledged or
// cleared by hand (api), delivered to the subscribers
// watching its device, so scoped as every device's events are.
const EventAlarm = "alarm"

// AlarmEvent is the data of an alarm event.
type AlarmEvent struct {
	DeviceID  string `json:"deviceId"`
	ProductID string `json:"productId"`
	RuleID    string `json:"ruleId"`
	RuleName  string `json:"ruleName"`
	Kind      string `json:"kind"` // raised, escalated, deescalated, cleared, acknowledged
	Severity  string `json:"severity"`
	Value     string `json:"value,omitempty"` // what caused it, e.g. "temp=31.5"; by hand, the comment
	Timestamp int64  `json:"timestamp"`       // the transition's time, epoch ms
}

// AlarmChanged hands the hub an alarm transition. The evaluating instance
// announces each to every instance (cmd/devicehub relays them over
// PostgreSQL), so it is delivered here only.
func (h *Hub) AlarmChanged(e AlarmEvent) { h.deviceEvent(e.DeviceID, EventAlarm, e) }

// deviceEvent delivers an event of kind about device to the local
// subscribers watching it.
func (h *Hub) deviceEvent(device, kind string, e any) {
	subs := (*h.local.Load())[device]
	if len(subs) == 0 {
		return
	}
	data, err := json.Marshal(e)
	if err != nil {
		return
	}
	f := frame(kind, data)
	for _, s := range subs {
		s.offer(f)
	}
}

// EventShadow is the event of a change of a device's desired state
// (ingest/shadow): its new version and delta, delivered to the
// subscribers watching the device, so scoped as every device's events are.
const EventShadow = "shadow"

// ShadowEvent is the data of a shadow event.
type ShadowEvent struct {
	DeviceID  string `json:"deviceId"`
	ProductID string `json:"productId"`
	Version   int64  `json:"version"`
	// Delta: the desired properties whose reported value differs, as
	// the device is sent them.
	Delta     map[string]json.RawMessage `json:"delta"`
	Timestamp int64                      `json:"timestamp"` // the change's time, epoch ms
}

// ShadowChanged hands the hub a change of a device's desired state; the
// changing instance announces each to every instance (cmd/devicehub
// relays them over PostgreSQL), so it is delivered here only.
func (h *Hub) ShadowChanged(e ShadowEvent) { h.deviceEvent(e.DeviceID, EventShadow, e) }

// EventFirmware is the event of a change of a device's firmware job
// (ingest/firmware): its rollout, state, progress or failure reason,
// delivered to the subscribers watching the device.
const EventFirmware = "firmware"

// FirmwareEvent is the data of a firmware event.
type FirmwareEvent struct {
	DeviceID  string `json:"deviceId"`
	ProductID string `json:"productId"`
	RolloutID string `json:"rolloutId"`
	State     string `json:"state"`              // QUEUED, INITIATED, DOWNLOADING, ..., UPDATED, FAILED, TIMED_OUT, CANCELED
	Progress  int    `json:"progress,omitempty"` // with DOWNLOADING, 0-100
	Reason    string `json:"reason,omitempty"`   // with FAILED, TIMED_OUT, and a restart
	Version   string `json:"version"`            // the rollout's target version
	Timestamp int64  `json:"timestamp"`          // the change's time, epoch ms
}

// FirmwareChanged hands the hub a change of a device's firmware job; the
// instance that made it announces each to every instance (cmd/devicehub
// relays them over PostgreSQL), so it is delivered here only.
func (h *Hub) FirmwareChanged(e FirmwareEvent) { h.deviceEvent(e.DeviceID, EventFirmware, e) }
