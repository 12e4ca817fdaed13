package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"devicehub/api"
	"devicehub/meta"
	"devicehub/tsdb"
	"devicehub/tsdb/tsdbtest"
)

// propEnv is a server with ClickHouse in the platform zone loc, a product
// "pp" whose thing model has numeric (temp, count) and other properties,
// and its devices "p1" and "p2".
func propEnv(t *testing.T, loc *time.Location) (*env, *tsdb.DB) {
	t.Helper()
	db := tsdbtest.NewDB(t, loc)
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		deps.Dashboard = db
		deps.Models = store
	})
	p := e.createProduct("pp", "Prop product", nil)
	p["metadata"] = `{"properties":[
		{"id":"temp","name":"Temperature","valueType":{"type":"float","scale":2,"unit":"percent"}},
		{"id":"count","name":"Counter","valueType":{"type":"long"}},
		{"id":"mode","name":"Mode","valueType":{"type":"enum","elements":[{"value":"1","text":"Eco"}]}},
		{"id":"on","name":"Power","valueType":{"type":"boolean","trueValue":true,"falseValue":false}},
		{"id":"label","name":"Label","valueType":{"type":"string"}}]}`
	e.ok("PATCH", "/api/device-product", p, nil)
	for _, id := range []string{"p1", "p2"} {
		e.ok("POST", "/api/device/instance", map[string]any{"id": id, "name": "Device " + id, "productId": "pp"}, nil)
	}
	return e, db
}

type propAggResult struct {
	Group    string `json:"group"`
	Property string `json:"property"`
	Data     struct {
		Value      *float64 `json:"value"`
		TimeString string   `json:"timeString"`
		Timestamp  int      `json:"timestamp"`
	} `json:"data"`
}

// propAgg posts one property aggregate query and returns its items.
func (e *env) propAgg(params map[string]any) []propAggResult {
	e.t.Helper()
	body := []map[string]any{{"dashboard": "device", "object": "pp", "measurement": "properties", "dimension": "agg", "group": "g", "params": params}}
	var res []propAggResult
	e.ok("POST", "/api/dashboard/_multi", body, &res)
	return res
}

