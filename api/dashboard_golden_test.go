package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"devicehub/api"
	"devicehub/ingest/alarm"
	"devicehub/meta"
	"devicehub/tsdb"
	"devicehub/tsdb/tsdbtest"
)

// The golden set of endpoint 14 (POST /api/dashboard/_multi) and of its
// exports (POST /api/dashboard/_export): requests and the exact bytes
// answered, against the fixed dataset of goldenEnv with the dashboard
// clock fixed at goldenNow. TestDashboardGolden replays every file of
// testdata/dashboard14 and requires the same status, headers and body,
// byte for byte (but the envelope's own timestamp, the time of the
// answer); -golden-update rewrites the files from goldenCases.

var goldenUpdate = flag.Bool("golden-update", false, "rewrite testdata/dashboard14 from goldenCases")

const goldenDir = "testdata/dashboard14"

// goldenNow is the dashboard's "now" in the golden set.
var goldenNow = time.Date(2024, 3, 10, 15, 4, 5, 678_000_000, shanghai)

// goldenCase is one request of the golden set.
type goldenCase struct {
	name   string
	path   string // after /api/dashboard/
	as     string // admin or lim (dashboard:read on product gp only)
	accept string // an export's Accept header
	body   string
}

const goldenModel = `{"properties":[
	{"id":"temp","name":"Temperature","valueType":{"type":"float","scale":2,"unit":"percent"}},
	{"id":"count","name":"Counter","valueType":{"type":"int","unit":"meter"}},
	{"id":"big","name":"Big","valueType":{"type":"double"}},
	{"id":"mode","name":"Mode","valueType":{"type":"enum","elements":[{"value":"1","text":"Eco"},{"value":"2","text":"Boost"}]}},
	{"id":"on","name":"Power","valueType":{"type":"boolean","trueText":"On","trueValue":true,"falseText":"Off","falseValue":false}},
	{"id":"label","name":"Label","valueType":{"type":"string"}}]}`

