package sim

import (
	"encoding/json"
	"math"
	"testing"

	"devicehub/schema"
)

// TestAppendValue: every value is written byte for byte as encoding/json
// writes it.
func TestAppendValue(t *testing.T) {
	for _, v := range []any{
		0.0, 21.5, 99.99, -3.25, 1e-7, 5e-324, 1e20, 1e21, 123456789.125, math.Inf(1),
		0, 42, -7, int64(1764000000000), true, false,
		"", "sim-42", `say "hi"`, `back\slash`, "a<b>&c", "tab\there", "ünïcode", "\xff bad utf-8", "\u2028",
		map[string]float64{"lon": 116.39, "lat": 39.9}, []int{1, 2}, nil,
	} {
		want, err := json.Marshal(v)
		if err != nil {
			want = []byte("null")
		}
		if got := appendValue([]byte("x"), v); string(got) != "x"+string(want) {
			t.Errorf("%#v: got %s, want x%s", v, got, want)
		}
	}
}

// TestReplyBody: a reply is the JSON object encoding/json would write for
// the map of its fields (keys sorted), for reads (all properties or some),
// invokes and failures.
func TestReplyBody(t *testing.T) {
	model := &schema.ThingModel{Properties: []schema.Property{
		{ID: "temp", ValueType: schema.ValueType{Type: "float"}},
		{ID: "mode", ValueType: schema.ValueType{Type: "string"}},
		{ID: "blob", ValueType: schema.ValueType{Type: "object"}},
		{ID: "count", ValueType: schema.ValueType{Type: "int"}},
	}}
	values := func(_, property string, vt *schema.ValueType) (any, bool) {
		switch vt.Type {
		case "float":
			return 21.5, true
		case "int":
			return 7, true
		case "string":
			return "eco <fast>", true
		}
		return nil, false
	}
	newDevice := func(failureRate float64) *Device {
		f := &Fleet{opts: Options{Model: model, ValueFunc: values, FailureRate: failureRate}, sorted: sortedProperties(model)}
		return &Device{ID: "dev-1", fleet: f}
	}
	for _, tc := range []struct {
		name        string
		failureRate float64
		fill        func(d *Device) func([]byte) []byte
		want        map[string]any // without timestamp
	}{
		{"read all", 0, func(d *Device) func([]byte) []byte {
			return func(b []byte) []byte { return d.appendProperties(b, nil) }
		}, map[string]any{"deviceId": "dev-1", "messageId": "m1", "success": true,
			"properties": map[string]any{"temp": 21.5, "mode": "eco <fast>", "count": 7.0}}},
		{"read some", 0, func(d *Device) func([]byte) []byte {
			return func(b []byte) []byte { return d.appendProperties(b, []string{"temp", "blob", "nope"}) }
		}, map[string]any{"deviceId": "dev-1", "messageId": "m1", "success": true,
			"properties": map[string]any{"temp": 21.5}}},
		{"read none there", 0, func(d *Device) func([]byte) []byte {
			return func(b []byte) []byte { return d.appendProperties(b, []string{"nope"}) }
		}, map[string]any{"deviceId": "dev-1", "messageId": "m1", "success": true, "properties": map[string]any{}}},
		{"invoke", 0, func(*Device) func([]byte) []byte {
			return func(b []byte) []byte { return append(b, `,"output":"ok"`...) }
		}, map[string]any{"deviceId": "dev-1", "messageId": "m1", "success": true, "output": "ok"}},
		{"failure", 1, func(*Device) func([]byte) []byte {
			return func(b []byte) []byte { panic("fill on failure") }
		}, map[string]any{"deviceId": "dev-1", "messageId": "m1", "success": false,
			"code": "simulated_failure", "message": "the simulated device failed on purpose"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDevice(tc.failureRate)
			body := d.replyBody("m1", tc.fill(d))
			var got map[string]any
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatalf("%s: %v", body, err)
			}
			ts, ok := got["timestamp"].(float64)
			if !ok || ts <= 0 {
				t.Fatalf("timestamp: %s", body)
			}
			tc.want["timestamp"] = ts
			want, _ := json.Marshal(tc.want)
			if string(body) != string(want) {
				t.Fatalf("got  %s\nwant %s", body, want)
			}
		})
	}
}
