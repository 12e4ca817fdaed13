package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"devicehub/api"
	"devicehub/api/live"
	"devicehub/bench/testkit"
	"devicehub/meta"
	"devicehub/tsdb"
	"devicehub/tsdb/tsdbtest"
)

// Product scope from the attacker's side: a user whose role is limited to
// product "sa" tries to reach product "sb" and its device "b1" every way
// the API offers. Each refusal must look like an object that does not
// exist (the answer for "nosuch"), and each check fails when its rule is
// removed.

type scopeEnv struct {
	*env
	alice string // operator's permissions and device:secret, on sa only
	pw    string // product:read and product:write on sa only
	db    *tsdb.DB
}

const scopeModel = `{"properties":[{"id":"temp","name":"Temperature","valueType":{"type":"float"}}],"events":[],"functions":[],"tags":[]}`

func newScopeEnv(t *testing.T) *scopeEnv {
	t.Helper()
	db := tsdbtest.NewDB(t, time.UTC)
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		hub, err := live.New(context.Background(), live.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(hub.Close)
		deps.Dashboard, deps.Models, deps.Live, deps.LiveDevices = db, store, hub, store
	})
	for _, p := range []string{"sa", "sb"} {
		prod := e.createProduct(p, "Product "+p, map[string]any{"regulator": true})
		prod["metadata"] = scopeModel
		e.ok("PATCH", "/api/device-product", prod, nil)
		e.ok("POST", "/api/device-product/"+p+"/deploy", nil, nil)
	}
	for _, d := range []struct{ id, product string }{{"a1", "sa"}, {"a2", "sa"}, {"b1", "sb"}, {"b2", "sb"}} {
		e.ok("POST", "/api/device/instance", map[string]any{"id": d.id, "name": d.id, "productId": d.product}, nil)
		e.ok("POST", "/api/device/instance/"+d.id+"/deploy", nil, nil)
	}
	e.ok("POST", "/api/role", map[string]any{"id": "only-a", "name": "Only A", "products": []string{"sa"},
		"permissions": []string{"product:read", "device:read", "device:write", "device:command", "device:secret", "dashboard:read"}}, nil)
	e.ok("POST", "/api/role", map[string]any{"id": "products-a", "name": "Products A", "products": []string{"sa"},
		"permissions": []string{"product:read", "product:write"}}, nil)
	_, alice := e.addUser("alice", "only-a")
	_, pw := e.addUser("pw", "products-a")
	return &scopeEnv{env: e, alice: alice, pw: pw, db: db}
}

// hidden requires method path with body, by token, to be refused as the
// same request naming "nosuch" instead of what is hidden: same status
// and code, and the same message but for the name.
func (e *scopeEnv) hidden(token, method, path string, body any, hidden string) {
	e.t.Helper()
	got := e.do(method, path, body, token)
	other := strings.ReplaceAll(path, hidden, "nosuch")
	otherBody := body
	if s, ok := body.(string); ok {
		otherBody = strings.ReplaceAll(s, hidden, "nosuch")
	}
	want := e.do(method, other, otherBody, token)
	if got.HTTPStatus == 200 || got.HTTPStatus != want.HTTPStatus || got.Code != want.Code ||
		strings.ReplaceAll(got.Message, hidden, "nosuch") != want.Message {
		e.t.Fatalf("%s %s by a user limited to sa: %d %s, want it refused as %s is (%d %s)", method, path, got.HTTPStatus, got.raw, other, want.HTTPStatus, want.raw)
	}
}

func (e *scopeEnv) okAs(token, method, path string, body, out any) {
	e.t.Helper()
	r := e.do(method, path, body, token)
	if r.HTTPStatus != 200 {
		e.t.Fatalf("%s %s: want 200, got %d: %s", method, path, r.HTTPStatus, r.raw)
	}
	if out != nil {
		if err := json.Unmarshal(r.Result, out); err != nil {
			e.t.Fatal(err)
		}
	}
}

