package api_test

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"devicehub/api"
	"devicehub/meta"
	"devicehub/tsdb"
	"devicehub/tsdb/tsdbtest"
)

var shanghai = func() *time.Location {
	l, err := time.LoadLocation("Asia/Shanghai")
	if err != nil {
		panic(err)
	}
	return l
}()

// dashEnv is a server with ClickHouse in the Asia/Shanghai zone, a product
// "dp" with a thing model, and its device "dd".
func dashEnv(t *testing.T) (*env, *tsdb.DB) {
	t.Helper()
	db := tsdbtest.NewDB(t, shanghai)
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		deps.Dashboard = db
		deps.Models = store
	})
	p := e.createProduct("dp", "Dash product", nil)
	p["metadata"] = `{"properties":[
		{"id":"temp","name":"Temperature","valueType":{"type":"float","scale":2,"unit":"percent"}},
		{"id":"count","name":"Counter","valueType":{"type":"int","unit":"meter"}},
		{"id":"mode","name":"Mode","valueType":{"type":"enum","elements":[{"value":"1","text":"Eco"},{"value":"2","text":"Boost"}]}},
		{"id":"on","name":"Power","valueType":{"type":"boolean","trueText":"On","trueValue":true,"falseText":"Off","falseValue":false}}]}`
	e.ok("PATCH", "/api/device-product", p, nil)
	e.ok("POST", "/api/device/instance", map[string]any{"id": "dd", "name": "Dash device", "productId": "dp"}, nil)
	return e, db
}

type aggResult struct {
	Group string `json:"group"`
	Data  struct {
		Value      uint64 `json:"value"`
		TimeString string `json:"timeString"`
		Timestamp  int    `json:"timestamp"`
	} `json:"data"`
}

