package api_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"devicehub/api"
	"devicehub/meta"
)

// TestBadInput: every malformed request answers 400 (or 404) with a code and
// a message naming the field, and writes nothing.
func TestBadInput(t *testing.T) {
	t.Parallel()
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

// send is do with the admin token and the given Content-Type ("" sends
// none).
func (e *env) send(method, path, contentType, body string) response {
	e.t.Helper()
	req, err := http.NewRequest(method, e.base+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("X-Access-Token", e.token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	return e.envelope(method, path, res)
}

// TestBadInputHygiene: a NUL character or bytes that are not UTF-8 in any
// string of any JSON body are refused with 400 illegal_argument naming the
// field, on every endpoint that reads a body, and nothing is written.
func TestBadInputHygiene(t *testing.T) {
	t.Parallel()
	// Models resolves the device of commands; Commands and Dashboard stay
	// nil: a refused body must never reach them.
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) { deps.Models = store })
	e.createProduct("base", "Base", nil)
	e.ok("POST", "/api/device/instance", map[string]any{"id": "dev-1", "name": "Dev 1", "productId": "base"}, nil)
	const nul, bad = `\u0000`, "\xff\xfe"
	product := func(name string) string {
		return `{"name":"` + name + `","classifiedId":"c","modelFrom":"custom","accessId":"a","deviceType":"device"}`
	}
	patch := func(name string) string {
		return `{"id":"base","name":"` + name + `","classifiedId":"c","accessId":"a","deviceType":{"value":"device"},"metadata":"{}"}`
	}
	term := func(v string) string { return `{"terms":[{"column":"name","value":"` + v + `"}]}` }
	nested := func(v string) string {
		return `{"terms":[{"terms":[{"column":"id","value":"x"},{"column":"name","value":["a","` + v + `"],"termType":"in"}]}]}`
	}
	model := func(name string) string {
		return `{"properties":[{"id":"hum","name":"` + name + `","valueType":{"type":"int"}}]}`
	}
	ctrl := func(loc string) string {
		return `{"Location":"` + loc + `","ProductID":"base","OperCode":{"Switch":"1","Temperature":20}}`
	}
	dash := func(dev string) string {
		return `[{"dashboard":"device","object":"base","measurement":"properties","dimension":"history","params":{"deviceId":"` + dev + `"}}]`
	}
	cases := []struct {
		method, path string
		body         func(string) string
		field        string
	}{
		{"POST", "/api/authorize/login", func(v string) string { return `{"username":"adm` + v + `in","password":"admin123"}` }, "username"},
		{"POST", "/api/authorize/login", func(v string) string { return `{"username":"admin","password":"admin123` + v + `"}` }, "password"},
		{"POST", "/api/device/product", product, "name"},
		{"POST", "/api/device/product", func(v string) string { return `{"id":"p` + v + `",` + product("N")[1:] }, "id"},
		{"PATCH", "/api/device-product", patch, "name"},
		{"POST", "/api/device-product/_query/", term, "terms[0].value"},
		{"POST", "/api/device-product/_query/", nested, "terms[0].terms[1].value[1]"},
		{"POST", "/api/device-product/_query/", func(v string) string { return `{"sorts":[{"name":"name` + v + `"}]}` }, "sorts[0].name"},
		{"POST", "/api/device-product/_count", term, "terms[0].value"},
		{"POST", "/api/device-instance/_query/", term, "terms[0].value"},
		{"POST", "/api/role/_query/", term, "terms[0].value"},
		{"POST", "/api/device/instance", func(v string) string { return `{"id":"dev-2","name":"` + v + `","productId":"base"}` }, "name"},
		{"POST", "/api/device/instance", func(v string) string {
			return `{"id":"dev-2","name":"D","productId":"base","deviceConfiguration":{"k":"` + v + `"}}`
		}, "deviceConfiguration.k"},
		{"PUT", "/api/device/instance/dev-1", func(v string) string { return `{"name":"` + v + `"}` }, "name"},
		{"PUT", "/api/device/instance/dev-1", func(v string) string { return `{"tags":[{"key":"` + v + `"}]}` }, "tags[0].key"},
		{"PUT", "/api/device/instance/dev-1/metadata", model, "properties[0].name"},
		{"POST", "/api/device/instance/dev-1/properties/_read", func(v string) string { return `["a","` + v + `"]` }, "[1]"},
		{"POST", "/api/device/invoked/dev-1/function/DeviceCtrl", ctrl, "Location"},
		{"POST", "/api/dashboard/_multi", dash, "[0].params.deviceId"},
		// In a key, unknown or not: the message names where the key is.
		{"POST", "/api/device/product", func(v string) string { return `{"na` + v + `me":"x"}` }, "key"},
	}
	before := e.countRows("products") + e.countRows("devices")
	var baseBefore map[string]any
	e.ok("GET", "/api/device-product/base", nil, &baseBefore)
	devBefore := e.deviceDetail("dev-1")
	for _, c := range cases {
		for _, v := range []struct{ what, text, mention string }{
			{"NUL", nul, "NUL"}, {"raw NUL byte", "\x00", "NUL"}, {"non-UTF-8", bad, "UTF-8"},
		} {
			body := c.body(v.text)
			r := e.do(c.method, c.path, body, e.token)
			if r.HTTPStatus != 400 || r.Code != "illegal_argument" {
				t.Errorf("%s %s %s in %s: want 400 illegal_argument, got %d %s", c.method, c.path, v.what, c.field, r.HTTPStatus, r.raw)
				continue
			}
			if !strings.Contains(r.Message, c.field) || !strings.Contains(r.Message, v.mention) {
				t.Errorf("%s %s %s in %s: message %q does not name %q and %q", c.method, c.path, v.what, c.field, r.Message, c.field, v.mention)
			}
		}
	}
	if after := e.countRows("products") + e.countRows("devices"); after != before {
		t.Fatalf("refused input changed the product and device count: %d -> %d", before, after)
	}
	var baseAfter map[string]any
	e.ok("GET", "/api/device-product/base", nil, &baseAfter)
	if baseAfter["modifyTime"] != baseBefore["modifyTime"] {
		t.Fatalf("refused input changed product base: %v -> %v", baseBefore, baseAfter)
	}
	if devAfter := e.deviceDetail("dev-1"); devAfter["modifyTime"] != devBefore["modifyTime"] {
		t.Fatalf("refused input changed device dev-1: %v -> %v", devBefore, devAfter)
	}
	// A backslash followed by u0000 is text, not NUL; other characters,
	// escaped or not, pass.
	e.createProduct("fine", `a\u0000 "é" `+"\u00e9\U0001F600", nil)
	var fine map[string]any
	e.ok("GET", "/api/device-product/fine", nil, &fine)
	if fine["name"] != `a\u0000 "é" `+"\u00e9\U0001F600" {
		t.Fatalf("name stored as %q", fine["name"])
	}
}

// TestContentType: a body is JSON (application/json, application/*+json,
// or no Content-Type at all); anything else is 415 and changes nothing.
func TestContentType(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	n := 0
	product := func() string {
		n++
		return fmt.Sprintf(`{"id":"p%d","name":"N","classifiedId":"c","modelFrom":"custom","accessId":"a","deviceType":"device"}`, n)
	}
	accepted := []string{"", "application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8", "application/vnd.devicehub+json"}
	for _, ct := range accepted {
		if r := e.send("POST", "/api/device/product", ct, product()); r.HTTPStatus != 200 {
			t.Errorf("Content-Type %q: want 200, got %d %s", ct, r.HTTPStatus, r.raw)
		}
	}
	before := e.countRows("products")
	refused := []string{"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
		"application/xml", "application/json; charset=latin1", "json", "application/jsonx", ";;"}
	for _, ct := range refused {
		for _, req := range []struct{ method, path, body string }{
			{"POST", "/api/device/product", product()},
			{"POST", "/api/device-product/_query/", `{"pageSize":1}`},
			{"POST", "/api/authorize/login", `{"username":"admin","password":"admin123"}`},
		} {
			body := req.body
			if strings.HasPrefix(ct, "multipart/") {
				// Well-formed: fasthttp parses multipart bodies before any
				// handler, and answers 400 for a malformed one.
				body = "--x\r\nContent-Disposition: form-data; name=\"json\"\r\n\r\n" + body + "\r\n--x--\r\n"
			}
			r := e.send(req.method, req.path, ct, body)
			if r.HTTPStatus != 415 || r.Code != "unsupported_media_type" || !strings.Contains(r.Message, "application/json") {
				t.Errorf("%s %s with Content-Type %q: want 415 unsupported_media_type naming application/json, got %d %s",
					req.method, req.path, ct, r.HTTPStatus, r.raw)
			}
		}
	}
	if after := e.countRows("products"); after != before {
		t.Fatalf("refused bodies created products: %d -> %d", before, after)
	}
	// Compressed bodies are refused: inflating them would bypass BodyLimit.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte(product()))
	_ = zw.Close()
	req, err := http.NewRequest("POST", e.base+"/api/device/product", &gz)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Encoding", "gzip")
	req.Header.Set("X-Access-Token", e.token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if r := e.envelope("POST", "/api/device/product", res); r.HTTPStatus != 415 || r.Code != "unsupported_media_type" {
		t.Errorf("gzip-encoded body: want 415 unsupported_media_type, got %d %s", r.HTTPStatus, r.raw)
	}
	if after := e.countRows("products"); after != before {
		t.Fatalf("refused bodies created products: %d -> %d", before, after)
	}
	// Without a body the Content-Type does not matter (curl -XPOST with
	// no -d sends none; some clients send one anyway).
	e.createProduct("x", "X", nil)
	if r := e.send("POST", "/api/device-product/x/deploy", "application/x-www-form-urlencoded", ""); r.HTTPStatus != 200 {
		t.Fatalf("deploy without a body: want 200, got %d %s", r.HTTPStatus, r.raw)
	}
}
