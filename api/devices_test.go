package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"devicehub/meta"
)

type devicePage struct {
	PageIndex int              `json:"pageIndex"`
	PageSize  int              `json:"pageSize"`
	Total     int              `json:"total"`
	Data      []map[string]any `json:"data"`
}

// createDevice creates a device with a name and product plus extra.
func (e *env) createDevice(id, name, productID string, extra map[string]any) map[string]any {
	e.t.Helper()
	body := map[string]any{"name": name, "productId": productID}
	if id != "" {
		body["id"] = id
	}
	for k, v := range extra {
		body[k] = v
	}
	var d map[string]any
	e.ok("POST", "/api/device/instance", body, &d)
	return d
}

func (e *env) deviceDetail(id string) map[string]any {
	e.t.Helper()
	var d map[string]any
	e.ok("GET", "/api/device/instance/"+id+"/detail", nil, &d)
	return d
}

func (e *env) queryDevices(body any) devicePage {
	e.t.Helper()
	var p devicePage
	e.ok("POST", "/api/device-instance/_query/", body, &p)
	return p
}

// deviceIDs queries and returns the ids of the page, in order.
func (e *env) deviceIDs(body any) []string {
	e.t.Helper()
	p := e.queryDevices(body)
	ids := []string{}
	for _, d := range p.Data {
		ids = append(ids, d["id"].(string))
	}
	return ids
}

func enumValue(v any) string {
	m, _ := v.(map[string]any)
	s, _ := m["value"].(string)
	return s
}

func TestDeviceCreate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("meter", "Power meter", nil)

	d := e.createDevice("", "Meter 1", "meter", map[string]any{"description": "basement", "features": []any{"supportFirmware", map[string]any{"id": "ota", "name": "OTA", "type": "x"}}})
	id, _ := d["id"].(string)
	if len(id) != 16 {
		t.Fatalf("generated id %q", id)
	}
	want := map[string]any{
		"name": "Meter 1", "productId": "meter", "productName": "Power meter", "description": "basement",
		"state": "map[text:Not active value:notActive]", "independentMetadata": false,
		"superDeviceType": "map[text:Normal device value:normalDevice]",
		"deviceType":      "map[text:Directly connected device value:device]",
		"presetType":      "map[text:None value:none]", "creatorId": "admin", "onlineTime": 0.0, "offlineTime": 0.0,
		"registerTime": 0.0, "edge": false, "mediaDevice": false, "regulator": false, "address": "",
		"metadata":        `{"properties":[],"events":[],"functions":[],"tags":[]}`,
		"productPhotoUrl": "/images/device-product.png",
		"tags":            "[]", "binds": "[]", "relations": "[]",
		"deviceConfiguration": "map[]", "cachedConfiguration": "map[]", "aloneConfiguration": false,
		"features": "[map[deprecated:false id:supportFirmware name:supportFirmware type:] map[deprecated:false id:ota name:OTA type:x]]",
	}
	for k, v := range want {
		if got := d[k]; fmt.Sprint(got) != fmt.Sprint(v) {
			t.Errorf("created %s = %v, want %v", k, got, v)
		}
	}
	// The create response is where its creator learns the generated key.
	conf, _ := d["configuration"].(map[string]any)
	var key string
	if err := e.store.DB().Get(&key, `SELECT secure_key FROM devices WHERE id = $1`, id); err != nil || len(key) != 32 {
		t.Errorf("stored secure key %q %v", key, err)
	}
	if conf["secureKey"] != key || conf["secureId"] != id || conf["channelId"] != "" {
		t.Errorf("configuration: %v (stored key %s)", conf, key)
	}
	if ct, _ := d["createTime"].(float64); ct < 1.7e12 {
		t.Errorf("createTime %v is not epoch ms", d["createTime"])
	}

	// A chosen id and configuration.
	d = e.createDevice("m-2", "Meter 2", "meter", map[string]any{
		"configuration":       map[string]any{"secureId": "sid", "secureKey": "k1-0123456789abcd", "channelId": "ch-7"},
		"deviceConfiguration": map[string]any{"host": "10.0.0.2", "port": 502},
		"edge":                true,
	})
	if d["id"] != "m-2" || d["edge"] != true || d["aloneConfiguration"] != true {
		t.Fatalf("created: %v", d)
	}
	if conf := d["configuration"].(map[string]any); conf["secureId"] != "sid" || conf["channelId"] != "ch-7" || conf["secureKey"] != "k1-0123456789abcd" {
		t.Fatalf("configuration: %v", conf)
	}
	if dc := d["deviceConfiguration"].(map[string]any); dc["host"] != "10.0.0.2" || dc["port"] != 502.0 {
		t.Fatalf("deviceConfiguration: %v", dc)
	}

	// A secureId is one device's broker username.
	r := e.fails("POST", "/api/device/instance", map[string]any{"id": "m-3", "name": "x", "productId": "meter",
		"configuration": map[string]any{"secureId": "sid"}}, 400, "duplicate_key")
	if !strings.Contains(r.Message, "configuration.secureId") {
		t.Fatalf("duplicate secureId: %s", r.raw)
	}

	// Errors.
	r = e.fails("POST", "/api/device/instance", map[string]any{"name": "x", "productId": "nope"}, 404, "not_found")
	if !strings.Contains(r.Message, `"nope"`) {
		t.Errorf("unknown product message: %s", r.Message)
	}
	e.fails("POST", "/api/device/instance", map[string]any{"id": "m-2", "name": "x", "productId": "meter"}, 400, "duplicate_key")
	f := func(body any, field string) {
		t.Helper()
		r := e.fails("POST", "/api/device/instance", body, 400, "illegal_argument")
		if !strings.HasPrefix(r.Message, field) {
			t.Errorf("%v: message %q does not name %s", body, r.Message, field)
		}
	}
	f(map[string]any{"productId": "meter"}, "name")
	f(map[string]any{"name": "", "productId": "meter"}, "name")
	f(map[string]any{"name": "x"}, "productId")
	f(map[string]any{"name": strings.Repeat("n", 129), "productId": "meter"}, "name")
	f(map[string]any{"id": "a b", "name": "x", "productId": "meter"}, "id")
	f(map[string]any{"id": strings.Repeat("i", 65), "name": "x", "productId": "meter"}, "id")
	f(map[string]any{"name": 5, "productId": "meter"}, "name")
	f(map[string]any{"name": "x", "productId": "meter", "photoUrl": strings.Repeat("u", 1025)}, "photoUrl")
	f(map[string]any{"name": "x", "productId": "meter", "features": "f"}, "features")
	f(map[string]any{"name": "x", "productId": "meter", "features": []any{map[string]any{"name": "no id"}}}, "features[0].id")
	f(map[string]any{"name": "x", "productId": "meter", "deviceConfiguration": []any{1}}, "deviceConfiguration")
	f(map[string]any{"name": "x", "productId": "meter", "tags": map[string]any{}}, "tags")
	f(map[string]any{"name": "x", "productId": "meter", "relations": []any{map[string]any{"relation": "r"}}}, "relations[0].objectId")
	f(`{"name":`, "body")
	f(``, "body")
	if n := e.countRows("devices"); n != 2 {
		t.Fatalf("%d devices stored, want 2", n)
	}

	// The product counts its devices.
	var p map[string]any
	e.ok("GET", "/api/device-product/meter", nil, &p)
	if p["deviceNum"] != 2.0 {
		t.Fatalf("deviceNum %v, want 2", p["deviceNum"])
	}
}