func TestDashboardMessageCounts(t *testing.T) {
	t.Parallel()
	e, db := dashEnv(t)
	// Messages over 14 months, with month ends, the leap day and times just
	// before and after midnight in Shanghai (16:00 UTC).
	var times []time.Time
	base := time.Date(2023, 12, 1, 0, 0, 0, 0, shanghai)
	for d := 0; d < 430; d += 3 {
		day := base.AddDate(0, 0, d)
		for k := 0; k < 1+d%4; k++ {
			times = append(times, day.Add(time.Duration(k)*5*time.Hour+time.Minute))
		}
	}
	times = append(times,
		time.Date(2024, 2, 29, 23, 59, 59, 0, shanghai), time.Date(2024, 2, 29, 0, 0, 0, 0, shanghai),
		time.Date(2024, 3, 1, 0, 0, 0, 0, shanghai), time.Date(2024, 1, 31, 23, 59, 59, 0, shanghai),
		time.Date(2024, 4, 30, 23, 30, 0, 0, shanghai), time.Date(2024, 5, 1, 0, 30, 0, 0, shanghai))
	var msgs []tsdb.Message
	for i, tm := range times {
		product := "dp"
		if i%5 == 0 {
			product = "other"
		}
		msgs = append(msgs, tsdb.Message{Time: tm, ProductID: product, DeviceID: "dd", Direction: "up",
			MessageType: "REPORT_PROPERTY", MessageID: fmt.Sprint(i), Topic: "/dp/dd/properties/report", Payload: []byte("{}")})
	}
	if err := db.Insert(context.Background(), msgs, nil); err != nil {
		t.Fatal(err)
	}
	// Expected counts, computed here from the list.
	want := map[string]map[string]uint64{"day": {}, "month": {}, "dayDP": {}}
	for i, tm := range times {
		local := tm.In(shanghai)
		want["day"][local.Format("2006-01-02")]++
		want["month"][local.Format("2006-01")]++
		if i%5 != 0 {
			want["dayDP"][local.Format("2006-01-02")]++
		}
	}
	query := func(params map[string]any) []aggResult {
		t.Helper()
		body := []map[string]any{{"dashboard": "device", "object": "message", "measurement": "quantity", "dimension": "agg", "group": "g1", "params": params}}
		var res []aggResult
		e.ok("POST", "/api/dashboard/_multi", body, &res)
		return res
	}
	check := func(res []aggResult, want map[string]uint64, n int) {
		t.Helper()
		if len(res) != n {
			t.Fatalf("%d buckets, want %d", len(res), n)
		}
		for i, r := range res {
			if r.Group != "g1" || r.Data.Timestamp != i {
				t.Fatalf("item %d: group %q timestamp %d", i, r.Group, r.Data.Timestamp)
			}
			if r.Data.Value != want[r.Data.TimeString] {
				t.Fatalf("bucket %s: %d, want %d", r.Data.TimeString, r.Data.Value, want[r.Data.TimeString])
			}
			if i > 0 && r.Data.TimeString >= res[i-1].Data.TimeString {
				t.Fatalf("not newest first: %s after %s", r.Data.TimeString, res[i-1].Data.TimeString)
			}
		}
	}
	ms := func(y int, m time.Month, d int) int64 { return time.Date(y, m, d, 12, 0, 0, 0, shanghai).UnixMilli() }

	// 30 days ending 2024-03-10: every day present, empty ones 0.
	res := query(map[string]any{"time": "1d", "format": "yyyy-MM-dd", "limit": 30, "from": ms(2024, 2, 10), "to": ms(2024, 3, 10)})
	check(res, want["day"], 30)
	if res[0].Data.TimeString != "2024-03-10" || res[29].Data.TimeString != "2024-02-10" {
		t.Fatalf("day range %s..%s", res[29].Data.TimeString, res[0].Data.TimeString)
	}
	// from and to swapped give the same answer.
	swapped := query(map[string]any{"time": "1d", "limit": 30, "from": ms(2024, 3, 10), "to": ms(2024, 2, 10)})
	if fmt.Sprint(swapped) != fmt.Sprint(res) {
		t.Fatalf("swapped from/to differ")
	}
	// limit smaller than the range: the newest 7.
	check(query(map[string]any{"time": "1d", "limit": 7, "from": ms(2024, 2, 10), "to": ms(2024, 3, 10)}), want["day"], 7)
	// limit larger than the range: only the range.
	check(query(map[string]any{"time": "1d", "limit": 100, "from": ms(2024, 2, 25), "to": ms(2024, 3, 2)}), want["day"], 7)
	// Month buckets over 12 months.
	mres := query(map[string]any{"time": "1M", "format": "yyyy-MM", "limit": 12, "from": ms(2023, 12, 1), "to": ms(2024, 11, 1)})
	check(mres, want["month"], 12)
	var total uint64
	for _, r := range mres {
		total += r.Data.Value
	}
	var wantTotal uint64
	for k, v := range want["month"] {
		if k >= "2023-12" && k <= "2024-11" {
			wantTotal += v
		}
	}
	if total != wantTotal {
		t.Fatalf("12 months hold %d messages, want %d", total, wantTotal)
	}
	// One product only.
	check(query(map[string]any{"time": "1d", "limit": 30, "from": ms(2024, 2, 10), "to": ms(2024, 3, 10), "productId": "dp"}), want["dayDP"], 30)
	// An empty range: every bucket present as 0.
	for _, r := range query(map[string]any{"time": "1d", "limit": 5, "from": ms(2030, 1, 1), "to": ms(2030, 1, 5)}) {
		if r.Data.Value != 0 {
			t.Fatalf("empty range bucket %s = %d", r.Data.TimeString, r.Data.Value)
		}
	}
	// Chinese pattern.
	cn := query(map[string]any{"time": "1d", "format": "MM月dd日", "limit": 1, "to": ms(2024, 2, 29)})
	if len(cn) != 1 || cn[0].Data.TimeString != "02月29日" || cn[0].Data.Value != want["day"]["2024-02-29"] {
		t.Fatalf("MM月dd日: %+v (want %d)", cn, want["day"]["2024-02-29"])
	}
}

