package api_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

type productPage struct {
	PageIndex int              `json:"pageIndex"`
	PageSize  int              `json:"pageSize"`
	Total     int              `json:"total"`
	Data      []map[string]any `json:"data"`
}

func TestProductLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)

	// Create with a generated id and the documented defaults.
	p := e.createProduct("", "Power meter", map[string]any{"describe": "3-phase", "manufacturer": "ACME"})
	id, _ := p["id"].(string)
	if len(id) != 16 {
		t.Fatalf("generated id %q", id)
	}
	want := map[string]any{
		"name": "Power meter", "photoUrl": "/images/device-product.png", "classifiedId": "meter",
		"modelFrom": "custom", "accessId": "mqtt-direct", "state": 0.0, "creatorId": "admin",
		"deviceType":        map[string]any{"text": "Directly connected device", "value": "device"},
		"superProductType":  map[string]any{"text": "Common product", "value": "commonProduct"},
		"virtualType":       map[string]any{"text": "Real device", "value": "real"},
		"productCreateType": map[string]any{"text": "Manual", "value": "manual"},
		"presetType":        map[string]any{"text": "None", "value": "none"},
		"metadata":          `{"properties":[],"events":[],"functions":[],"tags":[]}`,
		"describe":          "3-phase", "manufacturer": "ACME", "deviceNum": 0.0,
	}
	for k, v := range want {
		if got := p[k]; fmt.Sprint(got) != fmt.Sprint(v) {
			t.Errorf("created %s = %v, want %v", k, got, v)
		}
	}
	conf, _ := p["configuration"].(map[string]any)
	if conf["secureKey"] != "******" || conf["secureId"] == "" {
		t.Errorf("configuration not masked: %v", conf)
	}
	if ct, _ := p["createTime"].(float64); ct < 1.7e12 {
		t.Errorf("createTime %v is not epoch ms", p["createTime"])
	}

	// Detail.
	var got map[string]any
	e.ok("GET", "/api/device-product/"+id, nil, &got)
	if got["name"] != "Power meter" || got["modifyTime"] == nil || got["deviceNum"] != 0.0 {
		t.Fatalf("detail: %v", got)
	}

	// A thing model given at creation is kept, validated and normalised
	// like endpoint 4's; an invalid one is refused and nothing is created.
	withModel := e.createProduct("with-model", "Thermometer", map[string]any{
		"metadata": `{"properties":[{"id":"temp","name":"T","valueType":{"type":"float","scale":1}}]}`})
	if m, _ := withModel["metadata"].(string); !strings.Contains(m, `"id":"temp"`) || !strings.Contains(m, `"events":[]`) {
		t.Errorf("metadata given at creation: %q", m)
	}
	e.fails("POST", "/api/device/product", map[string]any{"id": "bad-model", "name": "B", "classifiedId": "c", "modelFrom": "custom",
		"accessId": "a", "deviceType": "device", "metadata": `{"properties":[{"id":"x","valueType":{"type":"nope"}}]}`}, 400, "illegal_argument")
	e.fails("GET", "/api/device-product/bad-model", nil, 404, "not_found")
	e.ok("DELETE", "/api/device-product/with-model", nil, nil) // out of the counts below

	// Duplicate id.
	e.createProduct("dup-1", "A", nil)
	e.fails("POST", "/api/device/product", map[string]any{"id": "dup-1", "name": "B", "classifiedId": "c", "modelFrom": "custom", "accessId": "a", "deviceType": "gateway"}, 400, "duplicate_key")

	// Patch: take the detail, edit the thing model, send it back (spec's usage rule).
	model := `{"properties":[{"id":"temp","name":"Temperature","valueType":{"type":"float","scale":1,"unit":"percent"},"expands":{"source":"device","type":["read","report"]},"custom":"kept"}],"events":[],"functions":[],"tags":[]}` // a key of its own inside is kept; at the top it is refused (hardening3_data_test.go)
	got["metadata"] = model
	got["name"] = "Power meter v2"
	e.ok("PATCH", "/api/device-product", got, nil)
	e.ok("GET", "/api/device-product/"+id, nil, &got)
	if got["name"] != "Power meter v2" {
		t.Fatalf("patched name: %v", got["name"])
	}
	var stored, sent any
	_ = json.Unmarshal([]byte(got["metadata"].(string)), &stored)
	_ = json.Unmarshal([]byte(model), &sent)
	if fmt.Sprint(stored) != fmt.Sprint(sent) {
		t.Fatalf("metadata changed on the way: %s", got["metadata"])
	}

	// An invalid thing model is refused and nothing changes.
	got["metadata"] = `{"properties":[{"id":"temp","name":"T","valueType":{"type":"int","unit":"furlong"}}]}`
	got["name"] = "should not be stored"
	r := e.fails("PATCH", "/api/device-product", got, 400, "illegal_argument")
	if !strings.Contains(r.Message, "properties[0].valueType.unit") {
		t.Fatalf("error does not name the path: %s", r.Message)
	}
	e.ok("GET", "/api/device-product/"+id, nil, &got)
	if got["name"] != "Power meter v2" {
		t.Fatalf("failed patch changed the product: %v", got["name"])
	}

	// Deploy / undeploy and the state count.
	var n int
	e.ok("POST", "/api/device-product/"+id+"/deploy", nil, nil)
	e.ok("POST", "/api/device-product/_count", `{"terms":[{"column":"state","value":"1"}]}`, &n)
	if n != 1 {
		t.Fatalf("normal products: %d", n)
	}
	e.ok("POST", "/api/device-product/_count", `{"terms":[{"column":"state","value":"0"}]}`, &n)
	if n != 1 {
		t.Fatalf("disabled products: %d", n)
	}
	e.ok("POST", "/api/device-product/_count", nil, &n)
	if n != 2 {
		t.Fatalf("all products: %d", n)
	}
	e.ok("POST", "/api/device-product/"+id+"/undeploy", nil, nil)
	e.ok("POST", "/api/device-product/_count", `{"terms":[{"column":"state","value":"1"}]}`, &n)
	if n != 0 {
		t.Fatalf("normal products after undeploy: %d", n)
	}
	e.fails("POST", "/api/device-product/nope/deploy", nil, 404, "not_found")

	// Delete returns the product, then it is gone.
	var del map[string]any
	e.ok("DELETE", "/api/device-product/"+id, `{}`, &del)
	if del["id"] != id || del["name"] != "Power meter v2" {
		t.Fatalf("delete result: %v", del)
	}
	e.fails("GET", "/api/device-product/"+id, nil, 404, "not_found")
	e.fails("DELETE", "/api/device-product/"+id, nil, 404, "not_found")
}