// TestDashboardPropertyAggregates: items exact against the values stored
// here for every aggregate, per device and product-wide, every bucket
// present newest first with null (avg, min, max, first, last) or 0
// (count, sum) where empty; buckets are hours of Asia/Shanghai.
func TestDashboardPropertyAggregates(t *testing.T) {
	t.Parallel()
	e, db := propEnv(t, shanghai)
	day := time.Date(2024, 3, 1, 0, 0, 0, 0, shanghai)
	type val struct {
		dev   string
		prop  string
		at    time.Duration // after day's midnight
		value float64
	}
	vals := []val{
		{"p1", "temp", -time.Second, 7}, // the day before: outside every range below
		{"p1", "temp", 0, 20}, {"p1", "temp", 30 * time.Minute, 22.5}, {"p1", "temp", 59*time.Minute + 59*time.Second, 21},
		{"p1", "temp", 2*time.Hour + 10*time.Minute, 19.25},
		{"p2", "temp", 10 * time.Minute, 30}, {"p2", "temp", 3*time.Hour + 5*time.Minute, 31.5},
		{"p1", "count", 15 * time.Minute, 4}, {"p1", "count", 45 * time.Minute, 6},
		{"p1", "temp", 4 * time.Hour, 18}, // at the end of the range: the next bucket
	}
	var ps []tsdb.PropertyValue
	for _, v := range vals {
		ps = append(ps, tsdb.PropertyValue{Time: day.Add(v.at), ProductID: "pp", DeviceID: v.dev, Property: v.prop, ValueType: "number", Num: v.value})
	}
	if err := db.Insert(context.Background(), nil, ps); err != nil {
		t.Fatal(err)
	}
	// 00:00 to 03:59:59.999 on 2024-03-01: four hours, newest first.
	hours := []string{"2024-03-01 03:00", "2024-03-01 02:00", "2024-03-01 01:00", "2024-03-01 00:00"}
	null := "null"
	f := func(agg, device string, want map[string][]string) {
		t.Helper()
		params := map[string]any{"properties": []string{"temp", "count"}, "agg": agg, "time": "1h", "format": "yyyy-MM-dd HH:mm",
			"from": day.UnixMilli(), "to": day.Add(4*time.Hour - time.Millisecond).UnixMilli(), "limit": 24}
		if device != "" {
			params["deviceId"] = device
		}
		res := e.propAgg(params)
		got := map[string][]string{}
		for i, r := range res {
			prop := "temp"
			if i >= len(hours) {
				prop = "count"
			}
			pos := i % len(hours)
			if r.Group != "g" || r.Property != prop || r.Data.Timestamp != pos || r.Data.TimeString != hours[pos] {
				t.Fatalf("%s %q item %d: %+v", agg, device, i, r)
			}
			v := null
			if r.Data.Value != nil {
				v = fmt.Sprint(*r.Data.Value)
			}
			got[prop] = append(got[prop], v)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s device %q:\n got %v\nwant %v", agg, device, got, want)
		}
	}
	// Per hour, newest first: temp of p1 is 03: none, 02: 19.25, 01: none,
	// 00: 20, 22.5, 21; count of p1 is 00: 4, 6. p2 adds temp 30 (00) and
	// 31.5 (03).
	f("avg", "p1", map[string][]string{"temp": {null, "19.25", null, "21.166666666666668"}, "count": {null, null, null, "5"}})
	f("min", "p1", map[string][]string{"temp": {null, "19.25", null, "20"}, "count": {null, null, null, "4"}})
	f("max", "p1", map[string][]string{"temp": {null, "19.25", null, "22.5"}, "count": {null, null, null, "6"}})
	f("sum", "p1", map[string][]string{"temp": {"0", "19.25", "0", "63.5"}, "count": {"0", "0", "0", "10"}})
	f("count", "p1", map[string][]string{"temp": {"0", "1", "0", "3"}, "count": {"0", "0", "0", "2"}})
	f("first", "p1", map[string][]string{"temp": {null, "19.25", null, "20"}, "count": {null, null, null, "4"}})
	f("last", "p1", map[string][]string{"temp": {null, "19.25", null, "21"}, "count": {null, null, null, "6"}})
	// Product-wide: every device of the product.
	f("avg", "", map[string][]string{"temp": {"31.5", "19.25", null, "23.375"}, "count": {null, null, null, "5"}})
	f("count", "", map[string][]string{"temp": {"1", "1", "0", "4"}, "count": {"0", "0", "0", "2"}})
	f("last", "", map[string][]string{"temp": {"31.5", "19.25", null, "21"}, "count": {null, null, null, "6"}})
	f("first", "", map[string][]string{"temp": {"31.5", "19.25", null, "20"}, "count": {null, null, null, "4"}})

	// Count values are integers; days of the platform zone; the default
	// 30 buckets and format.
	res := e.propAgg(map[string]any{"deviceId": "p1", "properties": []string{"temp"}, "agg": "count", "time": "1d", "to": day.UnixMilli()})
	if len(res) != 30 || res[0].Data.TimeString != "2024-03-01" || *res[0].Data.Value != 5 || res[1].Data.TimeString != "2024-02-29" || *res[1].Data.Value != 1 {
		t.Fatalf("1d count: %d items, %+v %+v", len(res), res[0], res[1])
	}
	// The example: 24 hours ending now, date math.
	now := time.Now()
	if err := db.Insert(context.Background(), nil, []tsdb.PropertyValue{
		{Time: now.Add(-30 * time.Minute), ProductID: "pp", DeviceID: "p1", Property: "temp", ValueType: "number", Num: 40},
		{Time: now.Add(-30 * time.Minute), ProductID: "pp", DeviceID: "p1", Property: "temp", ValueType: "number", Num: 42},
	}); err != nil {
		t.Fatal(err)
	}
	res = e.propAgg(map[string]any{"deviceId": "p1", "properties": []string{"temp"}, "agg": "avg", "time": "1h",
		"from": "now-1d", "to": "now", "limit": 24, "format": "yyyy-MM-dd HH:mm"})
	var sum float64
	var filled int
	for _, r := range res {
		if r.Data.Value != nil {
			sum += *r.Data.Value
			filled++
		}
	}
	if len(res) != 24 || filled != 1 || sum != 41 {
		t.Fatalf("now-1d..now: %d items, %d filled, sum %v", len(res), filled, sum)
	}
}