func TestDashboardHistory(t *testing.T) {
	t.Parallel()
	e, db := dashEnv(t)
	t0 := time.Date(2024, 6, 1, 8, 0, 0, 0, time.UTC)
	var props []tsdb.PropertyValue
	for i := 0; i < 5; i++ {
		tm := t0.Add(time.Duration(i) * time.Minute)
		props = append(props,
			tsdb.PropertyValue{Time: tm, ProductID: "dp", DeviceID: "dd", Property: "temp", ValueType: "number", Num: 20.5 + float64(i)},
			tsdb.PropertyValue{Time: tm, ProductID: "dp", DeviceID: "dd", Property: "mode", ValueType: "string", Str: fmt.Sprint(1 + i%2)},
		)
	}
	props = append(props,
		tsdb.PropertyValue{Time: t0, ProductID: "dp", DeviceID: "dd", Property: "count", ValueType: "number", Num: 42},
		tsdb.PropertyValue{Time: t0, ProductID: "dp", DeviceID: "dd", Property: "on", ValueType: "bool", Num: 1, Str: "true"},
		tsdb.PropertyValue{Time: t0, ProductID: "dp", DeviceID: "other", Property: "temp", ValueType: "number", Num: 99})
	if err := db.Insert(context.Background(), nil, props); err != nil {
		t.Fatal(err)
	}
	type item struct {
		Group string `json:"group"`
		Data  struct {
			Value struct {
				ID, Property, PropertyName, Type, FormatValue string
				Value                                         json.RawMessage
				CreateTime, Timestamp                         int64
			} `json:"value"`
			TimeString string `json:"timeString"`
			Timestamp  int64  `json:"timestamp"`
		} `json:"data"`
	}
	history := func(n int, props ...string) []item {
		t.Helper()
		body := []map[string]any{{"dashboard": "device", "object": "dp", "measurement": "properties", "dimension": "history", "group": "state",
			"params": map[string]any{"deviceId": "dd", "history": n, "properties": props}}}
		var res []item
		e.ok("POST", "/api/dashboard/_multi", body, &res)
		return res
	}
	res := history(3, "temp", "mode", "count", "on", "missing")
	var got []string
	for _, r := range res {
		got = append(got, r.Data.Value.Property+"="+string(r.Data.Value.Value)+"|"+r.Data.Value.FormatValue+"|"+r.Data.Value.PropertyName)
		if r.Group != "state" || r.Data.Timestamp != r.Data.Value.Timestamp || r.Data.TimeString == "" {
			t.Fatalf("item shape: %+v", r)
		}
	}
	want := []string{
		"temp=22.5|22.50%|Temperature", "temp=23.5|23.50%|Temperature", "temp=24.5|24.50%|Temperature",
		`mode="1"|Eco|Mode`, `mode="2"|Boost|Mode`, `mode="1"|Eco|Mode`,
		"count=42|42 m|Counter",
		"on=true|On|Power",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("history:\n got %v\nwant %v", got, want)
	}
	// Oldest first within a property.
	if res[0].Data.Timestamp >= res[1].Data.Timestamp {
		t.Fatalf("not oldest first")
	}
	// Ids: md5 hex of device, property and millisecond, one per value,
	// the same in every response.
	ids := map[string]bool{}
	for _, r := range res {
		sum := md5.Sum(fmt.Appendf(nil, "dd-%s-%d", r.Data.Value.Property, r.Data.Value.Timestamp))
		if id := r.Data.Value.ID; id != hex.EncodeToString(sum[:]) || ids[id] {
			t.Fatalf("id %q of %+v", id, r.Data.Value)
		}
		ids[r.Data.Value.ID] = true
	}
	if again := history(3, "temp"); again[2].Data.Value.ID != res[2].Data.Value.ID {
		t.Fatalf("id of the same value changed: %q, then %q", res[2].Data.Value.ID, again[2].Data.Value.ID)
	}
	// N larger than stored: all five.
	if n := len(history(50, "temp")); n != 5 {
		t.Fatalf("history 50 of temp: %d items", n)
	}
	// No properties named: every stored property, latest one each.
	all := history(1)
	var names []string
	for _, r := range all {
		names = append(names, r.Data.Value.Property)
	}
	sort.Strings(names)
	if fmt.Sprint(names) != "[count mode on temp]" {
		t.Fatalf("all properties: %v", names)
	}
	// Values of properties the thing model does not define (any more):
	// named and typed as stored, formatValue the value as plain text, as
	// the export writes it.
	if err := db.Insert(context.Background(), nil, []tsdb.PropertyValue{
		{Time: t0, ProductID: "dp", DeviceID: "dd", Property: "retired", ValueType: "json", Str: `{ "a": [1, 2], "h": "<b>" }`},
		{Time: t0, ProductID: "dp", DeviceID: "dd", Property: "big", ValueType: "number", Num: 1e6},
		{Time: t0, ProductID: "dp", DeviceID: "dd", Property: "tiny", ValueType: "number", Num: 1e-7},
	}); err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for _, r := range history(1, "retired", "big", "tiny") {
		got = append(got, r.Data.Value.Property+"="+string(r.Data.Value.Value)+"|"+r.Data.Value.FormatValue+"|"+r.Data.Value.PropertyName+"|"+r.Data.Value.Type)
	}
	want = []string{`retired={"a":[1,2],"h":"\u003cb\u003e"}|{ "a": [1, 2], "h": "<b>" }|retired|json`, "big=1000000|1000000|big|number", "tiny=1e-7|1e-7|tiny|number"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("properties the model does not define:\n got %v\nwant %v", got, want)
	}
}

