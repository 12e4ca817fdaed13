package api_test

import (
	"net/url"
	"testing"
)

// TestSQLInjection: injection attempts through ids, term columns, term
// values and sort names are refused or match nothing, and change nothing.
func TestSQLInjection(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("victim", "Victim", nil)
	e.ok("POST", "/api/device/instance", map[string]any{"id": "victim-1", "name": "V", "productId": "victim"}, nil)
	attacks := []string{
		`x' OR '1'='1`, `x'; DROP TABLE products; --`, `x" OR "1"="1`, `1; DELETE FROM devices`,
		`%' OR 1=1 --`, `') OR ('a'='a`, `x\'; TRUNCATE tokens; --`,
	}
	for _, a := range attacks {
		// Ids in paths: no such product or device.
		e.fails("GET", "/api/device-product/"+url.PathEscape(a), nil, 404, "not_found")
		e.fails("GET", "/api/device/instance/"+url.PathEscape(a)+"/detail", nil, 404, "not_found")
		e.fails("DELETE", "/api/device-product/"+url.PathEscape(a), nil, 404, "not_found")
		// Ids in bodies: refused as ids.
		e.fails("POST", "/api/device/product", map[string]any{"id": a, "name": "N", "classifiedId": "c", "modelFrom": "custom", "accessId": "a", "deviceType": "device"}, 400, "illegal_argument")
		// Columns and sorts: not in the whitelist.
		e.fails("POST", "/api/device-product/_query/", map[string]any{"terms": []map[string]any{{"column": a, "value": "x"}}}, 400, "illegal_argument")
		e.fails("POST", "/api/device-instance/_query/", map[string]any{"sorts": []map[string]any{{"name": a}}}, 400, "illegal_argument")
		e.fails("POST", "/api/role/_query/", map[string]any{"sorts": []map[string]any{{"name": "name", "order": a}}}, 400, "illegal_argument")
		// Values: bound parameters, so they match nothing.
		for _, tt := range []string{"eq", "like", "in", "not"} {
			var p productPage
			e.ok("POST", "/api/device-product/_query/", map[string]any{"terms": []map[string]any{{"column": "name", "value": a, "termType": tt}}}, &p)
			if (tt != "not" && p.Total != 0) || (tt == "not" && p.Total != 1) {
				t.Fatalf("value %q with %s matched %d products", a, tt, p.Total)
			}
		}
	}
	if n := e.countRows("products"); n != 1 {
		t.Fatalf("products: %d", n)
	}
	if n := e.countRows("devices"); n != 1 {
		t.Fatalf("devices: %d", n)
	}
	if n := e.countRows("tokens"); n != 1 {
		t.Fatalf("tokens: %d", n)
	}
}
