package api_test

import (
	"context"
	"encoding/csv"
	"encoding/json"
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