// dashAgg is an endpoint 14 body of one message-count aggregate with params.
func dashAgg(params string) string {
	return `[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":` + params + `}]`
}

// refusedMentioning posts body to endpoint 14 and requires 400
// illegal_argument with a message that mentions mention.
func (e *env) refusedMentioning(body, mention string) {
	e.t.Helper()
	r := e.fails("POST", "/api/dashboard/_multi", body, 400, "illegal_argument")
	if !strings.Contains(r.Message, mention) {
		e.t.Fatalf("%s: message %q does not mention %q", body, r.Message, mention)
	}
}

func TestDashboardBadInput(t *testing.T) {
	t.Parallel()
	e, _ := dashEnv(t)
	agg, f := dashAgg, e.refusedMentioning
	f(`{}`, "body")
	f(`[]`, "body")
	f(`[{"object":"message","measurement":"quantity","dimension":"agg"}]`, "[0].dashboard")
	f(`[{"dashboard":"device","measurement":"quantity","dimension":"agg"}]`, "[0].object")
	f(`[{"dashboard":"device","object":"message","dimension":"agg"}]`, "[0].measurement")
	f(`[{"dashboard":"device","object":"message","measurement":"quantity"}]`, "[0].dimension")
	f(`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg"},{"dashboard":"","object":"x","measurement":"y","dimension":"z"}]`, "[1].dashboard")
	f(`[{"dashboard":"user","object":"message","measurement":"quantity","dimension":"agg"}]`, "dashboard")
	f(`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"max"}]`, "unknown query")
	f(agg(`{"time":"2d"}`), "params.time")
	f(agg(`{"format":"yyyy-QQ"}`), "params.format")
	f(agg(`{"limit":0}`), "params.limit")
	f(agg(`{"limit":"7"}`), "params.limit")
	f(agg(`{"from":"yesterday"}`), "params.from")
	f(agg(`{"to":true}`), "params.to")
	f(`[{"dashboard":"device","object":"dp","measurement":"properties","dimension":"history","params":{}}]`, "params.deviceId")
	f(`[{"dashboard":"device","object":"dp","measurement":"properties","dimension":"history","params":{"deviceId":"dd","history":0}}]`, "params.history")
	f(`[{"dashboard":"device","object":"dp","measurement":"properties","dimension":"history","params":{"deviceId":"dd","properties":"temp"}}]`, "params.properties")
	f(`[{"dashboard":"device","object":"wrong","measurement":"properties","dimension":"history","params":{"deviceId":"dd"}}]`, "[0].object")
	e.fails("POST", "/api/dashboard/_multi", `[{"dashboard":"device","object":"dp","measurement":"properties","dimension":"history","params":{"deviceId":"nope"}}]`, 404, "not_found")
}