func TestDeviceDetailFields(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("gw", "Gateway", map[string]any{"deviceType": "gateway", "classifiedName": "Gateways", "accessName": "MQTT direct", "accessProvider": "mqtt-server-gateway", "messageProtocol": "jetlinks-v3", "protocolName": "JetLinks", "transportProtocol": "MQTT", "regulator": true, "photoUrl": "/p.png"})
	e.createDevice("d1", "Device 1", "gw", map[string]any{"photoUrl": "/d.png"})
	d := e.deviceDetail("d1")
	keys := []string{"id", "name", "productPhotoUrl", "devicePhotoUrl", "protocol", "protocolName", "transport",
		"productId", "productName", "deviceType", "state", "address", "onlineTime", "offlineTime", "createTime",
		"registerTime", "metadata", "independentMetadata", "configuration", "deviceConfiguration",
		"cachedConfiguration", "aloneConfiguration", "connectServerId", "edge", "tags", "binds", "features",
		"relations", "accessId", "accessProvider", "accessName", "classifiedId", "classifiedName", "presetType",
		"superDeviceType", "mediaDevice", "creatorId", "orgId", "storePolicy"}
	for _, k := range keys {
		if _, ok := d[k]; !ok {
			t.Errorf("detail lacks %s", k)
		}
	}
	want := map[string]any{
		"productPhotoUrl": "/p.png", "devicePhotoUrl": "/d.png", "protocol": "jetlinks-v3", "protocolName": "JetLinks",
		"transport": "MQTT", "deviceType": "map[text:Gateway value:gateway]", "accessId": "mqtt-direct",
		"accessProvider": "mqtt-server-gateway", "accessName": "MQTT direct", "classifiedId": "meter",
		"classifiedName": "Gateways", "regulator": true,
	}
	for k, v := range want {
		if got := d[k]; fmt.Sprint(got) != fmt.Sprint(v) {
			t.Errorf("detail %s = %v, want %v", k, got, v)
		}
	}
	if conf := d["configuration"].(map[string]any); conf["secureKey"] != "******" || len(conf) != 3 {
		t.Errorf("configuration: %v", conf)
	}
	// GET without /detail is the same object.
	var same map[string]any
	e.ok("GET", "/api/device/instance/d1", nil, &same)
	if fmt.Sprint(same) != fmt.Sprint(d) {
		t.Errorf("GET /instance/d1 differs from detail:\n%v\n%v", same, d)
	}
	e.fails("GET", "/api/device/instance/nope/detail", nil, 404, "not_found")

	// The list item.
	p := e.queryDevices(nil)
	if p.Total != 1 {
		t.Fatalf("total %d", p.Total)
	}
	item := p.Data[0]
	listKeys := []string{"id", "name", "photoUrl", "deviceType", "productId", "productName", "state", "edge",
		"superDeviceType", "creatorId", "creatorName", "createTime", "registryTime", "modifyTime", "modifierId",
		"modifierName", "features", "virtualType", "regulator", "comeFrom", "deviceCreateType", "presetType",
		"categoryType", "mediaDevice", "configuration", "orgId", "storePolicy"}
	for _, k := range listKeys {
		if _, ok := item[k]; !ok {
			t.Errorf("list item lacks %s", k)
		}
	}
	if _, ok := item["deviceMetadata"]; ok {
		t.Errorf("deviceMetadata shown for a device without its own model")
	}
	if item["productName"] != "Gateway" || item["regulator"] != true || enumValue(item["comeFrom"]) != "cloud" ||
		enumValue(item["deviceCreateType"]) != "fromProduct" || enumValue(item["categoryType"]) != "none" ||
		enumValue(item["virtualType"]) != "real" || item["creatorName"] == "" || item["photoUrl"] != "/d.png" {
		t.Errorf("list item: %v", item)
	}
	if conf := item["configuration"].(map[string]any); conf["secureKey"] != "******" {
		t.Errorf("list configuration: %v", conf)
	}
}

