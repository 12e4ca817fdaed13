package dashboard

import (
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"

	"devicehub/schema"
	"devicehub/schema/jsonw"
	"devicehub/tsdb"
)

// The items of endpoint 14's answer, written without reflection as
// encoding/json writes them (encode_test.go compares them): message and
// alarm counts' and property aggregates' buckets, and history values.

// countItemPrefix is what every message-count item of group starts
// with, up to its value (appendCountItem).
func countItemPrefix(group string) []byte {
	b := append(make([]byte, 0, len(group)+32), `{"group":`...)
	b = jsonw.String(b, group)
	return append(b, `,"data":{"value":`...)
}

// appendCountItem appends a message-count bucket, the aggItem
// {group, data: {value, timeString, timestamp: i, time, timeZone}}, as the tests'
// appendItem (encoding/json) does (without reflection:
// TestAppendCountItem compares them), prefix being countItemPrefix(group)
// and its timeString start in layout; scratch holds the timeString while
// it is written.
func appendCountItem(b, scratch []byte, size *resultBytes, prefix []byte, value uint64, layout javaLayout, start time.Time, i int) ([]byte, []byte, error) {
	before := len(b)
	if before > 0 {
		b = append(b, ',')
	}
	item := len(b)
	b = append(b, prefix...)
	b = strconv.AppendUint(b, value, 10)
	return endBucketItem(b, scratch, size, before, item, layout, start, i)
}

// endBucketItem ends a bucket's item that starts at b[item:] (b[before:]
// with its comma) after its value: its timeString (start in layout,
// written through scratch) and timestamp i; the item is counted into
// size, and taken back out of b when the result's size is refused.
func endBucketItem(b, scratch []byte, size *resultBytes, before, item int, layout javaLayout, start time.Time, i int) ([]byte, []byte, error) {
	b = append(b, `,"timeString":`...)
	scratch = layout.appendFormat(scratch[:0], start)
	b = jsonw.Bytes(b, scratch)
	b = append(b, `,"timestamp":`...)
	b = strconv.AppendInt(b, int64(i), 10)
	b = appendBucketTime(b, start)
	b = append(b, '}', '}')
	if err := size.add(len(b) - item + 1); err != nil {
		return b[:before], scratch, err
	}
	return b, scratch, nil
}

// appendBucketTime appends, beside the spec's fields of a bucket (whose
// timestamp is a position), the bucket's start as epoch milliseconds and
// the zone its timeString and boundaries follow: "time", "timeZone".
func appendBucketTime(b []byte, start time.Time) []byte {
	b = append(b, `,"time":`...)
	b = strconv.AppendInt(b, start.UnixMilli(), 10)
	return appendTimeZone(b, start.Location())
}

// appendTimeZone appends the member "timeZone": the zone's name (IANA,
// as DEVICEHUB_TIMEZONE names it; "Local" is the server's own).
func appendTimeZone(b []byte, loc *time.Location) []byte {
	b = append(b, `,"timeZone":`...)
	return jsonw.String(b, loc.String())
}

// historyItemPrefix is what every history item of group starts with, up
// to its value's id (appendHistoryItem).
func historyItemPrefix(group string) []byte {
	b := append(make([]byte, 0, len(group)+40), `{"group":`...)
	b = jsonw.String(b, group)
	return append(b, `,"data":{"value":{"id":`...)
}