// aggEnv is a server with an empty ClickHouse database in the platform
// zone loc; only message-count queries need nothing else.
func aggEnv(t *testing.T, loc *time.Location) *env {
	t.Helper()
	db := tsdbtest.NewDB(t, loc)
	return newEnvWith(t, func(_ *meta.Store, deps *api.Deps) { deps.Dashboard = db })
}

// aggQuery posts one message-count query and returns its items.
func (e *env) aggQuery(params map[string]any) []aggResult {
	e.t.Helper()
	body := []map[string]any{{"dashboard": "device", "object": "message", "measurement": "quantity", "dimension": "agg", "params": params}}
	var res []aggResult
	e.ok("POST", "/api/dashboard/_multi", body, &res)
	return res
}

// Without from, the range is exactly limit buckets (30 without a limit)
// ending with the bucket that holds to, whatever the unit and the day of
// month, leap day or DST day to falls on.
func TestDashboardDefaultRange(t *testing.T) {
	t.Parallel()
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	for _, loc := range []*time.Location{shanghai, berlin} {
		e := aggEnv(t, loc)
		f := func(interval, to string, limit int, newest, oldest string) {
			t.Helper()
			tm, err := time.ParseInLocation("2006-01-02 15:04:05.000 MST", to, loc)
			if err != nil {
				t.Fatal(err)
			}
			params := map[string]any{"time": interval, "format": "yyyy-MM-dd HH:mm", "to": tm.UnixMilli()}
			n := 30
			if limit > 0 {
				params["limit"], n = limit, limit
			}
			res := e.aggQuery(params)
			var got []string
			for _, r := range res {
				got = append(got, r.Data.TimeString)
			}
			if len(got) != n || got[0] != newest || got[n-1] != oldest {
				t.Errorf("%s, %s, to %s, limit %d: %d buckets, want %d buckets %s .. %s\n%q",
					loc, interval, to, limit, len(got), n, newest, oldest, got)
			}
		}
		if loc == shanghai {
			f("1M", "2026-07-31 12:00:00.000 CST", 30, "2026-07-01 00:00", "2024-02-01 00:00")
			f("1M", "2026-07-31 00:00:00.000 CST", 0, "2026-07-01 00:00", "2024-02-01 00:00")
			f("1M", "2026-12-31 23:59:59.999 CST", 11, "2026-12-01 00:00", "2026-02-01 00:00")
			f("1M", "2024-02-29 12:00:00.000 CST", 0, "2024-02-01 00:00", "2021-09-01 00:00")
			f("1M", "2026-04-30 12:00:00.000 CST", 3, "2026-04-01 00:00", "2026-02-01 00:00")
			f("1y", "2024-02-29 12:00:00.000 CST", 0, "2024-01-01 00:00", "1995-01-01 00:00")
			f("1y", "2026-01-01 00:30:00.000 CST", 5, "2026-01-01 00:00", "2022-01-01 00:00")
			f("1w", "2026-07-31 12:00:00.000 CST", 0, "2026-07-27 00:00", "2026-01-05 00:00")
			f("1d", "2024-03-01 00:30:00.000 CST", 0, "2024-03-01 00:00", "2024-02-01 00:00")
			f("1d", "2026-07-31 23:59:59.999 CST", 31, "2026-07-31 00:00", "2026-07-01 00:00")
			f("1h", "2026-07-31 23:59:59.999 CST", 0, "2026-07-31 23:00", "2026-07-30 18:00")
			continue
		}
		f("1M", "2026-07-31 12:00:00.000 CEST", 30, "2026-07-01 00:00", "2024-02-01 00:00")
		// The first hour after the spring DST day and the last hour of the
		// 25-hour autumn one.
		f("1d", "2026-03-30 00:30:00.000 CEST", 0, "2026-03-30 00:00", "2026-03-01 00:00")
		f("1d", "2026-03-29 23:30:00.000 CEST", 30, "2026-03-29 00:00", "2026-02-28 00:00")
		f("1d", "2026-10-25 23:30:00.000 CET", 0, "2026-10-25 00:00", "2026-09-26 00:00")
		f("1w", "2026-03-29 23:30:00.000 CEST", 4, "2026-03-23 00:00", "2026-03-02 00:00")
		f("1h", "2026-03-29 04:30:00.000 CEST", 30, "2026-03-29 04:00", "2026-03-27 22:00")
		f("1h", "2026-10-25 02:30:00.000 CET", 0, "2026-10-25 02:00", "2026-10-23 22:00")
	}
}

