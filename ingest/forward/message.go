package forward

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"

	"devicehub/ingest/wire"
	"devicehub/tsdb"
)

// message is one uplink decoded for forwarding.
type message struct {
	productID, deviceID string
	typ                 string // TypeProperty, TypeEvent, TypeOnline, TypeOffline
	eventID             string
	messageID           string
	time                time.Time // the device's (or arrival when it sent none)
	props               []tsdb.PropertyValue
	data                json.RawMessage // an event's data, compact
}

// decode reads an uplink; ok is false for what is not forwarded (replies,
// shadow requests, malformed payloads: ingest drops those too).
func decode(topic string, payload []byte, now time.Time) (message, bool) {
	t, ok := wire.ParseTopic(topic)
	if !ok {
		return message{}, false
	}
	m := message{productID: t.ProductID, deviceID: t.DeviceID}
	var rows wire.Rows
	switch t.Kind {
	case wire.KindReport:
		if wire.DecodeReport(&rows, t, payload, now) != nil {
			return message{}, false
		}
		m.typ, m.props = TypeProperty, rows.Props
	case wire.KindEvent:
		if wire.DecodeEvent(&rows, t, payload, now) != nil {
			return message{}, false
		}
		m.typ, m.eventID = TypeEvent, t.EventID
		var body struct {
			Data json.RawMessage `json:"data"`
		}
		if json.Unmarshal(payload, &body) == nil && len(body.Data) > 0 {
			var b bytes.Buffer
			if json.Compact(&b, body.Data) == nil {
				m.data = b.Bytes()
			}
		}
	case wire.KindOnline, wire.KindOffline:
		if _, err := wire.DecodePresence(&rows, t, payload, now); err != nil {
			return message{}, false
		}
		m.typ = TypeOnline
		if t.Kind == wire.KindOffline {
			m.typ = TypeOffline
		}
	default:
		return message{}, false
	}
	if len(rows.Msgs) == 0 {
		return message{}, false
	}
	m.messageID, m.time = rows.Msgs[0].MessageID, rows.Msgs[0].Time
	return m, true
}

// matcher is a rule's filter.
type matcher struct {
	devices map[string]bool // nil: every device
	types   map[string]bool // nil: every type
	props   map[string]bool // nil: every property
}

func newMatcher(r Rule) matcher {
	set := func(xs []string) map[string]bool {
		if len(xs) == 0 {
			return nil
		}
		m := make(map[string]bool, len(xs))
		for _, x := range xs {
			m[x] = true
		}
		return m
	}
	return matcher{devices: set(r.DeviceIDs), types: set(r.Types), props: set(r.Properties)}
}

// encode appends m as the rule forwards it (one JSON line without its
// rule and seq, which the sender adds) and reports whether the rule takes
// it at all. A property filter keeps only those properties of a report,
// and a report with none of them is not forwarded.
func (f matcher) encode(dst []byte, m *message, taken time.Time) ([]byte, bool) {
	if f.devices != nil && !f.devices[m.deviceID] || f.types != nil && !f.types[m.typ] {
		return dst, false
	}
	dst = append(dst, `"productId":`...)
	dst = appendJSONString(dst, m.productID)
	dst = append(dst, `,"deviceId":`...)
	dst = appendJSONString(dst, m.deviceID)
	dst = append(dst, `,"type":"`...)
	dst = append(dst, m.typ...)
	dst = append(dst, '"')
	if m.eventID != "" {
		dst = append(dst, `,"eventId":`...)
		dst = appendJSONString(dst, m.eventID)
	}
	if m.messageID != "" {
		dst = append(dst, `,"messageId":`...)
		dst = appendJSONString(dst, m.messageID)
	}
	dst = append(dst, `,"time":`...)
	dst = strconv.AppendInt(dst, m.time.UnixMilli(), 10)
	dst = append(dst, `,"received":`...)
	dst = strconv.AppendInt(dst, taken.UnixMilli(), 10)
	switch m.typ {
	case TypeProperty:
		dst = append(dst, `,"properties":{`...)
		n := 0
		for _, p := range m.props {
			if f.props != nil && !f.props[p.Property] {
				continue
			}
			if n > 0 {
				dst = append(dst, ',')
			}
			n++
			dst = appendJSONString(dst, p.Property)
			dst = append(dst, ':')
			dst = appendValue(dst, p)
		}
		if n == 0 && f.props != nil {
			return dst, false
		}
		dst = append(dst, '}')
	case TypeEvent:
		if len(m.data) > 0 {
			dst = append(dst, `,"data":`...)
			dst = append(dst, m.data...)
		}
	}
	return append(dst, '}'), true
}

func appendValue(dst []byte, p tsdb.PropertyValue) []byte {
	switch p.ValueType {
	case "number":
		return strconv.AppendFloat(dst, p.Num, 'g', -1, 64)
	case "bool":
		return strconv.AppendBool(dst, p.Num != 0)
	case "string":
		return appendJSONString(dst, p.Str)
	case "json":
		var b bytes.Buffer
		if json.Compact(&b, []byte(p.Str)) == nil {
			return append(dst, b.Bytes()...)
		}
		return appendJSONString(dst, p.Str)
	default:
		return append(dst, "null"...)
	}
}

func appendJSONString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s) // valid JSON for any text, unlike strconv.Quote
	return append(dst, b...)
}

// line is a record as sent: {"ruleId":...,"seq":...,<the rest>}.
func line(dst []byte, ruleID string, r record) []byte {
	dst = append(dst, `{"ruleId":`...)
	dst = appendJSONString(dst, ruleID)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendUint(dst, r.seq, 10)
	dst = append(dst, ',')
	return append(dst, r.msg...)
}