func pageIDs(t *testing.T, raw json.RawMessage) (ids []string, total int) {
	t.Helper()
	var page struct {
		Total int `json:"total"`
		Data  []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(raw, &page); err != nil {
		t.Fatal(err)
	}
	for _, d := range page.Data {
		ids = append(ids, d.ID)
	}
	slices.Sort(ids)
	return ids, page.Total
}

// TestScopeReads: lists, counts, details, guessed ids.
func TestScopeReads(t *testing.T) {
	t.Parallel()
	e := newScopeEnv(t)
	list := func(path, body string) ([]string, int) {
		t.Helper()
		r := e.do("POST", path, body, e.alice)
		if r.HTTPStatus != 200 {
			t.Fatalf("%s %s: %s", path, body, r.raw)
		}
		return pageIDs(t, r.Result)
	}
	for _, c := range []struct {
		path, body string
		want       []string
	}{
		{"/api/device-instance/_query", `{}`, []string{"a1", "a2"}},
		{"/api/device-instance/_query", `{"terms":[{"column":"productId","value":"sb"}]}`, nil},
		{"/api/device-instance/_query", `{"terms":[{"column":"id","value":"b1"}]}`, nil},
		{"/api/device-instance/_query", `{"terms":[{"column":"id","value":"a1"},{"column":"id","value":"b1","type":"or"}]}`, []string{"a1"}},
		{"/api/device-instance/_query", `{"paging":false}`, []string{"a1", "a2"}},
		{"/api/device-product/_query", `{}`, []string{"sa"}},
		{"/api/device-product/_query", `{"terms":[{"column":"id","value":"sb"}]}`, nil},
	} {
		// Twice, and the administrator's page between: the page cache
		// keeps each caller's page apart.
		for i := 0; i < 2; i++ {
			ids, total := list(c.path, c.body)
			if !slices.Equal(ids, c.want) || total != len(c.want) {
				t.Fatalf("%s %s: %v (total %d), want %v", c.path, c.body, ids, total, c.want)
			}
			r := e.call("POST", c.path, `{}`)
			if ids, _ := pageIDs(t, r.Result); len(ids) != 2 && len(ids) != 4 {
				t.Fatalf("administrator's %s: %v", c.path, ids)
			}
		}
	}
	var n int
	e.okAs(e.alice, "POST", "/api/device-product/_count", `{}`, &n)
	if n != 1 {
		t.Fatalf("product count %d, want 1", n)
	}
	e.okAs(e.alice, "POST", "/api/device-product/_count", `{"terms":[{"column":"id","value":"sb"}]}`, &n)
	if n != 0 {
		t.Fatalf("count of sb %d, want 0", n)
	}
	// By id, and by guessing: the same answer as an id that does not exist.
	e.hidden(e.alice, "GET", "/api/device-product/sb", nil, "sb")
	e.hidden(e.alice, "GET", "/api/device/instance/b1/detail", nil, "b1")
	e.hidden(e.alice, "GET", "/api/device/instance/b1", nil, "b1")
	e.okAs(e.alice, "GET", "/api/device/instance/a1/detail", nil, nil)
	e.okAs(e.alice, "GET", "/api/device-product/sa", nil, nil)
	// What she holds on every product she may read everywhere.
	var me meta.User
	e.okAs(e.alice, "GET", "/api/authorize/me", nil, &me)
	if !slices.Equal(me.Products[meta.PermDeviceRead], []string{"sa"}) {
		t.Fatalf("me: %+v", me)
	}
}

// TestScopeWrites: no write reaches sb or its devices, and none moves a
// device there; bulk rows name them as unknown.
func TestScopeWrites(t *testing.T) {
	t.Parallel()
	e := newScopeEnv(t)
	e.hidden(e.alice, "POST", "/api/device/instance", `{"id":"new-b","name":"N","productId":"sb"}`, "sb")
	e.okAs(e.alice, "POST", "/api/device/instance", `{"id":"new-a","name":"N","productId":"sa"}`, nil)
	e.hidden(e.alice, "PUT", "/api/device/instance/b1", `{"name":"mine"}`, "b1")
	e.hidden(e.alice, "DELETE", "/api/device/instance/b1", nil, "b1")
	e.hidden(e.alice, "POST", "/api/device/instance/b1/undeploy", nil, "b1")
	e.hidden(e.alice, "POST", "/api/device/instance/b2/deploy", nil, "b2")
	e.hidden(e.alice, "POST", "/api/device/instance/b1/secret", nil, "b1")
	e.hidden(e.alice, "PUT", "/api/device/instance/b1/metadata", scopeModel, "b1")
	e.hidden(e.alice, "DELETE", "/api/device/instance/b1/metadata", nil, "b1")
	e.hidden(e.alice, "POST", "/api/device/instance/sb/import", `[{"id":"imp-b","name":"I"}]`, "sb")
	// Moving a1 to sb.
	if r := e.do("PUT", "/api/device/instance/a1", map[string]any{"productId": "sb"}, e.alice); r.HTTPStatus != 400 {
		t.Fatalf("move a1 to sb: %d %s", r.HTTPStatus, r.raw)
	}
	// Bulk: a row of sb's is an unknown device or product, and refuses all.
	for _, c := range []struct{ path, body, hidden string }{
		{"/api/device/instance/batch/_undeploy", `["a1","b1"]`, "b1"},
		{"/api/device/instance/batch/_delete", `["new-a","b1"]`, "b1"},
		{"/api/device/instance/batch/_deploy", `["a1","b2"]`, "b2"},
		{"/api/device/instance/batch/_create", `[{"id":"bulk-a","name":"A","productId":"sa"},{"id":"bulk-b","name":"B","productId":"sb"}]`, "sb"},
	} {
		e.hidden(e.alice, "POST", c.path, c.body, c.hidden)
	}
	// Nothing of sb changed; a1 is still sa's.
	var rows []struct {
		ID      string `db:"id"`
		Product string `db:"product_id"`
		State   string `db:"state"`
		Name    string `db:"name"`
		Mod     string `db:"modifier_name"`
	}
	if err := e.store.DB().Select(&rows, `SELECT id, product_id, state, name, modifier_name FROM devices ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Product == "sb" && (r.State != meta.StateOffline || r.Name != r.ID || r.Mod == "alice") || r.ID == "a1" && r.Product != "sa" {
			t.Fatalf("after the attacks: %+v", r)
		}
		if strings.HasPrefix(r.ID, "imp-") || strings.HasPrefix(r.ID, "bulk-") || r.ID == "new-b" {
			t.Fatalf("device %s was made", r.ID)
		}
	}
	// Products: pw writes sa only, and makes none.
	prod := map[string]any{}
	e.okAs(e.pw, "GET", "/api/device-product/sa", nil, &prod)
	e.okAs(e.pw, "PATCH", "/api/device-product", prod, nil)
	prod["id"] = "sb"
	e.hidden(e.pw, "PATCH", "/api/device-product", mustJSONText(t, prod), "sb")
	e.hidden(e.pw, "POST", "/api/device-product/sb/undeploy", nil, "sb")
	e.hidden(e.pw, "DELETE", "/api/device-product/sb", nil, "sb")
	if r := e.do("POST", "/api/device/product", map[string]any{"id": "pnew", "name": "New", "classifiedId": "c", "modelFrom": "custom",
		"accessId": "mqtt", "deviceType": "device"}, e.pw); r.HTTPStatus != 403 || r.Code != "access_denied" {
		t.Fatalf("product creation by a limited writer: %d %s", r.HTTPStatus, r.raw)
	}
	var state int
	if err := e.store.DB().Get(&state, `SELECT state FROM products WHERE id = 'sb'`); err != nil || state != 1 {
		t.Fatalf("sb after the attacks: state %d %v", state, err)
	}
}

func mustJSONText(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestScopeCommandsAndLive: commands and live streams to sb's devices
// are refused as to devices that do not exist.
func TestScopeCommandsAndLive(t *testing.T) {
	t.Parallel()
	e := newScopeEnv(t)
	e.hidden(e.alice, "GET", "/api/device/standard/b1/property/temp", nil, "b1")
	e.hidden(e.alice, "POST", "/api/device/instance/b1/properties/_read", `["temp"]`, "b1")
	e.hidden(e.alice, "POST", "/api/device/invoked/b1/function/DeviceCtrl",
		`{"Location":"l","ProductID":"sb","OperCode":{"Switch":"1","Temperature":20}}`, "b1")
	// The device cache is shared: the administrator's lookup of b1 does
	// not open it to alice.
	// (This server has no device link: the administrator's read finds b1
	// and is answered client_offline.)
	if r := e.call("GET", "/api/device/standard/b1/property/temp", nil); r.Code != "client_offline" {
		t.Fatalf("the administrator's read of b1: %d %s", r.HTTPStatus, r.raw)
	}
	e.hidden(e.alice, "GET", "/api/device/standard/b1/property/temp", nil, "b1")

	live := func(devices ...string) (int, string) {
		t.Helper()
		req, err := http.NewRequest("GET", e.base+"/api/live?"+liveQuery("", devices), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Access-Token", e.alice)
		res, err := liveClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		if res.StatusCode == 200 {
			return 200, ""
		}
		raw, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(raw)
	}
	status, body := live("a1", "b1")
	_, other := live("a1", "nosuch")
	if status != 400 || !strings.Contains(body, `unknown device \"b1\"`) ||
		strings.ReplaceAll(body[:strings.Index(body, `"timestamp"`)], "b1", "nosuch") != other[:strings.Index(other, `"timestamp"`)] {
		t.Fatalf("live a1, b1: %d %s; want it refused as a1, nosuch: %s", status, body, other)
	}
	if status, body := live("a1", "a2"); status != 200 {
		t.Fatalf("live a1, a2: %d %s", status, body)
	}
}

// TestScopeDashboard: message counts of every product are alice's
// products' only; a named product, or a device, outside is not_found, in
// endpoint 14 and in exports.
func TestScopeDashboard(t *testing.T) {
	t.Parallel()
	e := newScopeEnv(t)
	now := time.Now().UTC()
	var msgs []tsdb.Message
	var props []tsdb.PropertyValue
	for i, c := range []struct {
		product, device string
		n               int
	}{{"sa", "a1", 3}, {"sb", "b1", 5}} {
		for k := 0; k < c.n; k++ {
			at := now.Add(-time.Duration(10*i+k+1) * time.Minute)
			msgs = append(msgs, tsdb.Message{Time: at, ProductID: c.product, DeviceID: c.device, Direction: "up",
				MessageType: "REPORT_PROPERTY", MessageID: fmt.Sprint(i, k), Topic: "/t", Payload: []byte("{}")})
			props = append(props, tsdb.PropertyValue{Time: at, ProductID: c.product, DeviceID: c.device, Property: "temp", ValueType: "number", Num: float64(k)})
		}
	}
	if err := e.db.Insert(context.Background(), msgs, props); err != nil {
		t.Fatal(err)
	}
	counts := func(token string, params map[string]any) (int, uint64, string) {
		t.Helper()
		params["time"], params["limit"] = "1h", 3
		r := e.do("POST", "/api/dashboard/_multi", []map[string]any{{"dashboard": "device", "object": "message", "measurement": "quantity",
			"dimension": "agg", "params": params}}, token)
		if r.HTTPStatus != 200 {
			return r.HTTPStatus, 0, string(r.raw)
		}
		var items []aggResult
		if err := json.Unmarshal(r.Result, &items); err != nil {
			t.Fatal(err)
		}
		var sum uint64
		for _, it := range items {
			sum += it.Data.Value
		}
		return 200, sum, ""
	}
	if _, sum, _ := counts(e.token, map[string]any{}); sum != 8 {
		t.Fatalf("administrator's message count %d, want 8", sum)
	}
	if _, sum, raw := counts(e.alice, map[string]any{}); sum != 3 {
		t.Fatalf("alice's message count of every product %d, want 3 (sa's): %s", sum, raw)
	}
	if _, sum, _ := counts(e.alice, map[string]any{"productId": "sa"}); sum != 3 {
		t.Fatalf("alice's message count of sa %d, want 3", sum)
	}
	q := func(object, dimension string, params map[string]any) string {
		return mustJSONText(t, []map[string]any{{"dashboard": "device", "object": object, "measurement": "properties", "dimension": dimension, "params": params}})
	}
	countsOf := func(product string) string {
		return mustJSONText(t, []map[string]any{{"dashboard": "device", "object": "message", "measurement": "quantity", "dimension": "agg",
			"params": map[string]any{"productId": product}}})
	}
	e.hidden(e.alice, "POST", "/api/dashboard/_multi", countsOf("sb"), "sb")
	e.hidden(e.alice, "POST", "/api/dashboard/_multi", q("sb", "agg", map[string]any{"properties": []string{"temp"}, "agg": "count"}), "sb")
	e.hidden(e.alice, "POST", "/api/dashboard/_multi", q("sb", "agg", map[string]any{"properties": []string{"temp"}, "agg": "count", "deviceId": "b1"}), "b1")
	e.hidden(e.alice, "POST", "/api/dashboard/_multi", q("sb", "history", map[string]any{"deviceId": "b1", "history": 5}), "b1")
	// A device of sb named under sa: as unknown, not "belongs to sb".
	e.hidden(e.alice, "POST", "/api/dashboard/_multi", q("sa", "history", map[string]any{"deviceId": "b1", "history": 5}), "b1")
	e.hidden(e.alice, "POST", "/api/dashboard/_multi", q("sa", "agg", map[string]any{"properties": []string{"temp"}, "agg": "count", "deviceId": "b1"}), "b1")
	e.okAs(e.alice, "POST", "/api/dashboard/_multi", q("sa", "history", map[string]any{"deviceId": "a1", "history": 5}), nil)

	// Exports.
	export := func(token, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest("POST", e.base+"/api/dashboard/_export?format=ndjson", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Access-Token", token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		raw, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(raw)
	}
	exportSum := func(token string) uint64 {
		t.Helper()
		status, body := export(token, `{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"time":"1h","limit":3}}`)
		if status != 200 {
			t.Fatalf("export: %d %s", status, body)
		}
		var sum uint64
		for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
			var row struct {
				Value uint64 `json:"value"`
			}
			if err := json.Unmarshal([]byte(line), &row); err != nil {
				t.Fatalf("export line %q: %v", line, err)
			}
			sum += row.Value
		}
		return sum
	}
	if sum := exportSum(e.token); sum != 8 {
		t.Fatalf("administrator's export of every product: %d, want 8", sum)
	}
	if sum := exportSum(e.alice); sum != 3 {
		t.Fatalf("alice's export of every product: %d, want 3 (sa's)", sum)
	}
	for _, c := range []struct{ body, hidden string }{
		{`{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"productId":"sb"}}`, "sb"},
		{`{"dashboard":"device","object":"sb","measurement":"properties","dimension":"history","params":{"deviceId":"b1","history":5}}`, "b1"},
		{`{"dashboard":"device","object":"sa","measurement":"properties","dimension":"history","params":{"deviceId":"b1","history":5}}`, "b1"},
		{`{"dashboard":"device","object":"sb","measurement":"properties","dimension":"agg","params":{"properties":["temp"],"agg":"count"}}`, "sb"},
	} {
		status, body := export(e.alice, c.body)
		wantStatus, want := export(e.alice, strings.ReplaceAll(c.body, c.hidden, "nosuch"))
		cut := func(s string) string {
			if i := strings.Index(s, `"timestamp"`); i >= 0 {
				return s[:i]
			}
			return s
		}
		if status != 404 || status != wantStatus || strings.ReplaceAll(cut(body), c.hidden, "nosuch") != cut(want) {
			t.Fatalf("export %s by alice: %d %s, want it refused as nosuch is: %d %s", c.body, status, body, wantStatus, want)
		}
	}
}

// TestScopeRoleChange: a change of a role's products reaches its users'
// next requests within 1 s (the token cache hears it), both ways.
func TestScopeRoleChange(t *testing.T) {
	t.Parallel()
	e := newScopeEnv(t)
	devices := func() []string {
		t.Helper()
		r := e.do("POST", "/api/device-instance/_query", `{}`, e.alice)
		if r.HTTPStatus != 200 {
			t.Fatalf("list: %s", r.raw)
		}
		ids, _ := pageIDs(t, r.Result)
		return ids
	}
	within := func(what string, want []string) {
		t.Helper()
		var got []string
		if !testkit.Within(time.Second, func() bool { got = devices(); return slices.Equal(got, want) }) {
			t.Fatalf("%s: alice sees %v after 1 s, want %v", what, got, want)
		}
	}
	within("before", []string{"a1", "a2"})
	e.ok("PUT", "/api/role/only-a", map[string]any{"products": []string{"sa", "sb"}}, nil)
	within("widened to sb", []string{"a1", "a2", "b1", "b2"})
	e.ok("PUT", "/api/role/only-a", map[string]any{"products": []string{"sb"}}, nil)
	within("moved to sb", []string{"b1", "b2"})
	e.hidden(e.alice, "GET", "/api/device/instance/a1/detail", nil, "a1")
	// Role editing refusals, named by field.
	for _, c := range []struct {
		method, path string
		body         any
		status       int
		code, field  string
	}{
		{"POST", "/api/role", map[string]any{"name": "X", "permissions": []string{"device:fly"}}, 400, "illegal_argument", "permissions[0]"},
		{"POST", "/api/role", map[string]any{"name": "X", "permissions": []string{"device:read"}, "products": []string{"sa", "nope"}}, 400, "illegal_argument", "products[1]"},
		{"POST", "/api/role", map[string]any{"name": "X", "products": "sa"}, 400, "illegal_argument", "products"},
		{"PUT", "/api/role/admin", map[string]any{"name": "Mine"}, 400, "illegal_argument", ""},
		{"DELETE", "/api/role/admin", nil, 400, "illegal_argument", ""},
		{"DELETE", "/api/role/only-a", nil, 400, "illegal_argument", ""}, // alice holds it
		{"PUT", "/api/role/nope", map[string]any{"name": "n"}, 404, "not_found", ""},
	} {
		r := e.call(c.method, c.path, c.body)
		if r.HTTPStatus != c.status || r.Code != c.code || !strings.HasPrefix(r.Message, c.field) {
			t.Fatalf("%s %s %v: %d %s, want %d %s naming %q", c.method, c.path, c.body, r.HTTPStatus, r.raw, c.status, c.code, c.field)
		}
	}
	// A role editor needs user:admin.
	if r := e.do("POST", "/api/role", map[string]any{"name": "Mine", "permissions": []string{"user:admin"}}, e.alice); r.HTTPStatus != 403 {
		t.Fatalf("role creation by alice: %d %s", r.HTTPStatus, r.raw)
	}
}