// Date math rounds in the platform zone (Asia/Shanghai here), not in the
// process's (UTC on the test machines): now/d is 00:00 in Shanghai. Hour
// buckets show the rounded edge whatever the time of day the test runs.
func TestDashboardDateMathZone(t *testing.T) {
	t.Parallel()
	e := aggEnv(t, shanghai)
	f := func(from, to string, want func(now time.Time) (newest, oldest string)) {
		t.Helper()
		before := time.Now()
		res := e.aggQuery(map[string]any{"time": "1h", "format": "yyyy-MM-dd HH:mm", "from": from, "to": to})
		after := time.Now()
		if len(res) == 0 {
			t.Fatalf("from %s to %s: no buckets", from, to)
		}
		got := [2]string{res[0].Data.TimeString, res[len(res)-1].Data.TimeString}
		// The day may change in Shanghai while the request runs.
		var wants [][2]string
		for _, now := range []time.Time{before.In(shanghai), after.In(shanghai)} {
			newest, oldest := want(now)
			wants = append(wants, [2]string{newest, oldest})
			if got == wants[len(wants)-1] {
				return
			}
		}
		t.Errorf("from %s to %s: buckets %s .. %s, want %v", from, to, got[0], got[1], wants)
	}
	hour := func(t time.Time) string { return t.Format("2006-01-02 15") + ":00" }
	day := func(t time.Time) string { return t.Format("2006-01-02") + " 00:00" }
	f("now-7d/d", "now", func(now time.Time) (string, string) { return hour(now), day(now.AddDate(0, 0, -7)) })
	f("now-1d/d", "now/d", func(now time.Time) (string, string) { return day(now), day(now.AddDate(0, 0, -1)) })
	f("now/M", "now", func(now time.Time) (string, string) { return hour(now), now.Format("2006-01") + "-01 00:00" })
	f("now/w", "now", func(now time.Time) (string, string) {
		return hour(now), day(now.AddDate(0, 0, -(int(now.Weekday())+6)%7))
	})
	f("now-1y/y", "now/y", func(now time.Time) (string, string) {
		return now.Format("2006") + "-01-01 00:00", now.AddDate(-1, 0, 0).Format("2006") + "-01-01 00:00"
	})
}

// An argument only tsdb can judge is refused with 400 illegal_argument,
// naming the parameter: here a default range reaching before 1970, which
// ClickHouse's DateTime cannot hold.
func TestDashboardInvalidArgumentFromTSDB(t *testing.T) {
	t.Parallel()
	e := aggEnv(t, shanghai)
	agg, f := dashAgg, e.refusedMentioning
	to1971 := time.Date(1971, 6, 15, 12, 0, 0, 0, shanghai).UnixMilli()
	f(agg(fmt.Sprintf(`{"time":"1M","to":%d,"limit":30}`, to1971)), "1970")
	f(agg(fmt.Sprintf(`{"time":"1d","to":%d,"limit":10000}`, to1971)), "1970")
	f(agg(`{"time":"1y","limit":100}`), "1970")
	f(agg(`{"from":"now-7q"}`), "[0].params.from")
	f(agg(`{"to":"now/q"}`), "[0].params.to")
	f(agg(`{"time":"1q"}`), "[0].params.time")
}