func TestDeviceQuery(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("pa", "Meters", nil)
	e.createProduct("pb", "Gateways", map[string]any{"deviceType": "gateway", "classifiedId": "gw"})
	e.ok("POST", "/api/device-product/pa/deploy", nil, nil)
	e.ok("POST", "/api/device-product/pb/deploy", nil, nil)
	// Creation order fixes createTime order: a1 oldest, b2 newest.
	for _, d := range []struct{ id, name, product string }{
		{"a1", "Kitchen meter", "pa"}, {"a2", "Garage meter", "pa"}, {"a3", "Attic Meter_x", "pa"},
		{"b1", "Main gateway", "pb"}, {"b2", "Spare gateway", "pb"},
	} {
		e.createDevice(d.id, d.name, d.product, nil)
	}
	e.ok("POST", "/api/device/instance/a2/deploy", nil, nil)
	e.ok("POST", "/api/device/instance/b1/deploy", nil, nil)
	if _, err := e.store.ApplyStateChanges(context.Background(), []meta.StateChange{{DeviceID: "b1", Online: true, At: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.DB().Exec(`UPDATE devices SET super_device_type = 'childDevice' WHERE id = 'a3'`); err != nil {
		t.Fatal(err)
	}

	f := func(body string, want ...string) {
		t.Helper()
		got := e.deviceIDs(body)
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s:\n got  %v\n want %v", body, got, want)
		}
	}
	term := func(col, tt string, v any) string {
		js, _ := json.Marshal(v)
		return fmt.Sprintf(`{"terms":[{"column":%q,"termType":%q,"value":%s}],"sorts":[{"name":"id"}]}`, col, tt, js)
	}
	// Default order: createTime desc.
	f(`{}`, "b2", "b1", "a3", "a2", "a1")
	f(``, "b2", "b1", "a3", "a2", "a1")
	// Each allowed column.
	f(term("id", "eq", "a2"), "a2")
	f(term("id", "like", "a"), "a1", "a2", "a3")
	f(term("id", "like", "%1"), "a1", "b1")
	f(term("name", "like", "METER"), "a1", "a2", "a3")
	f(term("name", "like", "meter_"), "a3") // _ is literal without %
	f(term("name", "like", "%ga%"), "a2", "b1", "b2")
	f(term("name", "nlike", "gateway"), "a1", "a2", "a3")
	f(term("productId", "eq", "pb"), "b1", "b2")
	f(term("state", "eq", "notActive"), "a1", "a3", "b2")
	f(term("state", "eq", "offline"), "a2")
	f(term("state", "eq", "online"), "b1")
	f(term("state", "in", []string{"online", "offline"}), "a2", "b1")
	f(term("state", "in", "online, offline"), "a2", "b1")
	f(term("state", "not", "notActive"), "a2", "b1")
	f(term("state", "nin", "notActive"), "a2", "b1")
	f(term("superDeviceType", "eq", "childDevice"), "a3")
	f(term("superDeviceType", "not", "childDevice"), "a1", "a2", "b1", "b2")
	f(term("deviceType", "eq", "gateway"), "b1", "b2")
	f(term("classifiedId", "eq", "meter"), "a1", "a2", "a3")
	f(term("classifiedId", "in", []string{"gw", "x"}), "b1", "b2")
	f(term("createTime", "gt", 0), "a1", "a2", "a3", "b1", "b2")
	f(term("createTime", "lt", 0))
	f(`{"terms":[{"column":"name$like","value":"spare"}]}`, "b2")
	// and/or and groups: (productId = pa AND state = offline) OR id = b2.
	f(`{"terms":[{"column":"productId","value":"pa"},{"column":"state","value":"offline"},{"type":"or","column":"id","value":"b2"}],"sorts":[{"name":"id"}]}`, "a2", "b2")
	// productId = pa AND (state = offline OR name like attic).
	f(`{"terms":[{"column":"productId","value":"pa"},{"terms":[{"column":"state","value":"offline"},{"type":"or","column":"name","termType":"like","value":"attic"}]}],"sorts":[{"name":"id"}]}`, "a2", "a3")
	// The spec's shape: terms nested one level.
	f(`{"terms":[{"terms":[{"column":"name","termType":"like","value":"%gateway%"},{"column":"deviceType","termType":"eq","value":"gateway","type":"and"}]}],"sorts":[{"name":"name","order":"asc"}]}`, "b1", "b2")
	// Sorts.
	f(`{"sorts":[{"name":"name","order":"asc"}]}`, "a3", "a2", "a1", "b1", "b2")
	f(`{"sorts":[{"name":"name","order":"desc"}]}`, "b2", "b1", "a1", "a2", "a3")
	f(`{"sorts":[{"name":"productId","order":"desc"},{"name":"id","order":"desc"}]}`, "b2", "b1", "a3", "a2", "a1")
	f(`{"sorts":[{"name":"state"},{"name":"id"}]}`, "a1", "a3", "b2", "a2", "b1")
	f(`{"sorts":[{"name":"createTime","order":"asc"}]}`, "a1", "a2", "a3", "b1", "b2")

	// Paging.
	p := e.queryDevices(`{"pageSize":2,"pageIndex":1,"sorts":[{"name":"id"}]}`)
	if p.Total != 5 || p.PageIndex != 1 || p.PageSize != 2 || len(p.Data) != 2 || p.Data[0]["id"] != "a3" {
		t.Errorf("page 1: %+v", p)
	}
	p = e.queryDevices(`{"pageSize":2,"pageIndex":99,"sorts":[{"name":"id"}]}`)
	if p.Total != 5 || p.PageIndex != 2 || len(p.Data) != 1 || p.Data[0]["id"] != "b2" {
		t.Errorf("past the end: %+v", p)
	}
	p = e.queryDevices(term("id", "eq", "none"))
	if p.Total != 0 || p.Data == nil || len(p.Data) != 0 {
		t.Errorf("empty: %+v", p)
	}

	// Bad queries name the field.
	bad := func(body, field string) {
		t.Helper()
		r := e.fails("POST", "/api/device-instance/_query", body, 400, "illegal_argument")
		if !strings.HasPrefix(r.Message, field) {
			t.Errorf("%s: message %q does not name %s", body, r.Message, field)
		}
	}
	bad(`{"terms":[{"column":"secureKey","value":"x"}]}`, "terms[0].column")
	bad(`{"terms":[{"column":"name","termType":"regex","value":"x"}]}`, "terms[0].termType")
	bad(`{"terms":[{"column":"createTime","termType":"like","value":"x"}]}`, "terms[0].termType")
	bad(`{"sorts":[{"name":"secureKey"}]}`, "sorts[0].name")
	bad(`{"sorts":[{"name":"deviceType"}]}`, "sorts[0].name")
	bad(`{"pageSize":-1}`, "pageSize")
	bad(`[1]`, "query body")
}

func TestDeviceMetadataInheritance(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("p", "Thermo", nil)
	e.createDevice("d", "Thermo 1", "p", nil)
	e.createDevice("d2", "Thermo 2", "p", nil)

	var prod map[string]any
	e.ok("GET", "/api/device-product/p", nil, &prod)
	prodModel := `{"properties":[{"id":"temp","name":"Temperature","valueType":{"type":"float","unit":"percent","scale":1},"expands":{"source":"device","type":["read","report"]}}],"events":[],"functions":[],"tags":[]}`
	prod["metadata"] = prodModel
	e.ok("PATCH", "/api/device-product", prod, nil)

	d := e.deviceDetail("d")
	if d["independentMetadata"] != false || !strings.Contains(d["metadata"].(string), `"temp"`) {
		t.Fatalf("device does not show the product's model: %v %v", d["independentMetadata"], d["metadata"])
	}

	// Its own model (the body is the model object itself; fields optional).
	own := `{"properties":[{"id":"hum","name":"Humidity","valueType":{"type":"int","unit":"percent"},"expands":{"source":"device","type":["read"],"metrics":[]},"sortsIndex":0}]}`
	r := e.call("PUT", "/api/device/instance/d/metadata", own)
	if r.HTTPStatus != 200 || r.Message != "success" || r.Result != nil {
		t.Fatalf("PUT metadata: %d %s", r.HTTPStatus, r.raw)
	}
	d = e.deviceDetail("d")
	m := d["metadata"].(string)
	if d["independentMetadata"] != true || !strings.Contains(m, `"hum"`) || strings.Contains(m, `"temp"`) {
		t.Fatalf("own model not in force: %v", m)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(m), &doc); err != nil || doc["events"] == nil || doc["functions"] == nil || doc["tags"] == nil {
		t.Fatalf("stored model not normalised: %s", m)
	}
	var page devicePage // the list carries the model when asked for (hardening3_data_test.go)
	e.ok("POST", "/api/device-instance/_query/?deviceMetadata=true", `{"terms":[{"column":"id","value":"d"}]}`, &page)
	if page.Data[0]["deviceMetadata"] != m {
		t.Fatalf("list deviceMetadata %v", page.Data[0]["deviceMetadata"])
	}
	ref, err := e.store.GetDeviceRef(context.Background(), "d")
	if err != nil || ref.Metadata != m || ref.ProductID != "p" || ref.ProductName != "Thermo" || ref.Name != "Thermo 1" || ref.State != "notActive" || ref.CreatorID != "admin" {
		t.Fatalf("ref %+v %v", ref, err)
	}

	// A product change afterwards leaves the independent device alone, but
	// reaches the inheriting one. (Read again: the copy read above is
	// stale since its PATCH, and would get 409 conflict.)
	e.ok("GET", "/api/device-product/p", nil, &prod)
	prod["metadata"] = strings.Replace(prodModel, "Temperature", "Temp (C)", 1)
	e.ok("PATCH", "/api/device-product", prod, nil)
	if got := e.deviceDetail("d")["metadata"]; got != m {
		t.Fatalf("product patch changed the device's own model: %v", got)
	}
	if got := e.deviceDetail("d2")["metadata"].(string); !strings.Contains(got, "Temp (C)") {
		t.Fatalf("inheriting device does not follow its product: %v", got)
	}
	ref, _ = e.store.GetDeviceRef(context.Background(), "d2")
	if !strings.Contains(ref.Metadata, "Temp (C)") {
		t.Fatalf("ref of inheriting device: %v", ref.Metadata)
	}

	// Reset: back to the product's.
	e.ok("DELETE", "/api/device/instance/d/metadata", nil, nil)
	d = e.deviceDetail("d")
	if d["independentMetadata"] != false || !strings.Contains(d["metadata"].(string), "Temp (C)") {
		t.Fatalf("reset: %v %v", d["independentMetadata"], d["metadata"])
	}
	// An empty object is a valid (empty) model.
	e.ok("PUT", "/api/device/instance/d/metadata", `{}`, nil)
	if d = e.deviceDetail("d"); d["metadata"] != `{"properties":[],"events":[],"functions":[],"tags":[]}` || d["independentMetadata"] != true {
		t.Fatalf("empty model: %v", d["metadata"])
	}
	e.fails("PUT", "/api/device/instance/nope/metadata", `{}`, 404, "not_found")
	e.fails("DELETE", "/api/device/instance/nope/metadata", nil, 404, "not_found")
	if _, err := e.store.GetDeviceRef(context.Background(), "nope"); err == nil {
		t.Fatal("ref of unknown device")
	}
}

// TestDeviceMetadataInvalid: endpoint 9 refuses invalid thing models, names
// the offending path and stores nothing.
func TestDeviceMetadataInvalid(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("p", "P", nil)
	e.createDevice("d", "D", "p", nil)
	prop := func(vt string) string {
		return `{"properties":[{"id":"p","name":"P","valueType":` + vt + `}]}`
	}
	cases := []struct{ body, path string }{
		{`[]`, ""},
		{`"x"`, ""},
		{`{"properties":`, ""},
		{`{"properties":{}}`, "properties"},
		{`{"events":[1]}`, "events[0]"},
		{`{"tags":"a"}`, "tags"},
		{`{"properties":[{"id":1,"name":"x","valueType":{"type":"int"}}]}`, "properties[0].id"},
		{`{"properties":[{"name":"A","valueType":{"type":"int"}}]}`, "properties[0].id"},
		{`{"properties":[{"id":"a b","name":"A","valueType":{"type":"int"}}]}`, "properties[0].id"},
		{`{"properties":[{"id":"a","valueType":{"type":"int"}}]}`, "properties[0].name"},
		{`{"properties":[{"id":"a","name":"A","valueType":{"type":"int"}},{"id":"a","name":"B","valueType":{"type":"int"}}]}`, "properties[1].id"},
		{`{"properties":[{"id":"a","name":"A"}]}`, "properties[0].valueType.type"},
		{prop(`{"type":"integer"}`), "properties[0].valueType.type"},
		{prop(`{"type":"int","unit":"furlong"}`), "properties[0].valueType.unit"},
		{prop(`{"type":"string","unit":"meter"}`), "properties[0].valueType.unit"},
		{prop(`{"type":"float","scale":11}`), "properties[0].valueType.scale"},
		{prop(`{"type":"string","expands":{"maxLength":0}}`), "properties[0].valueType.expands.maxLength"},
		{prop(`{"type":"enum","elements":[]}`), "properties[0].valueType.elements"},
		{prop(`{"type":"enum","elements":[{"value":"1","text":"A"},{"value":1,"text":"B"}]}`), "properties[0].valueType.elements[1].value"},
		{prop(`{"type":"array"}`), "properties[0].valueType.elementType"},
		{prop(`{"type":"object"}`), "properties[0].valueType.properties"},
		{prop(`{"type":"file","fileType":"binary"}`), "properties[0].valueType.fileType"},
		{prop(`{"type":"boolean","trueValue":1,"falseValue":1}`), "properties[0].valueType.falseValue"},
		{`{"properties":[{"id":"a","name":"A","valueType":{"type":"int"},"expands":{"source":"cloud"}}]}`, "properties[0].expands.source"},
		{`{"properties":[{"id":"a","name":"A","valueType":{"type":"int"},"expands":{"type":["read","exec"]}}]}`, "properties[0].expands.type[1]"},
		{`{"properties":[{"id":"a","name":"A","valueType":{"type":"int"},"expands":{"type":"read"}}]}`, "properties[0].expands.type"},
		{`{"functions":[{"id":"f","name":"F","async":"yes"}]}`, "functions[0].async"},
		{`{"functions":[{"id":"f","name":"F","inputs":[{"id":"x","name":"X","valueType":{"type":"int"}},{"id":"x","name":"Y","valueType":{"type":"int"}}]}]}`, "functions[0].inputs[1].id"},
		{`{"functions":[{"id":"f","name":"F","output":{"type":"nope"}}]}`, "functions[0].output.type"},
		{`{"events":[{"id":"e","name":"E","expands":{"level":""},"valueType":{"type":"object","properties":[]}}]}`, "events[0].expands.level"},
		{`{"tags":[{"id":"t","name":"T","valueType":{"type":"string"},"expands":{"type":["a","a"]}}]}`, "tags[0].expands.type[1]"},
	}
	if len(cases) < 20 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, c := range cases {
		r := e.fails("PUT", "/api/device/instance/d/metadata", c.body, 400, "illegal_argument")
		if c.path != "" && !strings.Contains(r.Message, c.path+": ") {
			t.Errorf("%s: message %q does not name %s", c.body, r.Message, c.path)
		}
		var own *string
		if err := e.store.DB().Get(&own, `SELECT metadata FROM devices WHERE id = 'd'`); err != nil || own != nil {
			t.Fatalf("%s: something was stored: %v %v", c.body, own, err)
		}
	}
	// Empty body.
	r := e.fails("PUT", "/api/device/instance/d/metadata", nil, 400, "illegal_argument")
	if !strings.HasPrefix(r.Message, "body") {
		t.Errorf("empty body: %s", r.Message)
	}
	if d := e.deviceDetail("d"); d["independentMetadata"] != false {
		t.Fatalf("device became independent")
	}
}

func TestDeviceDeploy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("p", "P", nil)
	e.createDevice("d", "D", "p", nil)
	state := func() string { return enumValue(e.deviceDetail("d")["state"]) }

	// The product is not deployed yet.
	r := e.fails("POST", "/api/device/instance/d/deploy", nil, 400, "illegal_argument")
	if !strings.Contains(r.Message, "product") {
		t.Errorf("message %q", r.Message)
	}
	if state() != "notActive" {
		t.Fatal("state changed on a refused deploy")
	}
	e.ok("POST", "/api/device-product/p/deploy", nil, nil)
	var d map[string]any
	e.ok("POST", "/api/device/instance/d/deploy", nil, &d)
	if enumValue(d["state"]) != "offline" || d["registerTime"].(float64) < 1.7e12 {
		t.Fatalf("deployed: %v %v", d["state"], d["registerTime"])
	}
	// Deploying again is harmless and keeps the registry time.
	var again map[string]any
	e.ok("POST", "/api/device/instance/d/deploy", nil, &again)
	if enumValue(again["state"]) != "offline" || again["registerTime"] != d["registerTime"] {
		t.Fatalf("deploy twice: %v %v", again["state"], again["registerTime"])
	}
	// Online devices stay online on deploy.
	if n, err := e.store.ApplyStateChanges(context.Background(), []meta.StateChange{{DeviceID: "d", Online: true, At: time.Now()}}); err != nil || n != 1 {
		t.Fatal(n, err)
	}
	e.ok("POST", "/api/device/instance/d/deploy", nil, nil)
	if state() != "online" {
		t.Fatal("deploy of an online device changed its state")
	}
	// Undeploy from any state.
	e.ok("POST", "/api/device/instance/d/undeploy", nil, &d)
	if enumValue(d["state"]) != "notActive" || d["registerTime"] != 0.0 {
		t.Fatalf("undeployed: %v", d)
	}
	e.ok("POST", "/api/device/instance/d/undeploy", nil, nil)
	if state() != "notActive" {
		t.Fatal("undeploy twice")
	}
	e.fails("POST", "/api/device/instance/nope/deploy", nil, 404, "not_found")
	e.fails("POST", "/api/device/instance/nope/undeploy", nil, 404, "not_found")
}

func TestDeviceUpdate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("p", "P", nil)
	e.createProduct("q", "Q", nil)
	e.createDevice("d", "D", "p", map[string]any{"description": "keep", "configuration": map[string]any{"secureKey": "secret-1-0123456789"}})
	var d map[string]any
	e.ok("PUT", "/api/device/instance/d", map[string]any{"name": "D2", "photoUrl": "/x.png", "features": []string{"f1"},
		"deviceConfiguration": map[string]any{"a": 1}, "configuration": map[string]any{"channelId": "c9"}}, &d)
	if d["name"] != "D2" || d["devicePhotoUrl"] != "/x.png" || d["description"] != "keep" || d["aloneConfiguration"] != true ||
		fmt.Sprint(d["features"]) != "[map[deprecated:false id:f1 name:f1 type:]]" || d["configuration"].(map[string]any)["channelId"] != "c9" {
		t.Fatalf("updated: %v", d)
	}
	var key string
	_ = e.store.DB().Get(&key, `SELECT secure_key FROM devices WHERE id = 'd'`)
	if key != "secret-1-0123456789" {
		t.Fatalf("key changed to %q", key)
	}
	// Sending the whole detail back (masked key included) changes nothing
	// but the modify time.
	before := e.deviceDetail("d")
	e.ok("PUT", "/api/device/instance/d", before, nil)
	after := e.deviceDetail("d")
	delete(before, "modifyTime")
	delete(after, "modifyTime")
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("round trip changed the device:\n%v\n%v", before, after)
	}
	_ = e.store.DB().Get(&key, `SELECT secure_key FROM devices WHERE id = 'd'`)
	if key != "secret-1-0123456789" {
		t.Fatalf("masked key was stored: %q", key)
	}
	r := e.fails("PUT", "/api/device/instance/d", map[string]any{"productId": "q"}, 400, "illegal_argument")
	if !strings.HasPrefix(r.Message, "productId") {
		t.Errorf("message %q", r.Message)
	}
	e.fails("PUT", "/api/device/instance/d", map[string]any{"id": "other"}, 400, "illegal_argument")
	e.fails("PUT", "/api/device/instance/d", map[string]any{"name": ""}, 400, "illegal_argument")
	e.fails("PUT", "/api/device/instance/d", map[string]any{"name": strings.Repeat("n", 129)}, 400, "illegal_argument")
	e.fails("PUT", "/api/device/instance/nope", map[string]any{"name": "x"}, 404, "not_found")
	if got := e.deviceDetail("d"); got["productId"] != "p" || got["name"] != "D2" {
		t.Fatalf("refused updates changed the device: %v", got)
	}
}