// The DST days of Europe/Berlin: hour buckets follow the local clock, 02:00
// twice in October, none in March; 15-minute buckets too.
func TestDashboardPropertyAggregatesDST(t *testing.T) {
	t.Parallel()
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	e, db := propEnv(t, berlin)
	autumn := time.Date(2024, 10, 27, 0, 30, 0, 0, time.UTC) // 02:30 CEST
	spring := time.Date(2024, 3, 31, 0, 30, 0, 0, time.UTC)  // 01:30 CET
	var ps []tsdb.PropertyValue
	for i, tm := range []time.Time{autumn, autumn.Add(time.Hour), autumn.Add(time.Hour + 10*time.Minute), spring, spring.Add(time.Hour)} {
		ps = append(ps, tsdb.PropertyValue{Time: tm, ProductID: "pp", DeviceID: "p1", Property: "temp", ValueType: "number", Num: float64(i + 1)})
	}
	if err := db.Insert(context.Background(), nil, ps); err != nil {
		t.Fatal(err)
	}
	f := func(interval string, from, to time.Time, want ...string) {
		t.Helper()
		res := e.propAgg(map[string]any{"deviceId": "p1", "properties": []string{"temp"}, "agg": "sum", "time": interval,
			"from": from.UnixMilli(), "to": to.UnixMilli(), "format": "HH:mm"})
		var got []string
		for _, r := range res {
			got = append(got, fmt.Sprintf("%s=%g", r.Data.TimeString, *r.Data.Value))
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("%s %v..%v:\n got %v\nwant %v", interval, from, to, got, want)
		}
	}
	f("1h", autumn.Add(-time.Hour), autumn.Add(2*time.Hour), "03:00=0", "02:00=5", "02:00=1", "01:00=0")
	f("15m", autumn, autumn.Add(time.Hour+15*time.Minute), "02:45=0", "02:30=5", "02:15=0", "02:00=0", "02:45=0", "02:30=1")
	f("1h", spring.Add(-time.Hour), spring.Add(2*time.Hour), "04:00=0", "03:00=5", "01:00=4", "00:00=0")
}

