package tsdb

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"devicehub/schema"
)

// A Batch gives back exactly the rows added, whatever their strings share.
func TestBatchRoundTrip(t *testing.T) {
	tm := time.UnixMilli(1764000000123).UTC()
	shared := "dev-1"
	for _, c := range []struct {
		name  string
		msgs  []Message
		props []PropertyValue
	}{
		{name: "empty"},
		{
			name:  "empty strings and payload",
			msgs:  []Message{{Time: tm, Direction: "up"}},
			props: []PropertyValue{{Time: tm, ValueType: "string"}},
		},
		{
			name: "a message and its properties",
			msgs: []Message{{Time: tm, ProductID: "meter", DeviceID: shared, Direction: "up", MessageType: "REPORT_PROPERTY",
				MessageID: "m1", Topic: "/meter/dev-1/properties/report", Payload: []byte(`{"a":1,"b":"x"}`)}},
			props: []PropertyValue{
				{Time: tm, ProductID: "meter", DeviceID: shared, Property: "a", ValueType: "number", Num: 1},
				{Time: tm, ProductID: "meter", DeviceID: strings.Clone(shared), Property: "b", ValueType: "string", Str: "x"},
			},
		},
		{
			name: "strings that change from row to row",
			msgs: []Message{
				{Time: tm, ProductID: "p1", DeviceID: "d1", Direction: "up", MessageType: "EVENT", MessageID: "1", Topic: "t1", Payload: []byte("x")},
				{Time: tm.Add(time.Millisecond), ProductID: "p1", DeviceID: "d10", Direction: "down", MessageType: "EVENT", MessageID: "1", Topic: "t1", Payload: []byte("x")},
				{Time: tm, ProductID: "p", DeviceID: "d1", Direction: "up", MessageType: "READ_PROPERTY", MessageID: "", Topic: "t", Payload: nil},
			},
			props: []PropertyValue{
				{Time: tm, ProductID: "p1", DeviceID: "d1", Property: "on", ValueType: "bool", Num: 1, Str: "true"},
				{Time: tm, ProductID: "p1", DeviceID: "d1", Property: "on", ValueType: "bool", Num: 0, Str: "false"},
				{Time: tm, ProductID: "p1", DeviceID: "d", Property: "obj", ValueType: "json", Str: `{"k":[1,2]}`},
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b Batch
			for round := range 2 { // the second reuses the first's memory
				b.Reset()
				if err := b.Append(c.msgs, c.props); err != nil {
					t.Fatal(err)
				}
				if b.Len() != len(c.msgs)+len(c.props) {
					t.Fatalf("round %d: Len %d, want %d", round, b.Len(), len(c.msgs)+len(c.props))
				}
				if b.Bytes() > rowBytes(c.msgs, c.props) {
					t.Fatalf("round %d: %d bytes, more than rowBytes' %d", round, b.Bytes(), rowBytes(c.msgs, c.props))
				}
				if got := b.Messages(); !reflect.DeepEqual(normalize(got), normalize(c.msgs)) {
					t.Fatalf("round %d: messages\n got %+v\nwant %+v", round, got, c.msgs)
				}
				if got := b.Properties(); !reflect.DeepEqual(normalizeProps(got), normalizeProps(c.props)) {
					t.Fatalf("round %d: properties\n got %+v\nwant %+v", round, got, c.props)
				}
			}
		})
	}
}

// The copies handed out outlive the batch's memory.
func TestBatchCopiesOut(t *testing.T) {
	var b Batch
	payload := []byte(`{"v":1}`)
	if err := b.Append([]Message{{Time: time.Now(), DeviceID: "d1", Direction: "up", Payload: payload}}, nil); err != nil {
		t.Fatal(err)
	}
	payload[5] = '2' // the caller may reuse its bytes once Append returns
	got := b.Messages()
	b.Reset()
	if err := b.Append([]Message{{Time: time.Now(), DeviceID: "XX", Direction: "up", Payload: []byte(`{"v":3}`)}}, nil); err != nil {
		t.Fatal(err)
	}
	if got[0].DeviceID != "d1" || string(got[0].Payload) != `{"v":1}` {
		t.Fatalf("copy changed with the batch: %q %q", got[0].DeviceID, got[0].Payload)
	}
}

// A property value repeating its message's strings stores them once.
func TestBatchSharesRepeatedStrings(t *testing.T) {
	var b Batch
	props := make([]PropertyValue, 10)
	for i := range props {
		props[i] = PropertyValue{Time: time.Now(), ProductID: "product-0001", DeviceID: "device-000001",
			Property: "p", ValueType: "number"}
	}
	if err := b.Append(nil, props); err != nil {
		t.Fatal(err)
	}
	if want := len("product-0001device-000001number") + 10*len("p"); len(b.arena) != want {
		t.Fatalf("arena %d bytes, want %d", len(b.arena), want)
	}
}

// Rows the tables refuse are refused before anything is added.
func TestBatchRejectsInvalidRows(t *testing.T) {
	var b Batch
	good := Message{Time: time.Now(), Direction: "up"}
	err := b.Append([]Message{good, {Time: time.Now(), Direction: "sideways"}}, nil)
	if !errors.Is(err, schema.ErrIllegalArgument) || b.Len() != 0 || len(b.arena) != 0 {
		t.Fatalf("invalid row: err %v, %d rows, %d bytes added", err, b.Len(), len(b.arena))
	}
	err = b.Append(nil, []PropertyValue{{Time: time.Unix(-1, 0), ValueType: "number"}})
	if !errors.Is(err, schema.ErrIllegalArgument) || b.Len() != 0 {
		t.Fatalf("time before 1970: err %v, %d rows", err, b.Len())
	}
}

func TestBatchRecordsHoldNoPointers(t *testing.T) {
	// 64 and 56 bytes, and no pointer for the GC to follow: if a field
	// became a string or slice, both checks would catch it.
	if s := unsafe.Sizeof(msgRec{}); s != 64 {
		t.Fatalf("msgRec is %d bytes", s)
	}
	if s := unsafe.Sizeof(propRec{}); s != 56 {
		t.Fatalf("propRec is %d bytes", s)
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[msgRec](), reflect.TypeFor[propRec]()} {
		for f := range typ.Fields() {
			if k := f.Type.Kind(); k != reflect.Int64 && k != reflect.Float64 && f.Type != reflect.TypeFor[span]() {
				t.Fatalf("%s.%s is a %s", typ.Name(), f.Name, f.Type)
			}
		}
	}
}

// normalize makes rows comparable after a round trip: times in UTC, empty
// payloads nil.
func normalize(ms []Message) []Message {
	out := make([]Message, len(ms))
	for i, m := range ms {
		m.Time = m.Time.UTC()
		if len(m.Payload) == 0 {
			m.Payload = nil
		}
		out[i] = m
	}
	return out
}

func normalizeProps(ps []PropertyValue) []PropertyValue {
	out := make([]PropertyValue, len(ps))
	for i, p := range ps {
		p.Time = p.Time.UTC()
		out[i] = p
	}
	return out
}