func TestDeviceDelete(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("p", "P", nil)
	e.ok("POST", "/api/device-product/p/deploy", nil, nil)
	e.createDevice("d1", "D1", "p", nil)
	e.createDevice("d2", "D2", "p", nil)

	// A product with devices cannot be deleted, and nothing is deleted.
	r := e.fails("DELETE", "/api/device-product/p", nil, 400, "illegal_argument")
	if !strings.Contains(r.Message, "devices") {
		t.Errorf("message %q", r.Message)
	}
	if e.countRows("products") != 1 || e.countRows("devices") != 2 {
		t.Fatal("refused product delete deleted something")
	}

	// A deployed device cannot be deleted.
	e.ok("POST", "/api/device/instance/d1/deploy", nil, nil)
	r = e.fails("DELETE", "/api/device/instance/d1", nil, 400, "illegal_argument")
	if !strings.Contains(r.Message, "undeploy") {
		t.Errorf("message %q", r.Message)
	}
	var d map[string]any
	e.ok("DELETE", "/api/device/instance/d2", nil, &d)
	if d["id"] != "d2" || d["name"] != "D2" {
		t.Fatalf("deleted: %v", d)
	}
	e.fails("GET", "/api/device/instance/d2/detail", nil, 404, "not_found")
	e.fails("DELETE", "/api/device/instance/d2", nil, 404, "not_found")
	var p map[string]any
	e.ok("GET", "/api/device-product/p", nil, &p)
	if p["deviceNum"] != 1.0 {
		t.Fatalf("deviceNum %v", p["deviceNum"])
	}
	e.ok("POST", "/api/device/instance/d1/undeploy", nil, nil)
	e.ok("DELETE", "/api/device/instance/d1", nil, nil)
	e.ok("DELETE", "/api/device-product/p", nil, nil)
	if e.countRows("products") != 0 || e.countRows("devices") != 0 {
		t.Fatal("rows left")
	}
}

