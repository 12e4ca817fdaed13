package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"devicehub/tsdb"
)

// TestDashboardTimeZoneInTheOpen: every bucket of endpoint 14 names the
// zone its timeString and boundaries follow and carries its start in
// epoch ms; history items name the zone; /api/settings says it; format
// writes zone letters.
func TestDashboardTimeZoneInTheOpen(t *testing.T) {
	t.Parallel()
	e, db := dashEnv(t)
	at := time.Date(2024, 3, 10, 9, 30, 0, 0, shanghai)
	if err := db.Insert(t.Context(), []tsdb.Message{{Time: at, ProductID: "dp", DeviceID: "dd", Direction: "up",
		MessageType: "REPORT_PROPERTY", MessageID: "tz1", Topic: "/dp/dd/properties/report", Payload: []byte("{}")}}, nil); err != nil {
		t.Fatal(err)
	}
	var settings struct {
		TimeZone         string `json:"timeZone"`
		Abbreviation     string `json:"timeZoneAbbreviation"`
		UTCOffsetSeconds int    `json:"utcOffsetSeconds"`
	}
	e.ok("GET", "/api/settings", nil, &settings)
	if settings.TimeZone != "Asia/Shanghai" || settings.Abbreviation != "CST" || settings.UTCOffsetSeconds != 8*3600 {
		t.Fatalf("settings: %+v", settings)
	}
	var items []struct {
		Data struct {
			Value      uint64 `json:"value"`
			TimeString string `json:"timeString"`
			Timestamp  int    `json:"timestamp"`
			Time       int64  `json:"time"`
			TimeZone   string `json:"timeZone"`
		} `json:"data"`
	}
	e.ok("POST", "/api/dashboard/_multi", []map[string]any{{"dashboard": "device", "object": "message", "measurement": "quantity", "dimension": "agg",
		"group": "g", "params": map[string]any{"productId": "dp", "time": "1d", "limit": 2, "format": "yyyy-MM-dd'T'HH:mmXXX z",
			"from": at.AddDate(0, 0, -1).UnixMilli(), "to": at.UnixMilli()}}}, &items)
	if len(items) != 2 {
		t.Fatalf("items: %+v", items)
	}
	day := time.Date(2024, 3, 10, 0, 0, 0, 0, shanghai)
	if d := items[0].Data; d.Value != 1 || d.Time != day.UnixMilli() || d.TimeZone != "Asia/Shanghai" || d.TimeString != "2024-03-10T00:00+08:00 CST" || d.Timestamp != 0 {
		t.Fatalf("newest bucket: %+v", d)
	}
	if d := items[1].Data; d.Time != day.AddDate(0, 0, -1).UnixMilli() || d.TimeZone != "Asia/Shanghai" {
		t.Fatalf("older bucket: %+v", d)
	}
}

// TestDashboardWhatDoesNotExist: a message-count query of a product that
// does not exist is not_found (as a property query of it is), and a
// parameter no query has is 400 naming it, on both decoding paths.
func TestDashboardWhatDoesNotExist(t *testing.T) {
	t.Parallel()
	e, _ := dashEnv(t)
	count := func(params map[string]any) map[string]any {
		return map[string]any{"dashboard": "device", "object": "message", "measurement": "quantity", "dimension": "agg", "group": "g", "params": params}
	}
	e.fails("POST", "/api/dashboard/_multi", []any{count(map[string]any{"productId": "nope", "time": "1d", "limit": 3})}, http.StatusNotFound, "not_found")
	for _, q := range []map[string]any{
		count(map[string]any{"productId": "dp", "time": "1d", "tz": "UTC"}),
		count(map[string]any{"time": "1d", "Tz": "UTC", "limit": "x"}), // encoding/json's path
		{"dashboard": "device", "object": "dp", "measurement": "properties", "dimension": "agg", "params": map[string]any{"properties": []string{"temp"}, "agg": "avg", "tz": 1}},
		{"dashboard": "device", "object": "dp", "measurement": "properties", "dimension": "history", "params": map[string]any{"deviceId": "dd", "tz": 1}},
	} {
		r := e.call("POST", "/api/dashboard/_multi", []any{q})
		if r.HTTPStatus != http.StatusBadRequest || r.Code != "illegal_argument" || !strings.Contains(strings.ToLower(r.Message), "params.tz") {
			b, _ := json.Marshal(q)
			t.Errorf("%s: %d %s", b, r.HTTPStatus, r.raw)
		}
	}
	// Case aside, known keys still work (as encoding/json matches them).
	e.ok("POST", "/api/dashboard/_multi", []any{count(map[string]any{"ProductId": "dp", "time": "1d", "limit": 1})}, nil)
}

// TestReadUndeclaredProperty: endpoints 10 and 11 refuse a property the
// device's thing model does not define (400 naming it), before asking
// whether the device is connected: an empty answer would read as "no
// value yet".
func TestReadUndeclaredProperty(t *testing.T) {
	t.Parallel()
	e, _ := dashEnv(t)
	r := e.fails("GET", "/api/device/standard/dd/property/nosuch", nil, http.StatusBadRequest, "illegal_argument")
	if !strings.Contains(r.Message, "property") || !strings.Contains(r.Message, `"nosuch"`) {
		t.Errorf("endpoint 10: %s", r.raw)
	}
	r = e.fails("POST", "/api/device/instance/dd/properties/_read", []string{"temp", "nosuch"}, http.StatusBadRequest, "illegal_argument")
	if !strings.Contains(r.Message, "[1]") || !strings.Contains(r.Message, `"nosuch"`) {
		t.Errorf("endpoint 11: %s", r.raw)
	}
	// A declared property gets as far as the device (here: no device link).
	e.fails("GET", "/api/device/standard/dd/property/temp", nil, http.StatusInternalServerError, "client_offline")
	e.fails("GET", "/api/device/standard/nodevice/property/temp", nil, http.StatusNotFound, "not_found")
}

// TestAllowedColumnsWhole: an unknown column or sort is answered with
// every column allowed in the result, where the message is cut.
func TestAllowedColumnsWhole(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, c := range []struct {
		path string
		body any
		want []string
	}{
		{"/api/device-product/_count", map[string]any{"terms": []any{map[string]any{"column": "nosuch", "value": "1"}}}, []string{"transportProtocol", "virtualType", "state"}},
		{"/api/device-product/_query/", map[string]any{"sorts": []any{map[string]any{"name": "nosuch"}}}, []string{"createTime", "name"}},
		{"/api/device-instance/_query/", map[string]any{"terms": []any{map[string]any{"column": "nosuch", "value": "1"}}}, []string{"productId", "state"}},
	} {
		r := e.fails("POST", c.path, c.body, http.StatusBadRequest, "illegal_argument")
		var res struct {
			Field   string   `json:"field"`
			Allowed []string `json:"allowed"`
		}
		if err := json.Unmarshal(r.Result, &res); err != nil || res.Field == "" {
			t.Errorf("%s: result %s", c.path, r.raw)
			continue
		}
		for _, w := range c.want {
			found := false
			for _, a := range res.Allowed {
				found = found || a == w
			}
			if !found {
				t.Errorf("%s: %q not in allowed %v", c.path, w, res.Allowed)
			}
		}
	}
}