// goldenEnv is the golden set's server and dataset: products gp (devices
// gd1, gd2), gq (gq1) and gw (gw1, a thing model of 101 properties); a
// user lim whose role reaches gp only; messages, property values and
// alarms at fixed times around goldenNow.
func goldenEnv(t *testing.T) (*env, string) {
	t.Helper()
	db := tsdbtest.NewDB(t, shanghai)
	var as *alarm.Store
	opts := api.DefaultOptions()
	api.SetDashboardClock(&opts, func() time.Time { return goldenNow })
	e := newEnvOpts(t, opts, func(store *meta.Store, deps *api.Deps) {
		as = alarm.NewStore(store)
		deps.Alarms = as
		deps.Dashboard, deps.Models = db, store
	})
	e.createProduct("gp", "Golden product", map[string]any{"metadata": goldenModel})
	e.createProduct("gq", "Golden other", map[string]any{"metadata": `{"properties":[{"id":"temp","name":"Temp","valueType":{"type":"float"}}]}`})
	var wide []string
	for i := range 101 {
		wide = append(wide, fmt.Sprintf(`{"id":"w%03d","name":"W%d","valueType":{"type":"int"}}`, i, i))
	}
	e.createProduct("gw", "Golden wide", map[string]any{"metadata": `{"properties":[` + strings.Join(wide, ",") + `]}`})
	for _, d := range [][2]string{{"gd1", "gp"}, {"gd2", "gp"}, {"gq1", "gq"}, {"gw1", "gw"}} {
		e.ok("POST", "/api/device/instance", map[string]any{"id": d[0], "name": "Device " + d[0], "productId": d[1]}, nil)
	}
	e.ok("POST", "/api/role", map[string]any{"id": "golden-lim", "name": "Golden limited", "products": []string{"gp"},
		"permissions": []string{"product:read", "device:read", "dashboard:read"}}, nil)
	_, lim := e.addUser("lim", "golden-lim")

	// Messages: from 2022 to goldenNow, denser near it.
	var msgs []tsdb.Message
	add := func(tm time.Time, product, device string) {
		msgs = append(msgs, tsdb.Message{Time: tm, ProductID: product, DeviceID: device, Direction: "up",
			MessageType: "REPORT_PROPERTY", MessageID: strconv.Itoa(len(msgs)), Topic: "/" + product + "/" + device + "/properties/report", Payload: []byte("{}")})
	}
	for d := 0; d < 800; d += 7 { // about weekly over two years
		add(time.Date(2022, 1, 3, 9, 0, 0, 0, shanghai).AddDate(0, 0, d), "gp", "gd1")
	}
	for d := 0; d < 40; d++ { // daily from 2024-02-01, 1 to 4 a day
		day := time.Date(2024, 2, 1, 0, 0, 0, 0, shanghai).AddDate(0, 0, d)
		for k := 0; k < 1+d%4; k++ {
			product, device := "gp", "gd1"
			if k == 2 {
				product, device = "gq", "gq1"
			} else if k == 3 {
				device = "gd2"
			}
			add(day.Add(time.Duration(k)*5*time.Hour+time.Duration(d)*time.Minute), product, device)
		}
	}
	for m := 0; m < 180; m += 2 { // 2024-03-05 10:00 to 13:00, every 2 minutes
		add(time.Date(2024, 3, 5, 10, 0, 0, 0, shanghai).Add(time.Duration(m)*time.Minute), "gp", "gd1")
	}
	add(time.Date(2024, 3, 9, 23, 59, 59, 999_000_000, shanghai), "gp", "gd1") // a day's last moment
	add(time.Date(2024, 3, 10, 0, 0, 0, 0, shanghai), "gp", "gd2")             // the next day's first
	add(time.Date(2024, 2, 29, 12, 0, 0, 0, shanghai), "gq", "gq1")            // the leap day

	// Property values of gd1 every 2 hours from 2024-03-01 to 03-10,
	// fewer of gd2, one of gq1, and values outside the model.
	var ps []tsdb.PropertyValue
	num := func(tm time.Time, product, device, prop string, v float64) {
		ps = append(ps, tsdb.PropertyValue{Time: tm, ProductID: product, DeviceID: device, Property: prop, ValueType: "number", Num: v})
	}
	str := func(tm time.Time, device, prop, typ, v string) {
		ps = append(ps, tsdb.PropertyValue{Time: tm, ProductID: "gp", DeviceID: device, Property: prop, ValueType: typ, Str: v})
	}
	base := time.Date(2024, 3, 1, 0, 0, 0, 0, shanghai)
	labels := []string{"plain", "=1+2", "a,b", `say "hi"`, " padded ", "-3.5", "line\nbreak", "中文"}
	for i := 0; i < 9*12+7; i++ {
		tm := base.Add(time.Duration(i)*2*time.Hour + time.Duration(i%7)*time.Minute)
		num(tm, "gp", "gd1", "temp", 18+float64(i%13)*0.75-float64(i%5)*0.125)
		num(tm.Add(time.Second), "gp", "gd1", "count", float64(i*3))
		if i%4 == 0 {
			num(tm.Add(2*time.Second), "gp", "gd1", "big", float64(i)*1e20+0.5)
			ps = append(ps, tsdb.PropertyValue{Time: tm.Add(3 * time.Second), ProductID: "gp", DeviceID: "gd1", Property: "on", ValueType: "bool", Num: float64(i / 4 % 2)})
			str(tm.Add(4*time.Second), "gd1", "mode", "string", strconv.Itoa(1+i/4%3)) // 3: not in the enum
			str(tm.Add(5*time.Second), "gd1", "label", "string", labels[i/4%len(labels)])
		}
		if i%9 == 0 {
			num(tm.Add(time.Minute), "gp", "gd2", "temp", 30-float64(i)/10)
			str(tm.Add(6*time.Second), "gd1", "extra", "json", fmt.Sprintf(`{"k":%d,"s":"v<%d>"}`, i, i)) // undeclared
		}
	}
	str(base.Add(7*time.Hour), "gd1", "count", "string", "many") // wrong type
	num(base.Add(5*time.Hour), "gq", "gq1", "temp", 21.5)
	num(base.Add(5*time.Hour), "gw", "gw1", "w000", 1)
	if err := db.Insert(context.Background(), msgs, ps); err != nil {
		t.Fatal(err)
	}

	// Alarms of gp and gq from 2024-03-08.
	ctx := context.Background()
	epoch, err := as.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ id, product string }{{"ga", "gp"}, {"gb", "gp"}, {"gc", "gq"}} {
		rule := alarm.Rule{ID: r.id, Name: r.id, ProductID: r.product, Severity: alarm.SeverityMajor, Enabled: true,
			Trigger: alarm.Trigger{Type: alarm.TriggerNoData, For: alarm.Duration(time.Minute)}}
		if _, err := as.PutRule(ctx, rule, true, alarm.Actor{}); err != nil {
			t.Fatal(err)
		}
	}
	at := func(d, h int) time.Time { return time.Date(2024, 3, 8+d, h, 17, 0, 0, shanghai) }
	trs := []alarm.Transition{
		{Kind: "raised", RuleID: "ga", ProductID: "gp", DeviceID: "gd1", Severity: "major", At: at(0, 1)},
		{Kind: "cleared", RuleID: "ga", ProductID: "gp", DeviceID: "gd1", Severity: "major", At: at(0, 3)},
		{Kind: "raised", RuleID: "ga", ProductID: "gp", DeviceID: "gd1", Severity: "major", At: at(0, 9)},
		{Kind: "raised", RuleID: "gb", ProductID: "gp", DeviceID: "gd2", Severity: "critical", At: at(1, 2)},
		{Kind: "raised", RuleID: "ga", ProductID: "gp", DeviceID: "gd2", Severity: "minor", At: at(1, 14)},
		{Kind: "raised", RuleID: "gc", ProductID: "gq", DeviceID: "gq1", Severity: "warning", At: at(2, 0)},
	}
	for _, tr := range trs {
		if _, err := as.Write(ctx, epoch, []alarm.Transition{tr}, nil); err != nil {
			t.Fatal(err)
		}
	}
	return e, lim
}

