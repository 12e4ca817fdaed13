package api_test

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"devicehub/tsdb"
)

// Tests of the data-path rows of "Hardening, round three" (issue 41):
// each fails without its fix.

// TestHardening3ExportFormulaGuard: a CSV export writes after a ' the
// texts a spreadsheet takes for formulas beyond OWASP's leading = + - @:
// those after leading spaces (ASCII, no-break) and the fullwidth forms.
func TestHardening3ExportFormulaGuard(t *testing.T) {
	e, db := dashEnv(t)
	t0 := time.Now().Truncate(time.Second).Add(-time.Hour)
	attacks := []string{" =1+1", "  @SUM(1)", "\u00a0=HYPERLINK(\"http://evil.example\")", "＝1+1", "＋1+1", "－1+1", "＠SUM(1)", "\u3000＝1"}
	plain := []string{" plain", "-3.5", "a＝b"}
	var props []tsdb.PropertyValue
	for i, v := range append(append([]string(nil), attacks...), plain...) {
		props = append(props, tsdb.PropertyValue{Time: t0.Add(time.Duration(i) * time.Second), ProductID: "dp", DeviceID: "dd",
			Property: "mode", ValueType: "string", Str: v})
	}
	if err := db.Insert(context.Background(), nil, props); err != nil {
		t.Fatal(err)
	}
	got, _ := e.exportText("?format=csv", "", map[string]any{"dashboard": "device", "object": "dp", "measurement": "properties",
		"dimension": "history", "params": map[string]any{"deviceId": "dd", "properties": []string{"mode"}, "history": 100}})
	records, err := csv.NewReader(strings.NewReader(got)).ReadAll()
	if err != nil {
		t.Fatalf("%v:\n%s", err, got)
	}
	cells := map[string]string{} // value as sent -> cell
	for _, r := range records[1:] {
		cells[strings.TrimPrefix(r[5], "'")] = r[5]
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
}

// TestHardening3ImportBOM: a file saved with a UTF-8 byte order mark (as
// Windows editors and Excel save them) imports through the console's
// multipart upload, JSON and CSV alike.
func TestHardening3ImportBOM(t *testing.T) {
	e, _ := newBulkEnv(t)
	e.createProduct("meter", "Meter", nil)
	for _, f := range []struct{ name, content, id string }{
		{"fleet.json", "\ufeff[{\"id\":\"bom-j1\",\"name\":\"J 1\"}]", "bom-j1"},
		{"fleet2.json", "\ufeff \r\n[{\"id\":\"bom-j2\",\"name\":\"J 2\"}]", "bom-j2"},
		{"fleet.csv", "\ufeffid,name\r\nbom-c1,C 1\r\n", "bom-c1"},
	} {
		var res bulkCreated
		r := e.upload("/api/device/instance/meter/import", f.name, []byte(f.content), nil)
		if r.HTTPStatus != 200 || json.Unmarshal(r.Result, &res) != nil || res.Total != 1 || len(res.Devices) != 1 || res.Devices[0].ID != f.id {
			t.Fatalf("%s with a BOM: %d %s", f.name, r.HTTPStatus, r.raw)
		}
	}
}

// bigModel is a valid thing model of n properties, each with a
// description of 1,000 characters: about n KiB.
func bigModel(n int) string {
	var b strings.Builder
	b.WriteString(`{"properties":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":"p%d","name":"P %d","description":"%s","valueType":{"type":"int"}}`, i, i, strings.Repeat("x", 1000))
	}
	b.WriteString(`]}`)
	return b.String()
}