// appendHistoryItem appends a stored value v, the historyItem {group,
// data: {value: {id, property, propertyName, type, value, formatValue,
// createTime, timestamp, outsideModel?}, timeString, timestamp, timeZone}}, after a comma if b
// holds items already, as encoding/json writes it (without reflection:
// TestAppendHistoryItem compares them). prefix is historyItemPrefix(group);
// the value is storedValue's, named, typed and formatted by its
// definition in model (without one: its own name and type, plainText);
// the timeString is its time in loc, written through scratch. The item
// is counted into size, and taken back out of b when the result's size
// is refused; a value encoding/json refuses to write (NaN, an infinity,
// a json value that is not JSON) is refused with encoding/json's error.
func appendHistoryItem(b, scratch []byte, size *resultBytes, prefix []byte, v *tsdb.PropertyValue, model *schema.ThingModel, loc *time.Location) ([]byte, []byte, error) {
	before := len(b)
	if before > 0 {
		b = append(b, ',')
	}
	item := len(b)
	value := storedValue(v)
	def, known := model.Property(v.Property)
	name, typ := v.Property, v.ValueType
	if known {
		name, typ = def.Name, def.ValueType.Type
	}
	b = append(b, prefix...)
	b = appendHistoryID(b, v)
	b = append(b, `,"property":`...)
	b = jsonw.String(b, v.Property)
	b = append(b, `,"propertyName":`...)
	b = jsonw.String(b, name)
	b = append(b, `,"type":`...)
	b = jsonw.String(b, typ)
	b = append(b, `,"value":`...)
	switch x := value.(type) {
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return b[:before], scratch, refusedValue(value)
		}
		b = jsonw.Float(b, x)
	case bool:
		b = strconv.AppendBool(b, x)
	case string:
		b = jsonw.String(b, x)
	case json.RawMessage:
		switch {
		case x == nil:
			b = append(b, "null"...)
		case !json.Valid(x):
			return b[:before], scratch, refusedValue(value)
		default:
			b = jsonw.Compact(b, x)
		}
	default:
		return b[:before], scratch, fmt.Errorf("history value of type %T", value)
	}
	b = append(b, `,"formatValue":`...)
	if known {
		b = jsonw.String(b, def.ValueType.FormatValue(value))
	} else {
		b = jsonw.String(b, plainText(value))
	}
	ms := v.Time.UnixMilli()
	b = append(b, `,"createTime":`...)
	b = strconv.AppendInt(b, ms, 10)
	b = append(b, `,"timestamp":`...)
	b = strconv.AppendInt(b, ms, 10)
	if reason := model.Outside(v.Property, value); reason != "" {
		b = appendOutsideModel(b, reason)
	}
	b = append(b, `},"timeString":`...)
	scratch = v.Time.In(loc).AppendFormat(scratch[:0], time.DateTime)
	b = jsonw.Bytes(b, scratch)
	b = append(b, `,"timestamp":`...)
	b = strconv.AppendInt(b, ms, 10)
	b = appendTimeZone(b, loc)
	b = append(b, '}', '}')
	if err := size.add(len(b) - item + 1); err != nil {
		return b[:before], scratch, err
	}
	return b, scratch, nil
}

// appendOutsideModel appends the mark of a stored value outside the
// device's current thing model, `,"outsideModel":{"text","value"}` with
// value the reason (schema.ThingModel.Outside); a value that fits has no
// such field.
func appendOutsideModel(b []byte, reason string) []byte {
	b = append(b, `,"outsideModel":`...)
	return appendOutsideModelObject(b, reason)
}

// appendOutsideModelObject appends the mark's object, {"text","value"}
// (exports write it too).
func appendOutsideModelObject(b []byte, reason string) []byte {
	b = append(b, `{"text":`...)
	b = jsonw.String(b, schema.OutsideText(reason))
	b = append(b, `,"value":`...)
	b = jsonw.String(b, reason)
	return append(b, '}')
}

// refusedValue is encoding/json's error for a value it refuses to write.
func refusedValue(value any) error {
	if _, err := json.Marshal(value); err != nil {
		return err
	}
	return fmt.Errorf("history value %v: refused", value)
}

// appendHistoryID appends a stored value's id quoted: the md5 hex of
// "device-property-ms", what identifies its row. The same value has the
// same id in every response, and the id needs no column of its own
// (device_property stored each value's message id for it until schema
// version 2).
func appendHistoryID(b []byte, v *tsdb.PropertyValue) []byte {
	var buf [96]byte
	key := append(buf[:0], v.DeviceID...)
	key = append(key, '-')
	key = append(key, v.Property...)
	key = append(key, '-')
	key = strconv.AppendInt(key, v.Time.UnixMilli(), 10)
	sum := md5.Sum(key)
	b = append(b, '"')
	b = hex.AppendEncode(b, sum[:])
	return append(b, '"')
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
	return jsonw.Float(b, bk.Value)
}

// propAggItemPrefix is what every item of property of a property
// aggregate query of group starts with, up to its value
// (appendPropAggItem).
func propAggItemPrefix(group, property string) []byte {
	b := append(make([]byte, 0, len(group)+len(property)+48), `{"group":`...)
	b = jsonw.String(b, group)
	b = append(b, `,"property":`...)
	b = jsonw.String(b, property)
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

// storedValue is a stored value as endpoint 14's history items carry it
// (appendHistoryItem).
func storedValue(v *tsdb.PropertyValue) any {
	switch v.ValueType {
	case "number":
		return v.Num
	case "bool":
		return v.Num != 0
	case "json":
		return json.RawMessage(v.Str)
	}
	return v.Str
}

// plainText is a value's text where the thing model does not format it.
func plainText(v any) string {
	switch v := v.(type) {
	case json.RawMessage:
		return string(v)
	case string:
		return v
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return strconv.FormatFloat(v, 'f', -1, 64) // no JSON for them: NaN, +Inf, -Inf
		}
		return string(jsonw.Float(nil, v))
	}
	return fmt.Sprint(v)
}