// TestDashboardHistoryRange: from/to select a range; the newest history
// values of it come oldest first; sending to = the oldest item's timestamp
// pages back through every value once.
func TestDashboardHistoryRange(t *testing.T) {
	t.Parallel()
	e, db := propEnv(t, shanghai)
	base := time.Date(2024, 6, 1, 8, 0, 0, 0, shanghai)
	var ps []tsdb.PropertyValue
	for i := range 11 {
		ps = append(ps, tsdb.PropertyValue{Time: base.Add(time.Duration(i) * time.Minute), ProductID: "pp", DeviceID: "p1",
			Property: "temp", ValueType: "number", Num: float64(i)})
	}
	ps = append(ps, tsdb.PropertyValue{Time: base.Add(5 * time.Minute), ProductID: "pp", DeviceID: "p1", Property: "label", ValueType: "string", Str: "x"})
	if err := db.Insert(context.Background(), nil, ps); err != nil {
		t.Fatal(err)
	}
	type item struct {
		Data struct {
			Value struct {
				Property  string          `json:"property"`
				Value     json.RawMessage `json:"value"`
				Timestamp int64           `json:"timestamp"`
			} `json:"value"`
			Timestamp int64 `json:"timestamp"`
		} `json:"data"`
	}
	page := func(params map[string]any) ([]string, int64) {
		t.Helper()
		params["deviceId"] = "p1"
		body := []map[string]any{{"dashboard": "device", "object": "pp", "measurement": "properties", "dimension": "history", "params": params}}
		var res []item
		e.ok("POST", "/api/dashboard/_multi", body, &res)
		var got []string
		for _, r := range res {
			got = append(got, r.Data.Value.Property+"="+string(r.Data.Value.Value))
		}
		if len(res) == 0 {
			return got, 0
		}
		return got, res[0].Data.Timestamp
	}
	ms := func(m int) int64 { return base.Add(time.Duration(m) * time.Minute).UnixMilli() }
	f := func(params map[string]any, want string) int64 {
		t.Helper()
		got, oldest := page(params)
		if strings.Join(got, " ") != want {
			t.Fatalf("%v:\n got %s\nwant %s", params, strings.Join(got, " "), want)
		}
		return oldest
	}
	// [from, to): minute 2 in, minute 6 out.
	f(map[string]any{"properties": []string{"temp"}, "history": 10, "from": ms(2), "to": ms(6)}, "temp=2 temp=3 temp=4 temp=5")
	// The newest 3 of the range, then page back with to = the oldest's
	// timestamp.
	var all []string
	params := map[string]any{"properties": []string{"temp"}, "history": 3, "from": ms(1), "to": "now"}
	for range 10 {
		got, oldest := page(params)
		if len(got) == 0 {
			break
		}
		all = append(got, all...)
		params["to"] = oldest
	}
	if strings.Join(all, " ") != "temp=1 temp=2 temp=3 temp=4 temp=5 temp=6 temp=7 temp=8 temp=9 temp=10" {
		t.Fatalf("paged: %v", all)
	}
	// Without from; every property when none is named.
	f(map[string]any{"history": 2, "to": ms(6)}, `label="x" temp=4 temp=5`)
	// Date math: nothing stored in the last hour.
	f(map[string]any{"properties": []string{"temp"}, "from": "now-1h"}, "")
}