// goldenCases are the requests of the golden set.
func goldenCases() []goldenCase {
	var cs []goldenCase
	ms := func(y int, m time.Month, d, h int) int64 { return time.Date(y, m, d, h, 0, 0, 0, shanghai).UnixMilli() }
	js := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		return string(b)
	}
	query := func(object, measurement, dimension, group string, params any) map[string]any {
		q := map[string]any{"dashboard": "device", "object": object, "measurement": measurement, "dimension": dimension, "group": group}
		if params != nil {
			q["params"] = params
		}
		return q
	}
	multi := func(name, as string, qs ...map[string]any) {
		cs = append(cs, goldenCase{name: name, path: "_multi", as: as, body: js(qs)})
	}
	raw := func(name, body string) {
		cs = append(cs, goldenCase{name: name, path: "_multi", as: "admin", body: body})
	}
	counts := func(name string, params any) {
		multi(name, "admin", query("message", "quantity", "agg", "msgs", params))
	}
	type p = map[string]any

	// Message counts: every interval, over every product and one each.
	ranges := []struct {
		interval string
		from, to int64
	}{
		{"1m", ms(2024, 3, 5, 10), ms(2024, 3, 5, 10) + 30*60_000},
		{"5m", ms(2024, 3, 5, 8), ms(2024, 3, 5, 12)},
		{"15m", ms(2024, 3, 5, 0), ms(2024, 3, 6, 0)},
		{"1h", ms(2024, 3, 4, 0), ms(2024, 3, 6, 0)},
		{"1d", ms(2024, 2, 1, 0), ms(2024, 3, 10, 0)},
		{"1w", ms(2024, 1, 1, 0), ms(2024, 3, 10, 0)},
		{"1M", ms(2023, 1, 1, 0), ms(2024, 3, 10, 0)},
		{"1y", ms(2020, 1, 1, 0), ms(2024, 3, 10, 0)},
	}
	for _, r := range ranges {
		for _, product := range []string{"", "gp", "gq"} {
			params := p{"time": r.interval, "from": r.from, "to": r.to, "format": "yyyy-MM-dd HH:mm"}
			if product != "" {
				params["productId"] = product
			}
			counts("counts-"+r.interval+"-"+product, params)
		}
		counts("counts-"+r.interval+"-limit5", p{"time": r.interval, "limit": 5, "to": r.to})
		counts("counts-"+r.interval+"-now", p{"time": r.interval, "limit": 3})
	}
	for i, f := range []string{"yyyy-MM-dd", "MM月dd日", "yyyy/MM/dd HH:mm:ss.SSS", "EEE, d MMM yyyy", "EEEE MMMM yy", "hh:mm a",
		"z zzzz Z X XX XXX x xx xxx VV", "'Day' d 'of' M, ''yy", "H:m:s", "y-M-d", "'quoted'''"} {
		counts(fmt.Sprintf("counts-format-%d", i), p{"time": "1d", "limit": 4, "format": f, "to": ms(2024, 3, 1, 0)})
	}
	for i, r := range []p{
		nil, {}, {"limit": 1}, {"limit": 10000, "time": "1M"}, {"to": ms(2024, 2, 29, 12)},
		{"from": ms(2024, 3, 10, 0), "to": ms(2024, 2, 25, 0)}, // swapped
		{"from": ms(2024, 2, 25, 0)}, {"from": "now-7d/d", "to": "now"}, {"from": "now-1M/M"}, {"to": "now/d", "limit": 2},
		{"from": "now-2h", "time": "15m"}, {"time": "1h", "from": "now-1d/d", "to": "now-1d/d+1d"},
		{"from": strconv.FormatInt(ms(2024, 3, 1, 0), 10), "to": strconv.FormatInt(ms(2024, 3, 3, 0), 10)},
		{"from": " now-3d ", "limit": 10}, {"from": 1.709e12, "to": ms(2024, 3, 3, 0)},
		{"from": ms(2024, 3, 1, 0), "to": ms(2024, 3, 3, 0), "limit": 2}, {"from": nil, "to": nil, "time": nil, "limit": nil},
		{"time": "1d", "productId": ""},
	} {
		counts(fmt.Sprintf("counts-params-%d", i), r)
	}
	// Message counts refused.
	for i, r := range []p{
		{"time": "2d"}, {"time": ""}, {"time": 5}, {"limit": 0}, {"limit": 10001}, {"limit": "5"}, {"limit": 1.5}, {"limit": -1},
		{"format": "'open"}, {"format": "Q"}, {"format": strings.Repeat("y", 65)}, {"format": "VVV"}, {"format": "XXXX"},
		{"from": "yesterday"}, {"from": p{}}, {"to": true}, {"to": "now-"}, {"from": "now+1x"}, {"to": ms(3000, 1, 1, 0)},
		{"from": ms(1900, 1, 1, 0)}, {"productId": "nosuch"}, {"tz": "UTC"}, {"productID": "gp"}, {"productId": 5},
		{"time": "1m", "from": ms(2024, 1, 1, 0), "to": ms(2024, 3, 1, 0), "limit": 2}, {"deviceId": "gd1"},
	} {
		counts(fmt.Sprintf("counts-bad-%d", i), r)
	}

	// Property aggregates: every aggregate, by device and product-wide.
	aggs := []string{"avg", "min", "max", "sum", "count", "first", "last"}
	for _, agg := range aggs {
		for _, interval := range []string{"1h", "1d"} {
			for _, dev := range []string{"gd1", ""} {
				params := p{"agg": agg, "time": interval, "properties": []string{"temp", "count"}, "from": ms(2024, 3, 2, 0), "to": ms(2024, 3, 3, 6)}
				if interval == "1d" {
					params["from"], params["format"] = ms(2024, 2, 27, 0), "MM-dd"
				}
				if dev != "" {
					params["deviceId"] = dev
				}
				multi("agg-"+agg+"-"+interval+"-"+dev, "admin", query("gp", "properties", "agg", "props", params))
			}
		}
	}
	for i, params := range []p{
		{"agg": "avg", "properties": []string{"temp", "temp"}, "time": "1d", "limit": 3, "to": ms(2024, 3, 5, 0)},
		{"agg": "max", "properties": []string{"big"}, "time": "1d", "limit": 12, "to": ms(2024, 3, 10, 0)},
		{"agg": "sum", "properties": []string{"big"}, "time": "1M", "limit": 2, "to": ms(2024, 3, 10, 0)},
		{"agg": "count", "properties": []string{"count", "temp"}, "time": "15m", "from": ms(2024, 3, 2, 0), "to": ms(2024, 3, 2, 3)},
		{"agg": "last", "properties": []string{"temp"}, "time": "1w", "from": ms(2024, 2, 1, 0), "to": ms(2024, 3, 10, 0)},
		{"agg": "first", "properties": []string{"temp"}, "time": "1y", "limit": 2},
		{"agg": "avg", "properties": []string{"temp"}, "deviceId": "gd2", "time": "1d", "from": "now-10d", "to": "now"},
		{"agg": "min", "properties": []string{"temp"}, "time": "5m", "from": ms(2024, 3, 1, 0), "to": ms(2024, 3, 1, 1)},
		{"agg": "avg", "properties": []string{"temp"}, "time": "1m", "from": ms(2024, 3, 1, 0), "to": ms(2024, 3, 1, 0) + 10*60_000},
	} {
		multi(fmt.Sprintf("agg-more-%d", i), "admin", query("gp", "properties", "agg", "props", params))
	}
	multi("agg-gq", "admin", query("gq", "properties", "agg", "q", p{"agg": "avg", "properties": []string{"temp"}, "deviceId": "gq1", "limit": 12, "time": "1d", "to": ms(2024, 3, 2, 0)}))
	// Property aggregates refused.
	for i, params := range []p{
		{"properties": []string{"temp"}}, {"agg": "median", "properties": []string{"temp"}}, {"agg": "avg"}, {"agg": "avg", "properties": []string{}},
		{"agg": "avg", "properties": []string{"mode"}}, {"agg": "avg", "properties": []string{"label"}}, {"agg": "avg", "properties": []string{"temp", "nosuch"}},
		{"agg": "avg", "properties": []string{""}}, {"agg": "avg", "properties": []string{strings.Repeat("p", 257)}},
		{"agg": "avg", "properties": goldenIDs(101)}, {"agg": "avg", "properties": "temp"}, {"agg": 1, "properties": []string{"temp"}},
		{"agg": "avg", "properties": []string{"temp"}, "deviceId": "gq1"}, {"agg": "avg", "properties": []string{"temp"}, "deviceId": "nosuch"},
		{"agg": "avg", "properties": []string{"temp"}, "time": "3h"}, {"agg": "avg", "properties": []string{"temp"}, "productId": "gp"},
		{"agg": "avg", "properties": []string{"temp"}, "limit": 0},
	} {
		multi(fmt.Sprintf("agg-bad-%d", i), "admin", query("gp", "properties", "agg", "props", params))
	}
	multi("agg-bad-product", "admin", query("nosuch", "properties", "agg", "props", p{"agg": "avg", "properties": []string{"temp"}}))

	// History: latest values, and ranges.
	for i, params := range []p{
		{"deviceId": "gd1"}, {"deviceId": "gd1", "history": 3}, {"deviceId": "gd1", "history": 1000, "properties": []string{"mode"}},
		{"deviceId": "gd1", "properties": []string{"temp", "label"}, "history": 5}, {"deviceId": "gd1", "properties": []string{"extra", "on"}, "history": 2},
		{"deviceId": "gd1", "properties": []string{"count"}, "history": 60}, {"deviceId": "gd2", "history": 2}, {"deviceId": "gd1", "properties": []string{"nosuch"}},
		{"deviceId": "gd1", "from": ms(2024, 3, 2, 0), "to": ms(2024, 3, 2, 8)}, {"deviceId": "gd1", "from": ms(2024, 3, 2, 0), "to": ms(2024, 3, 3, 0), "properties": []string{"temp"}, "history": 4},
		{"deviceId": "gd1", "from": ms(2024, 3, 9, 0)}, {"deviceId": "gd1", "to": ms(2024, 3, 1, 6)}, {"deviceId": "gd1", "from": "now-1d", "properties": []string{"temp"}},
		{"deviceId": "gd1", "from": ms(2024, 3, 2, 0), "to": ms(2024, 3, 2, 0)}, {"deviceId": "gd1", "properties": []string{"temp", "temp"}, "history": 2},
	} {
		multi(fmt.Sprintf("history-%d", i), "admin", query("gp", "properties", "history", "hist", params))
	}
	multi("history-gq", "admin", query("gq", "properties", "history", "h", p{"deviceId": "gq1"}))
	multi("history-wide-named", "admin", query("gw", "properties", "history", "h", p{"deviceId": "gw1", "properties": []string{"w000", "w100"}}))
	// History refused.
	for i, params := range []p{
		{}, {"deviceId": ""}, {"deviceId": "gd1", "history": 0}, {"deviceId": "gd1", "history": 1001}, {"deviceId": "gd1", "history": "3"},
		{"deviceId": "gd1", "properties": goldenIDs(101)}, {"deviceId": "gd1", "properties": []string{""}}, {"deviceId": "gq1"}, {"deviceId": "nosuch"},
		{"deviceId": "gd1", "from": ms(2024, 3, 3, 0), "to": ms(2024, 3, 2, 0)}, {"deviceId": "gd1", "from": "never"}, {"deviceId": "gd1", "agg": "avg"},
		{"deviceId": 7}, {"deviceId": "gd1", "properties": "temp"}, {"deviceId": "gd1", "limit": 3},
	} {
		multi(fmt.Sprintf("history-bad-%d", i), "admin", query("gp", "properties", "history", "hist", params))
	}
	multi("history-bad-wide-all", "admin", query("gw", "properties", "history", "h", p{"deviceId": "gw1"}))

	// Alarm counts.
	for i, params := range []p{
		{"time": "1h", "from": ms(2024, 3, 8, 0), "to": ms(2024, 3, 8, 12), "format": "HH"},
		{"time": "1d", "limit": 5, "to": ms(2024, 3, 11, 0)}, {"time": "1d", "limit": 5, "to": ms(2024, 3, 11, 0), "productId": "gp"},
		{"time": "1d", "limit": 5, "to": ms(2024, 3, 11, 0), "deviceId": "gd2"}, {"time": "1d", "limit": 5, "to": ms(2024, 3, 11, 0), "severity": "critical"},
		{"time": "1d", "limit": 5, "to": ms(2024, 3, 11, 0), "state": "active"}, {"time": "1d", "limit": 5, "to": ms(2024, 3, 11, 0), "state": "cleared"},
		{"limit": 3}, nil, {"time": "1w", "from": "now-30d"},
	} {
		multi(fmt.Sprintf("alarms-%d", i), "admin", query("alarm", "quantity", "agg", "alarms", params))
	}
	for i, params := range []p{
		{"severity": "bad"}, {"state": "open"}, {"deviceId": "nosuch"}, {"productId": "nosuch"}, {"time": "2h"}, {"rule": "ga"}, {"limit": 0},
	} {
		multi(fmt.Sprintf("alarms-bad-%d", i), "admin", query("alarm", "quantity", "agg", "alarms", params))
	}

	// Several queries in one request, in request order.
	multi("multi-mixed", "admin",
		query("message", "quantity", "agg", "a", p{"time": "1d", "limit": 3, "to": ms(2024, 3, 3, 0)}),
		query("gp", "properties", "history", "b", p{"deviceId": "gd1", "properties": []string{"temp"}, "history": 2}),
		query("gp", "properties", "agg", "c", p{"agg": "max", "properties": []string{"count"}, "time": "1d", "limit": 2, "to": ms(2024, 3, 3, 0)}),
		query("alarm", "quantity", "agg", "d", p{"time": "1d", "limit": 2, "to": ms(2024, 3, 10, 0)}))
	multi("multi-empty-between", "admin",
		query("gp", "properties", "history", "a", p{"deviceId": "gd1", "properties": []string{"nosuch"}}),
		query("message", "quantity", "agg", "b", p{"time": "1h", "limit": 2, "to": ms(2024, 3, 3, 0)}))
	multi("multi-second-bad", "admin",
		query("message", "quantity", "agg", "a", p{"time": "1d"}), query("message", "quantity", "agg", "b", p{"time": "bad"}))
	var many []map[string]any
	for i := range 32 {
		many = append(many, query("message", "quantity", "agg", fmt.Sprint(i), p{"time": "1d", "limit": 1, "to": ms(2024, 3, 1+i%9, 0)}))
	}
	multi("multi-32", "admin", many...)
	multi("multi-33", "admin", append(many, query("message", "quantity", "agg", "x", nil))...)
	var buckets []map[string]any
	for range 5 {
		buckets = append(buckets, query("message", "quantity", "agg", "b", p{"time": "1h", "limit": 10000}))
	}
	multi("limit-buckets", "admin", append(buckets, query("message", "quantity", "agg", "b", p{"time": "1h", "limit": 1}))...)
	var values []map[string]any
	for range 2 {
		values = append(values, query("gw", "properties", "history", "h", p{"deviceId": "gw1", "properties": goldenIDs(100), "history": 1000}))
	}
	multi("limit-history-values", "admin", values...)
	multi("limit-agg-buckets", "admin", query("gp", "properties", "agg", "p", p{"agg": "avg", "properties": goldenIDs(6), "time": "1h", "limit": 10000}))

	// Scope: a user whose role reaches gp only.
	multi("scope-counts", "lim", query("message", "quantity", "agg", "m", p{"time": "1d", "limit": 5, "to": ms(2024, 3, 10, 0)}))
	multi("scope-counts-gp", "lim", query("message", "quantity", "agg", "m", p{"time": "1d", "limit": 5, "to": ms(2024, 3, 10, 0), "productId": "gp"}))
	multi("scope-counts-gq", "lim", query("message", "quantity", "agg", "m", p{"productId": "gq"}))
	multi("scope-history", "lim", query("gp", "properties", "history", "h", p{"deviceId": "gd1", "history": 2, "properties": []string{"temp"}}))
	multi("scope-history-gq", "lim", query("gq", "properties", "history", "h", p{"deviceId": "gq1"}))
	multi("scope-agg-gq", "lim", query("gq", "properties", "agg", "h", p{"agg": "avg", "properties": []string{"temp"}}))
	multi("scope-agg-gq-device", "lim", query("gq", "properties", "agg", "h", p{"agg": "avg", "properties": []string{"temp"}, "deviceId": "gq1"}))
	multi("scope-alarms", "lim", query("alarm", "quantity", "agg", "a", p{"time": "1d", "limit": 4, "to": ms(2024, 3, 11, 0)}))
	multi("scope-alarms-gq", "lim", query("alarm", "quantity", "agg", "a", p{"productId": "gq"}))
	multi("scope-alarms-gq1", "lim", query("alarm", "quantity", "agg", "a", p{"deviceId": "gq1"}))

	// Bodies and the fields that name a query.
	for i, body := range []string{
		``, `{}`, `[]`, `null`, `not json`, `[{]`, `[1]`, `["x"]`, `[{"dashboard":"device"}]`,
		`[{"dashboard":"user","object":"message","measurement":"quantity","dimension":"agg"}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"history"}]`,
		`[{"dashboard":"device","object":"message","measurement":"bytes","dimension":"agg"}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity"}]`,
		`[{"dashboard":"device","object":"","measurement":"properties","dimension":"agg"}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":5}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":[]}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":"x"}]`,
		`[{"Dashboard":"device","OBJECT":"message","measurement":"quantity","dimension":"agg","params":{"Time":"1d","LIMIT":2,"to":1709251200000}}]`,
		`[{"dashboard":"d\u0065vice","object":"message","measurement":"quantity","dimension":"agg","group":"\u00e9\"<&>","params":{"limit":2,"to":1709251200000}}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","group":"g","extra":1,"params":{"limit":2,"to":1709251200000}}]`,
		` [ { "dashboard" : "device" , "object" : "message" , "measurement" : "quantity" , "dimension" : "agg" , "params" : { "limit" : 2 , "to" : 1709251200000 } } ] `,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"limit":2,"to":1709251200000,"limit":3}}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"limit":2e0,"to":1709251200000}}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"limit":2,"to":"1709251200000"}}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"limit":2,"to":-1}}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"limit":2,"to":1709251200000.5}}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"limit":2,"to":99999999999999999999}}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"lim\u0069t":2,"to":1709251200000}}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"time":"1\u0064","limit":2,"to":1709251200000}}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":null},{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"limit":1}}]`,
		`[{"dashboard":"device","object":"gp","measurement":"properties","dimension":"agg","params":{"agg":"avg","properties":["te\u006dp"],"limit":2,"to":1709251200000}}]`,
		`[{"dashboard":"device","object":"gp","measurement":"properties","dimension":"agg","params":{"agg":"avg","properties":["temp",null],"limit":2}}]`,
		`[{"dashboard":"device","object":"gp","measurement":"properties","dimension":"history","params":{"deviceId":"gd1","properties":null}}]`,
		`[{"dashboard":"device","object":"gp","measurement":"properties","dimension":"history","params":{"deviceId":"gd1","history":null,"from":null}}]`,
		"[{\"dashboard\":\"device\",\"object\":\"message\",\"measurement\":\"quantity\",\"dimension\":\"agg\",\"group\":\"\xff\"}]",
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","group":"\u0000"}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg"}] trailing`,
	} {
		raw(fmt.Sprintf("body-%d", i), body)
	}

	// Exports.
	export := func(name, qs, accept string, q map[string]any) {
		cs = append(cs, goldenCase{name: name, path: "_export" + qs, as: "admin", accept: accept, body: js(q)})
	}
	countQ := query("message", "quantity", "agg", "m", p{"time": "1d", "limit": 10, "to": ms(2024, 3, 10, 0), "format": "MM/dd"})
	aggQ := query("gp", "properties", "agg", "a", p{"agg": "avg", "properties": []string{"temp", "count"}, "time": "1d", "from": ms(2024, 3, 1, 0), "to": ms(2024, 3, 4, 0)})
	histQ := query("gp", "properties", "history", "h", p{"deviceId": "gd1", "from": ms(2024, 3, 1, 0), "to": ms(2024, 3, 3, 0)})
	for _, f := range []string{"csv", "ndjson"} {
		for _, fv := range []string{"", "&formatValue=true"} {
			suffix := ""
			if fv != "" {
				suffix = "-formatValue"
			}
			export("export-counts-"+f+suffix, "?format="+f+fv, "", countQ)
			export("export-agg-"+f+suffix, "?format="+f+fv, "", aggQ)
			export("export-history-"+f+suffix, "?format="+f+fv, "", histQ)
		}
	}
	export("export-history-all", "?format=ndjson&formatValue=1", "", query("gp", "properties", "history", "h", p{"deviceId": "gd1"}))
	export("export-history-newest", "?format=csv", "", query("gp", "properties", "history", "h", p{"deviceId": "gd1", "history": 2}))
	export("export-history-named", "?format=csv&formatValue=true", "", query("gp", "properties", "history", "h", p{"deviceId": "gd1", "properties": []string{"label", "mode", "extra"}}))
	export("export-agg-count", "?formatValue=true", "", query("gp", "properties", "agg", "a", p{"agg": "count", "properties": []string{"temp"}, "time": "1d", "limit": 3, "to": ms(2024, 3, 4, 0)}))
	export("export-agg-big", "?format=jsonl", "", query("gp", "properties", "agg", "a", p{"agg": "sum", "properties": []string{"big"}, "time": "1d", "limit": 3, "to": ms(2024, 3, 4, 0)}))
	export("export-accept-ndjson", "", "text/html, application/x-ndjson;q=0.9", countQ)
	export("export-accept-csv", "", "text/csv", countQ)
	export("export-accept-none", "", "application/json", countQ)
	export("export-bad-format", "?format=xml", "", countQ)
	export("export-bad-formatValue", "?format=csv&formatValue=maybe", "", countQ)
	export("export-bad-alarms", "?format=csv", "", query("alarm", "quantity", "agg", "a", nil))
	export("export-bad-history", "?format=csv", "", query("gp", "properties", "history", "h", p{"deviceId": "gd1", "history": 0}))
	export("export-bad-device", "?format=csv", "", query("gp", "properties", "history", "h", p{"deviceId": "nosuch"}))
	export("export-bad-agg", "?format=csv", "", query("gp", "properties", "agg", "a", p{"agg": "avg", "properties": []string{"mode"}}))
	export("export-bad-query", "?format=csv", "", query("message", "bytes", "agg", "a", nil))
	cs = append(cs, goldenCase{name: "export-bad-array", path: "_export?format=csv", as: "admin", body: js([]any{countQ})})
	return cs
}

// goldenIDs are n property ids w000, w001, ...
func goldenIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("w%03d", i)
	}
	return ids
}

// envelopeTime is the envelope's own timestamp, the time of the answer.
var envelopeTime = regexp.MustCompile(`,"timestamp":[0-9]+\}\s*$`)

// goldenFile is a case as stored: the request, then the answer.
func goldenFile(c goldenCase, status int, h http.Header, body []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "POST /api/dashboard/%s\nas: %s\naccept: %s\nbody-bytes: %d\n", c.path, c.as, c.accept, len(c.body))
	b.WriteString(c.body)
	fmt.Fprintf(&b, "\n--- response\nstatus: %d\n", status)
	for _, k := range []string{"Content-Type", "Content-Disposition", "Retry-After"} {
		fmt.Fprintf(&b, "%s: %s\n", k, h.Get(k))
	}
	fmt.Fprintf(&b, "body-bytes: %d\n", len(body))
	b.Write(envelopeTime.ReplaceAll(body, []byte(`,"timestamp":0}`)))
	return b.Bytes()
}

// parseGolden reads a stored case's request.
func parseGolden(t *testing.T, name string, data []byte) goldenCase {
	t.Helper()
	c := goldenCase{name: name}
	var n int
	head := 0
	for k := 0; k < 4; k++ {
		end := bytes.IndexByte(data[head:], '\n')
		if end < 0 {
			t.Fatalf("%s: malformed", name)
		}
		line := string(data[head : head+end])
		head += end + 1
		switch {
		case k == 0:
			c.path = strings.TrimPrefix(line, "POST /api/dashboard/")
		case strings.HasPrefix(line, "as: "):
			c.as = strings.TrimPrefix(line, "as: ")
		case strings.HasPrefix(line, "accept: "):
			c.accept = strings.TrimPrefix(line, "accept: ")
		case strings.HasPrefix(line, "body-bytes: "):
			n, _ = strconv.Atoi(strings.TrimPrefix(line, "body-bytes: "))
		}
	}
	c.body = string(data[head : head+n])
	return c
}

// TestDashboardGolden replays the golden set: each stored request must
// get the stored answer, byte for byte.
func TestDashboardGolden(t *testing.T) {
	t.Parallel()
	e, lim := goldenEnv(t)
	send := func(c goldenCase) (int, http.Header, []byte) {
		req, err := http.NewRequest("POST", e.base+"/api/dashboard/"+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		token := e.token
		if c.as == "lim" {
			token = lim
		}
		req.Header.Set("X-Access-Token", token)
		if c.accept != "" {
			req.Header.Set("Accept", c.accept)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		return res.StatusCode, res.Header, body
	}
	if *goldenUpdate {
		if err := os.RemoveAll(goldenDir); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(goldenDir, 0o755); err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for i, c := range goldenCases() {
			if seen[c.name] {
				t.Fatalf("case %s twice", c.name)
			}
			seen[c.name] = true
			status, h, body := send(c)
			file := filepath.Join(goldenDir, fmt.Sprintf("%03d-%s.golden", i, c.name))
			if err := os.WriteFile(file, goldenFile(c, status, h, body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	files, err := filepath.Glob(filepath.Join(goldenDir, "*.golden"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	if len(files) < 200 {
		t.Fatalf("%d golden cases, want at least 200 (run with -golden-update)", len(files))
	}
	for _, file := range files {
		want, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		c := parseGolden(t, filepath.Base(file), want)
		status, h, body := send(c)
		if got := goldenFile(c, status, h, body); !bytes.Equal(got, want) {
			t.Errorf("%s: answer differs:\n got: %s\nwant: %s", c.name, got, want)
		}
	}
}