func TestApplyStateChanges(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.createProduct("p", "P", nil)
	e.ok("POST", "/api/device-product/p/deploy", nil, nil)
	for _, id := range []string{"a", "b", "c", "idle"} {
		e.createDevice(id, id, "p", nil)
		if id != "idle" {
			e.ok("POST", "/api/device/instance/"+id+"/deploy", nil, nil)
		}
	}
	type view struct {
		state, address  string
		online, offline int64
	}
	get := func(id string) view {
		t.Helper()
		d := e.deviceDetail(id)
		return view{enumValue(d["state"]), d["address"].(string), int64(d["onlineTime"].(float64)), int64(d["offlineTime"].(float64))}
	}
	apply := func(want int, changes ...meta.StateChange) {
		t.Helper()
		n, err := e.store.ApplyStateChanges(ctx, changes)
		if err != nil || n != want {
			t.Fatalf("ApplyStateChanges: %d %v, want %d", n, err, want)
		}
	}
	t0 := time.UnixMilli(time.Now().UnixMilli())
	ms := func(d time.Duration) time.Time { return t0.Add(d) }

	apply(0)
	apply(3,
		meta.StateChange{DeviceID: "a", Online: true, At: ms(0), Address: "10.0.0.1:5000"},
		meta.StateChange{DeviceID: "b", Online: true, At: ms(0)},
		meta.StateChange{DeviceID: "c", Online: false, At: ms(0)},
		meta.StateChange{DeviceID: "idle", Online: true, At: ms(0)},    // notActive: left alone
		meta.StateChange{DeviceID: "unknown", Online: true, At: ms(0)}, // no such device
	)
	if v := get("a"); v != (view{"online", "10.0.0.1:5000", t0.UnixMilli(), 0}) {
		t.Fatalf("a: %+v", v)
	}
	if v := get("c"); v != (view{"offline", "", 0, t0.UnixMilli()}) {
		t.Fatalf("c: %+v", v)
	}
	if v := get("idle"); v != (view{"notActive", "", 0, 0}) {
		t.Fatalf("idle: %+v", v)
	}

	// Offline keeps the online time and the address.
	apply(1, meta.StateChange{DeviceID: "a", Online: false, At: ms(time.Second)})
	if v := get("a"); v != (view{"offline", "10.0.0.1:5000", t0.UnixMilli(), ms(time.Second).UnixMilli()}) {
		t.Fatalf("a offline: %+v", v)
	}
	// A stale online (delivered late) is ignored.
	apply(0, meta.StateChange{DeviceID: "a", Online: true, At: ms(500 * time.Millisecond), Address: "stale"})
	if v := get("a"); v.state != "offline" || v.address != "10.0.0.1:5000" {
		t.Fatalf("stale change applied: %+v", v)
	}
	// Several changes of one device in a batch: the latest wins, whatever
	// the order in the batch.
	apply(1,
		meta.StateChange{DeviceID: "b", Online: false, At: ms(3 * time.Second)},
		meta.StateChange{DeviceID: "b", Online: true, At: ms(2 * time.Second), Address: "x"},
	)
	if v := get("b"); v.state != "offline" || v.offline != ms(3*time.Second).UnixMilli() {
		t.Fatalf("b: %+v", v)
	}
	// Undeployed devices ignore state changes.
	e.ok("POST", "/api/device/instance/c/undeploy", nil, nil)
	apply(0, meta.StateChange{DeviceID: "c", Online: true, At: ms(time.Hour)})
	if v := get("c"); v.state != "notActive" {
		t.Fatalf("c: %+v", v)
	}
	// The list filters on the new states.
	ids := e.deviceIDs(`{"terms":[{"column":"state","value":"offline"}],"sorts":[{"name":"id"}]}`)
	sort.Strings(ids)
	if strings.Join(ids, ",") != "a,b" {
		t.Fatalf("offline devices %v", ids)
	}
}

// TestApplyStateChangesConcurrent: overlapping batches from two ingest
// instances, in opposite orders, neither deadlock nor fail.
func TestApplyStateChangesConcurrent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("p", "P", nil)
	if _, err := e.store.DB().Exec(`INSERT INTO devices (id, name, product_id, state)
		SELECT 'd' || i, 'D' || i, 'p', 'offline' FROM generate_series(1, 200) AS i`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; round < 20; round++ {
				batch := make([]meta.StateChange, 0, 200)
				for i := 1; i <= 200; i++ {
					n := i
					if w == 1 {
						n = 201 - i
					}
					batch = append(batch, meta.StateChange{DeviceID: fmt.Sprintf("d%d", n), Online: round%2 == 0, At: time.Now()})
				}
				if _, err := e.store.ApplyStateChanges(context.Background(), batch); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
