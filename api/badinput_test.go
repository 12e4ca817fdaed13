package api_test

import (
	"strings"
	"testing"
)

// TestBadInput: every malformed request answers 400 (or 404) with a code and
// a message naming the field, and writes nothing.
func TestBadInput(t *testing.T) {
	e := newEnv(t)
	e.createProduct("base", "Base", nil)
	long := strings.Repeat("x", 200)
	valid := `"name":"N","classifiedId":"c","modelFrom":"custom","accessId":"a","deviceType":"device"`
	patch := `"id":"base","name":"N","classifiedId":"c","accessId":"a","deviceType":{"value":"device"}`
	cases := []struct {
		method, path, body string
		status             int
		code, mention      string
	}{
		{"POST", "/api/device/product", `{"name":`, 400, "illegal_argument", "malformed JSON"},
		{"POST", "/api/device/product", `[1,2]`, 400, "illegal_argument", "body"},
		{"POST", "/api/device/product", ``, 400, "illegal_argument", "body"},
		{"POST", "/api/device/product", `{"name":5,"classifiedId":"c","modelFrom":"custom","accessId":"a","deviceType":"device"}`, 400, "illegal_argument", "name"},
		{"POST", "/api/device/product", `{"classifiedId":"c","modelFrom":"custom","accessId":"a","deviceType":"device"}`, 400, "illegal_argument", "name"},
		{"POST", "/api/device/product", `{"name":"N","modelFrom":"custom","accessId":"a","deviceType":"device"}`, 400, "illegal_argument", "classifiedId"},
		{"POST", "/api/device/product", `{"name":"N","classifiedId":"c","accessId":"a","deviceType":"device"}`, 400, "illegal_argument", "modelFrom"},
		{"POST", "/api/device/product", `{"name":"N","classifiedId":"c","modelFrom":"custom","deviceType":"device"}`, 400, "illegal_argument", "accessId"},
		{"POST", "/api/device/product", `{"name":"N","classifiedId":"c","modelFrom":"custom","accessId":"a"}`, 400, "illegal_argument", "deviceType"},
		{"POST", "/api/device/product", `{"name":"N","classifiedId":"c","modelFrom":"custom","accessId":"a","deviceType":"toaster"}`, 400, "illegal_argument", "deviceType"},
		{"POST", "/api/device/product", `{"name":"N","classifiedId":"c","modelFrom":"imported","accessId":"a","deviceType":"device"}`, 400, "illegal_argument", "modelFrom"},
		{"POST", "/api/device/product", `{"name":"N","classifiedId":"c","modelFrom":"custom","accessId":"a","deviceType":{"text":"x"}}`, 400, "illegal_argument", "value"},
		{"POST", "/api/device/product", `{"name":"` + long + `",` + valid[len(`"name":"N",`):] + `}`, 400, "illegal_argument", "name"},
		{"POST", "/api/device/product", `{"id":"a/b",` + valid + `}`, 400, "illegal_argument", "id"},
		{"POST", "/api/device/product", `{"id":"` + long + `",` + valid + `}`, 400, "illegal_argument", "id"},
		{"POST", "/api/device/product", `{"id":"base",` + valid + `}`, 400, "duplicate_key", "base"},
		{"POST", "/api/device/product", `{"superProductType":"fancy",` + valid + `}`, 400, "illegal_argument", "superProductType"},
		{"POST", "/api/device/product", "{\"name\":\"\xff\xfe\",\"classifiedId\":\"c\"}", 400, "illegal_argument", "UTF-8"},
		{"POST", "/api/device/product", `{"name":"N","classifiedId":"c","modelFrom":"custom","accessId":"a","deviceType":"device","regulator":"yes"}`, 400, "illegal_argument", "regulator"},
		{"PATCH", "/api/device-product", `{` + patch + `}`, 400, "illegal_argument", "metadata"},
		{"PATCH", "/api/device-product", `{"name":"N","classifiedId":"c","accessId":"a","deviceType":{"value":"device"},"metadata":"{}"}`, 400, "illegal_argument", "id"},
		{"PATCH", "/api/device-product", `{"id":"base","classifiedId":"c","accessId":"a","deviceType":{"value":"device"},"metadata":"{}"}`, 400, "illegal_argument", "name"},
		{"PATCH", "/api/device-product", `{"id":"base","name":"N","classifiedId":"c","accessId":"a","metadata":"{}"}`, 400, "illegal_argument", "deviceType"},
		{"PATCH", "/api/device-product", `{` + patch + `,"metadata":"not json"}`, 400, "illegal_argument", "thing model"},
		{"PATCH", "/api/device-product", `{` + patch + `,"metadata":"{\"properties\":{}}"}`, 400, "illegal_argument", "properties"},
		{"PATCH", "/api/device-product", `{` + patch + `,"metadata":"{\"properties\":[{\"id\":\"a\",\"name\":\"A\"}]}"}`, 400, "illegal_argument", "properties[0].valueType"},
		{"PATCH", "/api/device-product", `{` + patch + `,"metadata":"","modelFrom":"standard"}`, 400, "illegal_argument", "metadata"},
		{"PATCH", "/api/device-product", `{"id":"nope","name":"N","classifiedId":"c","accessId":"a","deviceType":{"value":"device"},"metadata":"{}"}`, 404, "not_found", "nope"},
		{"PATCH", "/api/device-product", `{` + patch + `,"metadata":5}`, 400, "illegal_argument", "metadata"},
		{"POST", "/api/device-product/_query/", `{"pageSize":100000}`, 400, "illegal_argument", "pageSize"},
		{"POST", "/api/device-product/_query/", `{"pageSize":-1}`, 400, "illegal_argument", "pageSize"},
		{"POST", "/api/device-product/_query/", `{"pageIndex":-3}`, 400, "illegal_argument", "pageIndex"},
		{"POST", "/api/device-product/_query/", `{"pageIndex":"x"}`, 400, "illegal_argument", "pageIndex"},
		{"POST", "/api/device-product/_query/", `{"terms":[{"column":"password","value":"x"}]}`, 400, "illegal_argument", "terms[0].column"},
		{"POST", "/api/device-product/_query/", `{"terms":[{"column":"name","value":"x","termType":"regex"}]}`, 400, "illegal_argument", "terms[0].termType"},
		{"POST", "/api/device-product/_query/", `{"terms":[{"column":"name","value":"x","type":"xor"}]}`, 400, "illegal_argument", "terms[0].type"},
		{"POST", "/api/device-product/_query/", `{"terms":[{"terms":[{"column":"nope","value":"x"}]}]}`, 400, "illegal_argument", "terms[0].terms[0].column"},
		{"POST", "/api/device-product/_query/", `{"sorts":[{"name":"secureKey","order":"asc"}]}`, 400, "illegal_argument", "sorts[0].name"},
		{"POST", "/api/device-product/_query/", `{"sorts":[{"name":"name","order":"sideways"}]}`, 400, "illegal_argument", "sorts[0].order"},
		{"POST", "/api/device-product/_query/", `{"terms":[{"column":"name; DROP TABLE products; --","value":"x"}]}`, 400, "illegal_argument", "column"},
		{"POST", "/api/device-product/_query/", `{"sorts":[{"name":"name desc; DELETE FROM products"}]}`, 400, "illegal_argument", "sorts[0].name"},
		{"POST", "/api/device-product/_query/", `{"terms":[{"column":"state","value":"one"}]}`, 400, "illegal_argument", "terms[0]"},
		{"POST", "/api/device-product/_query/", `{"terms":[{"column":"createTime","value":"yesterday","termType":"gt"}]}`, 400, "illegal_argument", "terms[0]"},
		{"POST", "/api/device-product/_query/", `{"terms":"name"}`, 400, "illegal_argument", "terms"},
		{"POST", "/api/device-product/_count", `{"terms":[{"column":"bogus","value":"1"}]}`, 400, "illegal_argument", "terms[0].column"},
		{"POST", "/api/role/_query/", `{"sorts":[{"name":"creatorId"}]}`, 400, "illegal_argument", "sorts[0].name"},
		{"GET", "/api/device-product/nope", ``, 404, "not_found", "nope"},
		{"DELETE", "/api/device-product/nope", ``, 404, "not_found", "nope"},
		{"GET", "/api/no/such/route", ``, 404, "not_found", "/api/no/such/route"},
		{"POST", "/api/device/product", `{"name":"` + strings.Repeat("y", 2<<20) + `"}`, 400, "illegal_argument", "too large"},
	}
	before := e.countRows("products")
	var baseBefore map[string]any
	e.ok("GET", "/api/device-product/base", nil, &baseBefore)
	for i, c := range cases {
		var r response
		if len(c.body) > 1<<20 {
			r = e.doOversized(c.method, c.path, len(c.body))
		} else {
			r = e.do(c.method, c.path, c.body, e.token)
		}
		if r.HTTPStatus != c.status || r.Code != c.code {
			t.Errorf("case %d %s %s %.80s: want %d %s, got %d %s", i, c.method, c.path, c.body, c.status, c.code, r.HTTPStatus, r.raw)
			continue
		}
		if !strings.Contains(r.Message, c.mention) {
			t.Errorf("case %d %s %s %.80s: message %q does not mention %q", i, c.method, c.path, c.body, r.Message, c.mention)
		}
	}
	if after := e.countRows("products"); after != before {
		t.Fatalf("bad input changed the product count: %d -> %d", before, after)
	}
	var baseAfter map[string]any
	e.ok("GET", "/api/device-product/base", nil, &baseAfter)
	if baseAfter["modifyTime"] != baseBefore["modifyTime"] || baseAfter["name"] != baseBefore["name"] {
		t.Fatalf("bad input changed product base: %v -> %v", baseBefore, baseAfter)
	}
	t.Logf("%d bad-input cases", len(cases))
}