// TestHardening3MetadataBounds: a thing model written through the API,
// a device's (endpoint 9) or a product's (endpoint 4), has only the four
// arrays at its top (an unknown key is refused, named) and at most
// 256 KiB as stored; endpoint 7's rows carry no device's own model unless
// asked for (?deviceMetadata=true), so that a list of devices with large
// models answers small.
func TestHardening3MetadataBounds(t *testing.T) {
	e := newEnv(t)
	p := e.createProduct("p", "P", nil)
	for i := range 20 {
		e.createDevice(fmt.Sprintf("d%02d", i), "D", "p", nil)
	}
	// Unknown top-level keys, named; keys elsewhere are the document's own
	// (valueType may carry more fields, the spec says).
	for _, c := range []struct{ body, key string }{
		{`{"properties":[],"junk":"x"}`, "junk"},
		{`{"blob":"` + strings.Repeat("y", 800_000) + `"}`, "blob"},
		{`{"properties":[],"events":[],"functions":[],"tags":[],"zzz":1,"aaa":2}`, "aaa"},
	} {
		r := e.fails("PUT", "/api/device/instance/d00/metadata", c.body, 400, "illegal_argument")
		if !strings.Contains(r.Message, c.key+": ") || !strings.Contains(r.Message, "unknown") {
			t.Errorf("%.40s: message %q does not name %s as unknown", c.body, r.Message, c.key)
		}
		p["metadata"] = c.body
		r = e.fails("PATCH", "/api/device-product", p, 400, "illegal_argument")
		if !strings.Contains(r.Message, c.key+": ") {
			t.Errorf("product %.40s: message %q does not name %s", c.body, r.Message, c.key)
		}
	}
	e.ok("PUT", "/api/device/instance/d00/metadata", `{"properties":[{"id":"a","name":"A","valueType":{"type":"int","extra":1},"more":2}]}`, nil)
	// Size: 300 KiB refused, 200 KiB taken.
	over, under := bigModel(300), bigModel(200)
	r := e.fails("PUT", "/api/device/instance/d00/metadata", over, 400, "illegal_argument")
	if !strings.Contains(r.Message, "262144") {
		t.Errorf("oversized model: message %q does not say the limit", r.Message)
	}
	p["metadata"] = over
	if r := e.fails("PATCH", "/api/device-product", p, 400, "illegal_argument"); !strings.Contains(r.Message, "262144") {
		t.Errorf("oversized product model: message %q does not say the limit", r.Message)
	}
	for i := range 20 {
		e.ok("PUT", fmt.Sprintf("/api/device/instance/d%02d/metadata", i), under, nil)
	}
	// The list: small by default, the models when asked for.
	body := map[string]any{"pageSize": 50}
	plain := e.call("POST", "/api/device-instance/_query/", body)
	if plain.HTTPStatus != 200 || len(plain.raw) > 32<<10 {
		t.Fatalf("a list of 20 devices with 200 KiB models answers %d bytes (%d)", len(plain.raw), plain.HTTPStatus)
	}
	var page devicePage
	if err := json.Unmarshal(plain.Result, &page); err != nil || len(page.Data) != 20 {
		t.Fatalf("list: %v %d", err, len(page.Data))
	}
	for _, d := range page.Data {
		if _, ok := d["deviceMetadata"]; ok {
			t.Fatalf("device %v has deviceMetadata without asking", d["id"])
		}
	}
	full := e.call("POST", "/api/device-instance/_query/?deviceMetadata=true", body)
	if err := json.Unmarshal(full.Result, &page); err != nil || full.HTTPStatus != 200 || len(page.Data) != 20 {
		t.Fatalf("list with models: %d %v", full.HTTPStatus, err)
	}
	for _, d := range page.Data {
		m, _ := d["deviceMetadata"].(string)
		if !strings.Contains(m, `"p199"`) {
			t.Fatalf("device %v: deviceMetadata %.80q, want its model", d["id"], m)
		}
	}
	if r := e.call("POST", "/api/device-instance/_query/?deviceMetadata=maybe", body); r.HTTPStatus != 400 || !strings.Contains(r.Message, "deviceMetadata") {
		t.Fatalf("?deviceMetadata=maybe: %d %s", r.HTTPStatus, r.raw)
	}
}