func TestProductQuery(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i := 0; i < 30; i++ {
		dt := []string{"device", "gateway", "childrenDevice"}[i%3]
		e.createProduct(fmt.Sprintf("p%02d", i), fmt.Sprintf("Sensor %02d", i), map[string]any{"deviceType": dt})
	}
	e.createProduct("other", "Camera", nil)
	page := func(body string) productPage {
		t.Helper()
		var p productPage
		e.ok("POST", "/api/device-product/_query/", body, &p)
		return p
	}
	ids := func(p productPage) string {
		var s []string
		for _, d := range p.Data {
			s = append(s, d["id"].(string))
		}
		return strings.Join(s, ",")
	}
	f := func(body string, total int, wantIDs string) {
		t.Helper()
		p := page(body)
		if p.Total != total {
			t.Fatalf("%s: total %d, want %d", body, p.Total, total)
		}
		if wantIDs != "" && ids(p) != wantIDs {
			t.Fatalf("%s: ids %s, want %s", body, ids(p), wantIDs)
		}
	}
	f(`{}`, 31, "")
	f(`{"terms":[{"column":"name","value":"%camera%","termType":"like"}]}`, 1, "other")
	f(`{"terms":[{"column":"name","value":"Camera"}]}`, 1, "other")
	f(`{"terms":[{"terms":[{"column":"superProductType","value":"commonProduct","termType":"eq"}]}]}`, 31, "")
	f(`{"terms":[{"column":"deviceType","value":"gateway"}],"sorts":[{"name":"id","order":"asc"}],"pageSize":3}`, 10, "p01,p04,p07")
	f(`{"terms":[{"column":"id","value":"p01,p02","termType":"in"},{"column":"id","value":"other","type":"or"}],"sorts":[{"name":"id","order":"desc"}]}`, 3, "p02,p01,other")
	f(`{"terms":[{"column":"name$like","value":"Sensor 2%"}],"sorts":[{"name":"name","order":"asc"}],"pageSize":5,"pageIndex":1}`, 10, "p25,p26,p27,p28,p29")
	// pageIndex past the end: the last page.
	p := page(`{"sorts":[{"name":"id","order":"asc"}],"pageSize":10,"pageIndex":99}`)
	if p.PageIndex != 3 || len(p.Data) != 1 || p.Data[0]["id"] != "p29" {
		t.Fatalf("past the end: index %d, %s", p.PageIndex, ids(p))
	}
	// Default order: newest first.
	p = page(`{"pageSize":2}`)
	if ids(p) != "other,p29" || p.PageSize != 2 {
		t.Fatalf("default order: %s", ids(p))
	}
	// Paging off returns everything (up to the cap).
	p = page(`{"paging":false}`)
	if len(p.Data) != 31 {
		t.Fatalf("paging false: %d rows", len(p.Data))
	}
}

func TestRoleQuery(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, r := range []struct{ id, name string }{{"operator", "Operator"}, {"viewer", "Viewer"}} {
		if _, err := e.store.DB().Exec(`INSERT INTO roles (id, name, description) VALUES ($1, $2, 'x') ON CONFLICT (id) DO NOTHING`, r.id, r.name); err != nil {
			t.Fatal(err)
		}
	}
	var p productPage
	e.ok("POST", "/api/role/_query/", `{"sorts":[{"name":"name","order":"asc"}]}`, &p)
	if p.Total != 3 || p.Data[0]["id"] != "admin" || p.Data[2]["id"] != "viewer" {
		t.Fatalf("roles: %+v", p)
	}
	if st, _ := p.Data[0]["state"].(map[string]any); st["value"] != "enabled" {
		t.Fatalf("role state: %v", p.Data[0]["state"])
	}
	for _, s := range []string{"id", "name", "description", "createTime"} {
		e.ok("POST", "/api/role/_query/", fmt.Sprintf(`{"sorts":[{"name":%q,"order":"desc"}]}`, s), nil)
	}
	e.fails("POST", "/api/role/_query/", `{"sorts":[{"name":"state"}]}`, 400, "illegal_argument")
	e.ok("POST", "/api/role/_query/", `{"terms":[{"column":"name","value":"%era%","termType":"like"}]}`, &p)
	if p.Total != 1 || p.Data[0]["id"] != "operator" {
		t.Fatalf("role like: %+v", p)
	}
}