// TestDashboardLateMessage is issue #20's exactness rule through the API: a
// message stored late for yesterday changes yesterday's count in the next
// answer of the instance that stored it, and within a second in the
// answers of another instance sharing the databases.
func TestDashboardLateMessage(t *testing.T) {
	t.Parallel()
	dbA := tsdbtest.NewDB(t, shanghai)
	dbB := tsdbtest.OpenDB(t, dbA.Database(), shanghai) // the other instance's handle
	envA := newEnvWith(t, func(_ *meta.Store, deps *api.Deps) { deps.Dashboard = dbA })
	envB := newEnvWith(t, func(_ *meta.Store, deps *api.Deps) { deps.Dashboard = dbB })
	// A count of a product that does not exist is not_found: the product
	// exists (in each instance's own database here).
	envA.createProduct("late", "Late", nil)
	envB.createProduct("late", "Late", nil)
	yesterday := time.Now().In(shanghai).AddDate(0, 0, -1)
	count := func(e *env) uint64 {
		t.Helper()
		res := e.aggQuery(map[string]any{"time": "1d", "limit": 2, "productId": "late"})
		if len(res) != 2 || res[1].Data.TimeString != yesterday.Format("2006-01-02") {
			t.Fatalf("buckets %+v", res)
		}
		return res[1].Data.Value
	}
	store := func(db *tsdb.DB, id string) time.Time {
		t.Helper()
		if err := db.Insert(context.Background(), []tsdb.Message{{Time: yesterday, ProductID: "late", DeviceID: "d",
			Direction: "up", MessageID: id}}, nil); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	if count(envA) != 0 || count(envB) != 0 {
		t.Fatal("not empty")
	}
	store(dbA, "m1")
	if n := count(envA); n != 1 {
		t.Fatalf("same instance, next answer: %d, want 1", n)
	}
	stored := store(dbB, "m2")
	if n := count(envB); n != 2 {
		t.Fatalf("storing instance, next answer: %d, want 2", n)
	}
	for {
		n := count(envA)
		if n == 2 {
			break
		}
		if n != 1 || time.Since(stored) > time.Second+200*time.Millisecond {
			t.Fatalf("other instance %v after the late message: %d", time.Since(stored), n)
		}
		time.Sleep(20 * time.Millisecond) // polling: the bound above is what is asserted
	}
}

// TestDashboardLatePropertyValue is issue #20's exactness rule for
// property aggregates, which read the hourly rollup for hour and longer
// buckets: a value stored late for yesterday changes yesterday's sum and
// last value in the next answer when stored through the serving instance,
// and within a second when stored through another instance sharing the
// database.
func TestDashboardLatePropertyValue(t *testing.T) {
	t.Parallel()
	e, dbA := propEnv(t, shanghai)
	dbB := tsdbtest.OpenDB(t, dbA.Database(), shanghai) // the other instance's handle
	yesterday := time.Now().In(shanghai).AddDate(0, 0, -1)
	agg := func(fn, interval string) string {
		t.Helper()
		res := e.propAgg(map[string]any{"properties": []string{"temp"}, "agg": fn, "time": interval, "limit": 2, "format": "yyyy-MM-dd"})
		if len(res) != 2 || res[1].Data.TimeString != yesterday.Format("2006-01-02") {
			t.Fatalf("buckets %+v", res)
		}
		if res[1].Data.Value == nil {
			return "null"
		}
		return fmt.Sprint(*res[1].Data.Value)
	}
	store := func(db *tsdb.DB, at time.Time, v float64) time.Time {
		t.Helper()
		if err := db.Insert(context.Background(), nil, []tsdb.PropertyValue{{Time: at, ProductID: "pp", DeviceID: "p1",
			Property: "temp", ValueType: "number", Num: v}}); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	if agg("sum", "1d") != "0" || agg("last", "1d") != "null" {
		t.Fatal("not empty")
	}
	store(dbA, yesterday, 2.5)
	if s, l := agg("sum", "1d"), agg("last", "1d"); s != "2.5" || l != "2.5" {
		t.Fatalf("same instance, next answer: sum %s, last %s", s, l)
	}
	stored := store(dbB, yesterday.Add(time.Millisecond), 4)
	for {
		s, l := agg("sum", "1d"), agg("last", "1d")
		if s == "6.5" && l == "4" {
			break
		}
		if (s != "2.5" && s != "6.5") || (l != "2.5" && l != "4") || time.Since(stored) > time.Second+200*time.Millisecond {
			t.Fatalf("other instance %v after the late value: sum %s, last %s", time.Since(stored), s, l)
		}
		time.Sleep(20 * time.Millisecond) // polling: the bound above is what is asserted
	}
}

// Every new parameter refuses bad input with 400 illegal_argument naming
// the field.
func TestDashboardPropertyBadInput(t *testing.T) {
	t.Parallel()
	e, _ := propEnv(t, shanghai)
	e.createProduct("other", "Other", nil)
	e.ok("POST", "/api/device/instance", map[string]any{"id": "o1", "name": "o1", "productId": "other"}, nil)
	agg := func(params string) string {
		return `[{"dashboard":"device","object":"pp","measurement":"properties","dimension":"agg","params":` + params + `}]`
	}
	hist := func(params string) string {
		return `[{"dashboard":"device","object":"pp","measurement":"properties","dimension":"history","params":` + params + `}]`
	}
	f := func(body string, mention ...string) {
		t.Helper()
		r := e.fails("POST", "/api/dashboard/_multi", body, 400, "illegal_argument")
		for _, m := range mention {
			if !strings.Contains(r.Message, m) {
				t.Fatalf("%s: message %q does not mention %q", body, r.Message, m)
			}
		}
	}
	many := make([]string, 101)
	for i := range many {
		many[i] = fmt.Sprintf("%q", fmt.Sprint("p", i))
	}
	for _, c := range []struct {
		body    string
		mention []string
	}{
		{agg(`{"properties":["temp"]}`), []string{"[0].params.agg"}},
		{agg(`{"properties":["temp"],"agg":"median"}`), []string{"[0].params.agg", "median"}},
		{agg(`{"properties":["temp"],"agg":5}`), []string{"[0].params.agg"}},
		{agg(`{"agg":"avg"}`), []string{"[0].params.properties"}},
		{agg(`{"agg":"avg","properties":[]}`), []string{"[0].params.properties"}},
		{agg(`{"agg":"avg","properties":"temp"}`), []string{"[0].params.properties"}},
		{agg(`{"agg":"avg","properties":[""]}`), []string{"[0].params.properties[0]"}},
		{agg(`{"agg":"avg","properties":[` + strings.Join(many, ",") + `]}`), []string{"[0].params.properties", "at most 100"}},
		{agg(`{"agg":"avg","properties":["temp","nope"]}`), []string{"[0].params.properties[1]", `"nope"`, `product "pp"`}},
		{agg(`{"agg":"avg","properties":["temp","nope"],"deviceId":"p1"}`), []string{"[0].params.properties[1]", `"nope"`, `device "p1"`}},
		{agg(`{"agg":"avg","properties":["temp","temp","nope"]}`), []string{"[0].params.properties[2]", `"nope"`}},
		{agg(`{"agg":"avg","properties":["mode"]}`), []string{"[0].params.properties[0]", `"mode"`, "enum"}},
		{agg(`{"agg":"max","properties":["temp","on"]}`), []string{"[0].params.properties[1]", `"on"`, "boolean"}},
		{agg(`{"agg":"sum","properties":["label"],"deviceId":"p2"}`), []string{"[0].params.properties[0]", `"label"`, "string"}},
		{agg(`{"agg":"avg","properties":["temp"],"time":"2h"}`), []string{"[0].params.time"}},
		{agg(`{"agg":"avg","properties":["temp"],"time":"1m","limit":10001}`), []string{"[0].params.limit"}},
		{agg(`{"agg":"avg","properties":["temp"],"limit":0}`), []string{"[0].params.limit"}},
		{agg(`{"agg":"avg","properties":["temp"],"format":"yyyy-QQ"}`), []string{"[0].params.format"}},
		{agg(`{"agg":"avg","properties":["temp"],"from":"yesterday"}`), []string{"[0].params.from"}},
		{agg(`{"agg":"avg","properties":["temp"],"to":[1]}`), []string{"[0].params.to"}},
		{agg(`{"agg":"avg","properties":["temp"],"deviceId":7}`), []string{"[0].params.deviceId"}},
		{agg(`{"agg":"avg","properties":["temp"],"deviceId":"o1"}`), []string{"[0].object", `"o1"`}},
		{`[` + strings.Repeat(`{"dashboard":"device","object":"pp","measurement":"properties","dimension":"agg","params":{"agg":"avg","properties":["temp","count","temp"],"time":"1m","limit":10000}},`, 2) +
			`{"dashboard":"device","object":"pp","measurement":"properties","dimension":"agg","params":{"agg":"avg","properties":["temp","count"],"time":"1m","limit":10000}}]`,
			[]string{"[2].params", "50000"}},
		{agg(`{"agg":"avg","properties":["temp"],"time":"1y","limit":100}`), []string{"[0].params", "1970"}},
		{hist(`{"deviceId":"p1","from":"someday"}`), []string{"[0].params.from"}},
		{hist(`{"deviceId":"p1","to":{}}`), []string{"[0].params.to"}},
		{hist(`{"deviceId":"p1","from":"now","to":"now-1h"}`), []string{"[0].params.from", "after to"}},
		{hist(`{"deviceId":"p1","from":1700000000001,"to":1700000000000}`), []string{"[0].params.from"}},
		{hist(`{"deviceId":"p1","properties":["temp",""]}`), []string{"[0].params.properties[1]"}},
	} {
		f(c.body, c.mention...)
	}
	e.fails("POST", "/api/dashboard/_multi", agg(`{"agg":"avg","properties":["temp"],"deviceId":"nope"}`), 404, "not_found")
	e.fails("POST", "/api/dashboard/_multi",
		`[{"dashboard":"device","object":"nope","measurement":"properties","dimension":"agg","params":{"agg":"avg","properties":["t"]}}]`, 404, "not_found")
}
